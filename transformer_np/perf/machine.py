"""The machine a benchmark runs on: its BLAS threads, matmul peak and description, and the load of other processes.

Thread counts (:func:`_blas_threads`, :func:`_limit_blas_threads`, :func:`library_thread_defaults`,
:func:`recommended_threads`), the lazy PyTorch import every bench part shares (:func:`_import_torch`), the
matmul peak and :func:`machine_info` of the ``--json`` document, and a busy machine: :class:`OtherLoad` /
:func:`other_load` (cores used by other processes) and :func:`busy_warnings`. NumPy and the standard library
only (torch and threadpoolctl imported lazily); no other module of :mod:`transformer_np.perf` is imported."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import numpy as np

from .._optional import require
from ..fast.threads import library_thread_defaults  # re-exported (in __all__): the bench's name
from ..fast.threads import limit_blas_threads as _limit_blas_threads  # noqa: F401  (the one setter; bench's name)

__all__ = ["matmul_peak", "machine_info", "OtherLoad", "other_load", "busy_warnings", "recommended_threads",
           "BUSY_CORES", "UNSTEADY_SPREAD", "library_thread_defaults"]


_TORCH_HINT = "the bench command needs PyTorch: pip install 'transformer_np[torch]' (torch==2.13.0)"


def _import_torch():
    return require("torch", _TORCH_HINT)


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


def _fmt_cores(v: float | None) -> str:
    return "?" if v is None else f"{v:.2f}"
