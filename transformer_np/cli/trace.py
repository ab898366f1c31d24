"""The ``trace`` command: the article's worked example ("the", "cat", "sat" through two Post-LN layers), recomputed.

Every table the article "Transformer Encoder Stack" prints is recomputed with the library's own ops and compared
with the printed figures; a figure that differs beyond the article's rounding is listed under ERRATA with the
step redone by hand. Under CLAIMS the article's qualitative statements are checked, each with a number; a claim's
id (A13, L14, …) is its row in the claims ledger — A for the article, L for the lesson — where its verdict and the
tests that check it are listed: docs/claims.md in the documentation, transformer_np/data/claims.json as data.

Python API: :func:`transformer_np.course.trace.run_trace` and :func:`~transformer_np.course.trace.format_trace`.
"""

from __future__ import annotations

import argparse
import json
import math

from ..course.trace import LN_EPS, SEED, format_trace, run_trace, trace_to_json


# ----------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (full precision; each claim carries its ledger id and verdict)")
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--precision", type=int, default=None, metavar="N",
                   help="decimals in every table, 0 to 17 (default: the article's rounding, 1 or 2 decimals)")
    g.add_argument("--full", action="store_true", help="full precision (repr of every float)")
    parser.add_argument("--seed", type=int, default=SEED,
                        help=f"seed of the FFN weights and of every layer-2 weight (default {SEED}: the "
                             "article's layer 1 has identity attention weights, the rest is seeded)")
    parser.add_argument("--eps", type=float, default=LN_EPS,
                        help=f"LayerNorm epsilon, > 0 (default {LN_EPS:g}, BERT's)")


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
