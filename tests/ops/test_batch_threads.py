"""A batch split over threads for inference (``set_batch_threads``; fast/threads.py, fast/inference.py).

The fast inference layer (``for_backward=False``) runs shards of the batch on their own threads, OpenBLAS
at one thread while they run, each shard writing its sequences' rows of the output and of A. Here:

* split vs not split (``set_batch_threads(1)``) vs the plain path: the same outputs and attention weights
  to round-off (assert_paths_close, k = d_ff, the longest reduction), Post-LN and Pre-LN, float32 and
  float64, with every kind of mask — a per-sequence one cut to each shard's rows, broadcast ones whole;
* when the batch is not split: fewer sequences than threads, dropout in training, a layer under
  ``_SHARD_MIN_FLOPS``; uneven shards (B = 5 on 2 and 3 threads);
* ``_in_shards``: BLAS at one thread inside and its counts restored after (also after an exception, and
  only when the last of two concurrent regions ends), the shard marker (no nested split, no elementwise
  pool), the caller's np.errstate carried into the workers, the first exception by shard index re-raised
  after every shard finished;
* ``set_batch_threads``'s argument errors and its ImportError without threadpoolctl;
* ``weights_out=`` of fast attention_forward / mha_forward: refused by name when it cannot receive A,
  else filled and returned as the cache's A.

Small shapes split only because ``inference._SHARD_MIN_FLOPS`` is set to 0 (fixture ``small_splits``).
Tests that split need threadpoolctl (fixture ``tpc``: the torch lane); the others run in the fast lane.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

import transformer_np as tnp
from helpers import assert_paths_close, nontrivial_params, spy_split_counts
from transformer_np import fast
from transformer_np.errors import InputTypeError, InputValueError
from transformer_np.fast import inference
from transformer_np.fast import threads as _threads
from transformer_np.model import encoder
from transformer_np.model.params import sub_params

B, N, D, HEADS, FF = 4, 12, 32, 4, 64          # B = HEADS: a (h, n, n) mask has B rows too (it must stay whole)
K = FF                                          # the longest reduction of a layer (d_ff > d > n)
DTYPES = (np.float32, np.float64)
pytestmark = pytest.mark.usefixtures("fast_thread_defaults")   # (tests/conftest.py)


@pytest.fixture
def small_splits(monkeypatch):
    """The test's small layers are split (the real threshold keeps layers under 2**24 flops whole)."""
    monkeypatch.setattr(inference, "_SHARD_MIN_FLOPS", 0)


@pytest.fixture
def shard_calls(monkeypatch):
    """The shard counts the encoder's layers were split into (a spy on inference._in_shards)."""
    return spy_split_counts(monkeypatch, inference)


def _cfg(norm: str = "post", dropout: float = 0.0, n_layers: int = 2) -> tnp.EncoderConfig:
    return tnp.EncoderConfig(n_layers=n_layers, d_model=D, n_heads=HEADS, d_ff=FF, dropout=dropout,
                             norm_position=norm)


def _layer_problem(norm: str, dtype, batch: int = B, dropout: float = 0.0, seed: int = 0):
    cfg = _cfg(norm, dropout)
    p = sub_params(nontrivial_params(cfg, seed, dtype), "layers.0.")
    x = np.random.default_rng(seed + 1).standard_normal((batch, N, D)).astype(dtype)   # (B, n, d)
    return cfg, p, x


def _lengths(batch: int) -> np.ndarray:
    """Real tokens per sequence, all different and all < N: a mask cut from the wrong rows changes a result."""
    return N - 1 - 2 * np.arange(batch)                    # B = 5: 11, 9, 7, 5, 3


def _attention_mask(batch: int) -> np.ndarray:
    am = np.zeros((batch, N), dtype=np.int64)                # (B, n): 1 = real token, 0 = padding
    for b, length in enumerate(_lengths(batch)):
        am[b, :length] = 1
    return am


