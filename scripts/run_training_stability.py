#!/usr/bin/env python
"""The full warm-up experiment of notebook 04; writes transformer_np/data/training_stability.json.

    nohup nice -n 10 python scripts/run_training_stability.py --workers 1 [--out PATH] &

The grid is transformer_np.course.stability.stability_grid(full=True): BERT and Xavier
initialisation, Post-LN and Pre-LN, with and without warm-up, 3 seeds (see its docstring).
Every finished run is appended to ``<out>.partial.jsonl`` at once, and a restarted script
skips the runs found there, so an interrupted experiment resumes where it stopped; the final
JSON lists the runs in the grid's order. BLAS runs single-threaded (one process per core is
faster than two BLAS threads fighting over tiny matrices, and the results do not depend on the
thread count). ``wall_seconds`` in the JSON is the runs' summed time (the wall time with one worker).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # before NumPy is imported (also in the workers)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from transformer_np.course.stability import run_stability_one, stability_grid, stability_table  # noqa: E402
from transformer_np.training.loop import RunConfig  # noqa: E402


def _key(kw: dict) -> str:
    """A run's identity: its full RunConfig, as canonical JSON."""
    return json.dumps(RunConfig(**kw).to_dict(), sort_keys=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "transformer_np" / "data" / "training_stability.json"))
    args = ap.parse_args()
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    out = Path(args.out)
    partial = out.with_name(out.name + ".partial.jsonl")
    grid = stability_grid(full=True)
    done: dict = {}
    if partial.is_file():
        for line in partial.read_text().splitlines():
            rec = json.loads(line)
            done[_key(rec["config"])] = rec
    todo = [kw for kw in grid if _key(kw) not in done]
    print(f"{len(grid)} runs in the grid, {len(done)} already done, {len(todo)} to run", flush=True)
    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with partial.open("a") as fh:
        def record(r):
            fh.write(json.dumps(r) + "\n")
            fh.flush()
            done[_key(r["config"])] = r
            c = r["config"]
            print(f"[{len(done)}/{len(grid)}] N={c['layers']} lr={c['lr']:g} {c['init']} {c['norm']} "
                  f"warm-up {c['warmup']} seed {c['seed']}: final loss {r['final_loss']} ({r['seconds']} s)",
                  flush=True)
        if args.workers == 1:
            for kw in todo:
                record(run_stability_one(kw))
        else:
            import multiprocessing as mp
            with mp.get_context("spawn").Pool(args.workers) as pool:
                for r in pool.imap_unordered(run_stability_one, todo, chunksize=1):
                    record(r)
    wall = time.perf_counter() - t0
    results = [done[_key(kw)] for kw in grid]
    payload = {"generated_by": "scripts/run_training_stability.py",
               "numpy": np.__version__, "python": platform.python_version(), "workers": args.workers,
               # with one worker the runs are sequential: their summed time is the experiment's wall time
               "wall_seconds": round(sum(r["seconds"] for r in results), 1),
               "runs": results, "table": stability_table(results)}
    out.write_text(json.dumps(payload, indent=0) + "\n")
    print(f"{len(results)} runs, {payload['wall_seconds']:.0f} s of run time ({wall:.0f} s in this part) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
