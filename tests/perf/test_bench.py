"""The benchmark's plumbing: FLOP-based GFLOP/s, the interleaved median ratio, the memory
report, the --json schema. No timed assertions: times are whatever the machine gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from transformer_np.fast import attention_forward, mha_forward  # the fast path's cache economy
from transformer_np.model.config import EncoderConfig
from transformer_np.model.encoder import encoder_forward, encoder_layer_forward
from transformer_np.model.flops import layer_flops
from transformer_np.model.params import init_params, sub_params
from transformer_np.ops.linear import linear_forward
from transformer_np.perf import bench, machine, timing
from transformer_np.perf.memory import cache_nbytes

TINY = "2,8,16,2,32"   # B, n, d, h, d_ff: runs in well under a second per call
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ----------------------------------------------------------------------------- timing logic
_INSTANT = (lambda: None, lambda: None)   # untimed settle calls that take no (fake) time


def test_interleaved_ratio_is_median_of_per_round_ratios(monkeypatch):
    """A fake clock: a takes 2, 9, 4 units and b takes 1, 3, 1, so the per-round ratios are
    2, 3, 4 (median 3), while median(a)/median(b) would be 4/1 = 4: the per-round rule wins.
    (The settle calls are instant fakes here; tests/perf/test_settle.py checks them.)"""
    durations = iter([0, 0,            # warm-up a, b
                      2, 1, 9, 3, 4, 1])
    clock = {"t": 0.0}

    def tick():
        clock["t"] += next(durations)

    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])
    out = bench.interleaved(tick, tick, rounds=3, warmup=1, settle=0.0, warm=_INSTANT)
    assert out["ratios"] == [2.0, 3.0, 4.0]
    assert out["ratio"] == 3.0
    assert out["a_ms"] == 4000.0 and out["b_ms"] == 1000.0


def test_interleaved_reports_the_spread_of_the_rounds(monkeypatch):
    """Per-round ratios 2, 3, 4, 5, 10: min 2, quartiles 3 and 5 (inclusive method), max 10,
    range (10 − 2) / 4 = 2."""
    durations = iter([0, 0, 2, 1, 3, 1, 4, 1, 5, 1, 10, 1])
    clock = {"t": 0.0}

    def tick():
        clock["t"] += next(durations)

    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["t"])
    out = bench.interleaved(tick, tick, rounds=5, warmup=1, settle=0.0, warm=_INSTANT)
    assert out["spread"] == {"min": 2.0, "q1": 3.0, "median": 4.0, "q3": 5.0, "max": 10.0, "rel_range": 2.0}
    assert bench.spread([1.5])["rel_range"] == 0.0


def test_interleaved_cpu_clock_reads_the_process_time(monkeypatch):
    """clock="cpu" times by time.process_time; the wall clock (which advances 100 units a call here)
    is read only to count the settle time."""
    durations = iter([0, 0, 3, 1, 6, 2])
    cpu, wall = {"t": 0.0}, {"t": 0.0}

    def tick():
        cpu["t"] += next(durations)
        wall["t"] += 100

    monkeypatch.setattr(timing.time, "process_time", lambda: cpu["t"])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: wall["t"])
    out = bench.interleaved(tick, tick, rounds=2, warmup=1, clock="cpu", settle=0.0, warm=_INSTANT)
    assert out["ratios"] == [3.0, 3.0]


def test_cpu_clock_needs_one_thread():
    with pytest.raises(ValueError, match="threads=1"):
        bench.run_benchmark([bench.parse_shape(TINY)], ["float32"], ("fwd",), rounds=1, memory=False, threads=2,
                            clock="cpu")
    with pytest.raises(ValueError, match="clock"):
        bench.run_benchmark([bench.parse_shape(TINY)], ["float32"], ("fwd",), rounds=1, memory=False, threads=1,
                            clock="sundial")
    proc = _run_cli("--quick", "--clock", "cpu")
    assert proc.returncode == 2 and "--threads 1" in proc.stderr


def _doc(other_before=0.0, other_rows=(0.0,), spreads=(0.05,), threads=2):
    rows = [{"shape": "bert-base", "dtype": "float32", "mode": "fwd", "other_load_cores": o,
             "spread": {"min": 1.0, "max": 1.0 + s, "rel_range": s}} for o, s in zip(other_rows, spreads)]
    return {"results": rows, "machine": {"cpu_count": 2, "threads": threads, "load_average": [0.1, 0.1, 0.1],
                                         "other_load_cores_before": other_before}}


def test_busy_warnings_quiet_machine_says_nothing():
    assert bench.busy_warnings(_doc()) == []
    assert bench.busy_warnings(_doc(other_before=None, other_rows=(None,))) == []   # unknown: no claim


def test_busy_warnings_name_the_load_and_the_thread_advice():
    w = bench.busy_warnings(_doc(other_rows=(0.0, 1.3), spreads=(0.05, 0.05)))
    assert len(w) == 1 and "busy" in w[0] and "1.3 of its 2 cores" in w[0] and "--threads 1" in w[0]
    w1 = bench.busy_warnings(_doc(other_before=0.9, threads=1))
    assert len(w1) == 1 and "busy" in w1[0] and "--threads 1" not in w1[0]
    # a wide round-to-round spread is its own warning, even when no other process was seen
    w2 = bench.busy_warnings(_doc(spreads=(0.05, 0.6), other_rows=(0.0, 0.0)))
    assert len(w2) == 1 and "unsteady" in w2[0] and "1.00–1.60" in w2[0]


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux /proc/stat")
def test_other_load_sees_a_spinning_child_process():
    """A child that spins for 1.5 s at our priority shows up as about one core of other load;
    our own spinning does not (it is subtracted)."""
    spin = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.3)                                          # past the interpreter's start
        with bench.OtherLoad() as seen:
            time.sleep(0.8)
    finally:
        child.kill()
        child.wait()
    assert seen.cores is not None and seen.cores >= 0.5
    with bench.OtherLoad() as own:
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            pass
    assert own.cores is not None and own.cores < seen.cores


def test_recommended_threads_is_one_only_when_busy(monkeypatch):
    assert bench.recommended_threads(others=0.1, available=2) == 2
    assert bench.recommended_threads(others=bench.BUSY_CORES, available=2) == 1
    # recommended_threads looks other_load up in perf.machine, where it lives: patched there
    monkeypatch.setattr(machine, "other_load", lambda seconds=0.5: None)  # not measurable (no /proc)
    assert bench.recommended_threads(available=2) == 2                    # unknown load: left as it is
    monkeypatch.setattr(machine, "other_load", lambda seconds=0.5: 1.8)
    assert bench.recommended_threads(available=2) == 1                    # measured when not given


def test_busy_start_lowers_the_threads_and_says_so(monkeypatch):
    """When other processes keep the machine busy before the run, the default is 1 thread each side,
    the document says from how many it was lowered, and OpenBLAS gets its thread count back after."""
    pytest.importorskip("torch", reason="the benchmark compares against PyTorch")
    threadpoolctl = pytest.importorskip("threadpoolctl")
    torch = pytest.importorskip("torch")

    def blas_threads():
        return next(i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")["num_threads"]

    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        torch_before = torch.get_num_threads()
        monkeypatch.setattr(bench, "other_load", lambda seconds=0.5: 1.5)   # run_benchmark's own look-up, in bench
        doc = bench.run_benchmark([bench.parse_shape(TINY)], ["float32"], ("fwd",), rounds=1, memory=False)
        assert doc["machine"]["threads"] == 1 and doc["machine"]["torch_threads"] == 1
        assert doc["machine"]["threads_lowered_from"] == 2
        assert any("instead of 2" in w for w in doc["warnings"])
        assert any("busy" in w for w in doc["warnings"])
        assert blas_threads() == 2                                    # restored after the run
        # an explicit thread count is kept even on a busy machine
        doc = bench.run_benchmark([bench.parse_shape(TINY)], ["float32"], ("fwd",), rounds=1, memory=False,
                                  threads=2)
        assert doc["machine"]["threads"] == 2 and doc["machine"]["threads_lowered_from"] is None
        torch.set_num_threads(torch_before)


def test_parse_shape_names_and_custom():
    assert bench.parse_shape("bert-base") == ("bert-base", (8, 128, 768, 12, 3072))
    assert bench.parse_shape("long")[1] == (2, 2048, 64, 4, 256)
    assert bench.parse_shape("attn-512")[1] == (2, 512, 64, 4, 256)
    assert bench.parse_shape(TINY)[1] == (2, 8, 16, 2, 32)
    for bad in ("huge", "1,2,3", "2,8,15,2,32", "2,8,16,0,32", "a,b,c,d,e"):
        with pytest.raises(ValueError, match="shape"):
            bench.parse_shape(bad)


# ----------------------------------------------------------------------------- memory report
def test_cache_nbytes_linear_counts_input_not_weight():
    rng = np.random.default_rng(0)
    x, W, b = rng.standard_normal((3, 5, 4)), rng.standard_normal((4, 6)), np.zeros(6)
    _, cache = linear_forward(x, W, b)
    rep = cache_nbytes(cache)
    assert rep["entries"] == {"x": x.nbytes}
    assert rep["total"] == x.nbytes
    assert rep["param_refs"] == {"W": W.nbytes}
    assert cache_nbytes(cache, include_params=True)["total"] == x.nbytes + W.nbytes


def test_cache_nbytes_counts_shared_buffers_once():
    """Q, K, V views of one array and A referenced three times (weights, A_drop, softmax.s); O is kept
    too (the fast backward's ⟨dO, O⟩ row sums)."""
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((3, 2, 2, 5, 4))                   # (3, B, h, n, d_k)
    O, cache = attention_forward(qkv[0], qkv[1], qkv[2])
    rep = cache_nbytes(cache)
    A = cache["weights"]
    assert rep["entries"]["Q"] == qkv[0].nbytes
    assert rep["entries"]["weights"] == rep["entries"]["softmax.s"] == A.nbytes
    assert rep["entries"]["O"] == O.nbytes and cache["O"] is O
    assert rep["total"] == qkv.nbytes + A.nbytes + O.nbytes       # owners: qkv, A, O
    assert sum(rep["entries"].values()) == 3 * qkv[0].nbytes + 3 * A.nbytes + O.nbytes


def test_cache_nbytes_layer_groups_and_encoder_per_layer():
    cfg = EncoderConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16, dropout=0.0)
    params = init_params(cfg, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 3, 8))
    _, lc = encoder_layer_forward(x, sub_params(params, "layers.0."), cfg)
    rep = cache_nbytes(lc)
    assert set(rep["groups"]) >= {"attn", "ln1", "ffn", "ln2"}
    assert sum(rep["groups"].values()) == sum(rep["entries"].values())
    # the attention weights A (B, h, n, n) and f'(z) (B, n, d_ff) are in the cache
    assert rep["entries"]["attn.attn.weights"] == 2 * 2 * 3 * 3 * 8
    assert rep["entries"]["ffn.act.grad"] == 2 * 3 * 16 * 8
    _, ec = encoder_forward(params, cfg, inputs_embeds=x)
    erep = cache_nbytes(ec)
    assert {"layers.0", "layers.1"} <= set(erep["groups"])