def _mask(kind: str, batch: int, dtype, seed: int = 5) -> np.ndarray | None:
    """An additive mask broadcastable to (B, h, n, n) of one kind (the per-sequence ones differ per sequence)."""
    r = np.random.default_rng(seed)
    blocked = np.finfo(dtype).min

    def soft(shape):                                          # a finite bias plus blocked keys, the diagonal open
        m = 0.5 * r.standard_normal(shape)
        m[r.random(shape) < 0.3] = blocked
        i = np.arange(N)
        m[..., i, i] = 0.0
        return m.astype(dtype)

    if kind == "none":
        return None
    if kind == "padding (B,1,1,n)":
        return tnp.padding_mask(_attention_mask(batch), dtype)
    if kind == "per head (B,h,n,n)":
        return soft((batch, HEADS, N, N))
    if kind == "per query (B,1,n,n)":
        return soft((batch, 1, N, N))
    if kind == "broadcast (1,1,n,n)":
        return tnp.causal_mask(N, dtype)[None, None]
    if kind == "broadcast (n,n)":
        return soft((N, N))
    if kind == "per head (h,n,n)":                            # 3-D: no batch axis although h = B
        return soft((HEADS, N, N))
    raise AssertionError(kind)


MASKS = ("none", "padding (B,1,1,n)", "per head (B,h,n,n)", "per query (B,1,n,n)", "broadcast (1,1,n,n)",
         "broadcast (n,n)", "per head (h,n,n)")


def _skeleton(cache):
    """A cache's keys and non-array values, arrays replaced by their shape and dtype (None stays None)."""
    if isinstance(cache, dict):
        return {k: _skeleton(v) for k, v in cache.items()}
    if isinstance(cache, np.ndarray):
        return ("array", cache.shape, cache.dtype)
    return cache


def _layer(x, p, cfg, mask, threads: int, store_attention: bool, fast_path: bool = True, **kw):
    fast.set_batch_threads(threads)
    return encoder.encoder_layer_forward(x, p, cfg, mask, fast=fast_path, store_attention=store_attention,
                                         for_backward=False, **kw)


def _blas_counts(tpc) -> dict[str, int]:
    """Every loaded BLAS library's thread count, by file."""
    return {i["filepath"]: i["num_threads"] for i in tpc.threadpool_info() if i["user_api"] == "blas"}


def _shard_blas_counts(tpc) -> dict[str, int]:
    """The thread counts of the BLAS libraries the shards set to one (those _blas_libs() found)."""
    files = {lib.filepath for lib in _threads._blas_libs()}
    assert files, "threadpoolctl found no BLAS library: nothing to set to one thread"
    return {f: c for f, c in _blas_counts(tpc).items() if f in files}


