"""The fast attention's head-by-head training loops against the plain path, with several row blocks per head.

Without attention dropout the forward and the backward go head by head, by blocks of one head's query rows
(:func:`transformer_np.fast.blocks._head_blocks`); the row sums come from the P [V | 1] product and
dA − D from the [dO | −D] [V | 1]ᵀ product. Forced small blocks here (the last one partial), n_q ≠ n_k,
d_k = 12 (1/√d_k on the scores) and 16 (on Q), masks, stored and recomputed A, with and without attention
dropout (the rows-across-heads loop): O, A and every gradient within ``assert_paths_close`` of the plain path.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import assert_paths_close, attention_mask_case
from transformer_np import fast
from transformer_np.fast import attention as fast_attention
from transformer_np.fast import blocks as _attention_blocks
from transformer_np.ops import kernels as plain


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask_kind", ["none", "padding", "full"])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("d_k", [12, 16])
@pytest.mark.parametrize("ones", [True, False])
def test_blocked_training_attention_agrees_with_plain(monkeypatch, dtype, mask_kind, p, d_k, ones):
    """``ones``: the row sums from P [V | 1] and dA − D from [dO | −D] [V | 1]ᵀ (_ONES_MIN lowered to 1),
    or by passes over the block (_ONES_MIN out of reach)."""
    r = np.random.default_rng(31)
    B, h, n_q, n_k, d_v = 2, 3, 29, 37, 5                    # n_k ≥ 2·d_v: the D rule applies
    monkeypatch.setattr(fast_attention, "_ONES_MIN", 1 if ones else 10**9)
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", 6 * n_k)   # 6 rows of one head per block: 5 a head
    assert len(_attention_blocks._head_blocks((B, h), n_q, n_k)) == B * h * 5
    Q = r.standard_normal((B, h, n_q, d_k)).astype(dtype)
    K = r.standard_normal((B, h, n_k, d_k)).astype(dtype)
    V = r.standard_normal((B, h, n_k, d_v)).astype(dtype)
    dO = r.standard_normal((B, h, n_q, d_v)).astype(dtype)
    mask = attention_mask_case(mask_kind, B, n_q, n_k, dtype, r)
    Op, cp = plain.attention_forward(Q, K, V, mask, p, p > 0, np.random.default_rng(1))
    gp = plain.attention_backward(dO, cp)
    k = max(n_k, n_q, d_k)                                   # the longest reduction (dK sums over the n_q rows)
    for store in (True, False):
        Of, cf = fast.attention_forward(Q, K, V, mask, p, p > 0, np.random.default_rng(1), store_attention=store)
        assert_paths_close(Of, Op, k=k, paths=(f"fast O (store={store})", "plain O"))
        assert_paths_close(fast.attention_weights(cf), cp["weights"], k=k, paths=(f"fast A (store={store})", "plain A"))
        gf = fast.attention_backward(dO, cf)
        scale = max(float(np.abs(g).max()) for g in gp)      # the floor of gradcheck (small gradients)
        for name, a, b in zip("QKV", gf, gp):
            assert a.dtype == dtype
            assert_paths_close(a, b, k=k, scale=scale, paths=(f"fast d{name} (store={store})", f"plain d{name}"))


@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("ones", [True, False])
def test_short_rows_keep_the_plain_softmax_backward(monkeypatch, store, ones):
    """Rows of fewer than 2·d_v keys: ⟨dA, A⟩ per row from the block (no D, no fold), several blocks a head."""
    r = np.random.default_rng(32)
    B, h, n_q, n_k, d_k, d_v = 2, 2, 13, 5, 4, 6
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", 4 * n_k)
    monkeypatch.setattr(fast_attention, "_ONES_MIN", 0 if ones else 10**9)   # 0: even rows of < d_v keys
    Q = r.standard_normal((B, h, n_q, d_k))
    K = r.standard_normal((B, h, n_k, d_k))
    V = r.standard_normal((B, h, n_k, d_v))
    dO = r.standard_normal((B, h, n_q, d_v))
    mask = attention_mask_case("padding", B, n_q, n_k, np.float64, r)
    Op, cp = plain.attention_forward(Q, K, V, mask)
    gp = plain.attention_backward(dO, cp)
    Of, cf = fast.attention_forward(Q, K, V, mask, store_attention=store)
    assert_paths_close(Of, Op, k=n_q, paths=("fast O", "plain O"))
    scale = max(float(np.abs(g).max()) for g in gp)
    for name, a, b in zip("QKV", fast.attention_backward(dO, cf), gp):
        assert_paths_close(a, b, k=n_q, scale=scale, paths=(f"fast d{name}", f"plain d{name}"))


@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("ones", [True, False])
def test_short_heads_go_several_to_a_block(monkeypatch, store, ones):
    """Heads smaller than a block go whole, several per block (MiniLM: 16 × 16 scores a head): blocks of
    2 batch entries × 3 heads, blocks of 2 of 3 heads (the last one partial), every head in one block."""
    r = np.random.default_rng(33)
    B, h, n, d_k = 4, 3, 6, 4
    Q, K, V, dO = (r.standard_normal((B, h, n, d_k)) for _ in range(4))
    mask = attention_mask_case("full", B, n, n, np.float64, r)
    monkeypatch.setattr(fast_attention, "_ONES_MIN", 1 if ones else 10**9)
    Op, cp = plain.attention_forward(Q, K, V, mask)
    gp = plain.attention_backward(dO, cp)
    scale = max(float(np.abs(g).max()) for g in gp)
    for heads, layout, count in ((6, (0, 2, n), 2), (2, (1, 2, n), 8), (12, (0, 4, n), 1)):
        monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", heads * n * n)
        assert _attention_blocks._block_layout((B, h), n, n) == layout
        assert len(_attention_blocks._head_blocks((B, h), n, n)) == count
        Of, cf = fast.attention_forward(Q, K, V, mask, store_attention=store)
        assert_paths_close(Of, Op, k=n, paths=(f"fast O ({heads} heads a block)", "plain O"))
        assert_paths_close(fast.attention_weights(cf), cp["weights"], k=n, paths=("fast A", "plain A"))
        for name, a, b in zip("QKV", fast.attention_backward(dO, cf), gp):
            assert_paths_close(a, b, k=n, scale=scale, paths=(f"fast d{name} ({heads} heads)", f"plain d{name}"))
        Oi, ci = fast.attention_forward(Q, K, V, mask, store_attention=store, for_backward=False)
        assert_paths_close(Oi, Op, k=n, paths=(f"inference O ({heads} heads a block)", "plain O"))


@pytest.mark.parametrize("store", [True, False])
def test_pool_threads_do_not_change_training_results(store):
    """Blocks of ≥ _POOL_MIN elements split their passes (exp, 1/ℓ, dS, the recomputed exp) over the pool:
    1 and 2 pool threads give the same bits (the same operations per element, the same BLAS calls)."""
    r = np.random.default_rng(34)
    Q, K, V, dO = (r.standard_normal((2, 2, 200, 16)).astype(np.float32) for _ in range(4))
    mask = attention_mask_case("full", 2, 200, 200, np.float32, r)
    assert 200 * 200 * 4 >= _attention_blocks._POOL_MIN              # one block of every head, on the pool
    runs = []
    before = fast.get_num_threads()
    try:
        for threads in (1, 2):
            fast.set_num_threads(threads)
            O, c = fast.attention_forward(Q, K, V, mask, store_attention=store)
            runs.append((O, fast.attention_weights(c)) + fast.attention_backward(dO, c))
    finally:
        fast.set_num_threads(before)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)   # exact: elementwise passes moved between threads, nothing else


def test_the_patched_block_constants_are_bound_only_where_they_are_read():
    """The tests set _BLOCK_SCORES, _SPLIT_MIN_FLOPS and _POOL_MIN on ``_attention_blocks``, whose functions read
    them at call time. A copy bound in another ops module (``from ._attention_blocks import _BLOCK_SCORES``) would
    be a second place to patch, where a patch changes nothing: each must be bound in that one module."""
    import importlib
    import pkgutil

    import transformer_np.fast as ops

    modules = [importlib.import_module(f"transformer_np.fast.{m.name}") for m in pkgutil.iter_modules(ops.__path__)]
    for name in ("_BLOCK_SCORES", "_SPLIT_MIN_FLOPS", "_POOL_MIN"):
        assert [m.__name__ for m in modules if name in vars(m)] == ["transformer_np.fast.blocks"], name