def test_cache_nbytes_rejects_non_dict():
    with pytest.raises(TypeError, match="cache"):
        cache_nbytes([np.zeros(3)])


def test_mha_cache_keeps_no_duplicate_of_qkv():
    """Nothing cached twice: Q, K, V are views of the one fused projection output."""
    cfg_d, h = 8, 2
    rng = np.random.default_rng(1)
    p = {k: rng.standard_normal((cfg_d, cfg_d) if k.startswith("W") else (cfg_d,))
         for k in ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O")}
    x = rng.standard_normal((2, 4, cfg_d))
    _, cache = mha_forward(x, p, h)
    rep = cache_nbytes(cache)
    # owners: x, the qkv output (B, n, 3d), A (B, h, n, n), ctx (B, n, d)
    expected = x.nbytes + 2 * 4 * 3 * cfg_d * 8 + 2 * h * 4 * 4 * 8 + x.nbytes
    assert rep["total"] == expected


# ----------------------------------------------------------------------------- the command
def _run_cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "transformer_np", "bench", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)


def test_bench_quick_json_schema_on_a_tiny_shape():
    pytest.importorskip("torch", reason="the benchmark compares against PyTorch")
    proc = _run_cli("--quick", "--json", "--shape", TINY, "--rounds", "2")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) >= {"results", "memory", "machine"}
    assert [r["mode"] for r in doc["results"]] == ["fwd", "fwd+bwd"]
    cfg = EncoderConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, dropout=0.0)
    for r in doc["results"]:
        assert set(r) >= {"shape", "dtype", "mode", "numpy_ms", "torch_ms", "ratio_vs_torch", "gflops",
                          "peak_fraction"}
        assert r["shape"] == TINY and r["dtype"] == "float32"
        assert r["numpy_ms"] > 0 and r["torch_ms"] > 0 and r["ratio_vs_torch"] > 0
        sp = r["spread"]                                          # the per-round ratios' spread
        assert sp["min"] <= sp["q1"] <= sp["median"] <= sp["q3"] <= sp["max"]
        assert sp["median"] == pytest.approx(r["ratio_vs_torch"], abs=1e-3)
        assert r["other_load_cores"] is None or r["other_load_cores"] >= 0
        # GFLOP/s is the FLOP function's count over NumPy's median time (rounding aside)
        flops = layer_flops(cfg, 2, 8, r["mode"])["total"]
        assert r["gflops"] == pytest.approx(flops / (r["numpy_ms"] / 1e3) / 1e9, rel=0.02, abs=0.06)
        peak = doc["machine"]["matmul_peak_gflops"]["float32"]
        # gflops is rounded to 0.1 and peak_fraction to 0.001, each from the unrounded value: at most
        # 0.05 / peak + 0.0005 apart (a tiny shape on a loaded machine: gflops ~0.1, peak ~25)
        assert abs(r["peak_fraction"] - r["gflops"] / peak) <= 0.05 / peak + 5e-4 + 1e-12
    assert doc["machine"]["threads"] >= 1 and doc["machine"]["torch_threads"] == doc["machine"]["threads"]
    assert isinstance(doc["warnings"], list) and all(isinstance(w, str) for w in doc["warnings"])
    assert doc["machine"]["clock"] == "wall"
    assert doc["warnings"] == bench.busy_warnings(doc)


