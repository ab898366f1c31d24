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
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, check_cache, check_dout

__all__ = ["layernorm_forward", "layernorm_backward"]


def layernorm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                      eps: float = 1e-5) -> tuple[np.ndarray, dict]:
    """y = γ ⊙ (x − μ)/√(σ² + ε) + β over the last axis. x (..., d), γ and β (d,)."""
    as_float_array(x, "x", finite=False)
    d = x.shape[-1] if x.ndim else 0
    for name, p in (("gamma", gamma), ("beta", beta)):
        as_float_array(p, name, ndim=1, dtype=x.dtype, finite=False)
        if p.shape != (d,):
            raise ValueError(f"{name} must have shape ({d},) to match x of shape {x.shape}, got shape {p.shape}")
    if not (isinstance(eps, (int, float, np.floating)) and eps > 0):
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    mu = x.mean(axis=-1, keepdims=True)                     # (..., 1)
    xc = x - mu                                             # (..., d)
    var = np.mean(xc * xc, axis=-1, keepdims=True)          # (..., 1)
    if not np.all(np.isfinite(var)):
        # (x − μ)² overflowed (or x held NaN/inf): r would be 0 and y = β — finite, silently wrong.
        # The check costs one pass over the (..., 1) variances only.
        raise ValueError(f"layernorm: the variance of x is not finite ({x.dtype} overflow: |x − mean| "
                         f"reaches {float(np.nanmax(np.abs(np.where(np.isfinite(xc), xc, 0)))):.3g}, whose "
                         f"square exceeds {x.dtype}'s range); rescale x or use float64")
    rstd = 1.0 / np.sqrt(var + float(eps))                  # (..., 1)
    xhat = xc
    xhat *= rstd                                            # (..., d) in place: xc is not needed again
    y = xhat * gamma
    y += beta
    return y, {"kind": "layernorm", "xhat": xhat, "rstd": rstd, "gamma": gamma}


def layernorm_backward(dy: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns ``(dx, dgamma, dbeta)``; see the module docstring for the derivation."""
    check_cache(cache, "cache", "layernorm")
    xhat, rstd, gamma = cache["xhat"], cache["rstd"], cache["gamma"]
    check_dout(dy, "dy", xhat.shape)
    d = xhat.shape[-1]
    lead = tuple(range(xhat.ndim - 1))
    dgamma = (dy * xhat).sum(axis=lead)                     # (d,)
    dbeta = dy.sum(axis=lead)                               # (d,)
    g = dy * gamma                                          # (..., d)
    mean_g = g.sum(axis=-1, keepdims=True) / d              # (..., 1)
    mean_gx = (g * xhat).sum(axis=-1, keepdims=True) / d    # (..., 1)
    dx = g                                                  # reuse g's buffer (g is ours)
    dx -= mean_g
    dx -= xhat * mean_gx
    dx *= rstd                                              # dx = r (g − mean(g) − x̂ mean(g x̂))
    return dx, dgamma, dbeta
