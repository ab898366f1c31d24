"""The NumPy limit of a bench row (transformer_np.perf.limit) and the bench's steadiness loop.

No timed assertions: what is checked is which work the limit call does (its products' FLOPs are
the layer's FLOP count, its exp pass covers every score once), not how long it takes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from transformer_np.model.config import EncoderConfig
from transformer_np.model.flops import layer_flops
from transformer_np.perf import bench, limit, timing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _flops(a_shape, b_shape) -> int:
    batch = int(np.prod(a_shape[:-2], dtype=np.int64)) if len(a_shape) > 2 else 1
    return 2 * batch * a_shape[-2] * a_shape[-1] * b_shape[-1]


@pytest.mark.parametrize("dims", [(2, 8, 16, 2, 32), (8, 128, 768, 12, 3072), (2, 2048, 64, 4, 256)])
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_limit_products_are_the_layers_flops(dims, mode):
    """The products of the limit are the layer's: their FLOPs sum to layer_flops' total (fwd, and 3× for
    fwd+bwd), and each product's inner dimensions match."""
    B, n, d, h, f = dims
    gemms = limit.layer_gemms(dims, mode)
    for name, a, b, _, _ in gemms:
        assert a[-1] == b[-2] and a[:-2] == b[:-2], name
    cfg = EncoderConfig(n_layers=1, d_model=d, n_heads=h, d_ff=f)
    assert sum(_flops(a, b) for _, a, b, _, _ in gemms) == layer_flops(cfg, B, n, mode)["total"]


def test_limit_call_runs_each_product_and_covers_every_score_once(monkeypatch):
    """Counting what one call does: one np.matmul per product (with out=) and exp over B·h·n² elements
    in total, split over the threads."""
    dims = (2, 9, 8, 2, 16)
    calls, exp_elems = [], []
    real_matmul, real_exp = np.matmul, np.exp
    call = limit.limit_call(dims, "float32", "fwd+bwd", threads=2)
    monkeypatch.setattr(limit.np, "matmul", lambda a, b, out=None: calls.append((a.shape, b.shape)) or
                        real_matmul(a, b, out=out))
    monkeypatch.setattr(limit.np, "exp", lambda x, out=None: exp_elems.append(x.size) or real_exp(x, out=out))
    monkeypatch.setattr(limit, "EXP_BLOCK", 7)                 # read at build time: no effect on this call
    call()
    assert calls == [(a, b) for _, a, b, _, _ in limit.layer_gemms(dims, "fwd+bwd")]
    assert sum(exp_elems) == 2 * 2 * 9 * 9


def test_limit_exp_blocks_partial_last_block(monkeypatch):
    monkeypatch.setattr(limit, "EXP_BLOCK", 50)
    sizes = []
    real_exp = np.exp
    call = limit.limit_call((1, 9, 4, 1, 4), "float64", "fwd", threads=1)   # 81 scores: blocks 50 + 31
    monkeypatch.setattr(limit.np, "exp", lambda x, out=None: sizes.append(x.size) or real_exp(x, out=out))
    call()
    assert sizes == [50, 31]


@pytest.mark.parametrize("elementwise_threads", [None, 1, 3])
def test_limit_exp_pass_runs_on_the_rows_threads(monkeypatch, elementwise_threads):
    """The exp pass is spread over the row's ``threads`` threads — the caller and a pool thread at 2 —
    whatever the fast path's elementwise thread count (its pool runs inline at the default of one: the
    pass ran on one thread at any row count until session 8), and each thread's blocks are its own."""
    from transformer_np import fast
    from transformer_np.fast import threads as _threads

    monkeypatch.setattr(limit, "EXP_BLOCK", 50)
    monkeypatch.setattr(_threads, "_THREADS", _threads._THREADS)   # the count set below is undone after the test
    fast.set_num_threads(elementwise_threads)
    threads, sizes = [], []
    real_exp = np.exp
    call = limit.limit_call((1, 15, 4, 1, 4), "float32", "fwd", threads=2)   # 225 scores: blocks 50 ×4 + 25
    monkeypatch.setattr(limit.np, "exp", lambda x, out=None: threads.append(threading.get_ident()) or
                        sizes.append(x.size) or real_exp(x, out=out))
    call()
    assert sorted(sizes) == [25, 50, 50, 50, 50]
    assert len(set(threads)) == 2 and threading.get_ident() in threads
    assert sorted(threads.count(t) for t in set(threads)) == [2, 3]    # blocks 0, 2, 4 and 1, 3