def test_bench_numpy_and_torch_sides_compute_the_same_layer():
    """The timed torch layer and the NumPy layer agree (same weights, same inputs)."""
    torch = pytest.importorskip("torch", reason="the benchmark compares against PyTorch")
    np_call, torch_call, _ = bench.build_pair((2, 8, 16, 2, 32), "float64", "fwd")
    ours, _ = np_call()
    theirs = torch_call().numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-10)
    assert torch.get_num_threads() >= 1


def test_bench_bad_arguments_exit_2():
    proc = _run_cli("--quick", "--rounds", "0")
    assert proc.returncode == 2 and "rounds" in proc.stderr
    proc = _run_cli("--shape", "1,2,3")
    assert proc.returncode == 2 and "shape" in proc.stderr


def test_measure_memory_reports_both_sides_on_a_tiny_shape():
    pytest.importorskip("torch", reason="the benchmark compares against PyTorch")
    mem = bench.measure_memory((2, 8, 16, 2, 32), "float32", threads=1)
    assert mem["numpy_rss_bytes"] >= 0 and mem["torch_rss_bytes"] >= 0 and mem["numpy_default_rss_bytes"] >= 0
    assert mem["numpy_tracemalloc_bytes"] > 0          # at least the gradients are allocated
    assert "VmHWM" in mem["method"]


