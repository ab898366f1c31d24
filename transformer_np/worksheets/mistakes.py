r"""Common mistakes as formulas, for the diagnosis (:mod:`~transformer_np.worksheets.diagnosis`) to try at a step.

Each builder returns ``(code, function, detail)`` triples; the function takes the step's inputs
(2-D arrays of one sequence, as in :mod:`.steps`) and computes what a student making that mistake
writes; ``detail`` finishes the sentence "…, which is …" of the explanation. The codes are those of
:data:`.names.DIAGNOSES`.

* ``missing_bias``: x W without + b;  ``transposed_weight``: x Wᵀ + b for x W + b (a square W that is
  not symmetric), and in the backward dy W for dy Wᵀ;
* ``softmax_jacobian``: dS = A ⊙ dA (the row sum ⟨dA, A⟩ not subtracted), or dS = dA;
* ``ln_stats_constant``: the LayerNorm backward with μ and σ² treated as constants — dx = γ ⊙ dy / σ —
  or with only one of them treated so (dx = (g − x̂ ⟨g, x̂⟩/d)/σ, or (g − mean g)/σ, g = γ ⊙ dy);
* ``activation_derivative``: GELU′(z) = Φ(z) (the z φ(z) term dropped), tanh-GELU′ = ½(1 + t) (the
  second term dropped), f(z) for f′(z), or no derivative at all (f′ = 1).
"""

from __future__ import annotations

import math

import numpy as np

from ..ops.kernels import erf as _erf  # the kernel, without erf's argument check

__all__ = ["linear", "linear_dx", "softmax_jacobian", "ln_stats_constant", "activation_derivative"]


def _square_asym(W) -> bool:
    return W.ndim == 2 and W.shape[0] == W.shape[1] and not np.array_equal(W, W.T)


def linear(W, b, wname: str, bname: str):
    """Mistakes of y = x W + b."""
    out = []
    if np.any(b != 0):
        out.append(("missing_bias", lambda x: x @ W, f"x {wname} without adding {bname}"))
    if _square_asym(W):
        out.append(("transposed_weight", lambda x: x @ W.T + b, f"x {wname}^T + {bname}, with {wname} transposed"))
    return out


def linear_dx(W, wname: str, dyname: str):
    """Mistakes of dx = dy Wᵀ (the backward of x W)."""
    if _square_asym(W):
        return [("transposed_weight", lambda dy: dy @ W, f"{dyname} {wname} instead of {dyname} {wname}^T")]
    return []


def softmax_jacobian(aname: str, daname: str):
    """Mistakes of dS = A ⊙ (dA − rowsum(dA ⊙ A)), as functions (A, dA) -> dS."""
    return [(lambda a, g: a * g, f"{aname} * {daname} without subtracting the row sum rowsum({daname} * {aname})"),
            (lambda a, g: g + 0.0, f"{daname} passed on unchanged, as if the softmax had no derivative")]


def _ln_parts(x, mean, var, eps):
    """x̂ and 1/σ from the statistics the student has (a negative σ² counts as 0)."""
    rstd = 1.0 / np.sqrt(np.maximum(var, 0.0) + eps)[..., None]
    return (x - mean[..., None]) * rstd, rstd


def ln_stats_constant(gamma, eps):
    """LayerNorm-backward mistakes, as functions (x, mean, var, dy) -> dx (the forward's statistics as the
    student has them)."""
    def both(x, mean, var, dy):
        _, rstd = _ln_parts(x, mean, var, eps)
        return gamma * dy * rstd

    def mean_only(x, mean, var, dy):           # the variance's dependence kept, the mean's dropped
        xhat, rstd = _ln_parts(x, mean, var, eps)
        g = gamma * dy
        return rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True))

    def var_only(x, mean, var, dy):            # the mean's dependence kept, the variance's dropped
        _, rstd = _ln_parts(x, mean, var, eps)
        g = gamma * dy
        return rstd * (g - g.mean(-1, keepdims=True))

    return [(both, "gamma * dy / sqrt(var + eps): the mean and the variance treated as constants"),
            (mean_only, "the gradient through the variance kept but the one through the mean dropped"),
            (var_only, "(g - mean(g)) / sqrt(var + eps): the gradient through the variance dropped")]


def activation_derivative(act: str):
    """Mistakes of d_ffn_hidden = da ⊙ f′(z), as functions (z, da)."""
    out = []
    if act == "gelu":
        out.append((lambda z, da: da * 0.5 * (1.0 + _erf(z / math.sqrt(2.0))),
                    "d_ffn_activation * Phi(ffn_hidden): GELU'(z) taken as Phi(z), without the z phi(z) term"))
    if act == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        out.append((lambda z, da: da * 0.5 * (1.0 + np.tanh(c * (z + 0.044715 * z ** 3))),
                    "d_ffn_activation * (1 + tanh(u)) / 2: tanh-GELU's derivative without its second term"))
    from ..ops.activations import activation_forward
    out.append((lambda z, da: da * activation_forward(z, act)[0],
                f"d_ffn_activation * {act}(ffn_hidden): the activation's value instead of its derivative"))
    out.append((lambda z, da: da + 0.0, "d_ffn_activation passed on unchanged, without the activation's derivative"))
    return out
