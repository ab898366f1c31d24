r"""Inverted dropout with an explicit random generator.

Training:  keep each entry with probability 1 − p and scale survivors by 1/(1 − p),
           out = x ⊙ m,  m_i ∈ {0, 1/(1−p)},  so E[out] = x.
Eval:      out = x (identity) — no rescaling needed at inference, which is why the
           scaling is done at training time ("inverted").
Backward:  dx = dout ⊙ m.

There is no hidden global RNG: the caller passes a ``numpy.random.Generator``, so the
same seed gives the same mask (gradient checks rely on this, and so does the test that the
plain and fast paths agree: both draw the same masks in the same order).
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, check_bool, check_cache, check_dout, check_float, check_rng

__all__ = ["dropout_forward", "dropout_backward"]


# ----------------------------------------------------------------------------- the computation
def _dropout_forward(x: np.ndarray, p: float, training: bool, rng) -> tuple[np.ndarray, dict]:
    if not training or p == 0.0:
        return x, {"kind": "dropout", "mask": None, "shape": x.shape}
    keep = rng.random(x.shape) >= p                          # P(keep) = 1 - p
    mask = keep.astype(x.dtype) * (1.0 / (1.0 - float(p)))   # 0 or 1/(1-p), in x's dtype
    return x * mask, {"kind": "dropout", "mask": mask, "shape": x.shape}


def _dropout_backward(dout: np.ndarray, cache: dict) -> np.ndarray:
    return dout if cache["mask"] is None else dout * cache["mask"]


# ----------------------------------------------------------------------------- the public API
def dropout_forward(x: np.ndarray, p: float, training: bool,
                    rng: np.random.Generator | None = None) -> tuple[np.ndarray, dict]:
    """Returns ``(out, cache)``. ``rng`` is required when ``training`` and ``p > 0``."""
    as_float_array(x, "x")
    check_float(p, "p (dropout probability)", 0.0, 1.0, max_inclusive=False)
    check_bool(training, "training")
    if training and p > 0.0:
        check_rng(rng)
    return _dropout_forward(x, p, training, rng)


def dropout_backward(dout: np.ndarray, cache: dict) -> np.ndarray:
    """dx = dout ⊙ m (identity at eval)."""
    check_cache(cache, "cache", "dropout")
    check_dout(dout, "dout", cache["shape"])
    return _dropout_backward(dout, cache)
