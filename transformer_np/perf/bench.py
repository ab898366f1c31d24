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
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from .._compat import forward_moved as _forward_moved
from ..model.flops import layer_flops

__all__ = ["SHAPES", "DTYPES", "MODES", "build_pair", "SETTLE_S", "settled_call", "interleaved", "spread",
           "matmul_peak", "machine_info",
           "OtherLoad", "other_load", "busy_warnings", "recommended_threads", "BUSY_CORES", "UNSTEADY_SPREAD",
           "run_benchmark", "measure_memory", "torch_saved_nbytes", "cache_report", "format_table",
           "minilm_throughput", "library_thread_defaults", "busy_study", "format_busy_study"]

#: name -> (batch B, sequence length n, d_model, heads h, d_ff)
SHAPES = {
    "bert-base": (8, 128, 768, 12, 3072),
    "minilm": (32, 16, 384, 12, 1536),
    "attn-512": (2, 512, 64, 4, 256),     # attention-bound: the (n, n) scores dominate the (n, d) work
    "long": (2, 2048, 64, 4, 256),
}
DTYPES = ("float32", "float64")
MODES = ("fwd", "fwd+bwd")
_TORCH_HINT = "the bench command needs PyTorch: pip install 'transformer_np[torch]' (torch==2.13.0)"


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError(_TORCH_HINT) from e
    return torch


def _blas_threads() -> tuple[int, str]:
    """(threads, source): OpenBLAS's pool size via threadpoolctl, else os.cpu_count()."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return os.cpu_count() or 1, "os.cpu_count() (threadpoolctl not installed)"
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not blas:
        return os.cpu_count() or 1, "os.cpu_count() (no BLAS found by threadpoolctl)"
    return int(blas[0]["num_threads"]), "threadpoolctl"


def parse_shape(text: str) -> tuple[str, tuple[int, int, int, int, int]]:
    """A shape name from :data:`SHAPES` or a custom ``B,n,d,h,d_ff`` (e.g. ``2,8,16,2,32``)."""
    if text in SHAPES:
        return text, SHAPES[text]
    parts = text.split(",")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != 5 or min(dims) < 1 or dims[2] % dims[3]:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)} or 'B,n,d,h,d_ff' with positive ints "
                         f"and h dividing d, got {text!r}")
    return text, dims  # type: ignore[return-value]


# ----------------------------------------------------------------------------- the two sides
def build_pair(dims, dtype: str, mode: str, seed: int = 0, free_cache: bool = False,
               store_attention: bool = True) -> tuple[Callable, Callable, object]:
    """``(numpy_call, torch_call, config)`` running one layer in ``mode`` on identical weights/inputs
    (``free_cache`` is passed to the NumPy backward, ``store_attention`` to the NumPy forward)."""
    kw = {} if store_attention else {"store_attention": False}
    torch = _import_torch()
    from ..io.interop import from_torch
    from ..model.encoder import encoder_layer_backward, encoder_layer_forward
    from ..model.params import sub_params

    B, n, d, h, f = dims
    tdt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(d, h, f, dropout=0.0, activation="gelu", batch_first=True,
                                             dtype=tdt)
    config, params = from_torch(layer)
    p = sub_params(params, "layers.0.")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, n, d)).astype(dtype)                  # H^(ℓ−1): (B, n, d)
    dy = rng.standard_normal((B, n, d)).astype(dtype)                 # ∂L/∂H^(ℓ): (B, n, d)
    xt, dyt = torch.from_numpy(x.copy()), torch.from_numpy(dy.copy())

    if mode == "fwd":
        layer.eval()

        def np_call():
            # inference, as torch's side runs under no_grad: no cache for a backward (for_backward=False);
            # the attention weights are still kept unless store_attention=False (the recompute rows)
            return encoder_layer_forward(x, p, config, for_backward=False, **kw)

        def torch_call():
            # op-by-op eager, like ours; the switch is global to torch: restore it after the call
            was_enabled = torch.backends.mha.get_fastpath_enabled()
            torch.backends.mha.set_fastpath_enabled(False)
            try:
                with torch.no_grad():
                    return layer(xt)
            finally:
                torch.backends.mha.set_fastpath_enabled(was_enabled)
    else:
        layer.train()                                                 # dropout is 0: only autograd differs
        xt.requires_grad_(True)

        def np_call():
            _, cache = encoder_layer_forward(x, p, config, **kw)
            return encoder_layer_backward(dy, cache, free_cache=free_cache)

        def torch_call():
            layer.zero_grad(set_to_none=True)
            xt.grad = None
            layer(xt).backward(dyt)
    return np_call, torch_call, config


#: The clocks a row can be timed with: wall time, or this process's CPU time ("cpu": only meaningful with
#: one thread each side — then it is the work done, whatever share of the cores other processes leave).
CLOCKS = ("wall", "cpu")

#: Seconds of untimed calls of a side (by the wall clock, and at least one call) before each of its timed
#: calls. OpenBLAS's idle worker threads spin for 2**28 TSC cycles (0.10 s at this machine's 2.6 GHz) after
#: a call before they sleep, and on 2 cores a spinning NumPy worker steals a core from torch's next call
#: (bert-base fwd 67–110 ms alone, 143–173 ms right after a NumPy call); twice that timeout lets them park.
SETTLE_S = 0.2


def settled_call(fn: Callable, settle: float, now: Callable[[], float], warm: Callable | None = None
                 ) -> tuple[float, int]:
    """(time of one call of ``fn`` by ``now``, untimed calls made before it).

    First ``warm`` (default ``fn`` itself) is called until ``settle`` seconds of the wall clock have
    passed since this block began, and at least once: so the timed call follows a call of its own
    side, and any other library's threads have been idle for at least ``settle`` seconds."""
    warm = fn if warm is None else warm
    t0, calls = time.perf_counter(), 0
    while True:
        warm()
        calls += 1
        if time.perf_counter() - t0 >= settle:
            break
    t1 = now()
    fn()
    return now() - t1, calls


