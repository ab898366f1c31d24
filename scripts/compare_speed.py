#!/usr/bin/env python
"""How long :func:`transformer_np.testing.compare_with_torch` takes against torch's own forward and backward.

    nice python scripts/compare_speed.py                  # BERT-base-sized layer, float32, 7 rounds
    nice python scripts/compare_speed.py --threads 1      # one thread each: the work, less the machine's load
    python scripts/compare_speed.py --rounds 11 --dtype float64 --model bertlayer

One round times torch's forward + backward of the module (autograd on for the input and every parameter, eval
mode, the same input and upstream gradient the comparison uses), then one whole ``compare_with_torch`` call (which
runs that torch forward and backward itself, then ours, then compares every tensor). Rounds are interleaved, so
both see the same machine load; the ratio is taken per round and reported as its median and spread (min–max),
and the same for CPU time (``time.process_time``, all threads), which another process's load disturbs less. With
``--threads 1`` both libraries run on one thread. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if "--threads" in sys.argv:                     # before NumPy and torch load their thread pools
    _n = sys.argv[sys.argv.index("--threads") + 1]
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = _n

import numpy as np  # noqa: E402


def build(model: str, dt):
    import torch

    torch.manual_seed(0)
    tdt = torch.float64 if dt == np.float64 else torch.float32
    if model == "layer":
        m = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True,
                                             dtype=tdt)
    else:
        import transformers

        m = transformers.BertModel(transformers.BertConfig(num_hidden_layers=1)).encoder.layer[0].to(tdt)
    return m.eval()


def torch_forward_backward(module, x, R):
    import torch

    mod = copy.deepcopy(module)                   # what compare_with_torch does first, too
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    out = mod(xt)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.from_numpy(R))
    return xt.grad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--model", default="layer", choices=("layer", "bertlayer"))
    ap.add_argument("--threads", type=int, help="threads for torch and NumPy's BLAS (default: their own)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from transformer_np.testing import compare_with_torch

    dt = np.dtype(args.dtype)
    module = build(args.model, dt)
    x = np.random.default_rng(0).standard_normal((2, 128, 768)).astype(dt)
    R = np.random.default_rng([0, 1]).standard_normal((2, 128, 768)).astype(dt)   # the comparison's default R
    for _ in range(2):                                                          # warm-up: BLAS, allocator
        torch_forward_backward(module, x, R)
        assert compare_with_torch(module, x).ok is not None
    t_torch, t_cmp, c_torch, c_cmp = [], [], [], []
    for _ in range(args.rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        torch_forward_backward(module, x, R)
        t1, c1 = time.perf_counter(), time.process_time()
        report = compare_with_torch(module, x)
        verdict = report.ok                       # the verdict is part of the comparison
        t2, c2 = time.perf_counter(), time.process_time()
        t_torch.append(t1 - t0)
        t_cmp.append(t2 - t1)
        c_torch.append(c1 - c0)
        c_cmp.append(c2 - c1)
    ratios = [c / t for c, t in zip(t_cmp, t_torch)]
    cpu_ratios = [c / t for c, t in zip(c_cmp, c_torch)]
    res = {"module": f"{args.model} (hidden 768, seq 128, batch 2)", "dtype": dt.name, "rounds": args.rounds,
           "torch threads": torch.get_num_threads(),
           "torch forward+backward ms (median)": 1e3 * statistics.median(t_torch),
           "compare_with_torch ms (median)": 1e3 * statistics.median(t_cmp),
           "ratio median": statistics.median(ratios), "ratio min": min(ratios), "ratio max": max(ratios),
           "CPU-time ratio median": statistics.median(cpu_ratios), "CPU-time ratio min": min(cpu_ratios),
           "CPU-time ratio max": max(cpu_ratios),
           "passes": verdict}
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
