"""The heads' layout: (B, n, d_model) ↔ (B, h, n, d_k), by reshape and transpose (views when possible).

Its own module, below both attention paths: the plain multi-head attention
(:mod:`transformer_np.ops.attention`, which re-exports both names) and the fast path's
(:mod:`transformer_np.ops.fast_mha`) split the same way, and the plain module dispatches a fast cache
to :mod:`transformer_np.ops.fast` — so the fast path must not import the plain module back.
"""

from __future__ import annotations

import numpy as np

__all__ = ["split_heads", "merge_heads"]


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(B, n, d_model) → (B, h, n, d_k): a view when possible, never a loop over heads."""
    B, n, d = x.shape
    return x.reshape(B, n, n_heads, d // n_heads).transpose(0, 2, 1, 3)   # (B, h, n, d_k)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, h, n, d_k) → (B, n, h·d_k): the concatenation of the heads along features."""
    B, h, n, dk = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, n, h * dk)     # (B, n, d_model)
