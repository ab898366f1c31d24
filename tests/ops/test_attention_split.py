"""The attention core's blocks split over threads (``_shard_blocks`` in fast/blocks.py, run by
fast/attention.py's ``_in_shards``).

Without attention dropout, the forward (``_forward_heads``: training or inference, A stored or not) and
``attention_backward`` give their blocks of heads (``_head_blocks``) to ``get_batch_threads()`` threads in
consecutive parts, the row blocks of one head always in the same part (the backward accumulates dK and dV
over a head's row blocks, in order), each thread with its own scratch buffers. Here:

* ``_shard_blocks``'s parts: in order they are ``_head_blocks``, no head (``ix``) in two parts, at most one part
  per thread, nearly equal; one part when threads < 2, a single block or group, or under ``_SPLIT_MIN_FLOPS``;
* split vs not split (``set_batch_threads(1)``) vs the plain path: O, A, dQ, dK, dV to round-off
  (assert_paths_close), A stored or recomputed, training or inference, float32 and float64, masks none,
  per-sequence padding, per-head random and causal, heads of several row blocks and blocks of several heads;
* each part its own scratch (the parts in lockstep at every block's pass) and the parts independent of their
  order (run last first);
* ``weights_out=`` filled by the parts;
* attention dropout in training: the forward is not split (one random stream: exact), the backward is;
* a whole encoder layer's forward and backward in training (the bench's fwd+bwd path), split vs not;
* an exception in a part propagates, with BLAS's thread counts restored.

Small shapes split only because ``_SPLIT_MIN_FLOPS`` is set to 0 (fixture ``small_splits``) and have several
blocks only because ``_BLOCK_SCORES`` is lowered. Splitting needs threadpoolctl (fixture ``tpc``).
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import transformer_np as tnp
from helpers import assert_paths_close, nontrivial_params, spy_split_counts
from transformer_np import fast
from transformer_np.fast import attention as fast_attention
from transformer_np.fast import blocks as _attention_blocks
from transformer_np.fast import threads as _threads
from transformer_np.model import encoder
from transformer_np.model.params import sub_params
from transformer_np.ops import kernels as plain

DTYPES = (np.float32, np.float64)
pytestmark = pytest.mark.usefixtures("fast_thread_defaults")   # (tests/conftest.py)


@pytest.fixture
def small_splits(monkeypatch):
    """The tests' small attentions are split (the real threshold keeps those under 2**24 flops whole)."""
    monkeypatch.setattr(_attention_blocks, "_SPLIT_MIN_FLOPS", 0)


@pytest.fixture
def split_calls(monkeypatch):
    """The part counts the attention core ran (a spy on fast_attention._in_shards; 1: not split)."""
    return spy_split_counts(monkeypatch, fast_attention)


def _blas_counts(tpc) -> dict[str, int]:
    """Every loaded BLAS library's thread count, by file."""
    return {i["filepath"]: i["num_threads"] for i in tpc.threadpool_info() if i["user_api"] == "blas"}


# ----------------------------------------------------------------------------- _shard_blocks's parts
def _groups(blocks) -> list[str]:
    """The head (ix, by repr: an ix may hold slices) of each block, runs of one head merged."""
    heads: list[str] = []
    for ix, _ in blocks:
        if not heads or heads[-1] != repr(ix):
            heads.append(repr(ix))
    return heads


# (lead, n_q, n_k, block scores, threads, parts): heads of several row blocks, blocks of several whole heads
# (ix with a slice), uneven counts
SPLITS = [
    ((2, 4), 64, 64, 16 * 64, 2, 2),      # 8 heads of 4 row blocks: 4 heads a part
    ((2, 4), 64, 64, 16 * 64, 3, 3),      # 3 + 3 + 2 heads
    ((3, 5), 12, 12, 5 * 12, 2, 2),       # 15 heads of 3 row blocks (5, 5, 2 rows): 7 + 8 heads
    ((3, 5), 12, 12, 5 * 12, 3, 3),       # 5 heads a part
    ((3, 5), 8, 8, 2 * 64, 2, 2),         # blocks of 2, 2 and 1 heads: 9 blocks, 4 + 5
    ((2, 4), 8, 8, 4 * 64, 3, 2),         # blocks of a whole batch entry (4 heads): 2 blocks, fewer than threads
    ((2, 3), 20, 13, 7 * 13, 3, 3),       # n_q ≠ n_k: 6 heads of 3 row blocks (7, 7, 6 rows)
]


