r"""Attention masks as additive biases on the scores.

An encoder's self-attention is unmasked over real tokens: the *only* mask it needs is
the padding mask, which stops real tokens from attending to padding keys. A causal
mask (position i sees only j ≤ i) is offered so notebooks can contrast encoder and
decoder; an encoder never uses it.

Masks are additive: ``scores + mask`` with 0 where attention is allowed and a very
large negative number where it is not. We use the dtype's most negative finite value
(as Hugging Face does) rather than −inf: exp(min − max) underflows to exactly 0, so a
masked key gets weight exactly 0, yet a row whose keys are *all* masked (a fully
padded sequence) stays finite — every score equals the same huge negative number and
the softmax returns a uniform row instead of 0/0 = NaN. Those rows belong to padding
positions whose outputs are ignored downstream.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_int_array, check_float_dtype, check_int, describe
from ..errors import InputTypeError, InputValueError

__all__ = ["padding_mask", "causal_mask", "combine_masks", "mask_value", "validate_attention_mask"]


def mask_value(dtype) -> float:
    """The additive value used for a masked position: the dtype's most negative finite number."""
    return float(np.finfo(dtype).min)


def validate_attention_mask(attention_mask, batch_shape: tuple[int, int] | None = None,
                            name: str = "attention_mask") -> np.ndarray:
    """Check a 1 = real / 0 = padding mask of shape (B, n) and return it as int64."""
    m = attention_mask
    if isinstance(m, np.ndarray) and m.dtype == bool:
        m = m.astype(np.int64)
    elif isinstance(m, np.ndarray) and np.issubdtype(m.dtype, np.floating):
        if not np.all(np.isin(m, (0.0, 1.0))):
            raise InputValueError(f"{name} must contain only 0 (padding) and 1 (real token), "
                             f"got values {np.unique(m)[:6].tolist()}")
        m = m.astype(np.int64)
    m = as_int_array(m, name, ndim=2)
    if batch_shape is not None and m.shape != tuple(batch_shape):
        raise InputValueError(f"{name} must have shape (B, n) = {tuple(batch_shape)} to match the input, "
                         f"got shape {m.shape}")
    if not np.all((m == 0) | (m == 1)):
        bad = np.unique(m[(m != 0) & (m != 1)])[:6].tolist()
        raise InputValueError(f"{name} must contain only 0 (padding) and 1 (real token), got values {bad}")
    return m


def padding_mask(attention_mask: np.ndarray, dtype=np.float64) -> np.ndarray:
    """(B, n) 1/0 attention mask → additive key mask of shape (B, 1, 1, n).

    The two singleton axes broadcast over heads and query positions: a padding key is
    hidden from every query in every head.
    """
    return _padding_mask(validate_attention_mask(attention_mask), check_float_dtype(dtype))


def _padding_mask(m: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """:func:`padding_mask` for a checked (B, n) 0/1 integer mask."""
    add = np.where(m == 1, 0.0, mask_value(dtype)).astype(dtype)   # (B, n)
    return add[:, None, None, :]                                   # (B, 1, 1, n)


def causal_mask(n: int, dtype=np.float64) -> np.ndarray:
    """(n, n) additive mask with the "future" (j > i) hidden: a decoder's mask, for contrast."""
    check_int(n, "n", minimum=1)
    dt = check_float_dtype(dtype)
    future = np.triu(np.ones((n, n), dtype=bool), k=1)       # (n, n)
    return np.where(future, mask_value(dt), 0.0).astype(dt)


def combine_masks(*masks: np.ndarray | None) -> np.ndarray | None:
    """Combine additive masks so that a position hidden by any of them stays hidden.

    Adding two masks would overflow (min + min = −inf); the elementwise minimum is the
    additive-mask form of a logical OR and never leaves the finite range.
    """
    out = None
    for m in masks:
        if m is None:
            continue
        if not isinstance(m, np.ndarray):
            raise InputTypeError(f"masks must be numpy arrays or None, got {describe(m)}")
        out = m if out is None else np.minimum(out, m)
    return out
