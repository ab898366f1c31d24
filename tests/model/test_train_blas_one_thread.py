"""The fast training layer's products at one OpenBLAS thread when the attention dominates it
(fast/layer.py, ``_blas_one_thread``): OpenBLAS's idle workers spin after a multi-threaded product and
took a core from the attention core's second thread, so an attention-bound layer runs its whole forward and
backward with OpenBLAS at one thread while the attention core still splits its heads over the batch threads.

Here: the rule (attention's share of the products ≥ 1/2, batch threads > 1, no attention dropout, a split
attention core), the counts seen inside the layer's sublayers (OpenBLAS 1, batch threads 2) and restored
after, the cache's record of it, and the results against the unsplit layer and the plain path to round-off.
Small layers split only because ``_attention_blocks._SPLIT_MIN_FLOPS`` and ``_BLOCK_SCORES`` are lowered
(fixture ``small``).
Every test needs threadpoolctl (fixture ``tpc``: the torch lane).
"""

from __future__ import annotations

import numpy as np
import pytest

import transformer_np as tnp
from helpers import assert_paths_close, nontrivial_params, spy_split_counts
from transformer_np import fast
from transformer_np.fast import attention as fast_attention
from transformer_np.fast import blocks as _attention_blocks
from transformer_np.fast import layer as encoder
from transformer_np.fast import threads as _threads
from transformer_np.model.params import sub_params

pytestmark = pytest.mark.usefixtures("tpc")


@pytest.fixture
def small(monkeypatch):
    """Small layers' attention split as a long sequence's is: no flop threshold, and blocks of 16 rows of
    64 keys (a head of 64 × 64 scores is then 4 blocks; heads stay whole in one block otherwise)."""
    monkeypatch.setattr(_attention_blocks, "_SPLIT_MIN_FLOPS", 0)
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", 16 * 64)


def _share(B, n, d, d_ff) -> float:
    """The attention's share of the layer's products, from the flop counts of model/flops.py's terms."""
    attention = 4 * B * n * n * d                  # Q Kᵀ and A V, every head: 2·n·n·d_k each, h heads
    projections = 2 * B * n * d * (4 * d + 2 * d_ff)
    return attention / (attention + projections)


def _cfg(d, h, d_ff, dropout=0.0, norm="post"):
    return tnp.EncoderConfig(n_layers=1, d_model=d, n_heads=h, d_ff=d_ff, dropout=dropout, norm_position=norm)


# the bench's shapes (B, n, d, h, d_ff) and two in between, with the real split threshold
@pytest.mark.parametrize("dims", [(2, 2048, 64, 4, 256), (2, 512, 64, 4, 256), (2, 1024, 128, 8, 512),
                                  (4, 512, 256, 4, 1024), (8, 128, 768, 12, 3072), (32, 16, 384, 12, 1536)])
def test_the_rule_is_the_attention_share_of_the_products(dims):
    B, n, d, h, d_ff = dims
    fast.set_batch_threads(2)
    assert encoder._blas_one_thread((B, n, d), _cfg(d, h, d_ff), dropout=False) == (_share(B, n, d, d_ff) >= 0.5)
    assert not encoder._blas_one_thread((B, n, d), _cfg(d, h, d_ff), dropout=True)     # no split with dropout
    fast.set_batch_threads(1)
    assert not encoder._blas_one_thread((B, n, d), _cfg(d, h, d_ff), dropout=False)    # nothing to split over


def test_the_rule_needs_a_split_attention_core(monkeypatch):
    """The attention core's own rule (_attention_blocks._shard_blocks): two heads in all, 2²⁴ flops."""
    fast.set_batch_threads(2)
    assert encoder._blas_one_thread((1, 2048, 64), _cfg(64, 2, 256), dropout=False)
    assert not encoder._blas_one_thread((1, 2048, 64), _cfg(64, 1, 256), dropout=False)  # one head in all
    flops = 4 * 1 * 2048 * 2048 * 64
    monkeypatch.setattr(_attention_blocks, "_SPLIT_MIN_FLOPS", flops + 1)
    assert not encoder._blas_one_thread((1, 2048, 64), _cfg(64, 2, 256), dropout=False)  # under the threshold
    monkeypatch.setattr(_attention_blocks, "_SPLIT_MIN_FLOPS", flops)
    assert encoder._blas_one_thread((1, 2048, 64), _cfg(64, 2, 256), dropout=False)


