"""The ``gradcheck`` command: finite-difference gradient checks (see :mod:`transformer_np.model.gradcheck`)."""

from __future__ import annotations

import argparse
import json
import math
import sys

from ..model.gradcheck import _H, TOLERANCE, run_all


# ----------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help='print a JSON list of {"name", "max_rel_error", "checked"} instead of a table')
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs and upstream gradients")
    parser.add_argument("--max-coords", type=int, default=24,
                        help="coordinates checked per tensor (all of them for smaller tensors)")
    parser.add_argument("--tol", type=float, default=TOLERANCE,
                        help="fail (exit 1) if any max relative error exceeds this (default 1e-7)")


def run(args: argparse.Namespace) -> int:
    if args.max_coords < 1:
        raise ValueError(f"--max-coords must be >= 1, got {args.max_coords}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if not (math.isfinite(args.tol) and args.tol >= 0):
        raise ValueError(f"--tol must be a finite number >= 0 (a bound on the relative error), got {args.tol}")
    results = run_all(seed=args.seed, max_coords=args.max_coords)
    worst = max(r.max_rel_error for r in results)
    if args.json:
        print(json.dumps([{"name": r.name, "max_rel_error": r.max_rel_error, "checked": r.checked}
                          for r in results], indent=2))
    else:
        width = max(len(r.name) for r in results)
        print(f"{'check':<{width}}  {'max rel error':>13}  {'checked':>7}  ok")
        print("-" * (width + 30))
        for r in results:
            ok = "yes" if r.max_rel_error <= args.tol else "NO"
            print(f"{r.name:<{width}}  {r.max_rel_error:13.3e}  {r.checked:7d}  {ok}")
        print("-" * (width + 30))
        print(f"{len(results)} checks, worst {worst:.3e} (tolerance {args.tol:g}), float64, "
              f"central differences h = {_H:g}, random upstream gradients")
    failed = [r.name for r in results if not r.max_rel_error <= args.tol]
    if failed:
        print(f"gradcheck FAILED for: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
