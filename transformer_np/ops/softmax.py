r"""Numerically stable softmax over the last axis.

    s_i = exp(x_i − m) / Σ_j exp(x_j − m),   m = max_j x_j

Subtracting the row maximum changes nothing mathematically (softmax is invariant to
adding a constant to a row) but keeps every exponent ≤ 0, so exp never overflows and
the largest term is exactly 1, so the denominator is ≥ 1 and never 0.

Backward (the Jacobian is diag(s) − s sᵀ, applied row by row without forming it):
    dx = s ⊙ (ds − Σ_j ds_j s_j)
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, check_cache, check_dout

__all__ = ["softmax_forward", "softmax_backward", "softmax"]


def softmax(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Stable softmax over the last axis (no cache). ``out`` (x's shape and dtype) receives
    the result; ``out=x`` computes it in place."""
    e = np.subtract(x, x.max(axis=-1, keepdims=True), out=out)   # the one new array (or out)
    np.exp(e, out=e)                                        # in place: no second temporary
    e /= e.sum(axis=-1, keepdims=True)
    return e


def softmax_forward(x: np.ndarray) -> tuple[np.ndarray, dict]:
    """Returns ``(s, cache)`` with s = softmax(x) over the last axis."""
    as_float_array(x, "x", finite=False)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last axis, got shape {x.shape}")
    s = softmax(x)
    return s, {"kind": "softmax", "s": s}


def softmax_backward(ds: np.ndarray, cache: dict) -> np.ndarray:
    """dx = s ⊙ (ds − ⟨ds, s⟩) row-wise."""
    check_cache(cache, "cache", "softmax")
    s = cache["s"]
    check_dout(ds, "ds", s.shape)
    dx = ds - (ds * s).sum(axis=-1, keepdims=True)          # ds − ⟨ds, s⟩
    dx *= s                                                 # in place: ⊙ s
    return dx