# ----------------------------------------------------------------------------- split vs one batch vs plain
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("store_attention", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_a_split_layer_computes_what_one_batch_and_the_plain_path_compute(tpc, small_splits, shard_calls, norm,
                                                                          dtype, store_attention, mask_kind):
    cfg, p, x = _layer_problem(norm, dtype)
    mask = _mask(mask_kind, B, dtype)
    whole, c_whole = _layer(x, p, cfg, mask, 1, store_attention)
    assert shard_calls == []
    split, c_split = _layer(x, p, cfg, mask, 2, store_attention)
    assert shard_calls == [2]
    plain, c_plain = _layer(x, p, cfg, mask, 1, True, fast_path=False)
    assert split.dtype == whole.dtype == dtype and split.shape == x.shape
    assert_paths_close(split, whole, paths=("2 shards", "one batch"), k=K)
    assert_paths_close(split, plain, paths=("2 shards", "plain path"), k=K)
    assert _skeleton(c_split) == _skeleton(c_whole)          # the whole batch's shape, A (B, h, n, n) or None
    A, A_whole = c_split["attn"]["attn"]["weights"], c_whole["attn"]["attn"]["weights"]
    if store_attention:
        assert A.shape == (B, HEADS, N, N) and A.dtype == dtype
        assert_paths_close(A, A_whole, paths=("2 shards: A", "one batch: A"), k=K)
        assert_paths_close(A, c_plain["attn"]["attn"]["weights"], paths=("2 shards: A", "plain path: A"), k=K)
    else:
        assert A is None and A_whole is None


@pytest.mark.parametrize("extra", ["none", "broadcast (n,n)", "per head (B,h,n,n)"])
@pytest.mark.parametrize("store_attention", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_a_split_stack_computes_what_one_batch_and_the_plain_path_compute(tpc, small_splits, shard_calls, norm,
                                                                          dtype, store_attention, extra):
    cfg = _cfg(norm)
    params = nontrivial_params(cfg, 3, dtype)
    x = np.random.default_rng(4).standard_normal((B, N, D)).astype(dtype)
    kw = dict(inputs_embeds=x, attention_mask=_attention_mask(B), extra_mask=_mask(extra, B, dtype),
              for_backward=False)
    fast.set_batch_threads(1)
    H_whole, c_whole = tnp.encoder_forward(params, cfg, store_attention=store_attention, **kw)
    H_plain, c_plain = tnp.encoder_forward(params, cfg, fast=False, **kw)
    assert shard_calls == []
    fast.set_batch_threads(2)
    H_split, c_split = tnp.encoder_forward(params, cfg, store_attention=store_attention, **kw)
    assert shard_calls == [2] * cfg.n_layers
    assert H_split.dtype == dtype
    assert_paths_close(H_split, H_whole, paths=("2 shards", "one batch"), k=K)
    assert_paths_close(H_split, H_plain, paths=("2 shards", "plain path"), k=K)
    for layer in range(cfg.n_layers):
        hs = c_split["hidden_states"][layer + 1]
        assert_paths_close(hs, c_whole["hidden_states"][layer + 1], paths=(f"2 shards: H{layer + 1}", "one batch"), k=K)
        A = c_split["attentions"][layer]
        if store_attention:
            assert_paths_close(A, c_whole["attentions"][layer], paths=(f"2 shards: A{layer}", "one batch"), k=K)
            assert_paths_close(A, c_plain["attentions"][layer], paths=(f"2 shards: A{layer}", "plain path"), k=K)
            # exact: a padding key gets exp(finfo.min − max) = 0 in every row, whichever shard ran its sequence
            for b, length in enumerate(_lengths(B)):
                assert not A[b, :, :, length:].any(), (layer, b)
        else:
            assert A is None and c_whole["attentions"][layer] is None


# ----------------------------------------------------------------------------- when and how the batch is split
@pytest.mark.parametrize("threads,sizes", [(2, [2, 3]), (3, [1, 2, 2])])
@pytest.mark.parametrize("mask_kind", ["padding (B,1,1,n)", "per head (B,h,n,n)"])
def test_uneven_shards(tpc, small_splits, shard_calls, monkeypatch, threads, sizes, mask_kind):
    cfg, p, x = _layer_problem("post", np.float64, batch=5)
    mask = _mask(mask_kind, 5, np.float64)
    whole, c_whole = _layer(x, p, cfg, mask, 1, True)
    seen, lock, real = [], threading.Lock(), inference._layer_infer_one

    def spy(xs, *args, **kwargs):
        with lock:
            seen.append(xs.shape[0])
        return real(xs, *args, **kwargs)

    monkeypatch.setattr(inference, "_layer_infer_one", spy)
    split, c_split = _layer(x, p, cfg, mask, threads, True)
    assert shard_calls == [threads]
    assert sorted(seen) == sizes                              # consecutive nearly equal shards cover the batch
    assert_paths_close(split, whole, paths=(f"{threads} shards", "one batch"), k=K)
    assert_paths_close(c_split["attn"]["attn"]["weights"], c_whole["attn"]["attn"]["weights"],
                       paths=(f"{threads} shards: A", "one batch: A"), k=K)


@pytest.mark.parametrize("batch,threads", [(1, 2), (2, 3)])
def test_fewer_sequences_than_threads_are_not_split(tpc, small_splits, shard_calls, batch, threads):
    cfg, p, x = _layer_problem("pre", np.float32, batch=batch)
    mask = _mask("padding (B,1,1,n)", batch, np.float32)
    whole = _layer(x, p, cfg, mask, 1, True)
    same = _layer(x, p, cfg, mask, threads, True)
    assert shard_calls == []
    # exact: not split, both calls run the very same operations on this thread with the same BLAS thread count
    assert np.array_equal(same[0], whole[0])                  # exact: the output, by the same operations
    a_same, a_whole = same[1]["attn"]["attn"]["weights"], whole[1]["attn"]["attn"]["weights"]
    assert np.array_equal(a_same, a_whole)                    # exact: A, by the same operations


def test_dropout_in_training_is_not_split(tpc, small_splits, shard_calls):
    cfg, p, x = _layer_problem("post", np.float64, dropout=0.25)
    mask = _mask("padding (B,1,1,n)", B, np.float64)
    _layer(x, p, cfg, mask, 2, True)                          # inference: this layer would be split …
    assert shard_calls == [2]
    whole = _layer(x, p, cfg, mask, 1, True, training=True, rng=np.random.default_rng(7))
    same = _layer(x, p, cfg, mask, 2, True, training=True, rng=np.random.default_rng(7))
    assert shard_calls == [2]                                 # … but not with dropout in training
    # exact: not split, the two calls run the same operations on this thread, with the same BLAS thread
    # count, drawing the same dropout masks from one random stream seeded alike (shards would share the
    # stream in an order set by the threads' timing, and draw other masks)
    assert np.array_equal(same[0], whole[0])                  # exact: the output, by the same operations
    a_same, a_whole = same[1]["attn"]["attn"]["weights"], whole[1]["attn"]["attn"]["weights"]
    assert np.array_equal(a_same, a_whole)                    # exact: A, by the same operations and masks


def test_training_without_dropout_is_split(tpc, small_splits, shard_calls):
    cfg, p, x = _layer_problem("pre", np.float64, dropout=0.0)
    whole = _layer(x, p, cfg, None, 1, False, training=True)
    split = _layer(x, p, cfg, None, 2, False, training=True)
    assert shard_calls == [2]
    assert_paths_close(split[0], whole[0], paths=("2 shards", "one batch"), k=K)


def test_a_layer_under_the_flops_threshold_is_not_split(tpc, shard_calls, monkeypatch):
    cfg, p, x = _layer_problem("post", np.float32)
    _layer(x, p, cfg, None, 2, False)                         # the real threshold: this small layer stays whole
    assert inference._SHARD_MIN_FLOPS > 0 and shard_calls == []
    # the layer's products: Q, K, V, O (4 of (Bn, d)(d, d)), W_1 and W_2 ((Bn, d)(d, d_ff), (Bn, d_ff)(d_ff, d)),
    # Q Kᵀ and A V (2 of (n, d)(d, n) per sequence, summed over the heads), 2 flops per multiply-add
    flops = 2 * B * N * D * (4 * D + 2 * FF) + 2 * 2 * B * N * N * D
    monkeypatch.setattr(inference, "_SHARD_MIN_FLOPS", flops + 1)
    _layer(x, p, cfg, None, 2, False)
    assert shard_calls == []
    monkeypatch.setattr(inference, "_SHARD_MIN_FLOPS", flops)
    _layer(x, p, cfg, None, 2, False)
    assert shard_calls == [2]


# ----------------------------------------------------------------------------- BLAS threads and the shard marker
def test_blas_threads_are_restored_after_a_split_layer(tpc, small_splits, shard_calls):
    cfg, p, x = _layer_problem("post", np.float32)
    with tpc.threadpool_limits(3, user_api="blas"):          # a count a missing restore could not leave by chance
        before = _blas_counts(tpc)
        assert 3 in before.values()
        _layer(x, p, cfg, None, 2, True)
        assert shard_calls == [2]
        assert _blas_counts(tpc) == before
    assert _threads._BLAS_DEPTH == 0


class ShardFailed(Exception):
    pass


def test_blas_threads_are_restored_after_an_exception_in_a_shard(tpc, small_splits, monkeypatch):
    cfg, p, x = _layer_problem("pre", np.float64)
    real, main = inference._layer_infer_one, threading.current_thread()

    def fail_off_main(*args, **kwargs):
        if threading.current_thread() is not main:
            raise ShardFailed("shard 1")
        return real(*args, **kwargs)

    monkeypatch.setattr(inference, "_layer_infer_one", fail_off_main)
    with tpc.threadpool_limits(3, user_api="blas"):
        before = _blas_counts(tpc)
        with pytest.raises(ShardFailed, match="shard 1"):
            _layer(x, p, cfg, None, 2, True)
        assert _blas_counts(tpc) == before
    assert _threads._BLAS_DEPTH == 0


def test_inside_a_shard_blas_runs_one_thread_and_nothing_splits_again(tpc):
    fast.set_batch_threads(2)
    fast.set_num_threads(2)
    seen, lock, together = {}, threading.Lock(), threading.Barrier(3)

    def record(i: int) -> None:
        together.wait(10)                                     # the three shards run at once (else: BrokenBarrierError)
        with lock:
            seen[i] = (fast.get_batch_threads(), fast.get_num_threads(), set(_shard_blas_counts(tpc).values()),
                       threading.get_ident())

    with tpc.threadpool_limits(3, user_api="blas"):
        before = _blas_counts(tpc)
        _threads._in_shards(record, 3)
        after = _blas_counts(tpc)
    assert sorted(seen) == [0, 1, 2]
    for i, (batch_threads, num_threads, blas, _) in seen.items():
        assert (batch_threads, num_threads, blas) == (1, 1, {1}), i
    assert seen[0][3] == threading.get_ident()               # the caller runs shard 0
    assert after == before
    assert (fast.get_batch_threads(), fast.get_num_threads()) == (2, 2)   # the caller is no shard afterwards


def test_blas_stays_at_one_thread_until_the_last_of_two_regions_ends(tpc):
    during = []

    def outer(i: int) -> None:
        if i == 0:                                            # the caller's thread, inside the first region
            _threads._in_shards(lambda j: None, 2)            # a second region begins and ends meanwhile
            during.append(_shard_blas_counts(tpc))

    with tpc.threadpool_limits(3, user_api="blas"):
        before = _blas_counts(tpc)
        _threads._in_shards(outer, 2)
        after = _blas_counts(tpc)
    assert set(during[0].values()) == {1}                     # the first region still runs: still one thread
    assert after == before
    assert _threads._BLAS_DEPTH == 0


def _controlling_thread_rule(tpc) -> bool:
    """threadpoolctl lets only one thread (the first to set it, until released) set a pthreads OpenBLAS's
    process-wide thread count; a set from another thread silently does nothing (threadpoolctl 3.8)."""
    ctl = getattr(tpc, "OpenBLASController", None)
    return (hasattr(ctl, "clear_controlling_thread")
            and any(lib.internal_api == "openblas" and lib.threading_layer == "pthreads"
                    for lib in _threads._blas_libs()))


def _free_control(tpc) -> None:
    """No thread controls OpenBLAS's count (as in a process where nothing has set it yet)."""
    tpc.OpenBLASController.clear_controlling_thread(force=True)


def test_a_split_in_another_thread_than_the_first_one_runs_blas_at_one_thread(tpc):
    seen = []

    def later() -> None:
        _threads._in_shards(lambda i: seen.append(set(_shard_blas_counts(tpc).values())) if i == 0 else None, 2)

    with tpc.threadpool_limits(3, user_api="blas"):
        if _controlling_thread_rule(tpc):
            _free_control(tpc)
        before = _blas_counts(tpc)
        _threads._in_shards(lambda i: None, 2)                # a first split, in this thread
        assert _blas_counts(tpc) == before
        worker = threading.Thread(target=later)               # then one in another thread
        worker.start()
        worker.join(10)
        after = _blas_counts(tpc)
    assert after == before
    assert seen == [{1}]                                      # 3 if only the first thread could set it


def test_blas_threads_are_restored_when_two_threads_regions_end_in_either_order(tpc):
    first_in, first_out, second_in, leave = (threading.Event() for _ in range(4))

    def first_region(i: int) -> None:
        if i == 0:
            first_in.set()
            second_in.wait(10)                                # ends while the second region runs

    def first_thread() -> None:
        _threads._in_shards(first_region, 2)
        first_out.set()
        leave.wait(10)                                        # the thread stays alive

    def second_region(i: int) -> None:
        if i == 0:
            second_in.set()
            first_out.wait(10)                                # ends last

    with tpc.threadpool_limits(3, user_api="blas"):
        if _controlling_thread_rule(tpc):
            _free_control(tpc)
        before = _blas_counts(tpc)
        other = threading.Thread(target=first_thread)
        other.start()
        try:
            assert first_in.wait(10)
            _threads._in_shards(second_region, 2)
            after = _blas_counts(tpc)                         # both regions ended
        finally:
            second_in.set()
            leave.set()
            other.join(10)
    assert _threads._BLAS_DEPTH == 0
    assert after == before                                    # fails: OpenBLAS left at one thread for good


def test_get_batch_threads_defaults_to_blas_threads(tpc):
    fast.set_batch_threads(None)
    for n in (1, 3):
        with tpc.threadpool_limits(n, user_api="blas"):
            assert fast.get_batch_threads() == n
    fast.set_batch_threads(3)
    with tpc.threadpool_limits(1, user_api="blas"):
        assert fast.get_batch_threads() == 3


# ----------------------------------------------------------------------------- _in_shards: errors and errstate
def test_in_shards_reraises_the_first_exception_by_index_after_every_shard_finished():
    finished, lock = [], threading.Lock()

    def fn(i: int) -> None:
        try:
            if i == 1:
                time.sleep(0.2)                               # shard 2 fails first in time, shard 1 first by index
                raise ValueError("shard 1")
            if i == 2:
                raise KeyError("shard 2")
            time.sleep(0.3)                                   # shard 0, the caller's, finishes last
        finally:
            with lock:
                finished.append(i)

    with pytest.raises(ValueError, match="shard 1"):
        _threads._in_shards(fn, 3)
    assert sorted(finished) == [0, 1, 2]


def test_in_shards_waits_for_the_other_shards_when_the_callers_shard_fails():
    finished = threading.Event()

    def fn(i: int) -> None:
        if i == 0:
            raise ValueError("shard 0")
        time.sleep(0.2)
        finished.set()

    with pytest.raises(ValueError, match="shard 0"):
        _threads._in_shards(fn, 2)
    assert finished.is_set()
    assert _threads._BLAS_DEPTH == 0


def test_in_shards_carries_the_callers_errstate():
    threads = {}
    big = np.array([3e38], dtype=np.float32)

    def fn(i: int) -> None:
        threads[i] = threading.get_ident()
        if i == 1:
            big * np.float32(10)                              # overflows float32

    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        _threads._in_shards(fn, 2)
    assert threads[1] != threading.get_ident()                # the overflow happened on another thread
    with np.errstate(over="warn"), pytest.warns(RuntimeWarning, match="overflow"):
        _threads._in_shards(fn, 2)                            # the worker keeps no errstate of an earlier call


# ----------------------------------------------------------------------------- set_batch_threads's arguments
@pytest.mark.parametrize("n,error", [(True, InputTypeError), (2.0, InputTypeError), ("2", InputTypeError),
                                     (0, InputValueError), (-1, InputValueError)])
def test_set_batch_threads_refuses_a_bad_count_by_name(n, error):
    with pytest.raises(error, match=r"^n must be a positive int or None, got ") as info:
        fast.set_batch_threads(n)
    assert repr(n) in str(info.value)                         # what was received
    assert _threads._BATCH_THREADS is None                    # nothing was set


def test_without_threadpoolctl_nothing_splits_and_set_batch_threads_says_what_to_install(monkeypatch,
                                                                                          shard_calls):
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # import threadpoolctl raises ImportError
    monkeypatch.setattr(_threads, "_BLAS", None)             # forget the controllers found: look again
    assert _threads._blas_libs() == []
    assert fast.get_batch_threads() == 1
    with pytest.raises(ImportError, match="pip install threadpoolctl") as info:
        fast.set_batch_threads(2)
    assert "found no BLAS" not in str(info.value)
    fast.set_batch_threads(1)                                 # 1 and None need no threadpoolctl
    fast.set_batch_threads(None)
    monkeypatch.setattr(_threads, "_BATCH_THREADS", 2)       # a count set earlier, while threadpoolctl was there
    monkeypatch.setattr(inference, "_SHARD_MIN_FLOPS", 0)
    assert fast.get_batch_threads() == 1
    cfg, p, x = _layer_problem("post", np.float64)
    encoder.encoder_layer_forward(x, p, cfg, for_backward=False)
    assert shard_calls == []


def test_threadpoolctl_without_a_blas_library_is_named(tpc, monkeypatch):
    monkeypatch.setattr(_threads, "_BLAS", [])
    assert fast.get_batch_threads() == 1
    with pytest.raises(ImportError, match=r"pip install threadpoolctl \(threadpoolctl found no BLAS library\)"):
        fast.set_batch_threads(2)


# ----------------------------------------------------------------------------- weights_out
def _qkv(dtype=np.float64):
    r = np.random.default_rng(11)
    return tuple(r.standard_normal((2, HEADS, N, 8)).astype(dtype) for _ in range(3))   # (B, h, n, d_k)


def _mha_input(dtype=np.float64):
    r = np.random.default_rng(12)
    p = {f"W_{k}": (r.standard_normal((D, D)) / np.sqrt(D)).astype(dtype) for k in "QKVO"}
    p.update({f"b_{k}": (0.1 * r.standard_normal(D)).astype(dtype) for k in "QKVO"})
    return r.standard_normal((2, N, D)).astype(dtype), p


def _bad_weights_out():
    shape = (2, HEADS, N, N)
    read_only = np.empty(shape)
    read_only.flags.writeable = False
    return [
        ("wrong shape", np.empty((2, HEADS, N, N + 1)), {}, InputValueError,
         "of shape (2, 4, 12, 12), got shape (2, 4, 12, 13)"),
        ("wrong dtype", np.empty(shape, dtype=np.float32), {}, InputTypeError, "dtype float64, got float32"),
        ("not an array", np.empty(shape).tolist(), {}, InputTypeError, "got list"),
        ("not C-contiguous", np.empty((2, HEADS, N, 2 * N))[..., ::2], {}, InputValueError, "C-contiguous: False"),
        ("read-only", read_only, {}, InputValueError, "writeable: False"),
        ("no A stored", np.empty(shape), {"store_attention": False}, InputValueError, "store_attention=True"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_weights_out())),
                         ids=[c[0] for c in _bad_weights_out()])
def test_a_weights_out_that_cannot_receive_A_is_refused_by_name(case):
    _, w, kw, error, detail = _bad_weights_out()[case]
    Q, K_, V = _qkv()
    x, p = _mha_input()
    for call in (lambda: fast.attention_forward(Q, K_, V, weights_out=w, **kw),
                 lambda: fast.attention_forward(Q, K_, V, for_backward=False, weights_out=w, **kw),
                 lambda: fast.mha_forward(x, p, HEADS, for_backward=False, weights_out=w, **kw)):
        with pytest.raises(error, match="^weights_out ") as info:
            call()
        assert detail in str(info.value)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("for_backward", [True, False])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_weights_out_receives_A_and_is_the_caches_A(dtype, for_backward, dropout):
    Q, K_, V = _qkv(dtype)
    mask = _mask("padding (B,1,1,n)", 2, dtype)
    kw = dict(dropout_p=dropout, training=dropout > 0, for_backward=for_backward)
    O_ref, c_ref = fast.attention_forward(Q, K_, V, mask, rng=np.random.default_rng(2), **kw)
    w = np.full((2, HEADS, N, N), np.nan, dtype=dtype)
    O, c = fast.attention_forward(Q, K_, V, mask, rng=np.random.default_rng(2), weights_out=w, **kw)
    assert c["weights"] is w
    # exact: the same operations on the same data (and the same dropout draws), only A's buffer differs
    assert np.array_equal(w, c_ref["weights"]) and np.array_equal(O, O_ref)

    x, p = _mha_input(dtype)
    y_ref, cm_ref = fast.mha_forward(x, p, HEADS, mask, rng=np.random.default_rng(3), **kw)
    w = np.full((2, HEADS, N, N), np.nan, dtype=dtype)
    y, cm = fast.mha_forward(x, p, HEADS, mask, rng=np.random.default_rng(3), weights_out=w, **kw)
    assert cm["attn"]["weights"] is w
    # exact: as above
    assert np.array_equal(w, cm_ref["attn"]["weights"]) and np.array_equal(y, y_ref)
