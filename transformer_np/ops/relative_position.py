r"""MPNet's relative position bias: a learned scalar per (head, bucket of j − i), added to the scores.

MPNet (Song et al. 2020, as T5) keeps BERT's absolute position table and adds, inside every layer's
attention, a bias that depends on the signed distance r = j − i between query i and key j only:

    S[b, h, i, j] = q_i · k_j / √d_k + P[h, i, j] + M[b, j],      P[h, i, j] = T[bucket(j − i), h]

with T (K, h) one table shared by every layer (HF: ``encoder.relative_attention_bias``, K =
``relative_attention_num_buckets`` rows). The buckets (Hugging Face's ``relative_position_bucket``,
``num_buckets`` = 32, ``max_distance`` = 128 — fixed there whatever the config says): half of the
buckets for keys before the query (r < 0), half for keys at or after it; within a half, with
n = |r| and E = num_buckets / 4 exact buckets,

    bucket = n                                                               if n < E
    bucket = min(E + ⌊ln(n / E) / ln(max_distance / E) · E⌋, num_buckets/2 − 1)   otherwise

plus num_buckets / 2 when r > 0 (HF computes n = −r and offsets n < 0). The logarithm is taken in
float32, as HF does (``n.float()``), so that the integer buckets are HF's exactly
(``tests/ops/test_relative_position.py`` checks every distance up to ±5000).

Backward. P[h, i, j] is a lookup T[bucket(i, j), h] broadcast over the batch, so its gradient is a
scatter-add over every (b, i, j) that read the row:

    dT[k, h] = Σ_{b, i, j : bucket(i, j) = k} dP[b, h, i, j]

(the attention's dS, :func:`transformer_np.ops.attention_bias.biased_attention_backward`); a stack
sums it over its layers, which share T.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import as_float_array, as_int_array, check_cache, check_int
from ..errors import InputValueError

__all__ = ["relative_position_bucket", "relative_position_bias_forward", "relative_position_bias_backward",
           "MPNET_NUM_BUCKETS", "MPNET_MAX_DISTANCE"]

MPNET_NUM_BUCKETS = 32       # HF's MPNetEncoder.compute_position_bias default (not the config's field)
MPNET_MAX_DISTANCE = 128


def relative_position_bucket(relative_position, num_buckets: int = MPNET_NUM_BUCKETS,
                             max_distance: int = MPNET_MAX_DISTANCE) -> np.ndarray:
    """The bucket of each signed distance r = j − i (integers, any shape) → int64, same shape."""
    r = as_int_array(relative_position, "relative_position")
    check_int(num_buckets, "num_buckets", minimum=4)
    check_int(max_distance, "max_distance", minimum=num_buckets // 4 + 1)
    n = -r
    half = num_buckets // 2
    ret = (n < 0).astype(np.int64) * half                    # keys after the query: the upper half
    n = np.abs(n)
    exact = half // 2
    big = np.maximum(n, exact).astype(np.float32)            # the log branch only where n ≥ E (no log 0)
    scale = np.float32(math.log(max_distance / exact))
    log_part = (np.log(big / np.float32(exact)) / scale * np.float32(half - exact)).astype(np.int64)  # ⌊·⌋, ≥ 0
    large = np.minimum(exact + log_part, half - 1)
    return ret + np.where(n < exact, n, large)               # same shape as r


def _relative_position_bias_forward(table: np.ndarray, n: int, num_buckets: int,
                                    max_distance: int) -> tuple[np.ndarray, dict]:
    pos = np.arange(n)
    bucket = relative_position_bucket(pos[None, :] - pos[:, None], num_buckets, max_distance)   # (n, n) j − i
    P = table[bucket]                                        # (n, n, h)
    P = P.transpose(2, 0, 1)[None]                           # (1, h, n, n) broadcast over the batch
    return P, {"kind": "relative_position_bias", "bucket": bucket, "table_shape": table.shape,
               "dtype": table.dtype}


def _relative_position_bias_backward(dP: np.ndarray, cache: dict) -> np.ndarray:
    """dT[k, h] = Σ_{b, i, j: bucket = k} dP[b, h, i, j] (the module docstring)."""
    bucket, (K, h) = cache["bucket"], cache["table_shape"]
    dP = dP.sum(axis=0)                                      # (h, n, n) the batch's share of one P
    dT = np.zeros((K, h), dtype=cache["dtype"])              # (K, h)
    np.add.at(dT, bucket.reshape(-1), dP.reshape(h, -1).T)   # repeated buckets accumulate
    return dT


def relative_position_bias_forward(table: np.ndarray, n: int, num_buckets: int = MPNET_NUM_BUCKETS,
                                   max_distance: int = MPNET_MAX_DISTANCE) -> tuple[np.ndarray, dict]:
    """P (1, h, n, n) for a sequence of ``n`` tokens from the table T (K, h); ``(P, cache)``.

    The table must have a row for every bucket the distances of ``n`` tokens reach."""
    as_float_array(table, "table", ndim=2)
    check_int(n, "n", minimum=1)
    top = int(relative_position_bucket(np.arange(-(n - 1), n), num_buckets, max_distance).max())
    if top >= table.shape[0]:
        raise InputValueError(f"table has {table.shape[0]} rows, but {n} tokens reach bucket {top} "
                              f"(num_buckets = {num_buckets}): it needs at least {top + 1} rows")
    return _relative_position_bias_forward(table, n, num_buckets, max_distance)


def relative_position_bias_backward(dP: np.ndarray, cache: dict) -> np.ndarray:
    """dT (K, h) from dP of shape (B, h, n, n) (or (1, h, n, n)): the scatter-add of the docstring."""
    check_cache(cache, "cache", "relative_position_bias")
    n, h = cache["bucket"].shape[0], cache["table_shape"][1]
    dP = as_float_array(dP, "dP", ndim=4)
    if dP.shape[1:] != (h, n, n):
        raise InputValueError(f"dP must have shape (B, h, n, n) = (B, {h}, {n}, {n}), got shape {dP.shape}")
    return _relative_position_bias_backward(dP, cache)