def interleaved(a: Callable, b: Callable, rounds: int, warmup: int = 1, clock: str = "wall",
                c: Callable | None = None, progress: Callable[[int, int], None] | None = None,
                settle: float = SETTLE_S, warm: tuple[Callable | None, ...] | None = None) -> dict:
    """Time a and b in alternating blocks; medians of the times and of the per-round a/b, and the
    spread of those ratios (:func:`spread`). ``clock``: one of :data:`CLOCKS`.

    Each round is a block of a, then a block of b (then of ``c``, if given: the bench's NumPy-limit
    call, ``c_ms`` its median). A block is :func:`settled_call`: untimed calls of its own side for at
    least ``settle`` seconds (and at least one), then one timed call — so no timed call directly
    follows a call of the other side, whose worker threads may still be spinning. ``warm`` (one entry
    per side, None for the side itself) gives a cheaper untimed call for a side whose call is long
    (MiniLM's encode of 1,000 sentences settles on a short batch). ``progress(i, rounds)`` is called
    after round i (1-based); ``settle_calls``: the median untimed calls per block, per side."""
    now = (lambda: time.perf_counter()) if clock == "wall" else (lambda: time.process_time())
    sides = [a, b] + ([c] if c is not None else [])
    warm = tuple(warm) if warm is not None else (None,) * len(sides)
    if len(warm) != len(sides):
        raise ValueError(f"warm must give one entry per side ({len(sides)}), got {len(warm)}")
    _check_settle(settle)
    for _ in range(warmup):
        for fn in sides:
            fn()
    times: list[list[float]] = [[] for _ in sides]
    calls: list[list[int]] = [[] for _ in sides]
    for i in range(rounds):
        for k, fn in enumerate(sides):
            t, n = settled_call(fn, settle, now, warm[k])
            times[k].append(t)
            calls[k].append(n)
        if progress is not None:
            progress(i + 1, rounds)
    ta, tb = times[0], times[1]
    ratios = [x / y for x, y in zip(ta, tb)]
    out = {"a_ms": 1e3 * statistics.median(ta), "b_ms": 1e3 * statistics.median(tb),
           "ratio": statistics.median(ratios), "ratios": ratios, "spread": spread(ratios),
           "settle_s": settle, "settle_calls": [statistics.median(n) for n in calls]}
    if c is not None:
        out["c_ms"] = 1e3 * statistics.median(times[2])
        out["c_over_a"] = [z / x for x, z in zip(ta, times[2])]
    return out


def spread(values: list[float]) -> dict:
    """min, quartiles, max of the per-round ratios and ``rel_range`` = (max − min) / median.

    Quartiles by :func:`statistics.quantiles` (``method="inclusive"``: with 5 rounds, q1 and q3
    are the 2nd and 4th smallest). One round gives a zero spread."""
    v = sorted(values)
    med = statistics.median(v)
    q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else (v[0], v[0], v[0])
    return {"min": v[0], "q1": q1, "median": med, "q3": q3, "max": v[-1],
            "rel_range": (v[-1] - v[0]) / med if med else 0.0}


