r"""The course's assignments as data: cases, how a student's function is called, the library's answer,
and the *known mistakes* that explain a wrong answer (each recomputed with the library's ops).

Used by :mod:`transformer_np.course.exercises`; the names of :data:`EXERCISES` are what the notebooks'
test cells pass to ``check_forward`` / ``check_backward``.

Conventions shared by every exercise:
    ``case.arrays``   the differentiable inputs, by name (the finite-difference check perturbs them)
    ``case.static``   the other arguments (mask, n_heads, eps, norm)
    ``call(fn, arrays, static)``         how the student's forward is called (the documented signature)
    ``reference(arrays, static)``        the library's ``(out, cache)``
    ``reference_backward(dout, cache)``  the library's gradients, by input name
    a forward mistake computes ``out`` from (arrays, static); a backward mistake computes a dict of
    gradients from (arrays, static, dout). A mistake that does not apply to a case returns None.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model.config import EncoderConfig
from ..model.encoder import encoder_layer_backward, encoder_layer_forward
from ..model.gradcheck import random_params
from ..model.params import sub_params
from ..ops.activations import activation_forward
from ..ops.attention import (
    MHA_PARAM_NAMES,
    attention_backward,
    attention_forward,
    merge_heads,
    mha_backward,
    mha_forward,
    split_heads,
)
from ..ops.erf import erf
from ..ops.feedforward import FFN_PARAM_NAMES, ffn_backward, ffn_forward
from ..ops.layernorm import layernorm_backward, layernorm_forward
from ..ops.linear import linear_backward
from ..ops.masks import mask_value
from ..ops.softmax import softmax_backward, softmax_forward

__all__ = ["EXERCISES", "Case", "Exercise", "Mistake", "copy_inputs"]


@dataclass(frozen=True)
class Case:
    """One input on which a student's function is checked."""

    label: str
    arrays: dict[str, np.ndarray]
    static: dict[str, Any] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)   # sizes that may explain a scale error
    gradcheck: bool = False                              # the case of the finite-difference check


@dataclass(frozen=True)
class Mistake:
    """A common error, as a function that reproduces its result, and what to tell the student."""

    code: str
    message: str                       # the diagnosis in words: which term, axis or shape (what a student reads)
    compute: Callable[..., Any]
    fix: str = ""                      # the corrected formula or code: the instructor's report only


@dataclass(frozen=True)
class Exercise:
    """One assignment: a forward and a backward the student writes."""

    name: str
    forward: str
    backward: str
    signature: str
    backward_signature: str
    cases: Callable[[], list[Case]]
    call: Callable[[Callable, dict, dict], Any]
    reference: Callable[[dict, dict], tuple]
    reference_backward: Callable[[np.ndarray, Any], dict]
    returns: str                          # "array" (dx) | "tuple" (dx, dgamma, …) | "dx_grads" (dx, grads)
    grad_names: tuple[str, ...]           # "array"/"tuple": the inputs in return order; "dx_grads": backward order
    forward_hint: str
    backward_hint: str
    nonfinite_hint: str
    forward_mistakes: tuple[Mistake, ...] = ()
    backward_mistakes: tuple[Mistake, ...] = ()
    backward_hints: dict[str, str] = field(default_factory=dict)
    answers: tuple[str, ...] = ()         # the reference's expressions: never in a student's feedback
    allowed: tuple[str, ...] = ()         # library functions the notebook hands the student (dotted names)
    extra_shapes: Callable[[Case], dict] = lambda case: {}

    def forward_mistakes_for(self, case: Case) -> list[tuple[Mistake, np.ndarray | None]]:
        return [(m, _attempt(m.compute, copy_inputs(case.arrays), dict(case.static)))
                for m in self.forward_mistakes]

    def backward_mistakes_for(self, case: Case, dout: np.ndarray) -> list[tuple[Mistake, dict | None]]:
        return [(m, _attempt(m.compute, copy_inputs(case.arrays), dict(case.static), dout.copy()))
                for m in self.backward_mistakes]

    def named_shapes(self, case: Case) -> dict[str, tuple]:
        return self.extra_shapes(case)

    def grad_order(self, case: Case) -> tuple[str, ...]:
        """The gradients in the order the backward computes them (so the first wrong one is the cause)."""
        return self.grad_names

    def grad_label(self, name: str) -> str:
        if self.returns == "dx_grads" and name != "x":
            return f"grads[{name!r}]"
        return "d" + name


def copy_inputs(value: Any) -> Any:
    """A deep copy of arrays (and dicts of arrays); other values as they are."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: copy_inputs(v) for k, v in value.items()}
    return value


def _attempt(fn: Callable, *args: Any) -> Any:
    """A mistake's output, or None where it cannot be formed (a shape that does not fit this case)."""
    try:
        with np.errstate(all="ignore"):
            return fn(*args)
    except (ValueError, IndexError):
        return None


def _softmax_along(x: np.ndarray, axis: int | None) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _global_sum(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))     # each row's max subtracted …
    return e / np.sum(e)                                  # … but divided by the sum of every entry


def _dx_grads(result: tuple) -> dict:
    """A library ``(dx, grads)`` as one dict {"x": dx, param: grad, …}."""
    dx, grads = result
    return {"x": dx, **grads}


def _lead(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(x.ndim - 1))


def _rows(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1, x.shape[-1])                     # (M, d)


def _phi(z: np.ndarray) -> np.ndarray:                    # φ(z), the standard normal density
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def _Phi(z: np.ndarray) -> np.ndarray:                    # Φ(z), its CDF
    return 0.5 * (1.0 + erf(z / math.sqrt(2.0)))


# ============================================================================= softmax
def _softmax_cases() -> list[Case]:
    rng = np.random.default_rng(0)
    big = rng.standard_normal((2, 4)) + np.array([[1000.0], [-1000.0]])
    return [Case("x of shape (4, 5): four rows of scores", {"x": 2 * rng.standard_normal((4, 5))}, dims={"n": 5}),
            Case("a batch, x of shape (2, 3, 5)", {"x": 2 * rng.standard_normal((2, 3, 5))}, dims={"n": 5},
                 gradcheck=True),
            Case("large scores: x of shape (2, 4), one row near +1000 and one near −1000", {"x": big},
                 dims={"n": 4})]


def _softmax_bwd_variant(kind: str) -> Callable:
    def compute(a: dict, s: dict, ds: np.ndarray) -> dict:
        sm = _softmax_along(a["x"], -1)
        if kind == "diagonal":
            return {"x": ds * sm * (1 - sm)}
        if kind == "no_s":
            return {"x": ds - np.sum(ds * sm, axis=-1, keepdims=True)}
        if kind == "axis0":
            return {"x": sm * (ds - np.sum(ds * sm, axis=0, keepdims=True))}
        return {"x": ds.copy()}
    return compute