def test_a_limit_call_still_runs_after_a_row_with_more_threads(monkeypatch):
    """The exp pass's pool grows for a row with more threads (the old one shut down): a call built before
    that keeps working, on its own row's thread count."""
    monkeypatch.setattr(limit, "EXP_BLOCK", 50)                 # 225 scores: 5 blocks, room for 4 threads
    monkeypatch.setattr(limit, "_EXP_POOL", None)               # a fresh pool, whatever ran before
    first = limit.limit_call((1, 15, 4, 1, 4), "float32", "fwd", threads=2)
    first()
    limit.limit_call((1, 15, 4, 1, 4), "float32", "fwd", threads=4)()
    first()                                            # raised "cannot schedule new futures after shutdown"


def test_attention_bound_rows():
    assert limit.attention_bound(bench.SHAPES["attn-512"]) and limit.attention_bound(bench.SHAPES["long"])
    assert not limit.attention_bound(bench.SHAPES["bert-base"]) and not limit.attention_bound(bench.SHAPES["minilm"])


def test_interleaved_third_call_is_timed_in_every_round(monkeypatch):
    """A B C per round: c's times 1, 2, 3 against a's 2, 2, 2 → c_ms median 2000, c/a ratios 0.5, 1, 1.5.
    (Instant fake settle calls: tests/perf/test_settle.py checks those.)"""
    durations = iter([0, 0, 0,            # warm-up a, b, c
                      2, 1, 1, 2, 1, 2, 2, 1, 3])
    clock = {"t": 0.0}

    def tick():
        clock["t"] += next(durations)

    seen = []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])
    out = bench.interleaved(tick, tick, rounds=3, warmup=1, c=tick, progress=lambda i, k: seen.append((i, k)),
                            settle=0.0, warm=(lambda: None,) * 3)
    assert out["c_ms"] == 2000.0 and out["c_over_a"] == [0.5, 1.0, 1.5]
    assert out["ratios"] == [2.0, 2.0, 2.0]
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_unsteady_row_is_rerun_until_steady_or_budget(monkeypatch):
    """Attempts whose per-round ratios are (1, 3, 1) are unsteady (range 2 > 0.3 of the median 1);
    (2, 2, 2) is steady. The row is run again until steady (then that attempt is reported) or until
    the round budget is spent (then the steadiest attempt, flagged unsteady, and the warning says so)."""

    def fake(attempts):
        it = iter(attempts)

        def interleaved(a, b, rounds, warmup=1, clock="wall", c=None, progress=None, settle=None):
            ratios = next(it)
            out = {"a_ms": 1e3 * sorted(ratios)[1], "b_ms": 1e3, "ratio": sorted(ratios)[1], "ratios": ratios,
                   "spread": bench.spread(ratios), "c_ms": 500.0, "c_over_a": [0.5 / r for r in ratios],
                   "settle_s": settle, "settle_calls": [1, 1, 1]}
            for i in range(rounds):
                progress(i + 1, rounds)
            return out
        return interleaved

    cfg = EncoderConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32)
    # _timed_row (in bench) looks build_pair and interleaved up in bench's namespace: patched there, and
    # limit_call in perf.limit (imported when the row runs); each stub records its calls, so a patch that
    # stopped reaching _timed_row (after a move) fails below instead of quietly building a real layer
    built, limits = [], []
    monkeypatch.setattr(bench, "build_pair", lambda *a, **k: built.append(a) or (None, None, cfg))
    monkeypatch.setattr(limit, "limit_call", lambda *a, **k: limits.append(a))
    seen = []
    for attempts, budget, steady, used in (([[1, 3, 1], [2, 2, 2]], None, True, 6),
                                           ([[1, 3, 1], [1, 2.5, 1], [1, 3, 1]], 9, False, 9),
                                           ([[1, 3, 1]] * 5, 7, False, 6)):
        monkeypatch.setattr(bench, "interleaved", fake(attempts))
        row = bench._timed_row("tiny", (2, 8, 16, 2, 32), "float32", "fwd", 3, 1.0, max_rounds=budget,
                               progress=lambda a, u, b: seen.append((a, u, b)))
        assert row["steady"] is steady and row["rounds_run"] == used, row
        if steady:
            assert row["ratio_vs_torch"] == 2.0 and row["attempts"] == 2
            assert row["limit_fraction"] == 0.25 and row["limit_s"] == 0.5
        else:
            assert row["spread"]["max"] == 2.5 or budget == 7        # the steadiest attempt is reported
            w = bench.busy_warnings({"results": [row], "machine": {"cpu_count": 2, "threads": 1}})
            assert any(f"still after {used} rounds" in x for x in w), w
    assert seen[:6] == [(1, 1, 9), (1, 2, 9), (1, 3, 9), (2, 4, 9), (2, 5, 9), (2, 6, 9)]
    assert len(built) == len(limits) == 3                             # one layer pair and one limit per row