@pytest.mark.parametrize("lead,n_q,n_k,scores,threads,count", SPLITS)
def test_parts_are_the_blocks_in_order_with_each_head_in_one_part(tpc, small_splits, monkeypatch, lead, n_q, n_k,
                                                                  scores, threads, count):
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", scores)
    fast.set_batch_threads(threads)
    blocks = _attention_blocks._head_blocks(lead, n_q, n_k)
    parts = _attention_blocks._shard_blocks(lead, n_q, n_k, 8)
    assert len(parts) == count <= threads
    assert all(parts)                                         # no empty part
    assert [b for part in parts for b in part] == blocks      # consecutive, in order, nothing lost or repeated
    owner: dict[str, int] = {}
    for i, part in enumerate(parts):
        for ix, _ in part:
            assert owner.setdefault(repr(ix), i) == i, f"head {ix} in parts {owner[repr(ix)]} and {i}"
    sizes = [len(_groups(part)) for part in parts]
    assert sum(sizes) == len(_groups(blocks)) and max(sizes) - min(sizes) <= 1, sizes   # nearly equal


def test_one_head_of_many_row_blocks_is_one_part(tpc, small_splits, monkeypatch):
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", 8 * 64)
    fast.set_batch_threads(2)
    blocks = _attention_blocks._head_blocks((1,), 64, 64)
    assert len(blocks) == 8                                   # 8 row blocks, one head: one group
    assert _attention_blocks._shard_blocks((1,), 64, 64, 8) == [blocks]


def test_no_split_with_one_thread_or_one_block(tpc, small_splits, monkeypatch):
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", 16 * 64)
    fast.set_batch_threads(1)
    blocks = _attention_blocks._head_blocks((2, 4), 64, 64)
    assert _attention_blocks._shard_blocks((2, 4), 64, 64, 8) == [blocks]
    fast.set_batch_threads(2)
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", 8 * 64)   # every head (8 of 8 × 8) in one block
    single = _attention_blocks._head_blocks((2, 4), 8, 8)
    assert len(single) == 1
    assert _attention_blocks._shard_blocks((2, 4), 8, 8, 8) == [single]


def test_no_split_under_the_flops_threshold(tpc, monkeypatch):
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", 16 * 64)
    fast.set_batch_threads(2)
    lead, n, d = (2, 4), 64, 8
    blocks = _attention_blocks._head_blocks(lead, n, n)
    assert _attention_blocks._SPLIT_MIN_FLOPS > 0
    assert _attention_blocks._shard_blocks(lead, n, n, d) == [blocks]   # 2**20 flops: under the real threshold
    flops = 4 * math.prod(lead) * n * n * d                  # Q Kᵀ and A V: 2 products of 2·n·n·d flops a head
    monkeypatch.setattr(_attention_blocks, "_SPLIT_MIN_FLOPS", flops + 1)
    assert len(_attention_blocks._shard_blocks(lead, n, n, d)) == 1
    monkeypatch.setattr(_attention_blocks, "_SPLIT_MIN_FLOPS", flops)
    assert len(_attention_blocks._shard_blocks(lead, n, n, d)) == 2


def test_inside_a_shard_the_attention_is_not_split_again(tpc, small_splits, monkeypatch):
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", 16 * 64)
    fast.set_batch_threads(2)
    seen = {}
    _threads._in_shards(lambda i: seen.setdefault(i, len(_attention_blocks._shard_blocks((2, 4), 64, 64, 8))), 2)
    assert seen == {0: 1, 1: 1}


