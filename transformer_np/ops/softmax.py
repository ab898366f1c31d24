r"""Numerically stable softmax over the last axis.

    s_i = exp(x_i − m) / Σ_j exp(x_j − m),   m = max_j x_j

Subtracting the row maximum changes nothing mathematically (softmax is invariant to
adding a constant to a row) but keeps every exponent ≤ 0, so exp never overflows and
the largest term is exactly 1, so the denominator is ≥ 1 and never 0.

Backward. The Jacobian of one row is ∂s_i/∂x_j = s_i (δ_ij − s_j) = diag(s) − s sᵀ; applied
to the upstream gradient ds without forming it:
    dx_j = Σ_i ds_i s_i (δ_ij − s_j) = s_j (ds_j − Σ_i ds_i s_i)
i.e.  dx = s ⊙ (ds − ⟨ds, s⟩)  row by row.

The public functions check their arguments; ``_softmax`` and ``_softmax_backward`` are the
same computations without checks, for callers that have already checked (attention).
An allocation-free version (in place, ``out=``) is :func:`transformer_np.fast.softmax`.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, check_cache, check_dout, describe
from ..errors import InputTypeError, InputValueError

__all__ = ["softmax_forward", "softmax_backward", "softmax"]


# ----------------------------------------------------------------------------- the computation
def _softmax(x: np.ndarray) -> np.ndarray:
    """s = exp(x − max x) / Σ exp(x − max x) over the last axis."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))          # (..., n) every exponent ≤ 0
    return e / e.sum(axis=-1, keepdims=True)               # (..., n) rows sum to 1


def _softmax_backward(ds: np.ndarray, s: np.ndarray) -> np.ndarray:
    """dx = s ⊙ (ds − ⟨ds, s⟩) over the last axis."""
    return s * (ds - (ds * s).sum(axis=-1, keepdims=True))


# ----------------------------------------------------------------------------- the public API
def _check_input(x, name: str = "x") -> np.ndarray:
    as_float_array(x, name)                                 # finite: ±inf or NaN would give NaN rows
    if x.ndim < 1 or x.shape[-1] == 0:
        raise InputValueError(f"{name} must have a non-empty last axis, got shape {x.shape}")
    return x


def softmax(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Stable softmax over the last axis (no cache).

    Args:
        x: float32/float64 array with a non-empty last axis and only finite values.
        out: optional array of x's shape and dtype that receives the result (``out=x`` is
            allowed: x is overwritten).

    Returns:
        softmax(x), a new array, or ``out``.

    Raises:
        InputTypeError: x (or out) is not a float32/float64 ndarray, or out's dtype differs.
        InputValueError: x is 0-d or has an empty last axis; out's shape differs.
        NonFiniteError: x holds NaN or ±inf (use a large finite negative number to mask,
            as :func:`transformer_np.ops.masks.mask_value` does).
    """
    _check_input(x)
    with np.errstate(over="ignore"):                        # x − max may round to −inf: exp gives 0, as it should
        s = _softmax(x)
    if out is None:
        return s
    if not isinstance(out, np.ndarray):
        raise InputTypeError(f"out must be a numpy.ndarray like x (shape {x.shape}, dtype {x.dtype}), "
                             f"got {describe(out)}")
    if out.dtype != x.dtype:
        raise InputTypeError(f"out must have x's dtype {x.dtype}, got dtype {out.dtype}")
    if out.shape != x.shape:
        raise InputValueError(f"out must have x's shape {x.shape}, got shape {out.shape}")
    if not out.flags.writeable:
        raise InputValueError("out must be writeable, got a read-only array")
    out[...] = s
    return out


def softmax_forward(x: np.ndarray) -> tuple[np.ndarray, dict]:
    """Returns ``(s, cache)`` with s = softmax(x) over the last axis (x finite, last axis non-empty)."""
    _check_input(x)
    with np.errstate(over="ignore"):
        s = _softmax(x)
    return s, {"kind": "softmax", "s": s}


def softmax_backward(ds: np.ndarray, cache: dict) -> np.ndarray:
    """dx = s ⊙ (ds − ⟨ds, s⟩) row-wise; see the module docstring."""
    check_cache(cache, "cache", "softmax")
    check_dout(ds, "ds", cache["s"].shape)
    return _softmax_backward(ds, cache["s"])
