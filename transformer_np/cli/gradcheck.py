"""The ``gradcheck`` command: every op's hand-written backward against finite differences (float64).

Each of the suite's cases (every op, both LayerNorm placements, the stacks and the heads) is run forward,
its backward is given a random upstream gradient R, and the gradient of every input and weight is compared
at up to --max-coords coordinates with the central difference (f(x + h) - f(x - h)) / 2h. The table lists
each case's largest relative error; the command exits with status 1 if any exceeds --tol. Progress (one
line per case, or a bar on a terminal) goes to stderr, the table or the JSON to stdout.

Python API: :func:`transformer_np.model.gradcheck.run_all`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from ..model.gradcheck import FD_STEP, TOLERANCE, run_all
from ._progress import Progress


# ----------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help='print a JSON list of {"name", "max_rel_error", "checked"} instead of a table '
                             "(no progress on stderr)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random inputs and upstream gradients, >= 0 (default 0)")
    parser.add_argument("--max-coords", type=int, default=24, metavar="N",
                        help="coordinates checked per tensor, >= 1 (all of them for smaller tensors; default 24)")
    parser.add_argument("--tol", type=float, default=TOLERANCE,
                        help=f"fail (exit 1) if any max relative error exceeds this (default {TOLERANCE:g})")


def run(args: argparse.Namespace) -> int:
    if args.max_coords < 1:
        raise ValueError(f"--max-coords must be >= 1, got {args.max_coords}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if not (math.isfinite(args.tol) and args.tol >= 0):
        raise ValueError(f"--tol must be a finite number >= 0 (a bound on the relative error), got {args.tol}")
    bar = None if (args.json or args.quiet) else Progress("gradcheck")
    at = [0, 0, ""]                                   # the case running: i, total, name

    def progress(i: int, total: int, name: str) -> None:
        at[:] = [i, total, name]
        if bar is not None:
            bar(i, total, name)

    try:
        results = run_all(seed=args.seed, max_coords=args.max_coords, progress=progress)
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        i, total, name = at
        where = f"at check {i} of {total} ({name})" if i else "before the first check"
        print(f"transformer-np gradcheck: interrupted {where}; nothing is kept (gradcheck writes no file and its "
              f"table is printed at the end): run it again to check everything (--max-coords 4 is quicker)",
              file=sys.stderr)
        return 130
    finally:
        if bar is not None:
            bar.close()
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
              f"central differences h = {FD_STEP:g}, random upstream gradients")
    failed = [r.name for r in results if not r.max_rel_error <= args.tol]
    if failed:
        print(f"gradcheck FAILED for: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
