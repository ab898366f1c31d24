"""The fast attention's inference forward (``for_backward=False``) against the plain path.

Inference runs the loop of :func:`transformer_np.fast.attention._forward_heads` and keeps nothing for a
backward: blocks of heads or of one head's rows; for rows of ≥ _ONES_MIN·d_v keys the row sums from the A V
product with a column of ones appended to V and the normalisation deferred to the (n_q, d_v) result; A (when
stored) scaled by 1/ℓ in place. Here it is
held to the plain path (``assert_paths_close``, k = the longest reduction: n_k keys or d_k) on random
shapes with masks, on several row blocks per head, on long rows where the max subtraction is skipped,
fully masked rows, huge logits, one key, and a strided ``out=``; with attention dropout in training it
takes the training forward's path.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import assert_paths_close, attention_mask_case
from transformer_np import fast
from transformer_np.fast import attention as fast_attention
from transformer_np.fast import blocks as _attention_blocks
from transformer_np.ops import kernels as plain

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
DTYPES = st.sampled_from([np.float64, np.float32])




def _check(Q, K, V, mask, store: bool, what: str = "") -> tuple[np.ndarray, np.ndarray | None]:
    """Inference O (and A when stored) against the plain forward; returns them."""
    Op, cp = plain.attention_forward(Q, K, V, mask)
    k = max(K.shape[-2], Q.shape[-1])                        # the longest reduction: n_k keys or d_k
    O, c = fast.attention_forward(Q, K, V, mask, store_attention=store, for_backward=False)
    assert O.dtype == Q.dtype and O.shape == Op.shape
    assert set(c) == {"kind", "weights", "for_backward"}
    assert_paths_close(O, Op, k=k, paths=("inference O", "plain O"))
    if store:
        assert c["weights"].dtype == Q.dtype
        assert_paths_close(c["weights"], cp["weights"], k=k, paths=("inference A", "plain A"))
    else:
        assert c["weights"] is None
    return O, c["weights"]


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.integers(1, 6),
       st.integers(1, 6), st.sampled_from(["none", "padding", "full"]), DTYPES, st.booleans(), st.integers(0, 2**16))
def test_inference_forward_agrees_with_plain(B, h, n_q, n_k, d_k, d_v, mask_kind, dtype, store, seed):
    r = np.random.default_rng(seed)
    Q = r.standard_normal((B, h, n_q, d_k)).astype(dtype)
    K = r.standard_normal((B, h, n_k, d_k)).astype(dtype)
    V = r.standard_normal((B, h, n_k, d_v)).astype(dtype)
    _check(Q, K, V, attention_mask_case(mask_kind, B, n_q, n_k, dtype, r), store)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask_kind", ["none", "padding", "full"])
@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("ones", [True, False])
def test_several_row_blocks_per_head(monkeypatch, dtype, mask_kind, store, ones):
    """Blocks of 7 query rows (the last one partial) with a mask that differs row by row, n_q ≠ n_k,
    d_k = 12 (1/√d_k not folded into Q) and d_k = 16 (folded)."""
    r = np.random.default_rng(5)
    n_q, n_k = 31, 23
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", 7 * n_k)
    monkeypatch.setattr(fast_attention, "_ONES_MIN", 1 if ones else 10**9)   # ℓ from P [V | 1], or a sum pass
    for d_k in (12, 16):
        Q = r.standard_normal((2, 3, n_q, d_k)).astype(dtype)
        K = r.standard_normal((2, 3, n_k, d_k)).astype(dtype)
        V = r.standard_normal((2, 3, n_k, 5)).astype(dtype)
        _check(Q, K, V, attention_mask_case(mask_kind, 2, n_q, n_k, dtype, r), store, f"d_k={d_k}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask_kind", ["none", "padding", "full"])
def test_long_rows_skip_the_max_and_agree(dtype, mask_kind):
    r = np.random.default_rng(21)
    B, h, n, d_k = 2, 2, 256, 16                             # past _SKIP_MIN_SCORES: the bound is used
    Q, K, V = (r.standard_normal((B, h, n, d_k)).astype(dtype) for _ in range(3))
    mask = attention_mask_case(mask_kind, B, n, n, dtype, r)
    safe = fast_attention._no_max_rows(Q, K, V, mask, np.sqrt(d_k))
    assert safe is not None and safe.all()                   # every row skips the max subtraction
    for store in (True, False):
        _check(Q, K, V, mask, store)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fully_masked_rows_stay_uniform(dtype):
    """Batch 0 has every key masked (finfo.min): those rows keep the max subtraction (the bound fails)
    and come out uniform like the plain path's; nothing is NaN."""
    r = np.random.default_rng(23)
    B, h, n, d_k = 2, 2, 192, 16
    Q, K, V = (r.standard_normal((B, h, n, d_k)).astype(dtype) for _ in range(3))
    mask = np.zeros((B, 1, 1, n), dtype=dtype)
    mask[0] = np.finfo(dtype).min
    O, A = _check(Q, K, V, mask, True)
    assert np.all(np.isfinite(O))
    assert_paths_close(A[0], np.full_like(A[0], 1.0 / n), k=n, paths=("inference A", "uniform 1/n"))
    _check(Q, K, V, mask, False)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_huge_logits_keep_the_max(dtype):
    r = np.random.default_rng(25)
    Q, K, V = (r.standard_normal((1, 2, 128, 16)) for _ in range(3))
    Q *= 1e3                                                 # |s| up to ~1e4: far past exp's range
    Q, K, V = (a.astype(dtype) for a in (Q, K, V))
    assert not fast_attention._no_max_rows(Q, K, V, None, 4.0).any()
    for store in (True, False):
        O, _ = fast.attention_forward(Q, K, V, store_attention=store, for_backward=False)
        Op, _ = plain.attention_forward(Q, K, V)
        assert np.all(np.isfinite(O))
        # exp turns the scores' rounding (relative eps on |s| ~ 1e4) into a relative error of the weights
        s_max = float(np.abs(Q.astype(np.float64) @ K.astype(np.float64).swapaxes(-1, -2)).max() / 4)
        assert_paths_close(O, Op, k=128, c=16 * (1 + s_max / np.sqrt(128)), paths=("inference O", "plain O"))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("store", [True, False])