def test_measure_memory_reports_the_median_of_its_runs():
    pytest.importorskip("torch", reason="the benchmark compares against PyTorch")
    mem = bench.measure_memory((2, 8, 16, 2, 32), "float32", threads=1, repeats=3)
    for side in ("numpy", "torch"):
        runs = mem[f"{side}_rss_bytes_runs"]
        assert len(runs) == 3 and mem["repeats"] == 3
        assert mem[f"{side}_rss_bytes"] == sorted(runs)[1]            # the middle run, a measured value
    assert "median of 3" in mem["method"]
    assert bench._mib_range([2**20, 3 * 2**20]) == "1.0–3.0 MiB" and bench._mib_range([5]) == "one run"
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="repeats"):
            bench.measure_memory((2, 8, 16, 2, 32), "float32", threads=1, repeats=bad)


# ----------------------------------------------------------------------------- complexity fit
def test_complexity_fit_recovers_known_coefficients():
    from transformer_np.course import complexity as cx
    rows = [{"n": n, "d": 256} for n in cx.N_SWEEP["ns"]] + [{"n": 256, "d": d} for d in cx.D_SWEEP["ds"]]
    true = np.array([2e-11, 1e-11, 3e-9])                      # alpha, beta, gamma
    F = cx._features([r["n"] for r in rows], [r["d"] for r in rows])
    for r, t in zip(rows, F @ true):
        r["seconds"] = float(t)
    coef = cx.fit({"rows": rows})
    np.testing.assert_allclose([coef["alpha"], coef["beta"], coef["gamma"]], true, rtol=1e-6)
    assert coef["max_rel_error"] < 1e-9
    # attention's share grows with n at fixed d, and the crossover is where it reaches 1/2
    share = cx.attention_share(coef, [64, 4096], [256, 256])
    assert share[0] < share[1]
    n_star = cx.crossover_measured(coef, 256)
    assert cx.attention_share(coef, [n_star - 1], [256])[0] < 0.5 <= cx.attention_share(coef, [n_star], [256])[0]