def matmul_peak(dtype: str, size: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of the best of ``repeats`` (size × size) @ (size × size) NumPy matmuls."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size)).astype(dtype)
    b = rng.standard_normal((size, size)).astype(dtype)
    a @ b                                                             # warm-up (thread pool, pages)
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2.0 * size ** 3 / best / 1e9


def _timed(fn: Callable) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def machine_info(threads: int, threads_source: str) -> dict:
    """Where and how the numbers were measured (CPU, libraries, threads, load)."""
    torch = _import_torch()
    info = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "platform": platform.platform(),
            "cpu": _cpu_model(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "torch": torch.__version__, "threads": threads,
            "threads_source": threads_source, "torch_threads": torch.get_num_threads(),
            "openblas_env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS")}}
    try:
        info["load_average"] = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        pass
    try:
        from threadpoolctl import threadpool_info
        info["blas"] = [{k: i.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
                        for i in threadpool_info() if i.get("user_api") == "blas"]
    except ImportError:
        info["blas"] = "threadpoolctl not installed"
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ----------------------------------------------------------------------------- a busy machine
#: Other processes using this many cores (on average, during a measurement) make the machine "busy".
BUSY_CORES = 0.5
#: A (max − min) / median of the per-round ratios above this is reported as an unsteady row.
UNSTEADY_SPREAD = 0.3


def _system_busy_seconds() -> float | None:
    """CPU seconds spent busy since boot by all processes (``/proc/stat``: every column but idle
    and iowait, summed over the CPUs), or None where there is no /proc (not Linux).

    Niced processes count in full: with the Linux scheduler's autogroups (on by default on
    desktops and on this project's machines), CPU time is shared fairly between *sessions* first,
    and a process's nice value only ranks it inside its own session — another user's ``nice``
    job still takes its session's share from ours."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    busy = sum(fields[:8]) - idle                        # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    """CPU seconds of this process (all its threads) and its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class OtherLoad:
    """The cores other processes used while a block ran: (Δ system busy − Δ our CPU) / Δ wall.

    ``with OtherLoad() as m: ...`` then ``m.cores`` (None where /proc/stat is missing). This
    is a direct measurement, unlike the load average, which lags by a minute and counts our
    own threads. Our own threads include OpenBLAS's workers, busy-waiting or not."""

    def __enter__(self):
        self._t, self._busy, self._own = time.perf_counter(), _system_busy_seconds(), _own_cpu_seconds()
        self.cores = None
        return self

    def __exit__(self, *exc):
        busy = _system_busy_seconds()
        wall = time.perf_counter() - self._t
        if busy is not None and self._busy is not None and wall > 0:
            self.cores = max(0.0, (busy - self._busy) - (_own_cpu_seconds() - self._own)) / wall
        return False


def other_load(seconds: float = 0.5) -> float | None:
    """Cores used by other processes while this one sleeps for ``seconds`` (None if unknown)."""
    with OtherLoad() as m:
        time.sleep(seconds)
    return m.cores


def busy_warnings(doc: dict) -> list[str]:
    """Plain-language warnings for a benchmark document: other processes using the cores (before
    or during the rows) and rows whose per-round ratios spread widely."""
    mach, out = doc["machine"], []
    cpus = mach.get("cpu_count") or 1
    seen = [v for v in [mach.get("other_load_cores_before")] + [r.get("other_load_cores") for r in doc["results"]]
            if v is not None]
    if seen and max(seen) >= BUSY_CORES:
        threads = mach.get("threads")
        out.append(f"the machine is busy: other processes used up to {max(seen):.1f} of its {cpus} cores during "
                   f"the benchmark (load average {mach.get('load_average')}). The ratios are not those of a quiet "
                   f"machine" + (f"; {threads} BLAS threads compete with them for the cores (see "
                                 f"docs/guide/performance.md, 'A busy machine': try --threads 1 or "
                                 f"OPENBLAS_NUM_THREADS=1)" if threads and threads > 1 else "") + ".")
    if mach.get("threads_lowered_from"):
        out.append(f"this run used {mach.get('threads')} thread(s) each side instead of "
                   f"{mach['threads_lowered_from']}, because other processes kept the machine busy at its start "
                   f"(on a busy machine 1 thread is faster and steadier for both NumPy and torch); pass "
                   f"--threads {mach['threads_lowered_from']} to measure with more.")
    unsteady = [r for r in doc["results"] if r.get("spread", {}).get("rel_range", 0) > UNSTEADY_SPREAD]
    if unsteady:
        worst = max(unsteady, key=lambda r: r["spread"]["rel_range"])
        out.append(f"{len(unsteady)} row(s) are unsteady: the per-round NumPy/torch ratio varies by more than "
                   f"{100 * UNSTEADY_SPREAD:.0f}% of its median (worst: {worst['shape']} {worst['dtype']} "
                   f"{worst['mode']}, {worst['spread']['min']:.2f}–{worst['spread']['max']:.2f}×)"
                   + (f", still after {worst['rounds_run']} rounds (the round budget: --max-rounds)"
                      if "rounds_run" in worst else "")
                   + "; rerun with more --rounds on a quieter machine before trusting them.")
    return out


# ----------------------------------------------------------------------------- the run
def run_benchmark(shapes, dtypes, modes=MODES, rounds: int = 7, memory: bool = True,
                  threads: int | None = None, log=None, recompute: bool = False, clock: str = "wall",
                  max_rounds: int | None = None, settle: float = SETTLE_S) -> dict:
    """Every (shape, dtype, mode) row, plus memory and machine info; the ``--json`` document.

    ``recompute=True`` adds ``doc["recompute"]``: the same rows with the NumPy layer run with
    ``store_attention=False`` (A recomputed by row blocks in the backward, see
    :func:`transformer_np.ops.fast.attention_forward`). ``clock="cpu"`` times each call by this
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


@contextmanager
def library_thread_defaults() -> Iterator[dict]:
    """The fast path's thread settings at the library's defaults while the block runs, restored after it:
    elementwise threads (:func:`transformer_np.ops.fast.set_num_threads`, default 1) and batch threads
    (:func:`~transformer_np.ops.fast.set_batch_threads`, default BLAS's thread count, so the run's
    ``threads``). Yields ``{"elementwise_threads": …, "batch_threads": …}`` as they are in the block."""
    from ..ops import _threads, fast
    saved = _threads._THREADS, _threads._BATCH_THREADS
    fast.set_num_threads(None)
    _threads._BATCH_THREADS = None               # (set_batch_threads(None) without its threadpoolctl check)
    try:
        yield {"elementwise_threads": fast.get_num_threads(), "batch_threads": fast.get_batch_threads()}
    finally:
        _threads._THREADS, _threads._BATCH_THREADS = saved


def _mib_range(values) -> str:
    """'a–b MiB' of a list of byte counts (the runs of a memory measurement); 'one run' for fewer than two."""
    if not values or len(values) < 2:
        return "one run"
    return f"{min(values) / 2**20:.1f}–{max(values) / 2**20:.1f} MiB"


def _check_settle(settle) -> None:
    if isinstance(settle, bool) or not isinstance(settle, (int, float)) or not settle >= 0 or settle > 60:
        raise ValueError(f"settle must be a number of seconds from 0 to 60, got {settle!r}")


def recommended_threads(others: float | None = None, available: int | None = None) -> int:
    """BLAS threads to use now: 1 when other processes keep the machine busy (``others``, in cores,
    at least :data:`BUSY_CORES`; measured with :func:`other_load` when not given), else ``available``
    (default: OpenBLAS's current thread count).

    Why 1: with other jobs sharing the cores, every OpenBLAS call (a fork-join of its threads, whose
    waiting threads spin) waits for its slowest thread, and the spinning burns the CPU share the work
    needed. Measured on the BERT-base layer, float32 fwd+bwd, 2 cores, other sessions busy: 2 threads
    took 2.5–4× longer than 1 thread and used 3× its CPU time per call (torch: 2× / 2×); see
    docs/guide/performance.md, "A busy machine". On a quiet machine 2 threads are ~1.7× faster.
    """
    if available is None:
        available = _blas_threads()[0]
    if others is None:
        others = other_load()
    return 1 if others is not None and others >= BUSY_CORES else available


def _limit_blas_threads(threads: int):
    """threadpoolctl's limiter for OpenBLAS (call ``.restore_original_limits()`` to undo)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError as e:
        raise ImportError("setting the BLAS thread count needs threadpoolctl: pip install threadpoolctl "
                          "(or set OPENBLAS_NUM_THREADS before starting Python)") from e
    return threadpool_limits(threads, user_api="blas")


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


def _fmt_cores(v: float | None) -> str:
    return "?" if v is None else f"{v:.2f}"


def minilm_throughput(n_sentences: int = 1000, rounds: int = 3, threads: int | None = None,
                      clock: str = "wall", settle: float = SETTLE_S) -> dict:
    """Sentences/s of :meth:`PretrainedEncoder.encode` (float32) vs sentence-transformers on the
    same ``n_sentences`` generated sentences, in alternating settled blocks (:func:`interleaved`; a
    block's untimed calls encode the first 64 sentences), median of per-round ratios."""
    _check_settle(settle)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = _import_torch()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise ImportError("the MiniLM throughput needs sentence-transformers: pip install sentence-transformers") from e
    from ..io.pretrained import MODEL_NAME, load_pretrained, model_folder

    ours = load_pretrained(MODEL_NAME)
    st = SentenceTransformer(str(model_folder(MODEL_NAME)), device="cpu")
    limiter = None
    if threads is not None:
        torch.set_num_threads(threads)
        if threads != _blas_threads()[0]:
            limiter = _limit_blas_threads(threads)
    try:
        from .minilm_limit import minilm_limit_call

        limit_threads = _blas_threads()[0]           # the limit's exp pass is spread over the run's threads
        with library_thread_defaults() as counts:    # the library's defaults, as encode runs for a user
            doc = _minilm_rounds(ours, st, n_sentences, rounds, clock, settle,
                                 limit=lambda s: minilm_limit_call(ours, s, 32, limit_threads))
        return {**doc, **counts}
    finally:
        if limiter is not None:
            limiter.restore_original_limits()


def _minilm_rounds(ours, st, n_sentences: int, rounds: int, clock: str = "wall", settle: float = SETTLE_S,
                  limit: Callable[[list[str]], Callable[[], None]] | None = None) -> dict:
    """Interleaved, settled rounds of ``ours.encode`` and ``st.encode`` (and of ``limit(sentences)()``, the
    NumPy limit of that encode, when ``limit`` is given: keys ``limit_s``, ``limit_fraction`` and
    ``limit_torch_ratio``, the limit over sentence-transformers' time)."""
    sentences = _sentences(n_sentences)
    short = sentences[:64]
    t = interleaved(lambda: ours.encode(sentences, batch_size=32),
                    lambda: st.encode(sentences, batch_size=32, normalize_embeddings=True), rounds, clock=clock,
                    c=None if limit is None else limit(sentences), settle=settle,
                    warm=(lambda: ours.encode(short, batch_size=32),
                          lambda: st.encode(short, batch_size=32, normalize_embeddings=True))
                    + (() if limit is None else (limit(short),)))
    agree = float(np.abs(ours.encode(sentences[:64]) - st.encode(sentences[:64], normalize_embeddings=True)).max())
    doc = {"sentences": n_sentences, "numpy_per_s": round(n_sentences / (t["a_ms"] / 1e3), 1),
           "sentence_transformers_per_s": round(n_sentences / (t["b_ms"] / 1e3), 1),
           "throughput_ratio": round(1.0 / t["ratio"], 3), "rounds": rounds, "clock": clock, "settle_s": settle,
           "max_abs_diff_embeddings": agree}
    if limit is not None:
        doc.update(limit_s=round(t["c_ms"] / 1e3, 4), limit_fraction=round(statistics.median(t["c_over_a"]), 3),
                   limit_torch_ratio=round(t["c_ms"] / t["b_ms"], 3))
    return doc


def _sentences(count: int, seed: int = 0) -> list[str]:
    """Deterministic English-like sentences of 4–30 words (lengths vary, as real text does)."""
    words = ("the a river bank money boat reached paid cat sat on mat model attention layer token "
             "sentence encoder students read quickly slowly under over every small large green old new "
             "network learns weights from data and then predicts next word in context").split()
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=int(rng.integers(4, 31)))).capitalize() + "."
            for _ in range(count)]


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


# Split by role (round 4): the busy study and the memory measurement live in their own modules;
# their names stay importable from here.
from .busy import busy_study, format_busy_study  # noqa: E402
from .memory_bench import MEMORY_REPEATS, cache_report, measure_memory, torch_saved_nbytes  # noqa: E402
