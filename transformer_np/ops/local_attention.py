r"""Local (sliding-window) attention, ModernBERT's: a query sees only the keys within w positions.

    allowed(i, j)  ⇔  |i − j| ≤ w             w = local_attention // 2 (HF: ``config.sliding_window``)
    W[i, j] = 0 if allowed, else finfo.min    (n, n)   an additive mask, like the padding mask
    S = Q Kᵀ/√d_k + min(W, M_pad)             (the window and the padding combined: hidden by either)

then softmax and A V as in :mod:`transformer_np.ops.attention`. The mask is a constant, so the backward
is scaled dot-product attention's (dS = A ⊙ (dA − rowsum(dA ⊙ A)), dQ = dS K/√d_k, dK = dSᵀ Q/√d_k,
dV = Aᵀ dO): a key outside the window has A = 0 exactly (exp(finfo.min − max) underflows to 0), so it
receives no gradient. A row whose window holds only padding keys — possible only at a padded query
far from every real token — is uniform over its keys, as in Hugging Face (the module doc of
:mod:`transformer_np.ops.masks`); such rows belong to padding positions.

The window is a band of width 2w + 1 in the (n, n) scores; this reference computes the full scores and
masks them (as HF's eager attention does), O(n²) like global attention.
"""

from __future__ import annotations

import numpy as np

from .._validate import check_float_dtype, check_int
from .attention import attention_backward, attention_forward
from .masks import combine_masks, mask_value

__all__ = ["sliding_window_mask", "local_attention_forward", "local_attention_backward"]


def sliding_window_mask(n: int, window: int, dtype=np.float64) -> np.ndarray:
    """(n, n) additive mask: 0 where |i − j| ≤ ``window`` (the half-width w), finfo.min elsewhere."""
    check_int(n, "n", minimum=1)
    check_int(window, "window", minimum=0)
    dt = check_float_dtype(dtype)
    i = np.arange(n)
    outside = np.abs(i[:, None] - i[None, :]) > window          # (n, n)
    return np.where(outside, mask_value(dt), 0.0).astype(dt)


def local_attention_forward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, window: int,
                            mask: np.ndarray | None = None, dropout_p: float = 0.0, training: bool = False,
                            rng=None) -> tuple[np.ndarray, dict]:
    """Attention of Q, K, V (..., n, d_k) within ``window`` positions, combined with an additive ``mask``."""
    W = sliding_window_mask(Q.shape[-2], window, Q.dtype)
    return attention_forward(Q, K, V, combine_masks(mask, W), dropout_p, training, rng)


def local_attention_backward(dO: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dQ, dK, dV)``: the attention backward (the window is a constant mask)."""
    return attention_backward(dO, cache)