def test_one_key_gives_weight_one_exactly(dtype, store):
    r = np.random.default_rng(26)
    Q, K, V = (r.standard_normal((2, 3, 1, 4)).astype(dtype) for _ in range(3))
    O, c = fast.attention_forward(Q, K, V, store_attention=store, for_backward=False)
    # exact: one key's exp(s − s) = 1 is its own row sum ℓ = 1·1; A = 1·(1/1) = 1 and O = (1·v)/1 = v
    np.testing.assert_array_equal(O, V)
    if store:
        np.testing.assert_array_equal(c["weights"], np.ones((2, 3, 1, 1), dtype=dtype))   # exact: as above


@pytest.mark.parametrize("store", [True, False])
def test_out_receives_o_through_a_strided_view(store):
    """``out=`` as mha_forward passes it: the heads' (B, h, n, d_k) view of a (B, n, d) context."""
    r = np.random.default_rng(7)
    B, h, n, d_k = 2, 3, 11, 4
    Q, K, V = (r.standard_normal((B, h, n, d_k)) for _ in range(3))
    ctx = np.full((B, n, h * d_k), np.nan)
    heads = ctx.reshape(B, n, h, d_k).transpose(0, 2, 1, 3)
    O, _ = fast.attention_forward(Q, K, V, store_attention=store, for_backward=False, out=heads)
    assert O is heads and np.all(np.isfinite(ctx))
    assert_paths_close(heads, plain.attention_forward(Q, K, V)[0], k=n, paths=("inference out=", "plain O"))


def test_dropout_in_training_takes_the_training_path():
    """Attention dropout with ``training=True`` and ``for_backward=False``: the training forward's
    loop, the same generator calls, so the same O as the training forward with a generator seeded alike."""
    r = np.random.default_rng(8)
    Q, K, V = (r.standard_normal((2, 2, 9, 4)) for _ in range(3))
    for store in (True, False):
        O_t, _ = fast.attention_forward(Q, K, V, None, 0.3, True, np.random.default_rng(1), store_attention=store)
        O_i, c = fast.attention_forward(Q, K, V, None, 0.3, True, np.random.default_rng(1), store_attention=store,
                                        for_backward=False)
        # exact: the same function on the same arrays with generators seeded alike, in one process
        np.testing.assert_array_equal(O_i, O_t)
        assert set(c) == {"kind", "weights", "for_backward"}


def test_threads_do_not_change_the_result():
    """The exp and 1/ℓ passes split a block's rows over the threads: every element is computed by the
    same operations whichever thread runs it."""
    r = np.random.default_rng(9)
    Q, K, V = (r.standard_normal((2, 2, 300, 16)).astype(np.float32) for _ in range(3))
    mask = attention_mask_case("full", 2, 300, 300, np.float32, r)
    before = fast.get_num_threads()
    try:
        fast.set_num_threads(1)
        O1, c1 = fast.attention_forward(Q, K, V, mask, for_backward=False)
        fast.set_num_threads(2)
        O2, c2 = fast.attention_forward(Q, K, V, mask, for_backward=False)
    finally:
        fast.set_num_threads(before)
    np.testing.assert_array_equal(O1, O2)                   # exact: same BLAS calls, elementwise passes per row
    np.testing.assert_array_equal(c1["weights"], c2["weights"])   # exact: as above