_AXIS_MSG = "normalises over axis {k} instead of the last axis: each row x[..., i, :] must sum to 1"
_AXIS_FIX = "take the max and the sum with axis=-1, keepdims=True"

SOFTMAX = Exercise(
    name="softmax", forward="softmax_forward", backward="softmax_backward",
    signature="softmax_forward(x) -> (out, cache)", backward_signature="softmax_backward(dout, cache) -> dx",
    cases=_softmax_cases,
    call=lambda fn, a, s: fn(a["x"]),
    reference=lambda a, s: softmax_forward(a["x"]),
    reference_backward=lambda d, c: {"x": softmax_backward(d, c)},
    returns="array", grad_names=("x",),
    forward_hint="s = exp(x − m) / Σ_j exp(x_j − m), m = x.max(axis=-1, keepdims=True): over the last axis.",
    backward_hint=("dx = s ⊙ (dout − Σ_j dout_j s_j): the Jacobian of a softmax row is diag(s) − s sᵀ; the sum runs "
                   "over the last axis (keepdims=True) and s comes from the cache."),
    nonfinite_hint=("exp overflowed (or 0/0 happened) on the rows with large scores: the softmax is unchanged by a "
                    "shift of a whole row, and a well-chosen shift keeps every exponent at most 0."),
    answers=("s ⊙ (dout − Σ", "dout − Σ_j dout_j s_j", "diag(s) − s sᵀ", "x.max(axis=-1, keepdims=True)"),
    forward_mistakes=(
        Mistake("softmax_axis", _AXIS_MSG.format(k=0), lambda a, s: _softmax_along(a["x"], 0), _AXIS_FIX),
        Mistake("softmax_axis", _AXIS_MSG.format(k=1), lambda a, s: _softmax_along(a["x"], 1), _AXIS_FIX),
        Mistake("not_normalised", "is not normalised: the rows do not sum to 1",
                lambda a, s: np.exp(a["x"] - a["x"].max(axis=-1, keepdims=True)),
                "divide exp(x − max) by each row's sum"),
        Mistake("global_sum", "divides by the sum over ALL entries instead of each row's own sum",
                lambda a, s: _global_sum(a["x"]), "np.sum(e, axis=-1, keepdims=True)"),
        Mistake("global_sum", "divides by the sum over ALL entries instead of each row's own sum",
                lambda a, s: _softmax_along(a["x"], None), "np.sum(e, axis=-1, keepdims=True)"),
    ),
    backward_mistakes=(
        Mistake("jacobian_diagonal", "uses only the diagonal of the softmax Jacobian: every output of a row depends "
                "on every input of that row, and the off-diagonal terms are missing",
                _softmax_bwd_variant("diagonal"), "dx = s ⊙ (dout − Σ_j dout_j s_j)"),
        Mistake("missing_factor", "has the right bracket but is missing a final elementwise factor that the "
                "Jacobian's every entry carries", _softmax_bwd_variant("no_s"), "dx = s ⊙ (dout − Σ_j dout_j s_j)"),
        Mistake("softmax_axis", "sums over axis 0; the sum in the softmax backward runs within each row (the last "
                "axis)", _softmax_bwd_variant("axis0"), "np.sum(dout * s, axis=-1, keepdims=True)"),
        Mistake("identity", "returns dout unchanged — the gradient must go through the softmax's Jacobian",
                _softmax_bwd_variant("identity"), "dx = s ⊙ (dout − Σ_j dout_j s_j)"),
    ),
)


# ============================================================================= LayerNorm
def _layernorm_cases() -> list[Case]:
    rng = np.random.default_rng(1)

    def arrays(x):
        d = x.shape[-1]
        return {"x": x, "gamma": 1 + 0.3 * rng.standard_normal(d), "beta": 0.3 * rng.standard_normal(d)}

    return [Case("x of shape (4, 6), ε = 1e-5", arrays(1 + 2 * rng.standard_normal((4, 6))), {"eps": 1e-5},
                 dims={"d": 6}),
            Case("a batch, x of shape (2, 3, 6), ε = 1e-5", arrays(rng.standard_normal((2, 3, 6))), {"eps": 1e-5},
                 dims={"d": 6}, gradcheck=True),
            Case("rows with a small spread (variance ≈ 0.001) and ε = 0.01, where ε matters",
                 arrays(5 + 0.03 * rng.standard_normal((3, 6))), {"eps": 1e-2}, dims={"d": 6})]


def _ln_variant(axis: Any = -1, ddof: int = 0, eps_mode: str = "inside", center: bool = True,
                affine: str = "ok") -> Callable:
    def compute(a: dict, s: dict) -> np.ndarray:
        x, g, b, eps = a["x"], a["gamma"], a["beta"], s["eps"]
        mu = x.mean(axis=axis, keepdims=True)
        var = x.var(axis=axis, ddof=ddof, keepdims=True)
        den = {"inside": np.sqrt(var + eps), "outside": np.sqrt(var) + eps, "none": np.sqrt(var),
               "no_sqrt": var + eps}[eps_mode]
        xhat = ((x - mu) if center else x) / den
        return {"ok": xhat * g + b, "swapped": xhat * b + g, "none": xhat}[affine]
    return compute


