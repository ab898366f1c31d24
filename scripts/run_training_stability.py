#!/usr/bin/env python
"""The full Post-LN / Pre-LN warm-up experiment of notebook 04; writes notebooks/data/training_stability.json.

    nice -n 10 python scripts/run_training_stability.py [--workers 2] [--out PATH]

The grid is transformer_np.training.loop.stability_grid(full=True). BLAS runs single-threaded
(one process per core is faster than two BLAS threads fighting over tiny matrices, and the
results do not depend on the thread count). Measured: 418–486 s wall-clock with 2 workers on the
shared, loaded 2-core development machine.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # before NumPy is imported (also in the workers)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from transformer_np.training.loop import run_stability, stability_grid, stability_table  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "notebooks" / "data" / "training_stability.json"))
    args = ap.parse_args()
    grid = stability_grid(full=True)
    # longest runs first so the two workers finish together
    order = sorted(range(len(grid)), key=lambda i: -grid[i]["layers"] * grid[i]["steps"])
    t0 = time.perf_counter()
    done = run_stability([grid[i] for i in order], workers=args.workers)
    results = [None] * len(grid)
    for i, r in zip(order, done):
        results[i] = r
    wall = time.perf_counter() - t0
    payload = {"generated_by": "scripts/run_training_stability.py",
               "numpy": np.__version__, "python": platform.python_version(),
               "workers": args.workers, "wall_seconds": round(wall, 1),
               "runs": results, "table": stability_table(results)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, indent=0) + "\n")
    print(f"{len(results)} runs in {wall:.0f}s -> {args.out}")
    for row in payload["table"]:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