def test_complexity_figure_from_stored_measurements(tmp_path):
    pytest.importorskip("matplotlib")
    from transformer_np.course import complexity as cx
    paths = cx.save_figures(str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["complexity.png"]
    first = open(paths[0], "rb").read()
    cx.save_figures(str(tmp_path))
    assert open(paths[0], "rb").read() == first               # deterministic bytes


def test_float32_layer_stays_float32_everywhere():
    """No float64 scalar or constant upcasts a float32 computation (NumPy 2, NEP 50): every
    cached array and every gradient of a float32 layer is float32."""
    cfg = EncoderConfig(n_layers=1, d_model=8, n_heads=2, d_ff=16, dropout=0.0)
    p = sub_params(init_params(cfg, seed=0, dtype=np.float32), "layers.0.")
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    out, cache = encoder_layer_forward(x, p, cfg)
    assert out.dtype == np.float32
    arrays = []
    from transformer_np.perf.memory import _walk
    _walk(cache, "", arrays)
    assert arrays and all(a.dtype == np.float32 for _, a in arrays), \
        [(path, a.dtype) for path, a in arrays if a.dtype != np.float32]
    from transformer_np.model.encoder import encoder_layer_backward
    dx, grads = encoder_layer_backward(np.ones_like(out), cache)
    assert dx.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())


