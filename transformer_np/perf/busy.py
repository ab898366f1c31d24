"""The busy-machine study of ``bench --busy-study``: thread count × background load, measured.

Split from :mod:`transformer_np.perf.bench` (which re-exports its names); see
docs/guide/performance.md, "A busy machine". Imports the lower modules (timing, machine, pair), never the
bench itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .machine import _fmt_cores
from .pair import SHAPES
from .timing import SETTLE_S, _check_settle

__all__ = ["busy_study", "format_busy_study"]


_SPIN = "import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end:\n    pass\n"

_BUSY_CHILD = r"""
import json, os, statistics, sys, time
import numpy as np, torch
from transformer_np.perf.machine import OtherLoad, other_load
from transformer_np.perf.pair import build_pair
from transformer_np.perf.timing import settled_call
dims, dtype, mode = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
threads, rounds, settle = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
torch.set_num_threads(threads)
np_call, torch_call, _ = build_pair(tuple(dims), dtype, mode)
tick = os.sysconf("SC_CLK_TCK")

def cpu():   # CPU seconds of each thread of this process
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            out[tid] = (int(f[11]) + int(f[12])) / tick
        except OSError:
            pass
    return out

def timed(fn):
    c0, t0 = cpu(), time.perf_counter()
    fn()
    t1, c1 = time.perf_counter(), cpu()
    return t1 - t0, sum(c1[k] - c0.get(k, 0.0) for k in c1)

np_call(); torch_call()
before = other_load(0.5)   # while this process sleeps: the rounds of a small shape are too short to sample
rows = []
with OtherLoad() as others:
    for _ in range(rounds):   # settled blocks, as the bench's rows: untimed calls of a side before its timed one
        row = []
        for fn in (np_call, torch_call):
            settled_call(lambda fn=fn: row.extend(timed(fn)), settle, time.perf_counter, fn)
        rows.append(tuple(row))
ratios = [a / c for a, _, c, _ in rows]
print(json.dumps({"numpy_ms": 1e3 * statistics.median(r[0] for r in rows),
                  "torch_ms": 1e3 * statistics.median(r[2] for r in rows),
                  "ratio_vs_torch": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                  "numpy_cpu_s_per_call": statistics.median(r[1] for r in rows),
                  "torch_cpu_s_per_call": statistics.median(r[3] for r in rows),
                  "other_load_cores": others.cores, "other_load_cores_before": before}))
"""


def busy_study(dims=None, dtype: str = "float32", mode: str = "fwd+bwd", threads=(1, 2),
               spinners=(0, 1, 2), rounds: int = 5, spin_seconds: float = 600.0, log=None,
               settle: float | None = None) -> list[dict]:
    """Thread count × background load, measured: the data behind :func:`recommended_threads`.

    For every (threads, k) cell, k busy-loop processes are started, each in its own session (so the
    scheduler treats them as another user's jobs, as on a shared JupyterHub node), each stopping by
    itself after ``spin_seconds`` and killed by its pid when the cell is done; then a fresh process with
    OpenBLAS and torch limited to ``threads`` runs the layer pair in ``rounds`` rounds of settled blocks
    (each timed call after ``settle`` seconds of its own side's untimed calls, default
    :data:`transformer_np.perf.timing.SETTLE_S`; see :func:`transformer_np.perf.timing.interleaved`).
    Each row: median times and ratio, the per-round range of the ratio, the CPU seconds per call
    (all threads of the process: work *and* the busy-waiting of threads waiting for each other), and the
    cores used by other processes (spinners included) during the rounds and in 0.5 s just before them.
    Linux only (reads /proc). ``dims`` defaults to the bert-base shape."""
    settle = SETTLE_S if settle is None else settle
    _check_settle(settle)

    dims = SHAPES["bert-base"] if dims is None else dims
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = []
    for t in threads:
        for k in spinners:
            procs = [subprocess.Popen([sys.executable, "-c", _SPIN, str(spin_seconds)], start_new_session=True)
                     for _ in range(k)]
            try:
                env = dict(os.environ, OPENBLAS_NUM_THREADS=str(t),
                           PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
                proc = subprocess.run([sys.executable, "-c", _BUSY_CHILD, json.dumps(list(dims)), dtype, mode,
                                       str(t), str(rounds), repr(settle)], capture_output=True, text=True, env=env,
                                      timeout=spin_seconds, check=False)
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
            if proc.returncode != 0:
                raise RuntimeError(f"busy study cell (threads={t}, spinners={k}) failed: "
                                   f"{proc.stderr.strip().splitlines()[-1:]}")
            row = {"threads": t, "spinners": k, **json.loads(proc.stdout.strip().splitlines()[-1])}
            out.append(row)
            if log:
                log(f"threads {t} spinners {k}: numpy {row['numpy_ms']:.0f} ms ({row['numpy_cpu_s_per_call']:.2f} "
                    f"CPU s), torch {row['torch_ms']:.0f} ms ({row['torch_cpu_s_per_call']:.2f} CPU s), ratio "
                    f"{row['ratio_vs_torch']:.2f} ({row['ratio_min']:.2f}–{row['ratio_max']:.2f}), others "
                    f"{_fmt_cores(row['other_load_cores'])} cores")
    return out


def format_busy_study(rows: list[dict]) -> str:
    """The busy-machine table of docs/guide/performance.md."""
    lines = ["| threads | busy loops | other processes (cores) | NumPy ms | torch ms | NumPy/torch (rounds) | "
             "NumPy CPU s/call | torch CPU s/call |", "|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['threads']} | {r['spinners']} | {_fmt_cores(r['other_load_cores'])} | {r['numpy_ms']:.0f} "
                     f"| {r['torch_ms']:.0f} | {r['ratio_vs_torch']:.2f}× ({r['ratio_min']:.2f}–{r['ratio_max']:.2f}) "
                     f"| {r['numpy_cpu_s_per_call']:.2f} | {r['torch_cpu_s_per_call']:.2f} |")
    return "\n".join(lines)
