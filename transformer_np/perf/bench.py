r"""``python -m transformer_np bench``: one encoder layer, NumPy against PyTorch's eager layer.

What is compared. Our Post-LN :func:`encoder_layer_forward` / :func:`encoder_layer_backward`
against ``torch.nn.TransformerEncoderLayer(d, h, d_ff, dropout=0, activation="gelu",
batch_first=True)`` with *the same weights* (the torch layer is built first, with torch's
seeded init, and our params are read from it by :func:`transformer_np.io.interop.from_torch`)
and the same number of threads (``torch.set_num_threads`` = OpenBLAS's thread count).

* ``fwd``: NumPy's forward (which also builds the cache backward needs) against torch under
  ``torch.no_grad()`` in eval mode with the fused "fast path" switched off
  (``torch.backends.mha.set_fastpath_enabled(False)``), i.e. torch's op-by-op eager layer.
* ``fwd+bwd``: forward, then the backward of a fixed upstream gradient dY to every
  parameter and to the input, on both sides (torch: ``y.backward(dY)``, grads set to None
  before each call so nothing accumulates).

How it is timed. After one warm-up call of each, the two run in alternating blocks, NumPy's
then torch's (then the limit's, below), for ``rounds`` rounds; the quoted ratio is the *median of
the per-round ratios* NumPy/torch. This machine's speed drifts from call to call (other jobs share
its cores); a drift slower than one round hits both sides of that round alike and cancels in its
ratio. A block is *settled* (:func:`settled_call`): untimed calls of its own side for at least
:data:`SETTLE_S` seconds and at least one call, then the timed call. The reason: after a call,
OpenBLAS's idle worker threads spin for 2**28 TSC cycles (~0.1 s here) before they sleep, and
with 2 threads on 2 cores a spinning NumPy worker takes a core from torch's next call (measured:
torch's bert-base fwd 67–110 ms alone, 143–173 ms straight after a NumPy call, which made the
old back-to-back ratios flatter NumPy); torch's threads park within a few ms. With 1 thread no
worker spins, yet torch's short calls still ran slower straight after NumPy's (attn-512 fwd:
4.6 ms alone, 6.9–14.5 ms after NumPy, with no page faults: the caches' state, probably); settled
blocks remove that too. An idle pause instead of the untimed calls is no fix: on this VM both
sides came back slower from a sleep (NumPy 179 → 233 ms, torch 110 → 150 ms).

The NumPy limit (:mod:`transformer_np.perf.limit`): each round also runs, third, the work NumPy
cannot avoid for the row — every matrix product of the layer as one ``np.matmul`` call, plus one
cache-blocked ``np.exp`` pass over the B·h·n² scores — and the row reports its median time
(``limit_s``) and the median of the per-round limit/NumPy ratios (``limit_fraction``). A row whose
per-round ratios spread by more than :data:`UNSTEADY_SPREAD` is run again with fresh rounds until
steady or until its round budget is spent (``steady``, ``attempts``, ``rounds_run``).

GFLOP/s = :func:`transformer_np.model.flops.layer_flops` ``["total"]`` (matrix products only, the
same count as the complexity plot) / NumPy's median time. ``peak_fraction`` divides it by
this machine's measured matmul peak: the best of a few large square ``np.matmul`` calls in
the same dtype and thread count.

Memory: the peak of one forward+backward, each side in a fresh Python process that imports
the same modules, builds the same inputs and runs one warm-up call first (Linux only). Measured as the growth of the
process's resident set size across the one call: free heap memory is handed back to the OS
first (``malloc_trim``), the high-water mark is reset (``/proc/self/clear_refs`` ← 5), and the
result is ``VmHWM`` after the call minus ``VmRSS`` before it. So parameters and inputs
(allocated before) are excluded and the gradients (alive at the end) are included — the same
rule for both sides (torch's CPU tensors come from the same malloc). A third process traces
NumPy's own allocations with :mod:`tracemalloc` (NumPy reports its buffers to it) as a
cross-check; torch has no equivalent hook, so RSS growth is the like-for-like number.
The NumPy side runs its backward with ``free_cache=True`` (each sublayer's cache entries are
released as soon as their backward step is done, as autograd frees saved tensors); the
default backward, which keeps the whole cache alive until the caller drops it, is measured
too (``numpy_default_rss_bytes``). The timed ``fwd+bwd`` rows use the default backward.
"""

from __future__ import annotations

import os
import statistics
import time