# ----------------------------------------------------------------------------- split vs not split vs plain
# (name, B, h, n, d, block scores (None: every head in one block … set from n), threads); n_k ≥ 8·d_v gives
# the ones-column products, n_k ≥ 2·d_v the D rule, shorter rows the plain softmax backward
# (block counts per part chosen so that cutting the blocks evenly would cut a head: 15 → 7 + 8, 16 → 5 + 5 + 6)
SHAPES = {
    "rows, ones column": (1, 3, 40, 4, 8 * 40, 2),        # 5 row blocks a head (8 rows): 1 + 2 heads
    "rows, D rule": (2, 2, 30, 8, 8 * 30, 3),             # 4 row blocks a head (8, 8, 8, 6 rows): 1 + 1 + 2 heads
    "heads, short rows": (3, 4, 12, 8, 2 * 144, 3),       # blocks of 2 whole heads: 6 blocks, 2 a part
}


def _mask(kind: str, B: int, h: int, n: int, dtype, r) -> np.ndarray | None:
    """An additive mask of one kind; the padding one has a different length per sequence."""
    if kind == "none":
        return None
    if kind == "padding (B,1,1,n)":
        am = np.zeros((B, n), dtype=np.int64)
        for b in range(B):
            am[b, :n - 1 - 3 * b] = 1
        return tnp.padding_mask(am, dtype)
    if kind == "random (B,h,n,n)":
        m = 0.5 * r.standard_normal((B, h, n, n))
        m[r.random(m.shape) < 0.3] = np.finfo(dtype).min
        m[..., np.arange(n), np.arange(n)] = 0.0              # every row keeps a key
        return m.astype(dtype)
    if kind == "causal (n,n)":
        return tnp.causal_mask(n, dtype)
    raise AssertionError(kind)


MASKS = ("none", "padding (B,1,1,n)", "random (B,h,n,n)", "causal (n,n)")


def _qkv(B, h, n, d, dtype, seed=0):
    r = np.random.default_rng(seed)
    return r, tuple(r.standard_normal((B, h, n, d)).astype(dtype) for _ in range(4))   # Q, K, V, dO


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_split_attention_computes_what_one_part_and_the_plain_path_compute(tpc, small_splits, split_calls,
                                                                           monkeypatch, shape, mask_kind, store,
                                                                           dtype):
    B, h, n, d, scores, threads = SHAPES[shape]
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", scores)
    r, (Q, K, V, dO) = _qkv(B, h, n, d, dtype)
    mask = _mask(mask_kind, B, h, n, dtype, r)
    k = max(n, d)                                             # the longest reduction (dK sums over the n rows)
    Op, cp = plain.attention_forward(Q, K, V, mask)
    gp = plain.attention_backward(dO, cp)
    scale = max(float(np.abs(g).max()) for g in gp)           # the floor of gradcheck (small gradients)

    def run(t: int):
        fast.set_batch_threads(t)
        O, c = fast.attention_forward(Q, K, V, mask, store_attention=store)
        A = fast.attention_weights(c)                         # recomputed (not split) from the split's m and ℓ
        w = np.full(Q.shape[:-1] + (n,), np.nan, dtype=dtype) if store else None   # every part fills its rows
        Oi, ci = fast.attention_forward(Q, K, V, mask, store_attention=store, for_backward=False, weights_out=w)
        assert ci["weights"] is w
        return O, A, fast.attention_backward(dO, c), Oi, ci["weights"]

    whole = run(1)
    assert split_calls == [1, 1, 1]
    del split_calls[:]
    split = run(threads)
    assert split_calls == [threads] * 3                       # training forward, backward, inference forward
    O, A, grads, Oi, Ai = split
    assert O.dtype == dtype and all(g.dtype == dtype for g in grads)
    for name, a, b, ref in (("O", O, whole[0], Op), ("A", A, whole[1], cp["weights"]),
                            ("inference O", Oi, whole[3], Op)):
        assert_paths_close(a, b, k=k, paths=(f"{threads} parts: {name}", f"one part: {name}"))
        assert_paths_close(a, ref, k=k, paths=(f"{threads} parts: {name}", f"plain: {name}"))
    if store:
        assert_paths_close(Ai, whole[4], k=k, paths=(f"{threads} parts: inference A", "one part: inference A"))
        assert_paths_close(Ai, cp["weights"], k=k, paths=(f"{threads} parts: inference A", "plain: A"))
    else:
        assert Ai is None and whole[4] is None
    for name, a, b, ref in zip(("dQ", "dK", "dV"), grads, whole[2], gp):
        assert_paths_close(a, b, k=k, scale=scale, paths=(f"{threads} parts: {name}", f"one part: {name}"))
        assert_paths_close(a, ref, k=k, scale=scale, paths=(f"{threads} parts: {name}", f"plain: {name}"))


