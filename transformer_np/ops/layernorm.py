r"""Layer normalisation over the feature axis (the last one, width d).

Forward, for one row x ∈ ℝ^d (every row independently):
    μ = (1/d) Σ_i x_i
    σ² = (1/d) Σ_i (x_i − μ)²          (biased variance, as PyTorch and Hugging Face)
    r = 1 / √(σ² + ε)
    x̂ = (x − μ) r
    y = γ ⊙ x̂ + β

Backward. With g = dy ⊙ γ (the gradient reaching x̂), the chain rule through μ and r:
    ∂x̂_j/∂x_i = r (δ_ij − 1/d − x̂_i x̂_j / d)
so
    dx = r (g − mean(g) − x̂ ⊙ mean(g ⊙ x̂))
    dγ = Σ_rows dy ⊙ x̂,    dβ = Σ_rows dy
The two means are over the feature axis; the sums over every other axis (batch and
positions share γ and β). A constant row (σ² = 0) gives x̂ = 0 and r = 1/√ε: finite.

The public function refuses NaN/±inf in x, γ and β, naming the argument (as every public op does).
One numerical guard remains: if (x − μ)² overflows, σ² is not finite, r would be 0 and y = β —
finite and silently wrong — so a non-finite σ² raises :class:`~transformer_np.errors.NonFiniteError`
(one pass over the (…, 1) variances only).

This module is the plain path; :mod:`transformer_np.fast` computes the same in fewer
temporary arrays for the encoder stack.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, check_cache, check_dout, check_float
from ..errors import InputValueError, NonFiniteError

__all__ = ["layernorm_forward", "layernorm_backward"]


# ----------------------------------------------------------------------------- the computation
def check_variance(var: np.ndarray, xc: np.ndarray) -> None:
    """Raise NonFiniteError when a row's variance is not finite (see the module docstring)."""
    if not np.all(np.isfinite(var)):
        big = float(np.nanmax(np.abs(np.where(np.isfinite(xc), xc, 0))))
        raise NonFiniteError(f"layernorm: the variance of x is not finite ({xc.dtype} overflow: |x − mean| "
                             f"reaches {big:.3g}, whose square exceeds {xc.dtype}'s range, or x holds NaN/inf); "
                             f"rescale x or use float64")


def _layernorm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                       eps: float = 1e-5) -> tuple[np.ndarray, dict]:
    mu = x.mean(axis=-1, keepdims=True)                     # (..., 1)
    xc = x - mu                                             # (..., d)
    var = (xc * xc).mean(axis=-1, keepdims=True)            # (..., 1) biased
    check_variance(var, xc)
    rstd = 1.0 / np.sqrt(var + eps)                         # (..., 1) r
    xhat = xc * rstd                                        # (..., d)
    y = gamma * xhat + beta                                 # (..., d)
    return y, {"kind": "layernorm", "xhat": xhat, "rstd": rstd, "gamma": gamma}


def _layernorm_backward(dy: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xhat, rstd, gamma = cache["xhat"], cache["rstd"], cache["gamma"]
    rows = tuple(range(xhat.ndim - 1))                      # every axis but the features
    dgamma = (dy * xhat).sum(axis=rows)                     # (d,)
    dbeta = dy.sum(axis=rows)                               # (d,)
    g = dy * gamma                                          # (..., d)
    mean_g = g.mean(axis=-1, keepdims=True)                 # (..., 1)
    mean_gx = (g * xhat).mean(axis=-1, keepdims=True)       # (..., 1)
    dx = rstd * (g - mean_g - xhat * mean_gx)               # (..., d)
    return dx, dgamma, dbeta


# ----------------------------------------------------------------------------- the public API
def check_layernorm_args(x, gamma, beta, eps, names=("x", "gamma", "beta", "eps")) -> None:
    nx, ng, nb, ne = names
    as_float_array(x, nx)
    d = x.shape[-1] if x.ndim else 0
    if d == 0:
        raise InputValueError(f"{nx} must have a non-empty last axis (the features normalised over), got shape "
                              f"{x.shape}")
    for name, p in ((ng, gamma), (nb, beta)):
        as_float_array(p, name, ndim=1, dtype=x.dtype)
        if p.shape != (d,):
            raise InputValueError(f"{name} must have shape ({d},) to match {nx} of shape {x.shape}, "
                                  f"got shape {p.shape}")
    check_float(eps, ne, 0.0, min_inclusive=False)          # a finite positive number, not a bool


def layernorm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                      eps: float = 1e-5) -> tuple[np.ndarray, dict]:
    """y = γ ⊙ (x − μ)/√(σ² + ε) + β over the last axis. x (..., d), γ and β (d,).

    ``eps`` must be a finite number > 0 (a bool is refused). Returns ``(y, cache)``.
    """
    check_layernorm_args(x, gamma, beta, eps)
    with np.errstate(over="ignore", invalid="ignore"):      # an overflow is reported as NonFiniteError
        return _layernorm_forward(x, gamma, beta, float(eps))


def layernorm_backward(dy: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns ``(dx, dgamma, dbeta)``; see the module docstring for the derivation."""
    check_cache(cache, "cache", "layernorm")
    check_dout(dy, "dy", cache["xhat"].shape)
    return _layernorm_backward(dy, cache)
