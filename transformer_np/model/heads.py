r"""Heads that read the encoder's output H^(N) (B, n, d), each with its backward.

* mean pooling over real tokens (sentence embeddings):
      m_b = Σ_i mask_bi H_bi / max(1, Σ_i mask_bi)        (B, d)
  backward: dH_bi = mask_bi · dm_b / max(1, Σ_i mask_bi).
  A fully padded sequence has no tokens to average: its pooled vector is 0, not 0/0.
* [CLS] sequence classifier: logits = H_{:,0} W + b      (B, C)   — reads position 0 only,
  so the gradient reaches H only at position 0 (the lesson's Figure 3).
* BERT pooler: tanh(H_{:,0} W + b)                        (B, d)   (kept for HF parity).
* per-token tagger: logits = H W + b                      (B, n, C).
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, check_cache, check_dout
from ..ops.linear import linear_backward, linear_forward
from ..ops.masks import validate_attention_mask

__all__ = ["token_count", "mean_pool_forward", "mean_pool_backward", "cls_classifier_forward",
           "cls_classifier_backward", "pooler_forward", "pooler_backward", "tagger_forward", "tagger_backward"]


def token_count(m: np.ndarray) -> np.ndarray:
    """The one pooling rule: the number of real tokens per row, floored at 1. m (B, n) of 0/1 → (B, 1).

    For a 0/1 mask this is Σ_i m_i whenever a row has a token (sentence-transformers' clamp at 1e-9 gives the
    same numbers), and a fully padded row pools to 0 instead of 0/0. Used by :func:`mean_pool_forward` and by
    :func:`transformer_np.io.pretrained.pool`.
    """
    return np.maximum(m.sum(axis=1, keepdims=True), m.dtype.type(1))   # (B, 1)


def mean_pool_forward(H: np.ndarray, attention_mask: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """Attention-mask mean pooling (what sentence-transformers does). H (B, n, d) → (B, d)."""
    as_float_array(H, "H", ndim=3, finite=False)
    B, n, _ = H.shape
    if attention_mask is None:
        m = np.ones((B, n), dtype=H.dtype)
    else:
        m = validate_attention_mask(attention_mask, (B, n)).astype(H.dtype)
    count = token_count(m)                                           # (B, 1)
    w = m / count                                                    # (B, n) pooling weights
    pooled = np.einsum("bn,bnd->bd", w, H)                           # (B, d)
    return pooled, {"kind": "mean_pool", "w": w, "shape": H.shape}


def mean_pool_backward(dpooled: np.ndarray, cache: dict) -> np.ndarray:
    """dH_bi = w_bi · dpooled_b."""
    check_cache(cache, "cache", "mean_pool")
    B, n, d = cache["shape"]
    check_dout(dpooled, "dpooled", (B, d))
    return cache["w"][:, :, None] * dpooled[:, None, :]              # (B, n, d)


def _cls(H: np.ndarray) -> np.ndarray:
    as_float_array(H, "H", ndim=3, finite=False)
    return H[:, 0, :]                                                # (B, d)


def _scatter_cls(dcls: np.ndarray, shape) -> np.ndarray:
    dH = np.zeros(shape, dtype=dcls.dtype)
    dH[:, 0, :] = dcls                                               # only position 0 is read
    return dH


def _check_head(H: np.ndarray, W, b, square: bool = False) -> None:
    """The head's W must read H's width d: (d, C), and b must be (C,)."""
    as_float_array(H, "H", ndim=3, finite=False)
    as_float_array(W, "W", ndim=2, dtype=H.dtype, finite=False)
    as_float_array(b, "b", ndim=1, dtype=H.dtype, finite=False)
    d = H.shape[-1]
    if W.shape[0] != d or (square and W.shape[1] != d):
        want = f"({d}, {d})" if square else f"({d}, C)"
        raise ValueError(f"W must have shape {want} to read H of width d = {d}, got shape {W.shape}")
    if b.shape != (W.shape[1],):
        raise ValueError(f"b must have shape ({W.shape[1]},) to match W {W.shape}, got shape {b.shape}")


def cls_classifier_forward(H: np.ndarray, W: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, dict]:
    """logits = H[:, 0] W + b: a linear classifier on the [CLS] position. W (d, C), b (C,)."""
    _check_head(H, W, b)
    logits, lc = linear_forward(_cls(H), W, b)                       # (B, C)
    return logits, {"kind": "cls_classifier", "lin": lc, "shape": H.shape}


def cls_classifier_backward(dlogits: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns ``(dH, dW, db)``; dH is zero except at position 0."""
    check_cache(cache, "cache", "cls_classifier")
    dcls, dW, db = linear_backward(dlogits, cache["lin"])
    return _scatter_cls(dcls, cache["shape"]), dW, db


def pooler_forward(H: np.ndarray, W: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, dict]:
    """BERT's pooler: tanh(H[:, 0] W + b), (B, d)."""
    _check_head(H, W, b, square=True)
    z, lc = linear_forward(_cls(H), W, b)
    t = np.tanh(z)
    return t, {"kind": "pooler", "lin": lc, "t": t, "shape": H.shape}


def pooler_backward(dout: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tanh' = 1 − tanh². Returns ``(dH, dW, db)``."""
    check_cache(cache, "cache", "pooler")
    check_dout(dout, "dout", cache["t"].shape)
    dz = dout * (1.0 - cache["t"] * cache["t"])
    dcls, dW, db = linear_backward(dz, cache["lin"])
    return _scatter_cls(dcls, cache["shape"]), dW, db


def tagger_forward(H: np.ndarray, W: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, dict]:
    """Per-token logits H W + b: (B, n, d) → (B, n, C)."""
    _check_head(H, W, b)
    logits, lc = linear_forward(H, W, b)
    return logits, {"kind": "tagger", "lin": lc}


def tagger_backward(dlogits: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns ``(dH, dW, db)``."""
    check_cache(cache, "cache", "tagger")
    return linear_backward(dlogits, cache["lin"])