# Parts in lockstep: every part waits for the others before each elementwise pass over a block (_block_pass),
# so that each part has written its block's scores (or dA) into its scratch before any part reads its own:
# parts sharing a scratch buffer then compute from another part's block, deterministically (run freely, the
# GIL mostly runs these small parts one after the other and such a race would go unseen).
LOCKSTEP = {                                                 # equal parts: as many passes in each
    "rows, ones column": (2, 2, 40, 4, 8 * 40),            # 4 heads of 5 row blocks: 2 heads a part
    "rows, D rule": (2, 2, 30, 8, 8 * 30),                 # 4 heads of 4 row blocks
    "heads, short rows": (4, 2, 12, 8, 2 * 144),           # blocks of one batch entry (2 heads): 2 a part
}


def _lockstep(monkeypatch, parties: int) -> list[int]:
    """From now on each _block_pass waits at a barrier of ``parties`` threads first; returns the threads that
    passed it (a broken barrier — a part with fewer passes — fails the test by BrokenBarrierError)."""
    barrier, real, seen = threading.Barrier(parties), fast_attention._block_pass, []

    def stepped(fn, block):
        barrier.wait(5)
        seen.append(threading.get_ident())
        real(fn, block)

    monkeypatch.setattr(fast_attention, "_block_pass", stepped)   # defined in _attention_blocks, looked up here
    return seen


@pytest.mark.parametrize("shape", list(LOCKSTEP))
@pytest.mark.parametrize("store", [True, False])
def test_parts_in_lockstep_each_use_their_own_scratch(tpc, small_splits, split_calls, monkeypatch, shape, store):
    B, h, n, d, scores = LOCKSTEP[shape]
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", scores)
    r, (Q, K, V, dO) = _qkv(B, h, n, d, np.float64, seed=4)
    mask = _mask("random (B,h,n,n)", B, h, n, np.float64, r)
    k = max(n, d)

    def run(t: int):
        fast.set_batch_threads(t)
        O, c = fast.attention_forward(Q, K, V, mask, store_attention=store)
        Oi, _ = fast.attention_forward(Q, K, V, mask, store_attention=store, for_backward=False)
        return O, fast.attention_backward(dO, c), Oi, c["weights"]

    whole = run(1)
    seen = _lockstep(monkeypatch, 2)
    split = run(2)
    assert split_calls == [1, 1, 1, 2, 2, 2]
    assert threading.get_ident() in seen and len(set(seen)) >= 2   # the caller and a pool thread ran passes
    for name, a, b in (("O", split[0], whole[0]), ("inference O", split[2], whole[2]),
                       *zip(("dQ", "dK", "dV"), split[1], whole[1])):
        assert_paths_close(a, b, k=k, paths=(f"2 parts in lockstep: {name}", f"one part: {name}"))
    if store:
        assert_paths_close(split[3], whole[3], k=k, paths=("2 parts in lockstep: A", "one part: A"))


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("store", [True, False])
def test_parts_give_the_same_results_in_reverse_order(tpc, small_splits, monkeypatch, shape, store):
    """The parts are independent: run one after the other from the last (a head cut between two parts
    would have its later row blocks added to dK and dV before its first block sets them)."""
    B, h, n, d, scores, threads = SHAPES[shape]
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", scores)
    r, (Q, K, V, dO) = _qkv(B, h, n, d, np.float64, seed=6)
    mask = _mask("padding (B,1,1,n)", B, h, n, np.float64, r)
    k = max(n, d)

    def run(t: int):
        fast.set_batch_threads(t)
        O, c = fast.attention_forward(Q, K, V, mask, store_attention=store)
        return (O, *fast.attention_backward(dO, c))

    whole = run(1)
    counts: list[int] = []

    def reversed_parts(fn, count):
        counts.append(count)
        for i in reversed(range(count)):
            fn(i)

    monkeypatch.setattr(fast_attention, "_in_shards", reversed_parts)
    backwards = run(threads)
    assert counts == [threads, threads]
    for name, a, b in zip(("O", "dQ", "dK", "dV"), backwards, whole):
        assert_paths_close(a, b, k=k, paths=(f"{threads} parts, last first: {name}", f"one part: {name}"))


