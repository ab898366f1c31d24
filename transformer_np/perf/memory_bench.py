"""Peak memory of one layer's forward+backward, NumPy and torch, each in a fresh process.

Split from :mod:`transformer_np.perf.bench` (which re-exports its names); the method is in that
module's docstring. Imports the lower modules (machine, pair), never the bench itself."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import numpy as np

from .machine import _import_torch

__all__ = ["measure_memory", "torch_saved_nbytes", "cache_report"]


_CHILD = r"""
import ctypes, gc, json, sys, numpy as np, torch
from transformer_np.perf.pair import build_pair
side, dims, dtype, threads = sys.argv[1], tuple(json.loads(sys.argv[2])), sys.argv[3], int(sys.argv[4])
torch.set_num_threads(threads)
np_call, torch_call, _ = build_pair(dims, dtype, "fwd+bwd", free_cache=(side != "numpy-default"),
                                   store_attention=(side != "numpy-recompute"))
np.ones((64, 64)) @ np.ones((64, 64)); torch.ones(64, 64) @ torch.ones(64, 64)   # start both thread pools

def status(key):   # VmRSS / VmHWM of /proc/self/status, in bytes
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return 1024 * int(line.split()[1])

(np_call if side.startswith("numpy") else torch_call)()   # warm-up: one-time inits (autograd engine) excluded
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)        # hand freed heap back to the OS: the peak must be new pages
if side == "numpy-tracemalloc":
    import tracemalloc
    tracemalloc.start()
    out = np_call()
    print(json.dumps({"peak_bytes": tracemalloc.get_traced_memory()[1]}))
else:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")                             # reset the high-water mark VmHWM to the current RSS
    before = status("VmRSS")
    out = torch_call() if side == "torch" else np_call()
    print(json.dumps({"peak_bytes": status("VmHWM") - before}))
"""


def torch_saved_nbytes(dims, dtype: str) -> int:
    """Bytes of the tensors torch's autograd saves for backward in one forward of the layer
    (distinct storages, read with ``saved_tensors_hooks``; parameters excluded) — torch's
    counterpart of our cache."""
    torch = _import_torch()
    B, n, d, h, f = dims
    layer = torch.nn.TransformerEncoderLayer(d, h, f, dropout=0.0, activation="gelu", batch_first=True,
                                             dtype={"float32": torch.float32, "float64": torch.float64}[dtype])
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: dict = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    x = torch.zeros((B, n, d), dtype=layer.linear1.weight.dtype, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return int(sum(seen.values()))


#: Fresh processes per side for the two compared peaks (the median is reported, every run kept). One process
#: per side was not enough: torch's peak varies by a third from run to run (docs/bench_notes.md, "MEMORY_REPEATS").
MEMORY_REPEATS = 3


def measure_memory(dims, dtype: str, threads: int, recompute: bool = False, repeats: int = MEMORY_REPEATS) -> dict:
    """Peak memory of one fwd+bwd, each side in a fresh process (see the module docstring);
    ``recompute`` adds the NumPy side with ``store_attention=False``. The NumPy and torch peaks are the
    median of ``repeats`` fresh processes each, run alternately (every run in ``numpy_rss_bytes_runs`` and
    ``torch_rss_bytes_runs``); the other NumPy variants are one process each."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
               OPENBLAS_NUM_THREADS=str(threads))
    runs: dict[str, list[int]] = {}
    sides = (("numpy", "torch") * repeats + ("numpy-tracemalloc", "numpy-default")
             + (("numpy-recompute",) if recompute else ()))
    for side in sides:
        proc = subprocess.run([sys.executable, "-c", _CHILD, side, json.dumps(list(dims)), dtype, str(threads)],
                              capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"memory measurement ({side}) failed: {proc.stderr.strip().splitlines()[-1:]}")
        runs.setdefault(side, []).append(json.loads(proc.stdout.strip().splitlines()[-1])["peak_bytes"])
    out = {side: int(statistics.median_low(v)) for side, v in runs.items()}   # a measured value, not a mean
    return {"numpy_rss_bytes": out["numpy"], "torch_rss_bytes": out["torch"],
            "numpy_rss_bytes_runs": runs["numpy"], "torch_rss_bytes_runs": runs["torch"], "repeats": repeats,
            "numpy_tracemalloc_bytes": out["numpy-tracemalloc"],
            "numpy_default_rss_bytes": out["numpy-default"],
            "numpy_recompute_rss_bytes": out.get("numpy-recompute"),
            "ratio_vs_torch": out["numpy"] / out["torch"] if out["torch"] else None,
            "ratio_vs_torch_recompute": out["numpy-recompute"] / out["torch"]
            if out["torch"] and "numpy-recompute" in out else None,
            "method": f"VmHWM after minus VmRSS before one fwd+bwd, in a fresh process per run (NumPy and torch: "
                      f"the median of {repeats} runs each, alternating), after "
                      "malloc_trim(0) and a high-water-mark reset (clear_refs 5); NumPy backward with "
                      "free_cache=True (numpy_default_rss_bytes: the default backward; numpy_recompute_rss_bytes: "
                      "free_cache=True and store_attention=False, the attention matrix recomputed by row blocks "
                      "like torch's fused attention does); tracemalloc peak of NumPy's allocations as a cross-check"}


def cache_report(dims, dtype: str) -> dict:
    """What the NumPy layer's cache keeps (bytes per entry, see :func:`transformer_np.perf.memory.cache_nbytes`)."""
    from ..model.config import EncoderConfig
    from ..model.params import init_params, sub_params
    from ..model.stack import encoder_layer_forward
    from .memory import cache_nbytes

    B, n, d, h, f = dims
    config = EncoderConfig(n_layers=1, d_model=d, n_heads=h, d_ff=f, dropout=0.0, layer_norm_eps=1e-5)
    p = sub_params(init_params(config, seed=0, dtype=dtype), "layers.0.")
    x = np.random.default_rng(0).standard_normal((B, n, d)).astype(dtype)
    _, cache = encoder_layer_forward(x, p, config)
    return cache_nbytes(cache)