def _run_cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "transformer_np", "bench", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


def test_bench_json_has_the_limit_keys_and_no_progress():
    pytest.importorskip("torch", reason="the benchmark compares against PyTorch")
    proc = _run_cli("--quick", "--json", "--shape", "2,8,16,2,32", "--rounds", "2", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for r in doc["results"]:
        assert r["limit_s"] > 0 and r["limit_fraction"] > 0
        assert isinstance(r["steady"], bool) and r["rounds_run"] >= r["rounds"]
    assert "rounds of NumPy" not in proc.stderr and "[1/" not in proc.stderr   # quiet under --json


def test_bench_table_prints_progress_and_the_limit():
    pytest.importorskip("torch", reason="the benchmark compares against PyTorch")
    proc = _run_cli("--quick", "--shape", "2,8,16,2,32", "--rounds", "2", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "[1/2] 2,8,16,2,32 float32 fwd" in proc.stderr and "[2/2]" in proc.stderr
    assert "transformer_np." not in proc.stderr + proc.stdout              # no module names for the user
    assert "| NumPy limit ms | limit / NumPy |" in proc.stdout


def test_bench_help_is_plain_text_and_every_flag_explained():
    proc = subprocess.run([sys.executable, "-m", "transformer_np", "bench", "--help"], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT, timeout=60)
    assert proc.returncode == 0
    for markup in ("``", ":func:", ":mod:", ":class:"):
        assert markup not in proc.stdout, markup
    import argparse

    from transformer_np.cli import bench as cli_bench
    parser = argparse.ArgumentParser()
    cli_bench.add_arguments(parser)
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and len(action.help) > 10, action.option_strings


def test_max_rounds_below_rounds_exits_2():
    proc = _run_cli("--quick", "--rounds", "5", "--max-rounds", "3")
    assert proc.returncode == 2 and "--max-rounds" in proc.stderr


def test_minilm_profile_parts_add_up_on_a_few_sentences():
    """The profile's parts (tokenisation, embeddings, layers, pooling, other) add up to each side's total,
    every timed part ran (> 0), and the throughput ratio is the two sides' sentences/s."""
    pytest.importorskip("torch", reason="the profile compares against PyTorch")
    pytest.importorskip("sentence_transformers", reason="pip install sentence-transformers")
    from transformer_np.perf.profile import PARTS, format_minilm_profile, minilm_profile
    doc = minilm_profile(n_sentences=40, rounds=1, threads=1, clock="cpu")
    for side in ("numpy", "sentence_transformers"):
        d = doc[side]
        assert sum(d[f"{k}_s"] for k in PARTS) == pytest.approx(d["total_s"], abs=5e-4)   # 4-digit rounding
        assert all(d[f"{k}_s"] > 0 for k in ("tokenisation", "layers"))
        assert d["sentences_per_s"] == pytest.approx(40 / d["total_s"], rel=0.01)
    assert doc["throughput_ratio"] == pytest.approx(
        doc["numpy"]["sentences_per_s"] / doc["sentence_transformers"]["sentences_per_s"], rel=0.01)
    table = format_minilm_profile(doc)
    assert "| layers |" in table and "transformer_np." not in table
    with pytest.raises(ValueError, match="threads=1"):
        minilm_profile(n_sentences=4, rounds=1, threads=2, clock="cpu")