# ----------------------------------------------------------------------------- attention dropout
@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_forward_is_not_split_and_its_backward_is(tpc, small_splits, split_calls, monkeypatch, store,
                                                          dtype):
    B, h, n, d, scores, _ = SHAPES["rows, D rule"]
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", scores)
    r, (Q, K, V, dO) = _qkv(B, h, n, d, dtype, seed=3)
    mask = _mask("padding (B,1,1,n)", B, h, n, dtype, r)

    def run(t: int):
        fast.set_batch_threads(t)
        O, c = fast.attention_forward(Q, K, V, mask, 0.3, True, np.random.default_rng(9), store_attention=store)
        return O, fast.attention_weights(c), c, fast.attention_backward(dO, c)

    whole = run(1)
    assert split_calls == [1]                                 # the backward's; the dropout forward has no parts
    del split_calls[:]
    split = run(2)
    assert split_calls == [2]                                 # the backward is split, the forward is not
    # exact: the dropout forward (_forward_dropout) never splits, so both runs are the very same operations on
    # this thread, BLAS at the same thread count, drawing the keep mask from one random stream seeded alike
    # (parts would draw from it in an order set by the threads' timing)
    assert np.array_equal(split[0], whole[0])                  # exact: O, by the same operations (above)
    assert np.array_equal(split[1], whole[1])                  # exact: A, likewise
    keep = (lambda c: c["dropout"]["mask"]) if store else (lambda c: c["keep"])
    assert np.array_equal(keep(split[2]), keep(whole[2]))      # exact: booleans from one seeded stream
    gp = plain.attention_backward(dO, plain.attention_forward(Q, K, V, mask, 0.3, True, np.random.default_rng(9))[1])
    scale = max(float(np.abs(g).max()) for g in whole[3])
    for name, a, b in zip(("dQ", "dK", "dV"), split[3], whole[3]):
        assert_paths_close(a, b, k=max(n, d), scale=scale, paths=(f"2 parts: {name}", f"one part: {name}"))
    if store:                                                 # the plain dropout draws the same mask from the stream
        for name, a, b in zip(("dQ", "dK", "dV"), split[3], gp):
            assert_paths_close(a, b, k=max(n, d), scale=scale, paths=(f"2 parts: {name}", f"plain: {name}"))