from .._compat import forward_moved as _forward_moved
from ..model.flops import layer_flops

# Split by role: the parts live in lower modules (timing, machine, pair, minilm_bench, memory_bench, busy),
# which never import this one; this module runs the rows. Every name importable from here before the split
# still is: the ones not used here are re-exported with an ``as`` alias.
from .busy import busy_study, format_busy_study
from .machine import (
    BUSY_CORES,
    UNSTEADY_SPREAD,
    OtherLoad,
    _blas_threads,
    _fmt_cores,
    _import_torch,
    _limit_blas_threads,
    busy_warnings,
    library_thread_defaults,
    machine_info,
    matmul_peak,
    other_load,
    recommended_threads,
)
from .memory_bench import MEMORY_REPEATS, cache_report, measure_memory, torch_saved_nbytes
from .minilm_bench import _minilm_rounds as _minilm_rounds
from .minilm_bench import _sentences as _sentences
from .minilm_bench import minilm_throughput
from .pair import DTYPES, MODES, SHAPES, build_pair
from .pair import parse_shape as parse_shape
from .timing import CLOCKS, SETTLE_S, _check_settle, interleaved, settled_call, spread

__all__ = ["SHAPES", "DTYPES", "MODES", "build_pair", "SETTLE_S", "settled_call", "interleaved", "spread",
           "matmul_peak", "machine_info",
           "OtherLoad", "other_load", "busy_warnings", "recommended_threads", "BUSY_CORES", "UNSTEADY_SPREAD",
           "run_benchmark", "measure_memory", "torch_saved_nbytes", "cache_report", "format_table",
           "minilm_throughput", "library_thread_defaults", "busy_study", "format_busy_study"]


