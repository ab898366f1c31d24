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


@dataclass
class Step:
    """One quantity: ``key = (layer, name)``, computed as ``fn(*values of inputs)``."""

    key: Key
    inputs: tuple[Key, ...]
    fn: Callable[..., np.ndarray]
    formula: str
    mistakes: list[Mistake] = field(default_factory=list)
    local: str | None = None      # "row": output row i reads only row i of every input; "element": entry-wise
    propagate: Callable | None = None   # (args, errs, rounding, rss) -> propagated error (own rule: LayerNorm)
    rowsum: Callable | None = None      # the step is the sum over tokens of this row-local function (dγ)
    multilinear: float = 0.0            # > 0: c · (a sum of products in which each input entry meets each output
    #                                     entry in at most one product); c the step's positive constant factor

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
    f.multilinear = 1.0 if which > 0 else 0.0                        # dW = xᵀ dy, db = Σ_tokens dy_t
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


def _layernorm_propagate(gamma, beta, eps):
    """The rounding a LayerNorm output carries in: the error of x through LN as a whole (μ and σ² follow
    x, so a shift of x cancels), plus the rounding of the mean and variance themselves.

    Moving x, μ and σ² each by its full error would count x's error three times over and, for a small
    σ², even push σ² below 0. When the statistics are the student's own written values (not x's), they
    stay fixed while x moves.
    """
    from .marking import propagated  # marking imports this module

    def prop(args, errs, rounding, rss=False):
        x, mean, var = args
        if _own_stats(x, mean, var):
            fx = _layernorm_direct(gamma, beta, eps)
        else:
            def fx(x_):
                return _normalise(x_, mean, var, gamma, beta, eps)
        t_x = propagated(fx, [x], [errs[0]], "row", rss)
        t_stats = propagated(lambda m_, v_: _normalise(x, m_, v_, gamma, beta, eps), [mean, var], rounding[1:],
                             "row", rss)
        return np.sqrt(t_x ** 2 + t_stats ** 2) if rss else t_x + t_stats
    return prop


def _layernorm_direct(gamma, beta, eps):
    def f(x):
        return layernorm_forward(x, gamma, beta, eps)[0]
    return f


