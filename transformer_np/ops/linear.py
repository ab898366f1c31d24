r"""Affine map, row-vector convention: y = x W + b.

Shapes: x (..., d_in), W (d_in, d_out), b (d_out,), y (..., d_out). The article's
pseudocode writes ``X @ W1 + b1`` (rows are tokens), so weights are stored
(d_in, d_out); PyTorch's ``nn.Linear.weight`` is the transpose (see interop).

Backward. Every leading position m uses the same W and b, y_m = x_m W + b, so with X the
(M, d_in) matrix of all M positions (leading axes flattened) and dY likewise (M, d_out):
    dX = dY Wᵀ          (M, d_in)
    dW = Xᵀ dY          (d_in, d_out)  = Σ_m x_mᵀ dy_m, a sum over every position
    db = Σ_rows dY      (d_out,)
The bias value is not needed by the backward; W is (for dX), and x is cached (for dW).

The public functions check their arguments; ``_linear_forward`` / ``_linear_backward`` are
the same computations without checks, for callers that have already checked.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, check_cache, check_dout
from ..errors import InputValueError

__all__ = ["linear_forward", "linear_backward"]


# ----------------------------------------------------------------------------- the computation
def _linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    y = x @ W                                               # (..., d_out)
    if b is not None:
        y = y + b
    return y, {"kind": "linear", "x": x, "W": W, "has_bias": b is not None}


def _linear_backward(dy: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    x, W = cache["x"], cache["W"]
    X = x.reshape(-1, x.shape[-1])                          # (M, d_in) every position a row
    dY = dy.reshape(-1, dy.shape[-1])                       # (M, d_out)
    dx = dy @ W.T                                           # (..., d_in)
    dW = X.T @ dY                                           # (d_in, d_out)
    db = dY.sum(axis=0) if cache["has_bias"] else None      # (d_out,)
    return dx, dW, db


# ----------------------------------------------------------------------------- the public API
def check_linear_args(x, W, b, names=("x", "W", "b")) -> None:
    """x (..., d_in) and W (d_in, d_out) of one float dtype; b None or (d_out,)."""
    nx, nW, nb = names
    as_float_array(x, nx)
    as_float_array(W, nW, ndim=2, dtype=x.dtype)
    if x.ndim < 1 or x.shape[-1] != W.shape[0]:
        raise InputValueError(f"{nx} must have last dimension d_in = {W.shape[0]} ({nW} has shape {W.shape}), "
                              f"got {nx} of shape {x.shape}")
    if b is not None:
        as_float_array(b, nb, ndim=1, dtype=x.dtype)
        if b.shape[0] != W.shape[1]:
            raise InputValueError(f"{nb} must have shape ({W.shape[1]},) to match {nW} {W.shape}, "
                                  f"got shape {b.shape}")


def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """y = x W + b. Returns ``(y, cache)``; ``b=None`` means no bias.

    x (..., d_in), W (d_in, d_out), b (d_out,) — one float dtype; y (..., d_out).
    """
    check_linear_args(x, W, b)
    return _linear_forward(x, W, b)


def linear_backward(dy: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Returns ``(dx, dW, db)`` (``db`` is None when the forward had no bias)."""
    check_cache(cache, "cache", "linear")
    check_dout(dy, "dy", cache["x"].shape[:-1] + (cache["W"].shape[1],))
    return _linear_backward(dy, cache)