def test_torch_saved_bytes_counts_activations_like_our_cache():
    """torch's saved tensors for one forward: at least the GELU input and output (B, n, d_ff)
    each; the same order of magnitude as our cache, which also keeps A (B, h, n, n)."""
    pytest.importorskip("torch", reason="the benchmark compares against PyTorch")
    dims = (2, 8, 16, 2, 32)
    saved = bench.torch_saved_nbytes(dims, "float32")
    assert saved >= 2 * 2 * 8 * 32 * 4
    ours = bench.cache_report(dims, "float32")["total"]
    assert saved / 2 < ours < saved * 2


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux /proc")
def test_busy_study_runs_its_cells_and_stops_its_busy_loops(monkeypatch):
    """Two cells on a tiny shape: without and with one busy loop. The loop the study started is gone
    afterwards (killed by pid), and with it running the other processes used more of the machine.
    Only the processes this study started are checked (by their ids): another test run or a colleague's
    busy loop on the same machine is none of this test's business."""
    pytest.importorskip("torch", reason="the benchmark compares against PyTorch")
    from transformer_np.perf import busy

    started = []   # the busy loops' Popen objects, recorded as the study starts them
    real_popen = subprocess.Popen

    def recording_popen(args, *a, **kw):
        p = real_popen(args, *a, **kw)
        if isinstance(args, list) and busy._SPIN in args:
            started.append(p)
        return p

    monkeypatch.setattr(busy.subprocess, "Popen", recording_popen)
    rows = bench.busy_study((2, 8, 16, 2, 32), threads=(1,), spinners=(0, 1), rounds=2, spin_seconds=60)
    monkeypatch.undo()
    assert [(r["threads"], r["spinners"]) for r in rows] == [(1, 0), (1, 1)]
    for r in rows:
        assert r["numpy_ms"] > 0 and r["torch_ms"] > 0 and r["ratio_min"] <= r["ratio_vs_torch"] <= r["ratio_max"]
        assert r["numpy_cpu_s_per_call"] >= 0 and r["torch_cpu_s_per_call"] >= 0
    assert rows[1]["other_load_cores_before"] > 0.3               # the busy loop was seen
    assert len(started) == 1                                      # one cell with one busy loop
    for p in started:
        assert p.returncode is not None, f"busy loop {p.pid} was not reaped"   # killed and waited for
        try:   # its pid is free, or reused by a process that is not a busy loop
            cmdline = open(f"/proc/{p.pid}/cmdline", errors="replace").read()
        except OSError:
            cmdline = ""
        assert "while time.time() < end" not in cmdline, f"busy loop {p.pid} still runs"
    assert "| 1 | 1 |" in bench.format_busy_study(rows)


def test_bench_recompute_rows_and_memory_side_on_a_tiny_shape():
    """--recompute adds the store_attention=False rows (same schema); the memory report then has the
    recompute side; and the recomputing NumPy layer still computes torch's layer."""
    pytest.importorskip("torch", reason="the benchmark compares against PyTorch")
    proc = _run_cli("--quick", "--json", "--shape", TINY, "--rounds", "1", "--recompute")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [r["mode"] for r in doc["recompute"]] == ["fwd", "fwd+bwd"]
    assert all(set(r) == set(doc["results"][0]) for r in doc["recompute"])
    mem = bench.measure_memory((2, 8, 16, 2, 32), "float32", threads=1, recompute=True)
    assert mem["numpy_recompute_rss_bytes"] >= 0 and mem["ratio_vs_torch_recompute"] is not None
    np_call, torch_call, _ = bench.build_pair((2, 8, 16, 2, 32), "float64", "fwd", store_attention=False)
    ours, cache = np_call()
    assert cache["attn"]["attn"]["weights"] is None                   # A was not kept
    np.testing.assert_allclose(ours, torch_call().numpy(), rtol=1e-10, atol=1e-10)