def _ln_parts(a: dict, s: dict, dy: np.ndarray) -> tuple:
    x, gamma, eps = a["x"], a["gamma"], s["eps"]
    mu = x.mean(axis=-1, keepdims=True)                   # (..., 1)
    r = 1 / np.sqrt(x.var(axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = (x - mu) * r                                   # (..., d)
    return x, xhat, r, dy * gamma


def _ln_bwd_variant(kind: str) -> Callable:
    def compute(a: dict, s: dict, dy: np.ndarray) -> dict:
        x, xhat, r, g = _ln_parts(a, s, dy)
        lead = _lead(x)
        def mean(t):
            return t.mean(axis=-1, keepdims=True)

        if kind == "naive":
            return {"x": r * g}
        if kind == "no_var_term":
            return {"x": r * (g - mean(g))}
        if kind == "no_mean_term":
            return {"x": r * (g - xhat * mean(g * xhat))}
        if kind == "no_gamma":
            return {"x": r * (dy - mean(dy) - xhat * mean(dy * xhat))}
        if kind == "no_rstd":
            return {"x": g - mean(g) - xhat * mean(g * xhat)}
        return {"gamma": (dy * x).sum(axis=lead)}          # "used_x"
    return compute


LAYERNORM = Exercise(
    name="layernorm", forward="layernorm_forward", backward="layernorm_backward",
    signature="layernorm_forward(x, gamma, beta, eps) -> (out, cache)",
    backward_signature="layernorm_backward(dout, cache) -> (dx, dgamma, dbeta)",
    cases=_layernorm_cases,
    call=lambda fn, a, s: fn(a["x"], a["gamma"], a["beta"], s["eps"]),
    reference=lambda a, s: layernorm_forward(a["x"], a["gamma"], a["beta"], s["eps"]),
    reference_backward=lambda d, c: dict(zip(("x", "gamma", "beta"), layernorm_backward(d, c))),
    returns="tuple", grad_names=("x", "gamma", "beta"),
    forward_hint=("μ and σ² are the mean and the (biased, divide-by-d) variance of each row over the last axis; "
                  "y = γ ⊙ (x − μ)/√(σ² + ε) + β."),
    backward_hint="see the equations above the exercise.",
    backward_hints={
        "x": "dx = (g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)) / √(σ² + ε) with g = γ ⊙ dout, the means over the last axis.",
        "gamma": "dgamma = Σ dout ⊙ x̂, summed over every axis except the last.",
        "beta": "dbeta = Σ dout, summed over every axis except the last.",
    },
    nonfinite_hint="a 0 in the denominator? Look at where ε enters the normalisation.",
    answers=("(g − mean(g) − x̂ ⊙ mean(g ⊙ x̂))", "x̂ ⊙ mean(g ⊙ x̂)", "δ_ij − 1/d − x̂_i x̂_j/d",
             "dgamma = Σ dout ⊙ x̂", "dbeta = Σ dout"),
    forward_mistakes=(
        Mistake("sample_variance", "uses the sample variance (divides by d − 1); LayerNorm's variance is the biased "
                "one", _ln_variant(ddof=1), "divide by d: np.var(x, axis=-1, keepdims=True)"),
        Mistake("ln_axis", "normalises over axis 0 (each feature across the rows — that is batch normalisation) "
                "instead of each row over its own d features", _ln_variant(axis=0), "axis=-1, keepdims=True"),
        Mistake("ln_axis", "normalises with the mean and variance of the whole array instead of each row's",
                _ln_variant(axis=None), "axis=-1, keepdims=True"),
        Mistake("eps_outside_sqrt", "adds ε outside the square root", _ln_variant(eps_mode="outside"),
                "the denominator is √(σ² + ε)"),
        Mistake("missing_eps", "leaves out ε", _ln_variant(eps_mode="none"), "the denominator is √(σ² + ε)"),
        Mistake("missing_sqrt", "divides by the variance (plus ε) instead of the standard deviation",
                _ln_variant(eps_mode="no_sqrt"), "the denominator is √(σ² + ε)"),
        Mistake("not_centred", "does not subtract the mean", _ln_variant(center=False), "x̂ = (x − μ)/√(σ² + ε)"),
        Mistake("swapped_parameters", "swaps γ and β (one scales, the other shifts)", _ln_variant(affine="swapped"),
                "y = γ ⊙ x̂ + β"),
        Mistake("missing_affine", "returns the normalised x̂ without the learned scale and shift",
                _ln_variant(affine="none"), "y = γ ⊙ x̂ + β"),
    ),
    backward_mistakes=(
        Mistake("ln_backward_terms", "treats μ and σ² as constants; they depend on x, so moving one x_i also moves "
                "the row's mean and variance, and both add a term", _ln_bwd_variant("naive"),
                "dx = (g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)) / √(σ² + ε), g = γ ⊙ dout"),
        Mistake("ln_backward_terms", "is missing the term that comes from the variance's dependence on x",
                _ln_bwd_variant("no_var_term"), "add −x̂ ⊙ mean(g ⊙ x̂) inside the bracket (g = γ ⊙ dout)"),
        Mistake("ln_backward_terms", "is missing the term that comes from the mean's dependence on x",
                _ln_bwd_variant("no_mean_term"), "add −mean(g) inside the bracket (g = γ ⊙ dout)"),
        Mistake("missing_factor", "leaves out γ on the way back to x̂", _ln_bwd_variant("no_gamma"),
                "the gradient reaching x̂ is g = γ ⊙ dout"),
        Mistake("missing_factor", "is missing the per-row factor of the normalisation (one number per row, in "
                "the cache)", _ln_bwd_variant("no_rstd"), "multiply by 1/√(σ² + ε)"),
        Mistake("ln_backward_used_x", "uses the raw input x where the normalised x̂ belongs",
                _ln_bwd_variant("used_x"), "dgamma = Σ dout ⊙ x̂"),
    ),
)


# ============================================================================= scaled dot-product attention
def _attention_cases() -> list[Case]:
    rng = np.random.default_rng(2)
    n = rng.standard_normal
    Q, K, V = n((2, 3, 5, 4)), n((2, 3, 6, 4)), n((2, 3, 6, 7))
    mask = np.zeros((2, 1, 1, 6))
    mask[1, ..., 4:] = mask_value(np.float64)                      # batch item 2: the last two keys hidden
    return [Case("self-attention, one head: Q, K, V of shape (4, 3), no mask",
                 {"Q": n((4, 3)), "K": n((4, 3)), "V": n((4, 3))}, {"mask": None}, dims={"d_k": 3}),
            Case("2 × 3 heads, 5 queries, 6 keys: Q (2, 3, 5, 4), K (2, 3, 6, 4), V (2, 3, 6, 7), no mask",
                 {"Q": Q, "K": K, "V": V}, {"mask": None}, dims={"d_k": 4}, gradcheck=True),
            Case("as case 2, with an additive padding mask of shape (2, 1, 1, 6) hiding the last 2 keys of batch "
                 "item 2 (0 to attend, −1.8e308 to hide)",
                 {"Q": Q.copy(), "K": K.copy(), "V": V.copy()}, {"mask": mask}, dims={"d_k": 4})]


def _attention_variant(scale: str = "sqrt", axis: int = -1, transposed: bool = False, mask_mode: str = "add",
                       softmax: bool = True) -> Callable:
    def compute(a: dict, s: dict) -> np.ndarray | None:
        Q, K, V, mask = a["Q"], a["K"], a["V"], s["mask"]
        d_k = Q.shape[-1]
        if transposed:
            if Q.shape[-2] != K.shape[-2]:
                return None
            S = K @ Q.swapaxes(-1, -2)                             # (..., n_k, n_q)
        else:
            S = Q @ K.swapaxes(-1, -2)                             # (..., n_q, n_k)
        S = S * {"sqrt": 1 / math.sqrt(d_k), "none": 1.0, "d_k": 1 / d_k, "times": math.sqrt(d_k)}[scale]
        if mask is not None and mask_mode == "add":
            S = S + mask
        elif mask is not None and mask_mode == "inverted":
            S = S + np.where(mask == 0, mask_value(np.float64), 0.0)
        A = _softmax_along(S, axis) if softmax else S
        return A @ V                                               # (..., n_q, d_v)
    return compute


def _attention_parts(a: dict, s: dict, dO: np.ndarray) -> tuple:
    Q, K, V, mask = a["Q"], a["K"], a["V"], s["mask"]
    scale = 1 / math.sqrt(Q.shape[-1])
    S = Q @ K.swapaxes(-1, -2) * scale + (0 if mask is None else mask)
    A = _softmax_along(S, -1)                                      # (..., n_q, n_k)
    dA = dO @ V.swapaxes(-1, -2)                                   # (..., n_q, n_k)
    dS = A * (dA - np.sum(dA * A, axis=-1, keepdims=True))
    return Q, K, A, dA, dS, scale


def _attention_bwd_variant(kind: str) -> Callable:
    def compute(a: dict, s: dict, dO: np.ndarray) -> dict:
        Q, K, A, dA, dS, scale = _attention_parts(a, s, dO)
        if kind == "no_softmax_backward":
            return {"Q": dA @ K * scale, "K": dA.swapaxes(-1, -2) @ Q * scale}
        if kind == "dV_not_transposed":
            return {"V": A @ dO}
        return {"K": dS @ Q * scale}                               # "dK_not_transposed"
    return compute


ATTENTION = Exercise(
    name="attention", forward="attention_forward", backward="attention_backward",
    signature="attention_forward(Q, K, V, mask) -> (out, cache)",
    backward_signature="attention_backward(dout, cache) -> (dQ, dK, dV)",
    cases=_attention_cases,
    call=lambda fn, a, s: fn(a["Q"], a["K"], a["V"], s["mask"]),
    reference=lambda a, s: attention_forward(a["Q"], a["K"], a["V"], s["mask"]),
    reference_backward=lambda d, c: dict(zip(("Q", "K", "V"), attention_backward(d, c))),
    returns="tuple", grad_names=("Q", "K", "V"),
    forward_hint=("out = softmax(Q Kᵀ/√d_k + mask) V with the softmax over the last axis (the keys); for batched "
                  "inputs Kᵀ is K.swapaxes(-1, -2)."),
    backward_hint="see the equations above the exercise.",
    backward_hints={
        "Q": "dQ = dS K / √d_k, where dS = A ⊙ (dA − rowsum(dA ⊙ A)) and dA = dout Vᵀ.",
        "K": "dK = dSᵀ Q / √d_k, where dS = A ⊙ (dA − rowsum(dA ⊙ A)) and dA = dout Vᵀ.",
        "V": "dV = Aᵀ dout.",
    },
    nonfinite_hint=("look at where the mask enters (it is additive: 0 to attend, very negative to hide, and it "
                    "belongs to the scores, not the weights) and at the softmax's stability for very negative "
                    "scores."),
    answers=("dK = dSᵀ Q", "dSᵀ Q / √d_k", "dQ = dS K", "dS K / √d_k", "dV = Aᵀ dout", "A ⊙ (dA − rowsum(dA ⊙ A))",
             "dA = dout Vᵀ"),
    extra_shapes=lambda c: {"the attention weights A (or the scores)":
                            np.broadcast_shapes(c.arrays["Q"].shape[:-2], c.arrays["K"].shape[:-2])
                            + (c.arrays["Q"].shape[-2], c.arrays["K"].shape[-2])},
    forward_mistakes=(
        Mistake("missing_scale", "does not scale the scores by the head width (without the scale the softmax "
                "saturates as d_k grows)", _attention_variant(scale="none"), "S = Q Kᵀ/√d_k"),
        Mistake("wrong_scale", "scales the scores by the head width itself, not by its square root",
                _attention_variant(scale="d_k"), "the scale is 1/√d_k"),
        Mistake("wrong_scale", "multiplies the scores by the scale's inverse (the scores grow instead of shrink)",
                _attention_variant(scale="times"), "divide by √d_k"),
        Mistake("softmax_axis", "normalises the weights over the queries (axis −2) instead of over the keys (the "
                "last axis): each row of the weights — one query's weights over all keys — must sum to 1",
                _attention_variant(axis=-2), "softmax over axis=-1"),
        Mistake("transposed_scores", "computes the scores with keys and queries swapped: row i of the scores is "
                "query i against every key", _attention_variant(transposed=True), "S = Q Kᵀ"),
        Mistake("mask_ignored", "ignores the mask: the hidden keys still get weight",
                _attention_variant(mask_mode="ignore"), "S = Q Kᵀ/√d_k + mask, before the softmax"),
        Mistake("mask_inverted", "inverts the mask: in an additive mask 0 means 'attend' and a very negative number "
                "means 'hide'", _attention_variant(mask_mode="inverted"), "add the mask to the scores as it is"),
        Mistake("missing_softmax", "leaves out the softmax: the weights of a row must be positive and sum to 1",
                _attention_variant(softmax=False), "A = softmax(S) row by row, then out = A V"),
    ),
    backward_mistakes=(
        Mistake("skipped_softmax_backward", "skips the softmax's backward: the gradient reaching the weights has to "
                "go through the softmax's Jacobian before it reaches the scores",
                _attention_bwd_variant("no_softmax_backward"),
                "dA = dout Vᵀ, dS = A ⊙ (dA − rowsum(dA ⊙ A)); then dQ = dS K/√d_k and dK = dSᵀ Q/√d_k"),
        Mistake("transposed", "uses the attention weights where their transpose belongs (a value row receives from "
                "every query that attended to it)", _attention_bwd_variant("dV_not_transposed"), "dV = Aᵀ dout"),
        Mistake("transposed", "uses the scores' gradient where its transpose belongs (a key row receives from every "
                "query)", _attention_bwd_variant("dK_not_transposed"), "dK = dSᵀ Q / √d_k"),
    ),
)


# ============================================================================= multi-head attention
def _mha_arrays(rng: np.random.Generator, B: int, n: int, d: int) -> dict:
    a = {"x": rng.standard_normal((B, n, d))}
    for name in MHA_PARAM_NAMES:
        a[name] = rng.standard_normal((d, d)) / math.sqrt(d) if name.startswith("W") else 0.3 * rng.standard_normal(d)
    return a


def _mha_cases() -> list[Case]:
    rng = np.random.default_rng(3)
    mask = np.zeros((2, 1, 1, 5))
    mask[1, ..., 4] = mask_value(np.float64)
    return [Case("x of shape (1, 4, 6), 2 heads (d_k = 3), no mask", _mha_arrays(rng, 1, 4, 6),
                 {"n_heads": 2, "mask": None}, dims={"d_k": 3, "d_model": 6}),
            Case("x of shape (2, 5, 6), 3 heads (d_k = 2), a padding mask of shape (2, 1, 1, 5) hiding the last "
                 "key of batch item 2", _mha_arrays(rng, 2, 5, 6), {"n_heads": 3, "mask": mask},
                 dims={"d_k": 2, "d_model": 6}, gradcheck=True)]


def _mha_params(a: dict) -> dict:
    return {k: a[k] for k in MHA_PARAM_NAMES}


def _mha_variant(split: str = "ok", merge: str = "ok", scale: str = "d_k", heads: int | None = None,
                 out_proj: bool = True, no_bias: tuple[str, ...] = ()) -> Callable:
    def compute(a: dict, s: dict) -> np.ndarray:
        x = a["x"]
        B, n, d = x.shape
        h = heads or s["n_heads"]
        dk = d // h
        b = {k: (0.0 if k in no_bias else a[k]) for k in ("b_Q", "b_K", "b_V", "b_O")}

        def heads_of(t):                                            # (B, n, d) → (B, h, n, d_k)
            return t.reshape(B, h, n, dk) if split == "plain" else split_heads(t, h)

        Q, K, V = (heads_of(x @ a["W_" + c] + b["b_" + c]) for c in "QKV")
        if scale == "d_model":
            Q = Q * math.sqrt(dk) / math.sqrt(d)                    # the scores become Q Kᵀ/√d_model
        O, _ = attention_forward(Q, K, V, s["mask"])                # (B, h, n, d_k)
        ctx = O.reshape(B, n, d) if merge == "plain" else merge_heads(O)
        return ctx @ a["W_O"] + b["b_O"] if out_proj else ctx
    return compute


def _mha_bwd_variant(drop: tuple[str, ...] = (), split: str = "ok", merge: str = "ok") -> Callable:
    def compute(a: dict, s: dict, dout: np.ndarray) -> dict:
        x, h = a["x"], s["n_heads"]
        B, n, d = x.shape
        _, c = mha_forward(x, _mha_params(a), h, s["mask"])
        dctx, dW_O, db_O = linear_backward(dout, c["o"])            # (B, n, d)
        dO = dctx.reshape(B, h, n, d // h) if split == "plain" else split_heads(dctx, h)
        dQKV = attention_backward(dO, c["attn"])                    # 3 × (B, h, n, d_k)
        g = {"W_O": dW_O, "b_O": db_O, "x": np.zeros_like(x)}
        for name, dh in zip("QKV", dQKV):
            dP = dh.reshape(B, n, d) if merge == "plain" else merge_heads(dh)   # (B, n, d)
            g["W_" + name] = _rows(x).T @ _rows(dP)
            g["b_" + name] = _rows(dP).sum(axis=0)
            if name not in drop:
                g["x"] = g["x"] + dP @ a["W_" + name].T
        return g
    return compute


_MHA_ORDER = ("W_O", "b_O", "W_V", "b_V", "W_K", "b_K", "W_Q", "b_Q", "x")
_PATH_MSG = "x feeds Q, K and V, so its gradient has a contribution from each projection; yours {what}"
_PATH_FIX = "dx = dQ W_Qᵀ + dK W_Kᵀ + dV W_Vᵀ (each head gradient merged back to (B, n, d_model))"

MHA = Exercise(
    name="mha", forward="mha_forward", backward="mha_backward",
    signature="mha_forward(x, p, n_heads, mask) -> (out, cache)",
    backward_signature="mha_backward(dout, cache) -> (dx, grads)",
    cases=_mha_cases,
    call=lambda fn, a, s: fn(a["x"], _mha_params(a), s["n_heads"], s["mask"]),
    reference=lambda a, s: mha_forward(a["x"], _mha_params(a), s["n_heads"], s["mask"]),
    reference_backward=lambda d, c: _dx_grads(mha_backward(d, c)),
    returns="dx_grads", grad_names=_MHA_ORDER,
    forward_hint=("Q = x W_Q + b_Q (same for K, V); split each (B, n, d) → (B, n, h, d_k) → (B, h, n, d_k); "
                  "O = attention(Q, K, V, mask); merge (B, h, n, d_k) → (B, n, h, d_k) → (B, n, d); "
                  "out = O W_O + b_O."),
    backward_hint="see the equations above the exercise.",
    backward_hints={
        "x": "dx = dQ W_Qᵀ + dK W_Kᵀ + dV W_Vᵀ, the head gradients merged back to (B, n, d_model).",
        **{f"W_{c}": f"dW_{c} = Σ xᵀ d{c} over batch and positions: x.reshape(-1, d).T @ d{c}.reshape(-1, d)."
           for c in "QKV"},
        **{f"b_{c}": f"db_{c} = d{c} summed over batch and positions." for c in "QKVO"},
        "W_O": "dW_O = Σ ctxᵀ dout over batch and positions, ctx = the merged heads (the input of W_O).",
    },
    nonfinite_hint="look at where the mask enters the attention (the given attention function adds it correctly).",
    answers=("dQ W_Qᵀ + dK W_Kᵀ + dV W_Vᵀ", "transpose(0, 2, 1, 3)"),
    allowed=("transformer_np.ops.attention.attention_forward", "transformer_np.ops.attention.attention_backward"),
    forward_mistakes=(
        Mistake("head_split", "splits the heads with a plain reshape, which mixes positions and features",
                _mha_variant(split="plain"), "reshape to (B, n, h, d_k), then transpose(0, 2, 1, 3)"),
        Mistake("head_merge", "merges the heads with a plain reshape, which mixes positions and features",
                _mha_variant(merge="plain"), "transpose(0, 2, 1, 3) back to (B, n, h, d_k) first, then reshape"),
        Mistake("head_split", "splits and merges the heads with plain reshapes, which mix positions and features",
                _mha_variant(split="plain", merge="plain"),
                "(B, n, d) → (B, n, h, d_k) → transpose → (B, h, n, d_k), and back the same way"),
        Mistake("wrong_scale", "scales the scores by the model width instead of the head width (each head has "
                "width d_model / n_heads)", _mha_variant(scale="d_model"), "1/√d_k"),
        Mistake("single_head", "ignores n_heads: it computes one head of width d_model", _mha_variant(heads=1),
                "split Q, K, V into n_heads heads of width d_k = d_model / n_heads"),
        Mistake("missing_output_projection", "leaves out the output projection", _mha_variant(out_proj=False),
                "out = Concat(heads) W_O + b_O"),
        Mistake("missing_bias", "leaves out the biases b_Q, b_K, b_V, b_O", _mha_variant(no_bias=("b_Q", "b_K", "b_V",
                                                                                                   "b_O"))),
        Mistake("missing_bias", "leaves out the output bias b_O", _mha_variant(no_bias=("b_O",))),
        Mistake("missing_bias", "leaves out the biases b_Q, b_K, b_V", _mha_variant(no_bias=("b_Q", "b_K", "b_V"))),
    ),
    backward_mistakes=(
        Mistake("missing_path", _PATH_MSG.format(what="keeps only the query path"), _mha_bwd_variant(drop=("K", "V")),
                _PATH_FIX),
        Mistake("missing_path", _PATH_MSG.format(what="leaves out the query path"), _mha_bwd_variant(drop=("Q",)),
                _PATH_FIX),
        Mistake("missing_path", _PATH_MSG.format(what="leaves out the key path"), _mha_bwd_variant(drop=("K",)),
                _PATH_FIX),
        Mistake("missing_path", _PATH_MSG.format(what="leaves out the value path"), _mha_bwd_variant(drop=("V",)),
                _PATH_FIX),
        Mistake("head_split", "splits the gradient of the merged heads with a plain reshape, which mixes positions "
                "and features (the backward must undo the forward's merge exactly)", _mha_bwd_variant(split="plain"),
                "(B, n, d) → (B, n, h, d_k) → transpose(0, 2, 1, 3)"),
        Mistake("head_merge", "merges the heads' gradients with a plain reshape, which mixes positions and features",
                _mha_bwd_variant(merge="plain"), "transpose(0, 2, 1, 3) back to (B, n, h, d_k) first"),
    ),
)


# ============================================================================= GELU
def _gelu_cases() -> list[Case]:
    rng = np.random.default_rng(4)
    return [Case("z of shape (3, 5) with values in [−3, 3]", {"z": rng.uniform(-3, 3, (3, 5))}),
            Case("z of shape (2, 4, 6), some |z| up to 6", {"z": 2.0 * rng.standard_normal((2, 4, 6))},
                 gradcheck=True)]


def _act(z: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    out, cache = activation_forward(z, kind)
    return out, cache["grad"]


_EXACT = "the exact GELU is z Φ(z) = ½ z (1 + erf(z/√2))"

GELU = Exercise(
    name="gelu", forward="gelu_forward", backward="gelu_backward",
    signature="gelu_forward(z) -> (out, cache)", backward_signature="gelu_backward(dout, cache) -> dz",
    cases=_gelu_cases,
    call=lambda fn, a, s: fn(a["z"]),
    reference=lambda a, s: activation_forward(a["z"], "gelu"),
    reference_backward=lambda d, c: {"z": d * c["grad"]},
    returns="array", grad_names=("z",),
    forward_hint=_EXACT + "; erf comes from transformer_np.ops.erf (NumPy has none).",
    backward_hint="dz = dout ⊙ (Φ(z) + z φ(z)), Φ(z) = ½(1 + erf(z/√2)), φ(z) = exp(−z²/2)/√(2π).",
    nonfinite_hint="GELU and its derivative are finite for every finite z: look at the sign of an exponent.",
    answers=("Φ(z) + z φ(z)", "dout ⊙ (Φ(z) + z φ(z))", "exp(−z²/2)/√(2π)"),
    allowed=("transformer_np.ops.erf.erf",),
    forward_mistakes=(
        Mistake("wrong_activation", "uses the tanh approximation of GELU; this exercise asks for the exact one, "
                "built on the Gaussian CDF", lambda a, s: _act(a["z"], "gelu_tanh")[0], _EXACT),
        Mistake("wrong_activation", "computes ReLU; this exercise asks for the exact GELU",
                lambda a, s: _act(a["z"], "relu")[0], _EXACT),
        Mistake("wrong_activation", "uses the sigmoid approximation of GELU; this exercise asks for the exact one",
                lambda a, s: a["z"] / (1 + np.exp(-1.702 * a["z"])), _EXACT),
        Mistake("gelu_missing_z", "returns the Gaussian CDF alone, without the factor that multiplies it",
                lambda a, s: _Phi(a["z"]), "GELU(z) = z Φ(z)"),
        Mistake("gelu_erf_argument", "feeds erf the wrong argument (the standard normal CDF rescales z first)",
                lambda a, s: 0.5 * a["z"] * (1 + erf(a["z"])), "Φ(z) = ½(1 + erf(z/√2))"),
    ),
    backward_mistakes=(
        Mistake("gelu_derivative", "has only one of the two terms of a product's derivative",
                lambda a, s, d: {"z": d * _Phi(a["z"])}, "Φ(z) + z φ(z), φ(z) = exp(−z²/2)/√(2π)"),
        Mistake("gelu_derivative", "leaves out the normalising constant of the Gaussian density",
                lambda a, s, d: {"z": d * (_Phi(a["z"]) + a["z"] * np.exp(-0.5 * a["z"] ** 2))},
                "φ(z) = exp(−z²/2)/√(2π)"),
        Mistake("wrong_activation", "uses the derivative of the tanh approximation; differentiate the exact GELU",
                lambda a, s, d: {"z": d * _act(a["z"], "gelu_tanh")[1]}, "Φ(z) + z φ(z)"),
        Mistake("wrong_activation", "uses ReLU's derivative (a step); GELU's derivative is smooth",
                lambda a, s, d: {"z": d * _act(a["z"], "relu")[1]}, "Φ(z) + z φ(z)"),
        Mistake("missing_upstream", "returns GELU's derivative without multiplying by the upstream gradient",
                lambda a, s, d: {"z": _act(a["z"], "gelu")[1]}, "dz = dout ⊙ GELU'(z)"),
    ),
)


# ============================================================================= position-wise FFN
def _ffn_arrays(rng: np.random.Generator, shape: tuple, d_ff: int) -> dict:
    d = shape[-1]
    return {"x": rng.standard_normal(shape), "W_1": rng.standard_normal((d, d_ff)) / math.sqrt(d),
            "b_1": 0.3 * rng.standard_normal(d_ff), "W_2": rng.standard_normal((d_ff, d)) / math.sqrt(d_ff),
            "b_2": 0.3 * rng.standard_normal(d)}


def _ffn_cases() -> list[Case]:
    rng = np.random.default_rng(5)
    return [Case("x of shape (4, 6), d_ff = 10", _ffn_arrays(rng, (4, 6), 10), dims={"d_model": 6, "d_ff": 10}),
            Case("a batch, x of shape (2, 3, 6), d_ff = 10", _ffn_arrays(rng, (2, 3, 6), 10),
                 dims={"d_model": 6, "d_ff": 10}, gradcheck=True)]


def _ffn_params(a: dict) -> dict:
    return {k: a[k] for k in FFN_PARAM_NAMES}


def _ffn_variant(act: str | None = "gelu", b1: str = "inside", b2: bool = True) -> Callable:
    def compute(a: dict, s: dict) -> np.ndarray:
        h = a["x"] @ a["W_1"] + (a["b_1"] if b1 == "inside" else 0.0)    # (..., d_ff)
        f = h if act is None else _act(h, act)[0]
        if b1 == "after":
            f = f + a["b_1"]
        return f @ a["W_2"] + (a["b_2"] if b2 else 0.0)                  # (..., d_model)
    return compute


def _ffn_bwd_variant(kind: str) -> Callable:
    def compute(a: dict, s: dict, dout: np.ndarray) -> dict:
        x, W_1, W_2 = a["x"], a["W_1"], a["W_2"]
        h = x @ W_1 + a["b_1"]                                           # (..., d_ff)
        f, fprime = _act(h, "gelu")
        dact = dout @ W_2.T                                              # (..., d_ff)
        dh = dact if kind == "no_act_grad" else dact * fprime
        g = {"W_2": _rows(h if kind == "dW2_pre" else f).T @ _rows(dout), "b_2": _rows(dout).sum(axis=0),
             "W_1": _rows(x).T @ _rows(dh), "b_1": _rows(dact if kind == "db1_before" else dh).sum(axis=0),
             "x": dh @ W_1.T}
        return g
    return compute


FFN = Exercise(
    name="ffn", forward="ffn_forward", backward="ffn_backward",
    signature="ffn_forward(x, p) -> (out, cache)", backward_signature="ffn_backward(dout, cache) -> (dx, grads)",
    cases=_ffn_cases,
    call=lambda fn, a, s: fn(a["x"], _ffn_params(a)),
    reference=lambda a, s: ffn_forward(a["x"], _ffn_params(a), "gelu"),
    reference_backward=lambda d, c: _dx_grads(ffn_backward(d, c)),
    returns="dx_grads", grad_names=("W_2", "b_2", "W_1", "b_1", "x"),
    forward_hint="FFN(x) = GELU(x W_1 + b_1) W_2 + b_2 (row vectors: W_1 is (d_model, d_ff), W_2 is (d_ff, d_model)).",
    backward_hint="see the equations above the exercise.",
    backward_hints={
        "x": "dx = dh W_1ᵀ with dh = (dout W_2ᵀ) ⊙ GELU'(h), h = x W_1 + b_1.",
        "W_1": "dW_1 = xᵀ dh over all rows: x.reshape(-1, d_model).T @ dh.reshape(-1, d_ff).",
        "b_1": "db_1 = dh summed over every axis but the last.",
        "W_2": "dW_2 = aᵀ dout over all rows, a = GELU(h).",
        "b_2": "db_2 = dout summed over every axis but the last.",
    },
    nonfinite_hint="check your GELU: it is finite for every finite input.",
    answers=("dh = (dout W_2ᵀ) ⊙ GELU'(h)", "dW_2 = aᵀ dout", "dW_1 = xᵀ dh", "dx = dh W_1ᵀ"),
    allowed=("transformer_np.ops.erf.erf",),
    forward_mistakes=(
        Mistake("missing_activation", "leaves out the activation between the two linear maps", _ffn_variant(act=None),
                "FFN(x) = GELU(x W_1 + b_1) W_2 + b_2"),
        Mistake("wrong_activation", "uses ReLU; this FFN uses the exact GELU", _ffn_variant(act="relu"), _EXACT),
        Mistake("wrong_activation", "uses the tanh approximation of GELU; this FFN uses the exact one",
                _ffn_variant(act="gelu_tanh"), _EXACT),
        Mistake("bias_after_activation", "adds b_1 after the activation instead of before it",
                _ffn_variant(b1="after"), "GELU(x W_1 + b_1)"),
        Mistake("missing_bias", "leaves out b_1", _ffn_variant(b1="none"), "GELU(x W_1 + b_1)"),
        Mistake("missing_bias", "leaves out b_2", _ffn_variant(b2=False), "… W_2 + b_2"),
    ),
    backward_mistakes=(
        Mistake("missing_activation_backward", "skips the activation's backward on the way from the output to the "
                "first linear map", _ffn_bwd_variant("no_act_grad"), "dh = (dout W_2ᵀ) ⊙ GELU'(h)"),
        Mistake("dW2_preactivation", "uses the pre-activation where the activation's output belongs (W_2 multiplies "
                "what GELU returned)", _ffn_bwd_variant("dW2_pre"), "dW_2 = aᵀ dout, a = GELU(h)"),
        Mistake("missing_activation_backward", "sums the gradient for b_1 before the activation's backward",
                _ffn_bwd_variant("db1_before"), "db_1 = Σ dh with dh = (dout W_2ᵀ) ⊙ GELU'(h)"),
    ),
)


# ============================================================================= encoder layer
_LAYER_D, _LAYER_H, _LAYER_FF, _LAYER_EPS = 6, 2, 10, 1e-5


def _layer_config(norm: str, d: int = _LAYER_D, h: int = _LAYER_H, d_ff: int = _LAYER_FF,
                  eps: float = _LAYER_EPS) -> EncoderConfig:
    return EncoderConfig(n_layers=1, d_model=d, n_heads=h, d_ff=d_ff, activation="gelu",
                         norm_position=norm, layer_norm_eps=eps, dropout=0.0)


def _layer_cases(norm: str) -> Callable[[], list[Case]]:
    title = "Post-LN" if norm == "post" else "Pre-LN"

    def cases() -> list[Case]:
        rng = np.random.default_rng(6 if norm == "post" else 7)
        params = sub_params(random_params(_layer_config(norm), seed=8), "layers.0.")
        mask = np.zeros((2, 1, 1, 4))
        mask[1, ..., 3] = mask_value(np.float64)
        static = {"norm": norm, "n_heads": _LAYER_H, "eps": _LAYER_EPS}
        return [Case(f"{title}, x of shape (1, 4, 6), 2 heads, no mask",
                     {"x": rng.standard_normal((1, 4, 6)), **copy_inputs(params)}, {**static, "mask": None}),
                Case(f"{title}, x of shape (2, 4, 6), 2 heads, a padding mask of shape (2, 1, 1, 4) hiding the last "
                     "key of batch item 2", {"x": rng.standard_normal((2, 4, 6)), **copy_inputs(params)},
                     {**static, "mask": mask}, gradcheck=True)]
    return cases


def _layer_params(a: dict) -> dict:
    return {k: v for k, v in a.items() if k != "x"}


def _layer_reference(a: dict, s: dict) -> tuple:
    cfg = _layer_config(s["norm"], a["x"].shape[-1], s["n_heads"], a["ffn.W_1"].shape[-1], s["eps"])
    return encoder_layer_forward(a["x"], _layer_params(a), cfg, s["mask"])


def _layer_variant(wiring: str) -> Callable:
    """The layer wired differently: "post" / "pre" (the placements), "post_no_res1", "post_no_res2",
    "post_ln_before_residual", "pre_no_res1", "pre_no_res2", "pre_skip_normed", "<norm>_ln_swapped"."""
    def compute(a: dict, s: dict) -> np.ndarray:
        x, p, h, mask, eps = a["x"], _layer_params(a), s["n_heads"], s["mask"], s["eps"]
        ln = {k: (p[f"ln{k}.gamma"], p[f"ln{k}.beta"]) for k in (1, 2)}
        if wiring.endswith("ln_swapped"):
            ln = {1: ln[2], 2: ln[1]}

        def attn(y): return mha_forward(y, sub_params(p, "attn."), h, mask)[0]
        def ffn(y): return ffn_forward(y, sub_params(p, "ffn."), "gelu")[0]
        def LN(y, k): return layernorm_forward(y, *ln[k], eps)[0]

        if wiring.startswith("post"):
            if wiring == "post_ln_before_residual":
                z = x + LN(attn(x), 1)
                return z + LN(ffn(z), 2)
            z = LN(attn(x) if wiring == "post_no_res1" else x + attn(x), 1)
            return LN(ffn(z) if wiring == "post_no_res2" else z + ffn(z), 2)
        if wiring == "pre_skip_normed":
            y = LN(x, 1)
            z = y + attn(y)
            y2 = LN(z, 2)
            return y2 + ffn(y2)
        z = attn(LN(x, 1)) if wiring == "pre_no_res1" else x + attn(LN(x, 1))
        return ffn(LN(z, 2)) if wiring == "pre_no_res2" else z + ffn(LN(z, 2))
    return compute


def _layer_bwd_variant(drop: tuple[str, ...]) -> Callable:
    """The library's layer backward with the gradient of a skip path left out ("attn" and/or "ffn")."""
    def compute(a: dict, s: dict, dout: np.ndarray) -> dict:
        _, c = _layer_reference(a, s)
        g: dict = {}
        if s["norm"] == "post":
            dr, g["ln2.gamma"], g["ln2.beta"] = layernorm_backward(dout, c["ln2"])
            dz_f, gf = ffn_backward(dr, c["ffn"])
            dz = dz_f if "ffn" in drop else dr + dz_f
            dr1, g["ln1.gamma"], g["ln1.beta"] = layernorm_backward(dz, c["ln1"])
            dx_a, ga = mha_backward(dr1, c["attn"])
            g["x"] = dx_a if "attn" in drop else dr1 + dx_a
        else:
            dy, gf = ffn_backward(dout, c["ffn"])
            dz_l, g["ln2.gamma"], g["ln2.beta"] = layernorm_backward(dy, c["ln2"])
            dz = dz_l if "ffn" in drop else dout + dz_l
            dy1, ga = mha_backward(dz, c["attn"])
            dx_l, g["ln1.gamma"], g["ln1.beta"] = layernorm_backward(dy1, c["ln1"])
            g["x"] = dx_l if "attn" in drop else dz + dx_l
        g.update({"ffn." + k: v for k, v in gf.items()})
        g.update({"attn." + k: v for k, v in ga.items()})
        return g
    return compute


_ATTN_ORDER = tuple("attn." + k for k in _MHA_ORDER[:-1])
_FFN_ORDER = ("ffn.W_2", "ffn.b_2", "ffn.W_1", "ffn.b_1")
_SKIP_MSG = "leaves out the gradient of the skip path around the {what}: a residual has two paths back to its input"
_SKIP_FIX = "a residual x + F(x) sends its upstream gradient to x unchanged AND through F's backward, and the two add"
_POST_EQ = "Post-LN: Z = LN₁(H + MHA(H)), H' = LN₂(Z + FFN(Z))"
_PRE_EQ = "Pre-LN: Z = H + MHA(LN₁(H)), H' = Z + FFN(LN₂(Z)) (no LayerNorm after the last add)"


def _layer_exercise(norm: str) -> Exercise:
    post = norm == "post"
    eq = _POST_EQ if post else _PRE_EQ
    other = _PRE_EQ if post else _POST_EQ
    common = (
        Mistake("no_residual", "leaves out the residual around attention", _layer_variant(f"{norm}_no_res1"), eq),
        Mistake("no_residual", "leaves out the residual around the FFN", _layer_variant(f"{norm}_no_res2"), eq),
        Mistake("swapped_parameters", "swaps the two LayerNorms' parameters: ln1 belongs to the attention sublayer, "
                "ln2 to the FFN", _layer_variant(f"{norm}_ln_swapped")),
    )
    specific = (
        (Mistake("ln_before_residual", "normalises each sublayer's output before the residual add instead of the "
                 "sum", _layer_variant("post_ln_before_residual"), eq),) if post else
        (Mistake("skip_from_normalised", "adds the sublayer to the normalised input instead of the un-normalised "
                 "stream", _layer_variant("pre_skip_normed"), eq),))
    order = (("ln2.gamma", "ln2.beta") + _FFN_ORDER + ("ln1.gamma", "ln1.beta") + _ATTN_ORDER + ("x",) if post else
             _FFN_ORDER + ("ln2.gamma", "ln2.beta") + _ATTN_ORDER + ("ln1.gamma", "ln1.beta", "x"))
    return Exercise(
        name=f"encoder_layer_{norm}", forward="encoder_layer_forward", backward="encoder_layer_backward",
        signature="encoder_layer_forward(x, p, norm, n_heads, mask, eps) -> (out, cache)",
        backward_signature="encoder_layer_backward(dout, cache) -> (dx, grads)",
        cases=_layer_cases(norm),
        call=lambda fn, a, s: fn(a["x"], _layer_params(a), s["norm"], s["n_heads"], s["mask"], s["eps"]),
        reference=_layer_reference,
        reference_backward=lambda d, c: _dx_grads(encoder_layer_backward(d, c)),
        returns="dx_grads", grad_names=order,
        forward_hint=eq + ".",
        backward_hint=("go through the forward in reverse; at each residual add the gradient is copied to both "
                       "operands, and where two paths meet their gradients add."),
        nonfinite_hint="check each sublayer on its own (mha_forward, layernorm_forward, ffn_forward).",
        forward_mistakes=(Mistake("wrong_norm_position", f"computes the other placement ({'Pre' if post else 'Post'}"
                                  f"-LN) where this check asks for {'Post' if post else 'Pre'}-LN",
                                  _layer_variant("pre" if post else "post"), f"{eq}, not {other}"),)
        + common + specific,
        backward_mistakes=(
            Mistake("missing_skip_gradient", _SKIP_MSG.format(what="FFN"), _layer_bwd_variant(("ffn",)), _SKIP_FIX),
            Mistake("missing_skip_gradient", _SKIP_MSG.format(what="attention sublayer"),
                    _layer_bwd_variant(("attn",)), _SKIP_FIX),
            Mistake("missing_skip_gradient", _SKIP_MSG.format(what="both sublayers"),
                    _layer_bwd_variant(("attn", "ffn")), _SKIP_FIX),
        ),
        answers=(_POST_EQ, _PRE_EQ),
        allowed=("transformer_np.model.params.sub_params", "transformer_np.ops.attention.mha_forward",
                 "transformer_np.ops.attention.mha_backward", "transformer_np.ops.feedforward.ffn_forward",
                 "transformer_np.ops.feedforward.ffn_backward", "transformer_np.ops.layernorm.layernorm_forward",
                 "transformer_np.ops.layernorm.layernorm_backward"),
    )


EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (
    SOFTMAX, LAYERNORM, ATTENTION, MHA, GELU, FFN, _layer_exercise("post"), _layer_exercise("pre"))}