def _layernorm_grad(gamma, beta, eps, which: int):
    """dx (0), dγ (1) or dβ (2) of LN at x, given dy."""
    def f(x, dy):
        return layernorm_backward(dy, layernorm_forward(x, gamma, beta, eps)[1])[which]
    ones, zeros = np.ones_like(gamma), np.zeros_like(beta)
    if which == 1:                                                   # dγ = Σ_tokens dy_t ⊙ x̂_t
        f.rowsum = lambda x, dy: dy * layernorm_forward(x, ones, zeros, eps)[0]
    f.multilinear = 1.0 if which == 2 else 0.0                       # dβ = Σ_tokens dy_t
    return f


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

    def add(self, name, inputs, fn, formula, mistakes=(), local=None, multilinear=0.0):
        keys = tuple(i if isinstance(i, tuple) else self.k(i) for i in inputs)
        ms = [Mistake(c, tuple(i if isinstance(i, tuple) else self.k(i) for i in ins), f, det)
              for c, ins, f, det in mistakes]
        self.steps.append(Step(self.k(name), keys, fn, formula, ms, local, rowsum=getattr(fn, "rowsum", None),
                               multilinear=multilinear or getattr(fn, "multilinear", 0.0)))

    # -------------------------------------------------------------- forward
    def layernorm(self, x, xname: str, prefix: str, out: str, which: str, extra=()):
        p, eps, d = self.p, self.ws.eps, self.d
        g, b = p[f"gamma{which}"], p[f"beta{which}"]
        mean, var = f"{prefix}_mean", f"{prefix}_var"
        sample = ([("sample_variance", (x, mean), _sample_var,
                    f"the variance divided by d - 1 = {d - 1} instead of d = {d}")] if d > 1 else [])
        self.add(mean, (x,), _mean, f"mean of each row of {xname}", local="row")
        self.add(var, (x, mean), _var, f"mean of (x - mean)^2 over the d = {d} entries of each row of {xname}",
                 sample, local="row")
        self.add(out, (x, mean, var), _layernorm(g, b, eps),
                 f"gamma{which} * ({xname} - mean) / sqrt(var + eps) + beta{which}", extra, local="row")
        self.steps[-1].propagate = _layernorm_propagate(g, b, eps)

    def attention(self, a_in, a_name: str):
        p, h = self.p, self.h
        for n in "QKV":
            self.add(n, (a_in,), _linear(p[f"W_{n}"], p[f"b_{n}"]), f"{a_name} W_{n} + b_{n}", local="row")
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
            self.add(S[i], ("Q", "K"), s, f"{qi} {ki}^T / {sd_formula}", mistakes, multilinear=self.scale)
        for i in range(h):
            self.add(A[i], (S[i],), lambda s: softmax_forward(s)[0], f"softmax of each row of {S[i]}",
                     [("softmax_axis", (S[i],), lambda s: softmax_forward(s.T)[0].T,
                       "the softmax of each column instead of each row")], local="row")
        self.add("context", (*A, "V"),
                 lambda *a: _merge([a[i] @ _heads(a[-1], h)[i] for i in range(h)]),
                 "attention_weights V" if h == 1 else "[A_1 V_1 | ... | A_h V_h] (heads side by side)",
                 multilinear=1.0)
        self.add("attention_output", ("context",), _linear(p["W_O"], p["b_O"]), "context W_O + b_O", local="row")

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
        self.add(name, (x, fx), _residual, f"{xname} + {fxname}", mistakes, local="element")

    def ffn(self, f_in, f_name: str):
        p, act = self.p, self.ws.activation
        self.add("ffn_hidden", (f_in,), _linear(p["W_1"], p["b_1"]), f"{f_name} W_1 + b_1", local="row")
        others = [("wrong_activation", ("ffn_hidden",), _activation(o), f"{o}(ffn_hidden) instead of {act}(ffn_hidden)")
                  for o in ACTIVATIONS if o != act]
        self.add("ffn_activation", ("ffn_hidden",), _activation(act), f"{act}(ffn_hidden)", others, local="element")
        self.add("ffn_output", ("ffn_activation",), _linear(p["W_2"], p["b_2"]), "ffn_activation W_2 + b_2",
                 local="row")

    def forward(self) -> list[Step]:
        x, xn, p, eps = self.x, self.xname, self.p, self.ws.eps
        if self.ws.norm == "post":
            self.attention(x, xn)
            self.residual("residual", x, xn, "attention_output", "attention_output", "1")
            self.layernorm("residual", "residual", "layer_norm", "layer_norm", "1",
                           [("ln_before_residual", (x, "attention_output"),
                             _pre_ln_residual(p["gamma1"], p["beta1"], eps), f"{xn} + LN1(attention_output)")])
            self.ffn("layer_norm", "layer_norm")
            self.residual("residual2", "layer_norm", "layer_norm", "ffn_output", "ffn_output", "2")
            self.layernorm("residual2", "residual2", "layer_norm2", "H", "2",
                           [("ln_before_residual", ("layer_norm", "ffn_output"),
                             _pre_ln_residual(p["gamma2"], p["beta2"], eps), "layer_norm + LN2(ffn_output)")])
        else:
            self.layernorm(x, xn, "layer_norm", "layer_norm", "1")
            self.attention("layer_norm", "layer_norm")
            self.residual("residual", x, xn, "attention_output", "attention_output", "1")
            self.layernorm("residual", "residual", "layer_norm2", "layer_norm2", "2")
            self.ffn("layer_norm2", "layer_norm2")
            self.residual("residual2", "residual", "residual", "ffn_output", "ffn_output", "2")
            self.add("H", ("residual2",), _copy, "residual2 (Pre-LN: the residual stream itself)", local="element")
        return self.steps

    # -------------------------------------------------------------- backward
    def attention_backward(self, a_in, a_name: str):
        p, h, sc = self.p, self.h, self.scale
        self.add("d_context", ("d_attention_output",), _linear_grad(p["W_O"], p["b_O"], 0), "d_attention_output W_O^T",
                 local="row")
        self.add("d_W_O", ("context", "d_attention_output"), _linear_grad(p["W_O"], p["b_O"], 1),
                 "context^T d_attention_output")
        self.add("d_b_O", ("d_attention_output",), _linear_grad(p["W_O"], p["b_O"], 2),
                 "column sums of d_attention_output")
        A, dA = head_names("attention_weights", h), head_names("d_attention_weights", h)
        dS = head_names("d_scores", h)
        for i in range(h):
            self.add(dA[i], ("d_context", "V"), lambda g, V, i=i: _heads(g, h)[i] @ _heads(V, h)[i].T,
                     "d_context V^T" + (f" (head {i + 1}'s columns)" if h > 1 else ""), multilinear=1.0)
        for i in range(h):
            self.add(dS[i], (A[i], dA[i]), lambda a, g: softmax_backward(g, {"kind": "softmax", "s": a}),
                     f"{A[i]} * ({dA[i]} - rowsum({dA[i]} * {A[i]}))", local="row")

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
            self.add(f"d_{which}", (*dS, other), g, f"{rhs} / sqrt(d_k) (per head)", mistakes, multilinear=sc)
        qk_grad("Q")
        qk_grad("K")
        self.add("d_V", (*A, "d_context"),
                 lambda *a: _merge([a[i].T @ _heads(a[-1], h)[i] for i in range(h)]), "attention_weights^T d_context",
                 multilinear=1.0)
        for n in "QKV":
            W, b = p[f"W_{n}"], p[f"b_{n}"]
            self.add(f"d_W_{n}", (a_in, f"d_{n}"), _linear_grad(W, b, 1), f"{a_name}^T d_{n}")
            self.add(f"d_b_{n}", (f"d_{n}",), _linear_grad(W, b, 2), f"column sums of d_{n}")

    def proj_input_grad(self):
        p = self.p
        fs = [_linear_grad(p[f"W_{n}"], p[f"b_{n}"], 0) for n in "QKV"]
        return lambda dq, dk, dv: fs[0](dq) + fs[1](dk) + fs[2](dv)

    def ffn_backward(self, f_in, f_name):
        p, act = self.p, self.ws.activation
        W2, b2, W1, b1 = p["W_2"], p["b_2"], p["W_1"], p["b_1"]
        self.add("d_ffn_activation", ("d_ffn_output",), _linear_grad(W2, b2, 0), "d_ffn_output W_2^T", local="row")
        self.add("d_W_2", ("ffn_activation", "d_ffn_output"), _linear_grad(W2, b2, 1), "ffn_activation^T d_ffn_output")
        self.add("d_b_2", ("d_ffn_output",), _linear_grad(W2, b2, 2), "column sums of d_ffn_output")
        others = [("wrong_activation", ("ffn_hidden", "d_ffn_activation"), _activation_grad(o),
                   f"d_ffn_activation times the derivative of {o} instead of {act}") for o in ACTIVATIONS if o != act]
        self.add("d_ffn_hidden", ("ffn_hidden", "d_ffn_activation"), _activation_grad(act),
                 f"d_ffn_activation * {act}'(ffn_hidden)", others, local="element")
        self.add("d_W_1", (f_in, "d_ffn_hidden"), _linear_grad(W1, b1, 1), f"{f_name}^T d_ffn_hidden")
        self.add("d_b_1", ("d_ffn_hidden",), _linear_grad(W1, b1, 2), "column sums of d_ffn_hidden")

    def backward(self, last: bool) -> list[Step]:
        p, eps, x, xn = self.p, self.ws.eps, self.x, self.xname
        g1, be1, g2, be2 = p["gamma1"], p["beta1"], p["gamma2"], p["beta2"]
        W1, b1 = p["W_1"], p["b_1"]
        if last:
            self.add("d_H", (DH_KEY,), _copy, "[input] dH, the upstream gradient", local="element")
        in_key, in_name = ((self.l - 1, "d_H") if self.l > 1 else (1, "d_H0")), ("d_H" if self.l > 1 else "d_H0")
        if self.ws.norm == "post":
            for n, w in (("d_residual2", 0), ("d_gamma2", 1), ("d_beta2", 2)):
                self.add(n, ("residual2", "d_H"), _layernorm_grad(g2, be2, eps, w),
                         "LayerNorm backward of d_H at residual2" if w == 0 else
                         ("column sums of d_H * LN-normalised residual2" if w == 1 else "column sums of d_H"),
                         local="row" if w == 0 else None)
            self.add("d_ffn_output", ("d_residual2",), _copy, "d_residual2 (the residual passes it on)",
                     local="element")
            self.ffn_backward("layer_norm", "layer_norm")
            lin1 = _linear_grad(W1, b1, 0)
            self.add("d_layer_norm", ("d_residual2", "d_ffn_hidden"), lambda r, g: r + lin1(g),
                     "d_residual2 + d_ffn_hidden W_1^T",
                     [("no_residual", ("d_ffn_hidden",), lin1,
                       "d_ffn_hidden W_1^T without the skip path's d_residual2")],
                     local="row")
            for n, w in (("d_residual", 0), ("d_gamma1", 1), ("d_beta1", 2)):
                self.add(n, ("residual", "d_layer_norm"), _layernorm_grad(g1, be1, eps, w),
                         "LayerNorm backward of d_layer_norm at residual" if w == 0 else
                         ("column sums of d_layer_norm * LN-normalised residual" if w == 1 else
                          "column sums of d_layer_norm"), local="row" if w == 0 else None)
            self.add("d_attention_output", ("d_residual",), _copy, "d_residual (the residual passes it on)",
                     local="element")
            self.attention_backward(x, xn)
            proj = self.proj_input_grad()
            self.add_key(in_key, in_name, ("d_residual", "d_Q", "d_K", "d_V"), lambda r, q, k, v: r + proj(q, k, v),
                         "d_residual + d_Q W_Q^T + d_K W_K^T + d_V W_V^T",
                         [("no_residual", ("d_Q", "d_K", "d_V"), proj,
                           "d_Q W_Q^T + d_K W_K^T + d_V W_V^T without the skip path's d_residual")],
                         local="row")
        else:
            self.add("d_residual2", ("d_H",), _copy, "d_H (H = residual2)", local="element")
            self.add("d_ffn_output", ("d_residual2",), _copy, "d_residual2 (the residual passes it on)",
                     local="element")
            self.ffn_backward("layer_norm2", "layer_norm2")
            self.add("d_layer_norm2", ("d_ffn_hidden",), _linear_grad(W1, b1, 0), "d_ffn_hidden W_1^T", local="row")
            ln2 = _layernorm_grad(g2, be2, eps, 0)
            self.add("d_residual", ("d_residual2", "residual", "d_layer_norm2"), lambda r, x2, g: r + ln2(x2, g),
                     "d_residual2 + LayerNorm backward of d_layer_norm2 at residual",
                     [("no_residual", ("residual", "d_layer_norm2"), ln2,
                       "the LayerNorm backward alone, without the skip path's d_residual2")],
                     local="row")
            for n, w in (("d_gamma2", 1), ("d_beta2", 2)):
                self.add(n, ("residual", "d_layer_norm2"), _layernorm_grad(g2, be2, eps, w),
                         "column sums of d_layer_norm2 * LN-normalised residual" if w == 1 else
                         "column sums of d_layer_norm2")
            self.add("d_attention_output", ("d_residual",), _copy, "d_residual (the residual passes it on)",
                     local="element")
            self.attention_backward("layer_norm", "layer_norm")
            self.add("d_layer_norm", ("d_Q", "d_K", "d_V"), self.proj_input_grad(),
                     "d_Q W_Q^T + d_K W_K^T + d_V W_V^T", local="row")
            for n, w in (("d_gamma1", 1), ("d_beta1", 2)):
                self.add(n, (x, "d_layer_norm"), _layernorm_grad(g1, be1, eps, w),
                         f"column sums of d_layer_norm * LN-normalised {xn}" if w == 1 else
                         "column sums of d_layer_norm")
            ln1 = _layernorm_grad(g1, be1, eps, 0)
            self.add_key(in_key, in_name, ("d_residual", x, "d_layer_norm"), lambda r, x0, g: r + ln1(x0, g),
                         f"d_residual + LayerNorm backward of d_layer_norm at {xn}",
                         [("no_residual", (x, "d_layer_norm"), ln1,
                           "the LayerNorm backward alone, without the skip path's d_residual")],
                         local="row")
        return self.steps

    def add_key(self, key: Key, shown: str, inputs, fn, formula, mistakes=(), local=None):
        """A step whose key is not in this layer: the gradient of the layer's input."""
        self.add(shown, inputs, fn, formula, mistakes, local)
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
