r"""Every step of a worksheet, as a small graph computed with the library's own ops.

A :class:`Step` names one quantity (``(layer, name)``, e.g. ``(1, "scores")``), the quantities it
is computed from (``inputs``) and the function that computes it — always one of the library's ops
(``linear_forward``, ``softmax_forward``, ``layernorm_forward``, ``activation_forward``,
``residual_forward`` and their backwards) applied to 2-D arrays of one sequence, so that each named
intermediate exists on its own. Parameters are fixed (captured by the functions); only quantities
flow along the graph, which is what lets the marker feed a student's own earlier answers into a
later step (follow-through) and lets the diagnosis swap one step's function for a common mistake.

The two inputs are ``(0, "H0")`` (the [input] table H^(0)) and ``(0, "dH")`` (∂L/∂H^(N)).
Forward steps come first, layer 1 … N; then the backward, layer N … 1. See :mod:`.names` for what
each name means in Post-LN and Pre-LN.

Per head (h heads, d_k = d_model / h, head i owns columns i·d_k … (i+1)·d_k − 1, as ``split_heads``):
    scores_i = Q_i K_iᵀ / √d_k,   A_i = softmax(scores_i) by row,   context = [A_1 V_1 | … | A_h V_h]
Backward of attention, per head (the library's ``attention_backward``, with its intermediates named):
    d_attention_weights_i = d_context_i V_iᵀ,   d_scores_i = softmax_backward(d_attention_weights_i)
    d_Q_i = d_scores_i K_i / √d_k,   d_K_i = d_scores_iᵀ Q_i / √d_k,   d_V_i = A_iᵀ d_context_i
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..ops.activations import ACTIVATIONS, activation_backward, activation_forward
from ..ops.attention import merge_heads, split_heads
from ..ops.layernorm import layernorm_backward, layernorm_forward
from ..ops.linear import linear_backward, linear_forward
from ..ops.residual import residual_forward
from ..ops.softmax import softmax_backward, softmax_forward
from . import mistakes as mk
from .band import hand
from .names import head_names

__all__ = ["Key", "Mistake", "Step", "build_steps", "evaluate", "H0_KEY", "DH_KEY"]

Key = tuple[int, str]
H0_KEY: Key = (0, "H0")
DH_KEY: Key = (0, "dH")


@dataclass(frozen=True)
class Mistake:
    """A common mistake at one step: the step computed by ``fn`` from ``inputs`` instead."""

    code: str
    inputs: tuple[Key, ...]
    fn: Callable[..., np.ndarray]
    detail: str
    carry: tuple = ()              # ((key, Mistake), …): how the mistake runs on in later steps (else: only here)
    confirm: Key | None = None     # a later step whose written value tells this reading from another one


@dataclass
class Step:
    """One quantity: ``key = (layer, name)``, computed as ``fn(*values of inputs)``."""

    key: Key
    inputs: tuple[Key, ...]
    fn: Callable[..., np.ndarray]
    formula: str
    mistakes: list[Mistake] = field(default_factory=list)
    local: str | None = None      # "row": output row i reads only row i of every input; "element": entry-wise
    hand: Callable | None = None  # hand(rd, *inputs): the formula as worked by hand, sub-steps rounded by rd
    #                               (:mod:`.band`); inputs carry a leading axis of samples

    @property
    def layer(self) -> int:
        return self.key[0]

    @property
    def name(self) -> str:
        return self.key[1]

    @property
    def backward(self) -> bool:
        return self.name.startswith("d_")


# ----------------------------------------------------------------------------- op wrappers (2-D, one sequence)
def _heads(X: np.ndarray, h: int) -> np.ndarray:
    return split_heads(X[None], h)[0]                                  # (n, d) -> (h, n, d_k)


def _merge(Xh: list[np.ndarray]) -> np.ndarray:
    return merge_heads(np.stack(Xh)[None])[0]                         # h × (n, d_k) -> (n, d)


def _linear(W, b):
    def f(x):
        return linear_forward(x, W, b)[0]                             # (n, d_out)
    return f


def _linear_grad(W, b, which: int):
    """dx (0), dW (1) or db (2) of y = x W + b. dx and db do not read x: a zero x stands in for it."""
    def f(*args):
        x, dy = args if which == 1 else (np.zeros(args[0].shape[:-1] + (W.shape[0],)), args[0])
        return linear_backward(dy, linear_forward(x, W, b)[1])[which]
    return f


def _mean(x):
    return x.mean(axis=-1)                                            # (n,)


def _var(x, mean):
    return np.mean((x - mean[..., None]) ** 2, axis=-1)               # (n,) population variance (÷ d)


def _sample_var(x, mean):
    return np.sum((x - mean[..., None]) ** 2, axis=-1) / (x.shape[-1] - 1)   # (n,) ÷ (d − 1)


def _own_stats(x, mean, var) -> bool:
    own_mean = _mean(x)
    return np.array_equal(mean, own_mean) and np.array_equal(var, _var(x, own_mean))


def _normalise(x, mean, var, gamma, beta, eps):
    """γ (x − μ)/√(σ² + ε) + β with the given μ and σ² (a negative σ² counts as 0)."""
    return gamma * (x - mean[..., None]) / np.sqrt(np.maximum(var[..., None], 0.0) + eps) + beta


def _layernorm(gamma, beta, eps):
    """LN(x) from x and the statistics the student wrote down.

    With x's own statistics (the truth, or a student who did not write them) this is the library's
    ``layernorm_forward``; with other ones it is the same formula γ (x − μ)/√(σ² + ε) + β with the
    student's μ and σ² — so a wrong mean is marked once and the LayerNorm built on it ``follows``.
    """
    def f(x, mean, var):
        if _own_stats(x, mean, var):
            return layernorm_forward(x, gamma, beta, eps)[0]
        return _normalise(x, mean, var, gamma, beta, eps)
    return f


def _layernorm_direct(gamma, beta, eps):
    def f(x):
        return layernorm_forward(x, gamma, beta, eps)[0]
    return f


def _layernorm_grad(gamma, beta, eps, which: int):
    """dx (0), dγ (1) or dβ (2) of LN at x, given the statistics μ, σ² of the forward and dy.

    With x's own statistics (the truth, or a student who did not write them) this is the library's
    ``layernorm_backward``; with other ones — a student's wrong mean or variance, carried into σ = √(σ² + ε)
    and x̂ = (x − μ)/σ — the same backward, dx = (g − mean(g) − x̂ · mean(g x̂))/σ with g = γ dy, dγ = Σ dy x̂,
    dβ = Σ dy, worked with the student's μ and σ², so that a backward done consistently after a wrong
    statistic ``follows``.
    """
    def f(x, mean, var, dy):
        if _own_stats(x, mean, var):
            return layernorm_backward(dy, layernorm_forward(x, gamma, beta, eps)[1])[which]
        return _ln_backward_with(x, mean, var, dy, gamma, eps)[which]
    return f


def _ln_backward_with(x, mean, var, dy, gamma, eps):
    """(dx, dγ, dβ) of LayerNorm with the given μ and σ² (a negative σ² counts as 0)."""
    sd = np.sqrt(np.maximum(var, 0.0) + eps)[..., None]               # (n, 1)
    xh = (x - mean[..., None]) / sd                                    # (n, d)
    g = gamma * dy
    dx = (g - g.mean(-1, keepdims=True) - xh * (g * xh).mean(-1, keepdims=True)) / sd
    return dx, (dy * xh).sum(-2), dy.sum(-2)


def _activation(act):
    def f(z):
        return activation_forward(z, act)[0]
    return f


def _activation_grad(act):
    def f(z, da):
        return activation_backward(da, activation_forward(z, act)[1])
    return f


def _residual(x, fx):
    return residual_forward(x, fx)[0]


def _copy(g):
    return np.array(g, dtype=np.float64, copy=True)   # a residual's / the identity's backward passes g on


def _pre_ln_residual(gamma, beta, eps):
    """Post-LN mistake: x + LN(sublayer) (normalised before the residual was added)."""
    ln = _layernorm_direct(gamma, beta, eps)
    return lambda x, fx: _residual(x, ln(fx))


def _post_ln_residual(gamma, beta, eps):
    """Pre-LN mistake: LN(x + sublayer) (the residual sum normalised, Post-LN wiring)."""
    ln = _layernorm_direct(gamma, beta, eps)
    return lambda x, fx: ln(_residual(x, fx))


# ----------------------------------------------------------------------------- one layer's steps
class _LayerBuilder:
    """The steps of layer ``l`` (1-based) of worksheet ``ws``."""

    def __init__(self, ws, l: int):
        self.ws, self.l, self.p = ws, l, ws.params[l - 1]
        self.h, self.dk, self.d = ws.n_heads, ws.d_k, ws.d_model
        self.scale = 1.0 / math.sqrt(self.dk)
        self.x = (l - 1, "H") if l > 1 else H0_KEY
        self.xname = f"H^({l - 1})"
        self.steps: list[Step] = []

    def k(self, name: str) -> Key:
        return (self.l, name)

    def add(self, name, inputs, fn, formula, mistakes=(), local=None, hand=None):
        keys = tuple(i if isinstance(i, tuple) else self.k(i) for i in inputs)
        ms = [m if isinstance(m, Mistake) else Mistake(m[0], self.keys(m[1]), m[2], m[3]) for m in mistakes]
        self.steps.append(Step(self.k(name), keys, fn, formula, ms, local, hand))

    def keys(self, names) -> tuple[Key, ...]:
        return tuple(i if isinstance(i, tuple) else self.k(i) for i in names)

    def linear(self, name, x, xname, which: str):
        """y = x W + b (W_Q … W_2), with its mistakes."""
        wn, bn = f"W_{which}", f"b_{which}"
        W, b = self.p[wn], self.p[bn]
        ms = [(c, (x,), f, det.replace("x ", f"{xname} ", 1)) for c, f, det in mk.linear(W, b, wn, bn)]
        self.add(name, (x,), _linear(W, b), f"{xname} {wn} + {bn}", ms, local="row", hand=hand.linear(W, b))

    def linear_dx(self, name, dy, which: str):
        """dx = dy Wᵀ, with its mistakes."""
        wn = f"W_{which}"
        W, b = self.p[wn], self.p[f"b_{which}"]
        ms = [(c, (dy,), f, det) for c, f, det in mk.linear_dx(W, wn, dy)]
        self.add(name, (dy,), _linear_grad(W, b, 0), f"{dy} {wn}^T", ms, local="row", hand=hand.linear_dx(W))

    def param_grads(self, x, xname, dy, which: str):
        W, b = self.p[f"W_{which}"], self.p[f"b_{which}"]
        self.add(f"d_W_{which}", (x, dy), _linear_grad(W, b, 1), f"{xname}^T {dy}", hand=hand.linear_dW())
        self.add(f"d_b_{which}", (dy,), _linear_grad(W, b, 2), f"column sums of {dy}", hand=hand.colsum())

    # -------------------------------------------------------------- forward
    def layernorm(self, x, xname: str, prefix: str, out: str, which: str, extra=(), wiring=None):
        p, eps, d = self.p, self.ws.eps, self.d
        g, b = p[f"gamma{which}"], p[f"beta{which}"]
        mean, var = f"{prefix}_mean", f"{prefix}_var"
        sample = ([("sample_variance", (x, mean), _sample_var,
                    f"the variance divided by d - 1 = {d - 1} instead of d = {d}")] if d > 1 else [])
        m_mean, m_var = [], []
        if wiring is not None:            # Post-LN: the statistics of the sublayer output alone (LN before the sum)
            sx, sxn, sf, sfn = wiring
            code = "ln_before_residual"
            carry = ((self.k(mean), Mistake(code, self.keys((sf,)), _mean, "")),
                     (self.k(var), Mistake(code, self.keys((sf, mean)), _var, "")),
                     (self.k(out), Mistake(code, self.keys((sx, sf, mean, var)),
                                           lambda x_, f_, mu, v: x_ + _normalise(f_, mu, v, g, b, eps), "")))
            m_mean.append(Mistake(code, self.keys((sf,)), _mean, f"the mean of {sfn} alone: the LayerNorm applied to "
                                  f"the sublayer output before {sxn} was added", carry, self.k(out)))
            m_var.append(Mistake(code, self.keys((sf, mean)), _var, f"the variance of {sfn} alone: the LayerNorm "
                                 f"applied to the sublayer output before {sxn} was added", carry, self.k(out)))
        self.add(mean, (x,), _mean, f"mean of each row of {xname}", m_mean, local="row", hand=hand.mean())
        self.add(var, (x, mean), _var, f"mean of (x - mean)^2 over the d = {d} entries of each row of {xname}",
                 sample + m_var, local="row", hand=hand.var())
        self.add(out, (x, mean, var), _layernorm(g, b, eps),
                 f"gamma{which} * ({xname} - mean) / sqrt(var + eps) + beta{which}", extra, local="row",
                 hand=hand.layernorm(g, b, eps))

    def attention(self, a_in, a_name: str):
        h = self.h
        for n in "QKV":
            self.linear(n, a_in, a_name, n)
        S, A = head_names("scores", h), head_names("attention_weights", h)
        sd = f"sqrt(d_k) = sqrt({self.dk})"
        sd_formula = f"sqrt(d_k)   (d_k = {self.dk})"
        for i in range(h):
            qi = f"Q_{i + 1}" if h > 1 else "Q"
            ki = f"K_{i + 1}" if h > 1 else "K"

            def s(Q, K, i=i, scale=self.scale):
                return (_heads(Q, h)[i] @ _heads(K, h)[i].T) * scale                     # (n, n)

            mistakes = [("missing_scale", ("Q", "K"), lambda Q, K, i=i: _heads(Q, h)[i] @ _heads(K, h)[i].T,
                         f"Q K^T without dividing by {sd}"),
                        ("transposed_scores", ("Q", "K"),
                         lambda Q, K, i=i, sc=self.scale: (_heads(K, h)[i] @ _heads(Q, h)[i].T) * sc,
                         "K Q^T / sqrt(d_k), the transpose")]
            if self.dk > 1:
                mistakes.append(("wrong_scale", ("Q", "K"),
                                 lambda Q, K, i=i, dk=self.dk: _heads(Q, h)[i] @ _heads(K, h)[i].T / dk,
                                 f"Q K^T / d_k = Q K^T / {self.dk} instead of / {sd}"))
            if h > 1:
                mistakes.append(("wrong_scale", ("Q", "K"),
                                 lambda Q, K, i=i, d=self.d: _heads(Q, h)[i] @ _heads(K, h)[i].T / math.sqrt(d),
                                 f"Q K^T / sqrt(d_model) = / sqrt({self.d}) instead of / {sd}"))
            self.add(S[i], ("Q", "K"), s, f"{qi} {ki}^T / {sd_formula}", mistakes, hand=hand.scores(h, i, self.dk))
        for i in range(h):
            self.add(A[i], (S[i],), lambda s: softmax_forward(s)[0], f"softmax of each row of {S[i]}",
                     [("softmax_axis", (S[i],), lambda s: softmax_forward(s.T)[0].T,
                       "the softmax of each column instead of each row")], local="row", hand=hand.softmax())
        self.add("context", (*A, "V"),
                 lambda *a: _merge([a[i] @ _heads(a[-1], h)[i] for i in range(h)]),
                 "attention_weights V" if h == 1 else "[A_1 V_1 | ... | A_h V_h] (heads side by side)",
                 hand=hand.context(h))
        self.linear("attention_output", "context", "context", "O")

    def residual(self, name, x, xname, fx, fxname, which: str):
        p, eps = self.p, self.ws.eps
        g, b = p[f"gamma{which}"], p[f"beta{which}"]
        mistakes = [("no_residual", (fx,), _copy, f"{fxname} alone, without adding {xname}")]
        if self.ws.norm == "post":
            mistakes.append(("ln_before_residual", (x, fx), _pre_ln_residual(g, b, eps),
                             f"{xname} + LN{which}({fxname})"))
        else:
            mistakes.append(("ln_after_residual", (x, fx), _post_ln_residual(g, b, eps),
                             f"LN{which}({xname} + {fxname})"))
        self.add(name, (x, fx), _residual, f"{xname} + {fxname}", mistakes, local="element", hand=hand.residual())

    def ffn(self, f_in, f_name: str):
        act = self.ws.activation
        self.linear("ffn_hidden", f_in, f_name, "1")
        others = [("wrong_activation", ("ffn_hidden",), _activation(o), f"{o}(ffn_hidden) instead of {act}(ffn_hidden)")
                  for o in ACTIVATIONS if o != act]
        self.add("ffn_activation", ("ffn_hidden",), _activation(act), f"{act}(ffn_hidden)", others, local="element",
                 hand=hand.activation(act))
        self.linear("ffn_output", "ffn_activation", "ffn_activation", "2")

    def forward(self) -> list[Step]:
        x, xn, p, eps = self.x, self.xname, self.p, self.ws.eps
        if self.ws.norm == "post":
            self.attention(x, xn)
            self.residual("residual", x, xn, "attention_output", "attention_output", "1")
            self.layernorm("residual", "residual", "layer_norm", "layer_norm", "1",
                           [("ln_before_residual", (x, "attention_output"),
                             _pre_ln_residual(p["gamma1"], p["beta1"], eps), f"{xn} + LN1(attention_output)")],
                           wiring=(x, xn, "attention_output", "attention_output"))
            self.ffn("layer_norm", "layer_norm")
            self.residual("residual2", "layer_norm", "layer_norm", "ffn_output", "ffn_output", "2")
            self.layernorm("residual2", "residual2", "layer_norm2", "H", "2",
                           [("ln_before_residual", ("layer_norm", "ffn_output"),
                             _pre_ln_residual(p["gamma2"], p["beta2"], eps), "layer_norm + LN2(ffn_output)")],
                           wiring=("layer_norm", "layer_norm", "ffn_output", "ffn_output"))
        else:
            self.layernorm(x, xn, "layer_norm", "layer_norm", "1")
            self.attention("layer_norm", "layer_norm")
            self.residual("residual", x, xn, "attention_output", "attention_output", "1")
            self.layernorm("residual", "residual", "layer_norm2", "layer_norm2", "2")
            self.ffn("layer_norm2", "layer_norm2")
            self.residual("residual2", "residual", "residual", "ffn_output", "ffn_output", "2")
            self.add("H", ("residual2",), _copy, "residual2 (Pre-LN: the residual stream itself)", local="element",
                     hand=hand.copy())
        return self.steps

    # -------------------------------------------------------------- backward
    def copy(self, name, src, formula):
        self.add(name, (src,), _copy, formula, local="element", hand=hand.copy())

    def ln_grads(self, x, xname, dy, which: str, names=("d_residual", "d_gamma1", "d_beta1"), skip=None):
        """dx, dγ, dβ of LayerNorm ``which`` at ``x`` given ``dy``, with the statistics of the forward (the
        student's own mean and variance); ``skip``: a gradient added to dx (Pre-LN)."""
        p, eps = self.p, self.ws.eps
        g, b = p[f"gamma{which}"], p[f"beta{which}"]
        prefix = "layer_norm" if which == "1" else "layer_norm2"
        stats = (f"{prefix}_mean", f"{prefix}_var")
        lnx = _layernorm_grad(g, b, eps, 0)
        const = mk.ln_stats_constant(g, eps)
        if skip is None:
            ms = [("ln_stats_constant", (x, *stats, dy), f, det) for f, det in const]
            self.add_any(names[0], (x, *stats, dy), lnx, f"LayerNorm backward of {dy} at {xname}", ms, local="row",
                         hand=hand.layernorm_grad(g, eps, 0))
        else:
            ms = [("ln_stats_constant", (skip, x, *stats, dy), lambda r, *a, f=f: r + f(*a), det)
                  for f, det in const]
            ms.append(("no_residual", (x, *stats, dy), lnx,
                       f"the LayerNorm backward alone, without the skip path's {skip}"))
            self.add_any(names[0], (skip, x, *stats, dy), lambda r, *a: r + lnx(*a),
                         f"{skip} + LayerNorm backward of {dy} at {xname}", ms, local="row",
                         hand=hand.plus(hand.layernorm_grad(g, eps, 0)))
        for n, w in ((names[1], 1), (names[2], 2)):
            if n is not None:
                self.add(n, (x, *stats, dy), _layernorm_grad(g, b, eps, w),
                         f"column sums of {dy} * LN-normalised {xname}" if w == 1 else f"column sums of {dy}",
                         hand=hand.layernorm_grad(g, eps, w))

    def attention_backward(self, a_in, a_name: str):
        h, sc = self.h, self.scale
        self.linear_dx("d_context", "d_attention_output", "O")
        self.param_grads("context", "context", "d_attention_output", "O")
        A, dA = head_names("attention_weights", h), head_names("d_attention_weights", h)
        dS = head_names("d_scores", h)
        for i in range(h):
            self.add(dA[i], ("d_context", "V"), lambda g, V, i=i: _heads(g, h)[i] @ _heads(V, h)[i].T,
                     "d_context V^T" + (f" (head {i + 1}'s columns)" if h > 1 else ""),
                     hand=hand.d_attention_weights(h, i))
        for i in range(h):
            ms = [("softmax_jacobian", (A[i], dA[i]), f, det) for f, det in mk.softmax_jacobian(A[i], dA[i])]
            self.add(dS[i], (A[i], dA[i]), lambda a, g: softmax_backward(g, {"kind": "softmax", "s": a}),
                     f"{A[i]} * ({dA[i]} - rowsum({dA[i]} * {A[i]}))", ms, local="row", hand=hand.softmax_grad())

        def qk_grad(which: str):
            other = "K" if which == "Q" else "Q"

            def g(*a, s=sc):
                return _merge([(a[i] if which == "Q" else a[i].T) @ _heads(a[-1], h)[i] for i in range(h)]) * s
            rhs = "d_scores K" if which == "Q" else "d_scores^T Q"
            mistakes = [("missing_scale", (*dS, other), lambda *a: g(*a, s=1.0),
                         f"{rhs} without the factor 1/sqrt(d_k) = {sc:g}")]
            if self.dk > 1:
                mistakes.append(("wrong_scale", (*dS, other), lambda *a: g(*a, s=1.0 / self.dk),
                                 f"{rhs} times 1/d_k = 1/{self.dk} instead of 1/sqrt(d_k)"))
            self.add(f"d_{which}", (*dS, other), g, f"{rhs} / sqrt(d_k) (per head)", mistakes,
                     hand=hand.qk_grad(which, h, self.dk))
        qk_grad("Q")
        qk_grad("K")
        self.add("d_V", (*A, "d_context"),
                 lambda *a: _merge([a[i].T @ _heads(a[-1], h)[i] for i in range(h)]), "attention_weights^T d_context",
                 hand=hand.d_V(h))
        for n in "QKV":
            self.param_grads(a_in, a_name, f"d_{n}", n)

    def proj_input_grad(self):
        p = self.p
        fs = [_linear_grad(p[f"W_{n}"], p[f"b_{n}"], 0) for n in "QKV"]
        return lambda dq, dk, dv: fs[0](dq) + fs[1](dk) + fs[2](dv)

    def proj_hand(self, skip: bool):
        return hand.sum3(*(hand.linear_dx(self.p[f"W_{n}"]) for n in "QKV"), skip=skip)

    def ffn_backward(self, f_in, f_name):
        act = self.ws.activation
        self.linear_dx("d_ffn_activation", "d_ffn_output", "2")
        self.param_grads("ffn_activation", "ffn_activation", "d_ffn_output", "2")
        others = [("wrong_activation", ("ffn_hidden", "d_ffn_activation"), _activation_grad(o),
                   f"d_ffn_activation times the derivative of {o} instead of {act}") for o in ACTIVATIONS if o != act]
        others += [("activation_derivative", ("ffn_hidden", "d_ffn_activation"), f, det)
                   for f, det in mk.activation_derivative(act)]
        self.add("d_ffn_hidden", ("ffn_hidden", "d_ffn_activation"), _activation_grad(act),
                 f"d_ffn_activation * {act}'(ffn_hidden)", others, local="element", hand=hand.activation_grad(act))
        self.param_grads(f_in, f_name, "d_ffn_hidden", "1")

    def backward(self, last: bool) -> list[Step]:
        p, x, xn = self.p, self.x, self.xname
        W1, b1 = p["W_1"], p["b_1"]
        if last:
            self.copy("d_H", DH_KEY, "[input] dH, the upstream gradient")
        in_key, in_name = ((self.l - 1, "d_H") if self.l > 1 else (1, "d_H0")), ("d_H" if self.l > 1 else "d_H0")
        if self.ws.norm == "post":
            self.ln_grads("residual2", "residual2", "d_H", "2", ("d_residual2", "d_gamma2", "d_beta2"))
            self.copy("d_ffn_output", "d_residual2", "d_residual2 (the residual passes it on)")
            self.ffn_backward("layer_norm", "layer_norm")
            lin1 = _linear_grad(W1, b1, 0)
            ms = [("no_residual", ("d_ffn_hidden",), lin1, "d_ffn_hidden W_1^T without the skip path's d_residual2")]
            ms += [(c, ("d_residual2", "d_ffn_hidden"), lambda r, g, f=f: r + f(g), det)
                   for c, f, det in mk.linear_dx(W1, "W_1", "d_ffn_hidden")]
            self.add("d_layer_norm", ("d_residual2", "d_ffn_hidden"), lambda r, g: r + lin1(g),
                     "d_residual2 + d_ffn_hidden W_1^T", ms, local="row", hand=hand.plus(hand.linear_dx(W1)))
            self.ln_grads("residual", "residual", "d_layer_norm", "1")
            self.copy("d_attention_output", "d_residual", "d_residual (the residual passes it on)")
            self.attention_backward(x, xn)
            proj = self.proj_input_grad()
            self.add_key(in_key, in_name, ("d_residual", "d_Q", "d_K", "d_V"), lambda r, q, k, v: r + proj(q, k, v),
                         "d_residual + d_Q W_Q^T + d_K W_K^T + d_V W_V^T",
                         [("no_residual", ("d_Q", "d_K", "d_V"), proj,
                           "d_Q W_Q^T + d_K W_K^T + d_V W_V^T without the skip path's d_residual")],
                         local="row", hand=self.proj_hand(skip=True))
        else:
            self.copy("d_residual2", "d_H", "d_H (H = residual2)")
            self.copy("d_ffn_output", "d_residual2", "d_residual2 (the residual passes it on)")
            self.ffn_backward("layer_norm2", "layer_norm2")
            self.linear_dx("d_layer_norm2", "d_ffn_hidden", "1")
            self.ln_grads("residual", "residual", "d_layer_norm2", "2", ("d_residual", None, None), skip="d_residual2")
            self.ln_grads("residual", "residual", "d_layer_norm2", "2", (None, "d_gamma2", "d_beta2"))
            self.copy("d_attention_output", "d_residual", "d_residual (the residual passes it on)")
            self.attention_backward("layer_norm", "layer_norm")
            self.add("d_layer_norm", ("d_Q", "d_K", "d_V"), self.proj_input_grad(),
                     "d_Q W_Q^T + d_K W_K^T + d_V W_V^T", local="row", hand=self.proj_hand(skip=False))
            self.ln_grads(x, xn, "d_layer_norm", "1", (None, "d_gamma1", "d_beta1"))
            self.ln_grads(x, xn, "d_layer_norm", "1", (in_name, None, None), skip="d_residual")
            self.steps[-1].key = in_key
        return self.steps

    def add_any(self, name, inputs, fn, formula, mistakes=(), local=None, hand=None):
        if name is not None:
            self.add(name, inputs, fn, formula, mistakes, local, hand)

    def add_key(self, key: Key, shown: str, inputs, fn, formula, mistakes=(), local=None, hand=None):
        """A step whose key is not in this layer: the gradient of the layer's input."""
        self.add(shown, inputs, fn, formula, mistakes, local, hand)
        self.steps[-1].key = key


def build_steps(ws) -> list[Step]:
    """The steps of worksheet ``ws`` in the order they are computed: forward 1 … N, then (if ``ws.dH``
    is given) backward N … 1."""
    steps: list[Step] = []
    for l in range(1, ws.layers + 1):
        steps += _LayerBuilder(ws, l).forward()
    if ws.backward:
        for l in range(ws.layers, 0, -1):
            steps += _LayerBuilder(ws, l).backward(last=l == ws.layers)
    return steps


def evaluate(steps: list[Step], inputs: dict, override: dict | None = None) -> dict:
    """Run the steps in order. ``inputs`` holds ``H0_KEY`` (and ``DH_KEY``); ``override(key, value) -> value``
    may replace a computed value (follow-through puts the student's given entries in)."""
    values = dict(inputs)
    with np.errstate(all="ignore"):
        for s in steps:
            v = s.fn(*(values[k] for k in s.inputs))
            values[s.key] = override(s.key, v) if override else v
    return values