# ----------------------------------------------------------------------------- the run
def run_benchmark(shapes, dtypes, modes=MODES, rounds: int = 7, memory: bool = True,
                  threads: int | None = None, log=None, recompute: bool = False, clock: str = "wall",
                  max_rounds: int | None = None, settle: float = SETTLE_S) -> dict:
    """Every (shape, dtype, mode) row, plus memory and machine info; the ``--json`` document.

    ``recompute=True`` adds ``doc["recompute"]``: the same rows with the NumPy layer run with
    ``store_attention=False`` (A recomputed by row blocks in the backward, see
    :func:`transformer_np.fast.attention_forward`). ``clock="cpu"`` times each call by this
    process's CPU time instead of the wall clock (``threads`` must then be 1: with more, CPU time
    also counts threads waiting for each other) — on a busy machine the wall clock measures the
    other processes as much as the code; a single thread's CPU time measures the work.

    ``max_rounds``: the round budget of an unsteady row (default 3 × ``rounds``, see :func:`_timed_row`).
    ``settle``: seconds of untimed calls of a side before each of its timed calls (:func:`interleaved`;
    ``machine["settle_s"]`` in the document).
    ``log`` (e.g. a printer to stderr) receives a progress line as each row starts, one every few
    seconds while a long row runs, and each row's result.

    The fast path's thread settings are the library's defaults for the run (:func:`library_thread_defaults`):
    one elementwise thread (a second one was measured slower at 2 BLAS threads; the limit's exp pass still
    uses ``threads``), and ``threads`` batch threads (the inference layer splits its batch, attention its
    heads, over them with OpenBLAS at one thread in each), recorded as ``machine["elementwise_threads"]``
    and ``machine["batch_threads"]``, and restored after it."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    if clock == "cpu" and threads != 1:
        raise ValueError(f"clock='cpu' needs threads=1 (CPU time of several threads counts their waiting), "
                         f"got threads={threads}")
    _check_settle(settle)
    torch = _import_torch()
    others_before = other_load()
    blas_threads, source = _blas_threads()
    lowered_from, limiter = None, None
    if threads is None:
        threads = recommended_threads(others_before, blas_threads)
        if threads < blas_threads:
            lowered_from = blas_threads
            source = (f"{threads}: the machine was busy before the run (other processes used "
                      f"{others_before:.1f} cores); --threads N overrides")
    if threads != blas_threads:
        limiter = _limit_blas_threads(threads)
        if _blas_threads()[0] != threads:
            limiter.restore_original_limits()
            raise RuntimeError(f"could not set OpenBLAS's threads to {threads} (it has {_blas_threads()[0]})")
    torch.set_num_threads(threads)
    machine = machine_info(threads, source)
    machine["other_load_cores_before"] = _round(others_before)
    machine["threads_lowered_from"] = lowered_from
    machine["clock"] = clock
    machine["settle_s"] = settle
    try:
        with library_thread_defaults() as counts:
            machine.update(counts)
            return _run_rows(shapes, dtypes, modes, rounds, memory, threads, machine, log, recompute, clock,
                             max_rounds, settle)
    finally:
        if limiter is not None:
            limiter.restore_original_limits()


def _mib_range(values) -> str:
    """'a–b MiB' of a list of byte counts (the runs of a memory measurement); 'one run' for fewer than two."""
    if not values or len(values) < 2:
        return "one run"
    return f"{min(values) / 2**20:.1f}–{max(values) / 2**20:.1f} MiB"


def _timed_row(name, dims, dtype, mode, rounds, peak, store_attention=True, clock="wall", threads: int = 1,
               max_rounds: int | None = None, progress=None, settle: float = SETTLE_S) -> dict:
    """One interleaved NumPy-vs-torch row (see :func:`run_benchmark`), with its NumPy limit.

    Every round runs a block of NumPy, of torch and of the limit (:func:`transformer_np.perf.limit.limit_call`),
    each block settled (:func:`interleaved`: ``settle`` seconds of untimed calls of its own side before
    its timed call). A row whose per-round ratios spread by more than :data:`UNSTEADY_SPREAD` of their median is
    run again with fresh rounds while the round budget ``max_rounds`` (default ``3 * rounds``) allows;
    the steadiest attempt is reported, with ``steady`` False when none was steady."""
    from .limit import attention_bound, limit_call

    np_call, torch_call, config = build_pair(dims, dtype, mode, store_attention=store_attention)
    limit = limit_call(dims, dtype, mode, threads)
    budget = 3 * rounds if max_rounds is None else max(rounds, max_rounds)
    best, used, attempts, others_seen = None, 0, 0, []
    while used + rounds <= budget:
        attempts += 1
        with OtherLoad() as others:
            t = interleaved(np_call, torch_call, rounds, clock=clock, c=limit, settle=settle,
                            progress=None if progress is None else
                            (lambda i, k, a=attempts, u=used: progress(a, u + i, budget)))
        used += rounds
        others_seen.append(others.cores)
        if best is None or t["spread"]["rel_range"] < best["spread"]["rel_range"]:
            best = t
        if best["spread"]["rel_range"] <= UNSTEADY_SPREAD:
            break
    t = best
    flops = layer_flops(config, dims[0], dims[1], mode)["total"]
    gflops = flops / (t["a_ms"] / 1e3) / 1e9
    seen = [v for v in others_seen if v is not None]
    return {"shape": name, "dtype": dtype, "mode": mode, "numpy_ms": round(t["a_ms"], 2),
            "torch_ms": round(t["b_ms"], 2), "ratio_vs_torch": round(t["ratio"], 3),
            "gflops": round(gflops, 1), "peak_fraction": round(gflops / peak, 3),
            "torch_gflops": round(flops / (t["b_ms"] / 1e3) / 1e9, 1), "rounds": rounds,
            "spread": {k: round(v, 3) for k, v in t["spread"].items()},
            "other_load_cores": _round(max(seen)) if seen else None,
            "limit_s": round(t["c_ms"] / 1e3, 6), "limit_fraction": round(statistics.median(t["c_over_a"]), 3),
            "limit_torch_ratio": round(t["c_ms"] / t["b_ms"], 3), "attention_bound": attention_bound(dims),
            "steady": t["spread"]["rel_range"] <= UNSTEADY_SPREAD, "attempts": attempts, "rounds_run": used,
            "settle_calls": dict(zip(("numpy", "torch", "limit"), t["settle_calls"]))}


def _log_row(log, row, label: str = "") -> None:
    if log:
        sp = row["spread"]
        log(f"{row['shape']:10s} {row['dtype']:8s} {row['mode']:8s}{label} numpy {row['numpy_ms']:9.1f} ms  torch "
            f"{row['torch_ms']:9.1f} ms  ratio {row['ratio_vs_torch']:.3f}  NumPy limit {1e3 * row['limit_s']:.1f} ms "
            f"(limit/numpy {row['limit_fraction']:.2f}, limit/torch {row['limit_torch_ratio']:.2f}) (rounds: min "
            f"{sp['min']:.2f}, IQR {sp['q1']:.2f}–{sp['q3']:.2f}, max {sp['max']:.2f}; others used "
            f"{_fmt_cores(row['other_load_cores'])} cores)"
            + ("" if row["steady"] else f" UNSTEADY after {row['rounds_run']} rounds (the round budget)"))


class _Progress:
    """Progress lines for ``log``: one as each row starts, then at most one every ``every`` seconds."""

    def __init__(self, log, total: int, every: float = 3.0, settle: float = SETTLE_S):
        self.log, self.total, self.every, self.done, self._last = log, total, every, 0, 0.0
        self.settle = settle

    def start(self, what: str, rounds: int) -> None:
        self.done += 1
        self.what = what
        if self.log:
            self.log(f"[{self.done}/{self.total}] {what}: {rounds} rounds of NumPy, torch and the NumPy limit "
                     f"(each timed call after {self.settle:g} s of its own side's untimed calls) …")
        self._last = time.perf_counter()

    def round(self, attempt: int, used: int, budget: int) -> None:
        if self.log and time.perf_counter() - self._last >= self.every:
            again = " (second try: the first rounds were unsteady)" if attempt == 2 else \
                (f" (try {attempt}: earlier rounds were unsteady)" if attempt > 2 else "")
            self.log(f"[{self.done}/{self.total}] {self.what}: round {used} of at most {budget}{again}")
            self._last = time.perf_counter()


def _run_rows(shapes, dtypes, modes, rounds, memory, threads, machine, log, recompute=False, clock="wall",
              max_rounds=None, settle=SETTLE_S) -> dict:
    peaks = {}
    results, recomputed = [], []
    prog = _Progress(log, len(shapes) * len(dtypes) * len(modes) * (2 if recompute else 1), settle=settle)
    kw = dict(clock=clock, threads=threads, max_rounds=max_rounds, progress=prog.round, settle=settle)
    for name, dims in shapes:
        for dtype in dtypes:
            if dtype not in peaks:
                if log:
                    log(f"measuring the {dtype} matmul peak …")
                peaks[dtype] = matmul_peak(dtype)
            for mode in modes:
                prog.start(f"{name} {dtype} {mode}", rounds)
                results.append(_timed_row(name, dims, dtype, mode, rounds, peaks[dtype], **kw))
                _log_row(log, results[-1])
            if recompute:
                for mode in modes:
                    prog.start(f"{name} {dtype} {mode} without stored attention", rounds)
                    recomputed.append(_timed_row(name, dims, dtype, mode, rounds, peaks[dtype], store_attention=False,
                                                 **kw))
                    _log_row(log, recomputed[-1], " [store_attention=False]")
    machine["matmul_peak_gflops"] = {k: round(v, 1) for k, v in peaks.items()}
    mem = {}
    if memory:
        for name, dims in shapes:
            for dtype in dtypes:
                key = f"{name}/{dtype}"
                if log:
                    log(f"peak memory {key}: one fwd+bwd per fresh process, NumPy and torch {MEMORY_REPEATS} "
                        f"times each …")
                mem[key] = measure_memory(dims, dtype, threads, recompute)
                cache = cache_report(dims, dtype)
                mem[key]["numpy_cache_bytes"] = cache["total"]
                mem[key]["numpy_cache_bytes_by_sublayer"] = cache["groups"]
                mem[key]["torch_saved_bytes"] = torch_saved_nbytes(dims, dtype)
                if log:
                    m = mem[key]
                    log(f"memory {key}: numpy {m['numpy_rss_bytes'] / 2**20:.1f} MiB "
                        f"({_mib_range(m['numpy_rss_bytes_runs'])}), torch "
                        f"{m['torch_rss_bytes'] / 2**20:.1f} MiB ({_mib_range(m['torch_rss_bytes_runs'])})")
    try:
        machine["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        pass
    doc = {"results": results, "memory": mem, "machine": machine}
    if recompute:
        doc["recompute"] = recomputed
    doc["warnings"] = busy_warnings(doc)
    return doc


def _round(v: float | None, digits: int = 2) -> float | None:
    return None if v is None else round(v, digits)


def format_table(doc: dict) -> str:
    """The Markdown table of the README (times, ratio, GFLOP/s, fraction of matmul peak, memory)."""
    lines = ["| shape | dtype | mode | NumPy ms | torch ms | NumPy/torch | rounds min–max | NumPy limit ms "
             "| limit / NumPy | limit / torch | NumPy GFLOP/s | of matmul peak | torch GFLOP/s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = [(r, "") for r in doc["results"]] + [(r, " (store_attention=False)") for r in doc.get("recompute", [])]
    for r, label in rows:
        sp = r.get("spread")
        rng = f"{sp['min']:.2f}–{sp['max']:.2f}" if sp else "n/a"
        if r.get("steady") is False:
            rng += f" (unsteady after {r['rounds_run']} rounds)"
        lim = (f"{1e3 * r['limit_s']:.1f} | {r['limit_fraction']:.2f}"
               + ("" if r.get("attention_bound", True) else " (FFN-heavy: loose)")
               + f" | {r['limit_torch_ratio']:.2f}×") if r.get("limit_s") is not None else "n/a | n/a | n/a"
        lines.append(f"| {r['shape']} | {r['dtype']} | {r['mode']}{label} | {r['numpy_ms']:.1f} | "
                     f"{r['torch_ms']:.1f} | {r['ratio_vs_torch']:.2f}× | {rng} | {lim} | {r['gflops']:.1f} | "
                     f"{100 * r['peak_fraction']:.0f}% | {r['torch_gflops']:.1f} |")
    if doc.get("memory"):
        lines += ["", "| shape/dtype | NumPy peak (RSS growth, free_cache; median, range) | torch peak (RSS growth; "
                      "median, range) | NumPy/torch | "
                      "NumPy peak, store_attention=False | its NumPy/torch | "
                      "NumPy peak, default backward | NumPy tracemalloc peak (free_cache) | NumPy cache | "
                      "torch saved tensors |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for key, m in doc["memory"].items():
            ratio = "n/a" if m["ratio_vs_torch"] is None else f"{m['ratio_vs_torch']:.2f}×"
            rc = m.get("ratio_vs_torch_recompute")
            np_runs, t_runs = _mib_range(m.get("numpy_rss_bytes_runs")), _mib_range(m.get("torch_rss_bytes_runs"))
            lines.append(f"| {key} | {m['numpy_rss_bytes'] / 2**20:.1f} MiB ({np_runs}) "
                         f"| {m['torch_rss_bytes'] / 2**20:.1f} MiB ({t_runs}) "
                         f"| {ratio} | {(m.get('numpy_recompute_rss_bytes') or float('nan')) / 2**20:.1f} MiB "
                         f"| {'n/a' if rc is None else f'{rc:.2f}×'} "
                         f"| {m.get('numpy_default_rss_bytes', float('nan')) / 2**20:.1f} MiB "
                         f"| {m['numpy_tracemalloc_bytes'] / 2**20:.1f} MiB | "
                         f"{m['numpy_cache_bytes'] / 2**20:.1f} MiB | "
                         f"{m.get('torch_saved_bytes', float('nan')) / 2**20:.1f} MiB |")
    mach = doc["machine"]
    lines += ["", f"Measured {mach['date']} on {mach['cpu']} ({mach['cpu_count']} cores), {mach['threads']} threads "
                  f"each side ({mach['threads_source']}), NumPy {mach['numpy']}, torch {mach['torch']}, "
                  f"matmul peak {mach.get('matmul_peak_gflops')} GFLOP/s, load average "
                  f"{mach.get('load_average')} before / {mach.get('load_average_after')} after, other processes "
                  f"{_fmt_cores(mach.get('other_load_cores_before'))} cores before the run; times by the "
                  f"{'process CPU time' if mach.get('clock') == 'cpu' else 'wall clock'}"
                  + (f", each timed call after {mach['settle_s']:g} s (and at least one call) of its own side's "
                     f"untimed calls" if mach.get("settle_s") is not None else "") + "."]
    for w in doc.get("warnings", []):
        lines += ["", f"**Warning:** {w}"]
    if "minilm" in doc:
        m = doc["minilm"]
        lines += ["", f"MiniLM encode ({m['sentences']} sentences, float32): NumPy {m['numpy_per_s']:.0f}/s, "
                      f"sentence-transformers {m['sentence_transformers_per_s']:.0f}/s, "
                      f"ratio {m['throughput_ratio']:.2f}"
                      + (f"; NumPy limit {m['limit_s']:.2f} s ({m['limit_fraction']:.2f} of NumPy's time, "
                         f"{m['limit_torch_ratio']:.2f}x sentence-transformers' time)" if "limit_s" in m else "")
                      + "."]
    return "\n".join(lines)


# Moved in 0.2 (study code to transformer_np.course, the command line to transformer_np.cli);
# the old names keep resolving.
__getattr__ = _forward_moved(__name__, {
    "add_arguments": "transformer_np.cli.bench",
    "run": "transformer_np.cli.bench",
})