def _spy_counts(monkeypatch):
    """(OpenBLAS threads, batch threads) seen at the start of every fast sublayer call of the layer."""
    seen: dict[str, list] = {}
    # the Post-LN fast backward calls the FFN's kernel (encoder._ffn_backward) with the sum buffer, Pre-LN ops'
    for module, name, label in ((fast, "mha_forward", "mha_forward"), (fast, "ffn_forward", "ffn_forward"),
                                (fast, "mha_backward", "mha_backward"), (fast, "ffn_backward", "ffn_backward"),
                                (encoder, "_ffn_backward", "ffn_backward")):
        real = getattr(module, name)

        def spy(*a, _real=real, _label=label, **k):
            counts = (_threads._blas_libs()[0].get_num_threads(), _threads.get_batch_threads())
            seen.setdefault(_label, []).append(counts)
            return _real(*a, **k)

        monkeypatch.setattr(module, name, spy)
    return seen


# attention-bound: share 4·64·16/(4·64·16 + 2·16·(64 + 64)) = 0.8;
# projection-bound: 4·64·64/(4·64·64 + 2·64·(256 + 512)) = 0.14 (its attention splits as well)
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("dims,bound", [((2, 64, 16, 2, 32), True), ((2, 64, 64, 4, 256), False)])
def test_the_layer_runs_its_products_at_one_blas_thread_only_when_attention_bound(tpc, small, monkeypatch,
                                                                                   norm, dims, bound):
    B, n, d, h, d_ff = dims
    assert (_share(B, n, d, d_ff) >= 0.5) == bound
    cfg = _cfg(d, h, d_ff, norm=norm)
    p = sub_params(nontrivial_params(cfg, 3, np.float64), "layers.0.")
    x = np.random.default_rng(4).standard_normal((B, n, d))
    with tpc.threadpool_limits(2, user_api="blas"):
        fast.set_batch_threads(None)                 # the default: BLAS's own count, 2
        seen = _spy_counts(monkeypatch)
        splits = spy_split_counts(monkeypatch, fast_attention)
        y, cache = tnp.encoder_layer_forward(x, p, cfg)
        assert cache["blas_one_thread"] is bound
        tnp.encoder_layer_backward(np.ones_like(y), cache)
        inside = {(1, 2)} if bound else {(2, 2)}     # OpenBLAS held at one; the batch threads still 2
        assert {c for v in seen.values() for c in v} == inside, seen
        assert set(seen) == {"mha_forward", "ffn_forward", "mha_backward", "ffn_backward"}
        assert splits and set(splits) == {2}         # the attention core split its heads, both ways
        assert _threads._blas_libs()[0].get_num_threads() == 2   # restored after the forward and the backward


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_an_attention_bound_layer_at_one_blas_thread_agrees_with_the_unsplit_and_the_plain_layer(tpc, small,
                                                                                                  norm, dtype):
    B, n, d, h, d_ff = 2, 64, 16, 2, 32
    cfg = _cfg(d, h, d_ff, norm=norm)
    p = {k: v.astype(dtype) for k, v in sub_params(nontrivial_params(cfg, 5, np.float64), "layers.0.").items()}
    r = np.random.default_rng(6)
    x, dy = (r.standard_normal((B, n, d)).astype(dtype) for _ in range(2))
    runs = {}
    with tpc.threadpool_limits(2, user_api="blas"):
        for label, threads, fast_path in (("one BLAS thread", None, True), ("unsplit", 1, True), ("plain", 1, False)):
            fast.set_batch_threads(threads)
            y, cache = tnp.encoder_layer_forward(x, p, cfg, fast=fast_path)
            assert cache.get("blas_one_thread", False) is (label == "one BLAS thread")
            runs[label] = (y, *tnp.encoder_layer_backward(dy, cache))
    y, dx, g = runs["one BLAS thread"]
    for other in ("unsplit", "plain"):
        y2, dx2, g2 = runs[other]
        assert_paths_close(y, y2, paths=("one BLAS thread", other), k=d_ff)
        assert_paths_close(dx, dx2, paths=("one BLAS thread", other), k=d_ff)
        for name in g2:
            assert_paths_close(g[name], g2[name], paths=("one BLAS thread", other), k=B * n,
                               scale=max(float(np.abs(v).max()) for v in g2.values()))


def test_batch_threads_inside_a_region_that_holds_blas_at_one_are_blas_count_before_it(tpc):
    with tpc.threadpool_limits(2, user_api="blas"):
        fast.set_batch_threads(None)
        assert _threads.get_batch_threads() == 2
        with _threads._blas_single():
            assert _threads._blas_libs()[0].get_num_threads() == 1
            assert _threads.get_batch_threads() == 2       # the default follows BLAS's count before the region
            fast.set_batch_threads(3)
            assert _threads.get_batch_threads() == 3       # a count set wins
            fast.set_batch_threads(None)
        assert _threads.get_batch_threads() == 2
