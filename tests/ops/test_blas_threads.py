"""The fast path's comparisons under one and under two BLAS threads, in one process (threadpoolctl).

OpenBLAS chooses how to split a matrix product by thread count, and some of its kernels then sum in
another order: measured on one machine, 1 vs 2 threads change the last bits of a (8, 64) @ (64, 2048)
float64 product under the Nehalem kernel and of float32 products under the Haswell kernel. So:

* within one BLAS thread count, the plain and the fast path (blocked attention, the elementwise thread
  pool, the recomputed attention) agree to round-off, forward and every gradient;
* the same computation under 1 and under 2 BLAS threads agrees to round-off — and no more is promised:
  "same seed ⇒ bit-identical" holds for the same machine, the same thread count, the same process.

The rule and the tolerance are CONTRIBUTING.md's ("Comparing numbers in tests"): assert_paths_close,
rtol = c·eps·√k with k the longest reduction (here d_ff = 256), atol scaled to the largest gradient of
the same backward.
"""

from __future__ import annotations

import numpy as np
import pytest

import transformer_np as tnp
from helpers import assert_paths_close
from transformer_np import fast
from transformer_np.fast import blocks as _attention_blocks

pytestmark = pytest.mark.torch          # threadpoolctl comes with the torch extra (tests/conftest.py)
threadpoolctl = pytest.importorskip("threadpoolctl", reason="pip install threadpoolctl (in the torch extra)")

K = 256                                                       # the longest reduction: d_ff (> n = 48, d = 64)
THREADS = (1, 2)


def _cfg(norm: str) -> tnp.EncoderConfig:
    return tnp.EncoderConfig(n_layers=2, d_model=64, n_heads=4, d_ff=K, dropout=0.0, norm_position=norm)


def _problem(norm: str, dtype):
    cfg = _cfg(norm)
    p = tnp.init_params(cfg, seed=0, init="xavier")
    r = np.random.default_rng(1)
    for k, v in p.items():                                    # γ ≠ 1, β ≠ 0, biases ≠ 0: their gradients show
        leaf = k.rsplit(".", 1)[-1]
        if leaf == "gamma":
            p[k] = 1 + 0.1 * r.standard_normal(v.shape)
        elif leaf == "beta" or leaf.startswith("b_"):
            p[k] = 0.1 * r.standard_normal(v.shape)
    params = {k: v.astype(dtype) for k, v in p.items()}
    x = r.standard_normal((2, 48, 64)).astype(dtype)          # (B, n, d): products large enough to be threaded
    mask = np.ones((2, 48), dtype=np.int64)
    mask[1, 40:] = 0                                          # padding in the second sequence
    dH = r.standard_normal(x.shape).astype(dtype)
    return cfg, params, x, mask, dH


def _run(cfg, params, x, mask, dH, **kw):
    """(H, every gradient) of one forward and backward."""
    H, cache = tnp.encoder_forward(params, cfg, inputs_embeds=x, attention_mask=mask, **kw)
    return H, tnp.encoder_backward(dH, cache)


def _assert_runs_close(a, b, paths, dtype):
    (Ha, ga), (Hb, gb) = a, b
    assert_paths_close(Ha, Hb, paths=paths, k=K, dtype=dtype)
    assert ga.keys() == gb.keys()
    floor = max(float(np.abs(g).max()) for g in gb.values())  # gradcheck's floor: d b_K is 0 in exact arithmetic
    for name in gb:
        assert_paths_close(ga[name], gb[name], paths=(f"{paths[0]}: {name}", f"{paths[1]}: {name}"), k=K,
                           scale=floor, dtype=dtype)


@pytest.fixture
def blas_threads():
    """Run under ``n`` BLAS threads: ``with blas_threads(n): ...`` (OpenBLAS, via threadpoolctl)."""
    info = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    assert info, "NumPy's BLAS is not visible to threadpoolctl: the thread count cannot be set"

    def limit(n: int):
        return threadpoolctl.threadpool_limits(n, user_api="blas")
    return limit


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_fast_and_plain_agree_under_one_and_two_blas_threads(norm, dtype, blas_threads, monkeypatch):
    problem = _problem(norm, dtype)
    runs = {}
    for n in THREADS:
        with blas_threads(n):
            assert all(i["num_threads"] == n for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")
            plain = _run(*problem, fast=False)
            runs[n] = fast_run = _run(*problem)
            _assert_runs_close(fast_run, plain, (f"fast, {n} BLAS threads", f"plain, {n} BLAS threads"), dtype)
            lean = _run(*problem, store_attention=False)                    # A recomputed in the backward
            _assert_runs_close(lean, fast_run, (f"recomputed A, {n} threads", f"stored A, {n} threads"), dtype)
            with monkeypatch.context() as m:                                  # scores by many small row blocks
                m.setattr(_attention_blocks, "_BLOCK_SCORES", 4 * 48)
                assert len(_attention_blocks._row_blocks(2 * 4, 48, 48)) == 48             # one query row per block
                for store in (True, False):
                    blocked = _run(*problem, store_attention=store)
                    _assert_runs_close(blocked, fast_run, (f"blocked (store_attention={store}), {n} threads",
                                                           f"one block, {n} threads"), dtype)
    _assert_runs_close(runs[1], runs[2], ("1 BLAS thread", "2 BLAS threads"), dtype)


def test_the_elementwise_pool_is_exact_at_either_blas_thread_count(blas_threads):
    """The fast path's own pool moves only elementwise work between threads: at a fixed BLAS thread count
    its thread count changes no bit (1 vs 2 pool threads, under 1 and under 2 BLAS threads)."""
    problem = _problem("post", np.float32)
    for n in THREADS:
        with blas_threads(n):
            runs = []
            try:
                for pool in (1, 2):
                    fast.set_num_threads(pool)
                    runs.append(_run(*problem))
            finally:
                fast.set_num_threads(None)
            (H1, g1), (H2, g2) = runs
            # exact: one process, the same BLAS calls at the same BLAS thread count; only elementwise passes moved
            np.testing.assert_array_equal(H1, H2, err_msg=f"{n} BLAS threads")
            for k in g1:   # exact: as above
                np.testing.assert_array_equal(g1[k], g2[k], err_msg=f"{k}, {n} BLAS threads")
