"""The exercises on single ops: softmax, LayerNorm, scaled dot-product attention (their cases, reference,
known mistakes; see :mod:`transformer_np.grader.specs`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..ops.attention import (
    attention_backward,
    attention_forward,
)
from ..ops.layernorm import layernorm_backward, layernorm_forward
from ..ops.masks import mask_value
from ..ops.softmax import softmax_backward, softmax_forward
from .exercise_base import (
    Case,
    Exercise,
    Mistake,
    _global_sum,
    _lead,
    _softmax_along,
)

__all__ = ["ATTENTION", "LAYERNORM", "SOFTMAX"]


# ============================================================================= softmax
def _softmax_cases() -> list[Case]:
    rng = np.random.default_rng(0)
    big = rng.standard_normal((2, 4)) + np.array([[1000.0], [-1000.0]])
    return [Case("x of shape (4, 5): four rows of scores", {"x": 2 * rng.standard_normal((4, 5))}, dims={"n": 5}),
            Case("a batch, x of shape (2, 3, 5)", {"x": 2 * rng.standard_normal((2, 3, 5))}, dims={"n": 5},
                 gradcheck=True),
            Case("large scores: x of shape (2, 4), one row near +1000 and one near −1000", {"x": big},
                 dims={"n": 4}, extreme=True)]


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
