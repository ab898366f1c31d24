r"""Softmax cross-entropy with an ignore index.

For logits z (..., C) and integer labels y (...), over the K positions whose label is
not ``ignore_index``:
    L = −(1/K) Σ_k log softmax(z_k)[y_k]
      = (1/K) Σ_k ( logsumexp(z_k) − z_k[y_k] )
    ∂L/∂z_k = (softmax(z_k) − onehot(y_k)) / K,   and 0 at ignored positions.

logsumexp is computed stably (max subtracted). If every position is ignored, K = 0:
the loss is defined as 0 with zero gradient (PyTorch would return NaN).
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, as_int_array, check_cache, check_int
from ..ops.softmax import softmax

__all__ = ["cross_entropy_forward", "cross_entropy_backward"]


def cross_entropy_forward(logits: np.ndarray, labels: np.ndarray, ignore_index: int = -100
                          ) -> tuple[float, dict]:
    """Mean cross-entropy over non-ignored positions. logits (..., C), labels (...)."""
    as_float_array(logits, "logits")  # NaN/inf logits would give a NaN loss: refuse them here
    labels = as_int_array(labels, "labels")
    check_int(ignore_index, "ignore_index")
    if logits.ndim < 1 or labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels must have shape {logits.shape[:-1]} (logits without the class axis), "
                         f"got shape {labels.shape}")
    C = logits.shape[-1]
    keep = labels != ignore_index
    bad = keep & ((labels < 0) | (labels >= C))
    if bad.any():
        raise ValueError(f"labels must lie in [0, {C - 1}] or equal ignore_index = {ignore_index}, "
                         f"got {int(labels[bad].flat[0])}")
    K = int(keep.sum())
    z = logits - logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1))                               # (...)
    safe = np.where(keep, labels, 0)
    picked = np.take_along_axis(z, safe[..., None], axis=-1)[..., 0]    # (...)
    per_pos = np.where(keep, lse - picked, 0.0)
    loss = float(per_pos.sum() / K) if K else 0.0
    return loss, {"kind": "cross_entropy", "logits": logits, "labels": safe, "keep": keep, "K": K}


def cross_entropy_backward(dloss: float = 1.0, cache: dict | None = None) -> np.ndarray:
    """dlogits = dloss · (softmax(z) − onehot(y)) / K at kept positions, 0 elsewhere."""
    check_cache(cache, "cache", "cross_entropy")
    if isinstance(dloss, np.ndarray):
        if dloss.size != 1:
            raise ValueError(f"dloss must be a scalar, got shape {dloss.shape}")
        dloss = float(dloss.reshape(()))
    if isinstance(dloss, bool) or not isinstance(dloss, (int, float, np.integer, np.floating)):
        raise TypeError(f"dloss must be a number (the upstream gradient of the scalar loss), got {dloss!r}")
    if not np.isfinite(dloss):
        raise ValueError(f"dloss must be finite, got {dloss}")
    logits, labels, keep, K = cache["logits"], cache["labels"], cache["keep"], cache["K"]
    if K == 0:
        return np.zeros_like(logits)
    g = softmax(logits)
    np.put_along_axis(g, labels[..., None], np.take_along_axis(g, labels[..., None], axis=-1) - 1.0, axis=-1)
    g *= (keep[..., None] * (float(dloss) / K)).astype(logits.dtype)
    return g
