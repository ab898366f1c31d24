r"""The residual connection: out = x + F(x), written as its own op.

It is trivial, and that is the point of the gradient-flow argument: the backward of
an addition copies the upstream gradient to *both* operands unchanged,
    dx_skip = dout,   dF = dout,
so whatever the sublayer F does to its share, the skip share reaches x untouched —
the identity term I in ∂X_ℓ/∂X_{ℓ−1} = I + ∂F/∂X_{ℓ−1}.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, check_cache, check_dout
from ..errors import InputValueError

__all__ = ["residual_forward", "residual_backward"]


def _residual_forward(x: np.ndarray, fx: np.ndarray) -> tuple[np.ndarray, dict]:
    return x + fx, {"kind": "residual", "shape": x.shape}


def _residual_backward(dout: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray]:
    return dout, dout


def residual_forward(x: np.ndarray, fx: np.ndarray) -> tuple[np.ndarray, dict]:
    """out = x + fx. Both must have the same shape: a residual never broadcasts."""
    as_float_array(x, "x")
    as_float_array(fx, "fx", dtype=x.dtype)
    if x.shape != fx.shape:
        raise InputValueError(f"residual: the sublayer output fx must have the shape of its input x "
                              f"{x.shape} (d_model must stay constant through the stack), got shape {fx.shape}")
    return _residual_forward(x, fx)


def residual_backward(dout: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray]:
    """Returns ``(dx, dfx)``: both are the upstream gradient itself."""
    check_cache(cache, "cache", "residual")
    check_dout(dout, "dout", cache["shape"])
    return _residual_backward(dout, cache)
