r"""Rotary position embeddings (RoPE, Su et al. 2021), as ModernBERT (and Hugging Face's ``rotate_half``) apply them.

Positions enter by rotating the queries and keys, not by adding a table to the input: for a head of
width d_k, frequencies ω_k = θ^{−2k/d_k} (k = 0 … d_k/2 − 1), and at position m the angles
φ_{m,k} = m ω_k. The layout is "half split" (HF's ``rotate_half``): feature k pairs with k + d_k/2,

    C[m] = [cos φ_m, cos φ_m],   S[m] = [sin φ_m, sin φ_m]                     (n, d_k)
    rot(x) = [−x₂, x₁]          x = [x₁, x₂], halves of width d_k/2
    RoPE(x)_m = x_m ⊙ C[m] + rot(x_m) ⊙ S[m]

which turns each pair (x_k, x_{k+d_k/2}) by the angle φ_{m,k}; so q_m · k_l depends on m − l only
through the rotation by φ_{l} − φ_{m}.

Backward. The map is linear in x: RoPE(x) = x ⊙ C + R x ⊙ S with R the fixed matrix of ``rot``, so
    dx = dy ⊙ C + Rᵀ (dy ⊙ S),       Rᵀ u = [u₂, −u₁]
(R is a rotation by 90° in every pair: Rᵀ = −R = R⁻¹). The tables are constants.

Precision: the tables are computed in float64 (then cast to the array's dtype). Hugging Face computes
them in float32 whatever the model's dtype (``position_ids.float() * inv_freq``, ``.cos()``) and rotates
float32 copies of q and k (``q.float()``): a float64 HF model carries float32 round-off there (see
``tests/io/test_parity_modernbert.py``).
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, check_cache, check_dout, check_float, check_float_dtype, check_int
from ..errors import InputValueError

__all__ = ["rotary_tables", "rotary_forward", "rotary_backward", "rotate_half"]


def rotary_tables(n: int, d_k: int, theta: float, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """(C, S), each (n, d_k): cos and sin of the angles m·θ^{−2k/d_k}, duplicated over the two halves."""
    check_int(n, "n", minimum=1)
    check_int(d_k, "d_k", minimum=2)
    if d_k % 2:
        raise InputValueError(f"d_k must be even (rotary embeddings turn pairs of features), got {d_k}")
    check_float(theta, "theta", 0.0, min_inclusive=False)
    dt = check_float_dtype(dtype)
    inv_freq = 1.0 / np.power(float(theta), np.arange(0, d_k, 2, dtype=np.float64) / d_k)   # (d_k/2,) ω_k
    phi = np.arange(n, dtype=np.float64)[:, None] * inv_freq[None, :]                       # (n, d_k/2)
    phi = np.concatenate([phi, phi], axis=-1)                                               # (n, d_k)
    return np.cos(phi).astype(dt), np.sin(phi).astype(dt)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """rot(x) = [−x₂, x₁] along the last axis."""
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)        # same shape


def _rotate_half_t(u: np.ndarray) -> np.ndarray:
    """Rᵀ u = [u₂, −u₁] (the transpose of :func:`rotate_half`)."""
    h = u.shape[-1] // 2
    return np.concatenate([u[..., h:], -u[..., :h]], axis=-1)        # same shape


def _rotary_forward(x: np.ndarray, C: np.ndarray, S: np.ndarray) -> tuple[np.ndarray, dict]:
    y = x * C + rotate_half(x) * S                                   # (..., n, d_k); C, S broadcast
    return y, {"kind": "rotary", "C": C, "S": S, "shape": x.shape}


def _rotary_backward(dy: np.ndarray, cache: dict) -> np.ndarray:
    return dy * cache["C"] + _rotate_half_t(dy * cache["S"])         # dx = dy ⊙ C + Rᵀ(dy ⊙ S)


def rotary_forward(x: np.ndarray, C: np.ndarray, S: np.ndarray) -> tuple[np.ndarray, dict]:
    """RoPE(x) for x (..., n, d_k) with the tables of :func:`rotary_tables` (n, d_k); ``(y, cache)``."""
    as_float_array(x, "x")
    if x.ndim < 2 or x.shape[-1] % 2:
        raise InputValueError(f"x must have shape (..., n, d_k) with d_k even, got shape {x.shape}")
    for name, t in (("C", C), ("S", S)):
        as_float_array(t, name, ndim=2, dtype=x.dtype)
        if t.shape != x.shape[-2:]:
            raise InputValueError(f"{name} must have shape (n, d_k) = {x.shape[-2:]}, got shape {t.shape}")
    return _rotary_forward(x, C, S)


def rotary_backward(dy: np.ndarray, cache: dict) -> np.ndarray:
    """dx = dy ⊙ C + Rᵀ(dy ⊙ S)."""
    check_cache(cache, "cache", "rotary")
    check_dout(dy, "dy", cache["shape"])
    return _rotary_backward(dy, cache)
