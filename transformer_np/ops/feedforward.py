r"""The position-wise feed-forward sublayer (the lesson's "MLP").

    FFN(Z) = f(Z W_1 + b_1) W_2 + b_2,     f ∈ {GELU, GELU-tanh, ReLU}
    Z (B, n, d_model) → (B, n, d_ff) → (B, n, d_model)

Row-vector convention: W_1 is (d_model, d_ff) and W_2 is (d_ff, d_model) — the
transposes of the lesson's column-vector W_1 ∈ ℝ^{d_ff×d}, W_2 ∈ ℝ^{d×d_ff}.
"Position-wise": the same weights act on every row, with no mixing across positions
(only attention mixes positions).

Backward is the chain of the three ops in reverse, with U = Z W_1 + b_1 and F = f(U):
    dF = dY W_2ᵀ,   dW_2 = Fᵀ dY,   db_2 = Σ_rows dY
    dU = dF ⊙ f'(U)
    dZ = dU W_1ᵀ,   dW_1 = Zᵀ dU,   db_1 = Σ_rows dU

This module is the plain path; :mod:`transformer_np.fast` runs the same chain with the
blocked activation and (``free_cache=True``) releases f(U) and f'(U) mid-backward.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, check_bool, check_cache, check_choice, check_dout, describe
from ..errors import InputTypeError, InputValueError
from .activations import ACTIVATIONS, _activation_backward, _activation_forward
from .cache import check_not_freed, engine_backward, release
from .linear import _linear_backward, _linear_forward, check_linear_args

__all__ = ["ffn_forward", "ffn_backward", "FFN_PARAM_NAMES"]

FFN_PARAM_NAMES = ("W_1", "b_1", "W_2", "b_2")


# ----------------------------------------------------------------------------- the computation
def _ffn_forward(z: np.ndarray, p: dict, activation: str = "gelu") -> tuple[np.ndarray, dict]:
    u, c1 = _linear_forward(z, p["W_1"], p["b_1"])           # (..., d_ff)  U = Z W_1 + b_1
    f, ca = _activation_forward(u, activation)               # (..., d_ff)  F = f(U)
    y, c2 = _linear_forward(f, p["W_2"], p["b_2"])           # (..., d_model)
    return y, {"kind": "ffn", "lin1": c1, "act": ca, "lin2": c2}


def _ffn_backward(dy: np.ndarray, cache: dict) -> tuple[np.ndarray, dict]:
    df, dW_2, db_2 = _linear_backward(dy, cache["lin2"])     # (..., d_ff)
    du = _activation_backward(df, cache["act"])              # (..., d_ff)
    dz, dW_1, db_1 = _linear_backward(du, cache["lin1"])     # (..., d_model)
    return dz, {"W_1": dW_1, "b_1": db_1, "W_2": dW_2, "b_2": db_2}


# ----------------------------------------------------------------------------- the public API
def check_ffn_args(z, p, activation) -> None:
    """Everything :func:`ffn_forward` needs, checked once (the encoder layer uses it too)."""
    as_float_array(z, "z")
    check_choice(activation, "activation", ACTIVATIONS)
    if not isinstance(p, dict):
        raise InputTypeError(f"p must be a dict of the feed-forward parameters {FFN_PARAM_NAMES}, got {describe(p)}")
    for name in FFN_PARAM_NAMES:
        if name not in p:
            raise InputValueError(f"params is missing the feed-forward parameter {name!r}")
    check_linear_args(z, p["W_1"], p["b_1"], ("z", "W_1", "b_1"))           # W_1 (d, d_ff), b_1 (d_ff,)
    W_2, b_2, d_ff, d = p["W_2"], p["b_2"], p["W_1"].shape[1], z.shape[-1]
    as_float_array(W_2, "W_2", ndim=2, dtype=z.dtype)
    if W_2.shape[0] != d_ff:
        raise InputValueError(f"W_2 must have d_ff = {d_ff} rows (W_1 has shape {p['W_1'].shape}), "
                              f"got shape {W_2.shape}")
    if W_2.shape[1] != d:
        raise InputValueError(f"the feed-forward output must have the input's shape {z.shape} so the residual "
                              f"type-checks; W_2 maps to width {W_2.shape[1]}")
    as_float_array(b_2, "b_2", ndim=1, dtype=z.dtype)
    if b_2.shape != (d,):
        raise InputValueError(f"b_2 must have shape ({d},) to match W_2 {W_2.shape}, got shape {b_2.shape}")


def ffn_forward(z: np.ndarray, p: dict, activation: str = "gelu") -> tuple[np.ndarray, dict]:
    """FFN(z) = f(z W_1 + b_1) W_2 + b_2. ``p`` holds W_1 (d, d_ff), b_1 (d_ff,), W_2 (d_ff, d), b_2 (d,)."""
    check_ffn_args(z, p, activation)
    return _ffn_forward(z, p, activation)


def ffn_backward(dout: np.ndarray, cache: dict, free_cache: bool = False) -> tuple[np.ndarray, dict]:
    """Returns ``(dz, grads)`` with grads keyed W_1, b_1, W_2, b_2.

    ``free_cache=True`` frees the cache (the engine's, f(z) and f'(z) first, mid-backward); it cannot be
    backpropagated again (:class:`~transformer_np.errors.StaleCacheError`). The speed engine's training-layer
    cache (its input kept as the LayerNorm that made it) goes to the engine's own backward
    (:func:`transformer_np.ops.cache.engine_backward`).
    """
    check_cache(cache, "cache", "ffn")
    check_bool(free_cache, "free_cache")
    check_not_freed(cache)
    lin2 = cache["lin2"]
    check_dout(dout, "dout", lin2["x"].shape[:-1] + (lin2["W"].shape[1],))
    if "ln" in cache.get("lin1", {}):                    # an engine training layer's: z kept as its LayerNorm
        return engine_backward("ffn_backward")(dout, cache, free_cache)
    out = _ffn_backward(dout, cache)
    if free_cache:
        release(cache)
    return out