# ----------------------------------------------------------------------------- a whole layer in training
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_training_layer_with_split_attention_computes_what_one_part_computes(tpc, small_splits, split_calls,
                                                                              monkeypatch, norm, store, dtype):
    B, n, D, heads, FF = 2, 32, 32, 4, 64
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", 8 * n)   # 4 row blocks a head
    cfg = tnp.EncoderConfig(n_layers=1, d_model=D, n_heads=heads, d_ff=FF, dropout=0.0, norm_position=norm)
    p = sub_params(nontrivial_params(cfg, 0, dtype), "layers.0.")
    r = np.random.default_rng(1)
    x = r.standard_normal((B, n, D)).astype(dtype)
    dout = r.standard_normal((B, n, D)).astype(dtype)
    mask = _mask("padding (B,1,1,n)", B, heads, n, dtype, r)

    def run(t: int, fast_path: bool = True):
        fast.set_batch_threads(t)
        y, c = encoder.encoder_layer_forward(x, p, cfg, mask, training=True, rng=np.random.default_rng(2),
                                             fast=fast_path, store_attention=store or not fast_path)
        return y, encoder.encoder_layer_backward(dout, c)

    whole = run(1)
    plain_ = run(1, fast_path=False)                         # (the plain path always stores A)
    del split_calls[:]
    split = run(2)
    assert split_calls == [2, 2]                              # the layer's attention forward and backward
    (y, (dx, grads)), (y1, (dx1, grads1)), (yp, (dxp, gradsp)) = split, whole, plain_
    assert y.dtype == dtype and sorted(grads) == sorted(grads1) == sorted(p)
    assert_paths_close(y, y1, k=FF, paths=("2 parts: y", "one part: y"))
    assert_paths_close(y, yp, k=FF, paths=("2 parts: y", "plain: y"))
    scale = max(float(np.abs(g).max()) for g in (dx1, *grads1.values()))
    assert_paths_close(dx, dx1, k=FF, scale=scale, paths=("2 parts: dx", "one part: dx"))
    assert_paths_close(dx, dxp, k=FF, scale=scale, paths=("2 parts: dx", "plain: dx"))
    for name in sorted(p):
        assert grads[name].dtype == dtype
        assert_paths_close(grads[name], grads1[name], k=FF, scale=scale, paths=(f"2 parts: {name}", "one part"))
        assert_paths_close(grads[name], gradsp[name], k=FF, scale=scale, paths=(f"2 parts: {name}", "plain"))


# ----------------------------------------------------------------------------- an exception in a part
class PartFailed(Exception):
    pass


def _fail_on_second_call(monkeypatch, name: str) -> list[int]:
    """fast_attention.<name> raises PartFailed on its 2nd call (from whichever part makes it)."""
    real, calls, lock = getattr(fast_attention, name), [], threading.Lock()

    def failing(*args, **kwargs):
        with lock:
            calls.append(threading.get_ident())
            nth = len(calls)
        if nth == 2:
            raise PartFailed(f"{name}: call 2")
        return real(*args, **kwargs)

    monkeypatch.setattr(fast_attention, name, failing)
    return calls


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_an_exception_in_a_part_propagates_and_blas_threads_are_restored(tpc, small_splits, split_calls,
                                                                         monkeypatch, where):
    B, h, n, d, scores, _ = SHAPES["rows, D rule"]
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", scores)
    _, (Q, K, V, dO) = _qkv(B, h, n, d, np.float64)
    fast.set_batch_threads(2)
    with tpc.threadpool_limits(3, user_api="blas"):           # a count a missing restore could not leave by chance
        before = _blas_counts(tpc)
        assert 3 in before.values()
        O, c = fast.attention_forward(Q, K, V, store_attention=False) if where == "backward" else (None, None)
        calls = _fail_on_second_call(monkeypatch, "_exp_only" if where == "forward" else "_accumulate")
        with pytest.raises(PartFailed, match="call 2"):
            if where == "forward":
                fast.attention_forward(Q, K, V, store_attention=False)
            else:
                fast.attention_backward(dO, c)
        assert split_calls[-1] == 2 and len(calls) >= 2
        assert _blas_counts(tpc) == before
    assert _threads._BLAS_DEPTH == 0
    monkeypatch.undo()                                        # the real functions: a later split still works
    monkeypatch.setattr(_attention_blocks, "_SPLIT_MIN_FLOPS", 0)
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", scores)
    O2, _ = fast.attention_forward(Q, K, V)
    fast.set_batch_threads(1)
    O1, _ = fast.attention_forward(Q, K, V)
    assert_paths_close(O2, O1, k=max(n, d), paths=("after the failure, 2 parts", "one part"))
