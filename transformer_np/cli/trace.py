"""The ``trace`` command: the article's worked example, recomputed (see :mod:`transformer_np.course.trace`)."""

from __future__ import annotations

import argparse
import json
import math

from ..course.trace import LN_EPS, SEED, format_trace, run_trace, trace_to_json


# ----------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object (full precision)")
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--precision", type=int, default=None, metavar="N",
                   help="decimals in every table (default: the article's rounding)")
    g.add_argument("--full", action="store_true", help="full precision (repr of every float)")
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed of the FFN / layer-2 weights (default {SEED})")
    parser.add_argument("--eps", type=float, default=LN_EPS, help=f"LayerNorm epsilon (default {LN_EPS:g})")


def run(args) -> int:
    if args.precision is not None and not 0 <= args.precision <= 17:
        raise ValueError(f"--precision must be in [0, 17], got {args.precision}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if not (args.eps > 0 and math.isfinite(args.eps)):
        raise ValueError(f"--eps must be a positive finite number, got {args.eps}")
    trace = run_trace(seed=args.seed, eps=args.eps)
    if args.json:
        print(json.dumps(trace_to_json(trace)))
    else:
        print(format_trace(trace, precision=args.precision, full=args.full))
    return 0
