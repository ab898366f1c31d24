"""Time one encoder layer in NumPy against PyTorch's (same weights, same threads), with the NumPy limit of each row.

Each row prints NumPy's time, torch's, their ratio, and the NumPy limit: the time of the work NumPy
cannot avoid for that layer (its matrix products, one call each, and one exp pass over the attention
scores), measured in the same rounds. The method is described in docs/guide/performance.md.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..perf.bench import (
    DTYPES,
    MODES,
    SETTLE_S,
    SHAPES,
    busy_study,
    format_busy_study,
    format_table,
    minilm_throughput,
    parse_shape,
    run_benchmark,
)

# ----------------------------------------------------------------------------- CLI
PARAMETER_FLAGS = {"shape": "--shape"}   # the parser of a shape names its argument: errors name the flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="only bert-base float32, 5 rounds, no memory or MiniLM runs (about a minute on a quiet "
                             "2-core machine; the full run took 10.5-13 minutes there, about twice its time before "
                             "each timed call was settled: see --settle)")
    parser.add_argument("--json", action="store_true",
                        help="print the results as JSON instead of a table (no progress lines; warnings on stderr)")
    parser.add_argument("--shape", action="append", default=None, metavar="NAME|B,n,d,h,d_ff",
                        help=f"shape(s) to run: {', '.join(SHAPES)} or a custom 'B,n,d,h,d_ff' (repeatable)")
    parser.add_argument("--dtype", action="append", choices=DTYPES, default=None,
                        help="floating-point type(s) to run, float32 or float64 (repeatable; default both, "
                             "float32 with --quick)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds after warm-up (default 7; 5 with --quick)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for both sides (default: OpenBLAS's, or 1 when other processes "
                             "keep the machine busy at the start: see the warning)")
    parser.add_argument("--max-rounds", type=int, default=None,
                        help="round budget of a row whose per-round ratios spread by more than 30%% of their "
                             "median: it is run again with fresh rounds until steady or this many rounds are "
                             "spent (default: 3 x --rounds)")
    parser.add_argument("--settle", type=float, default=SETTLE_S, metavar="SECONDS",
                        help=f"untimed calls of a side, for at least this long (and at least one call), before each "
                             f"of its timed calls, so that the other library's idle threads have stopped spinning "
                             f"(OpenBLAS's spin for ~0.1 s after a call and slow torch's next call at 2 threads; even "
                             f"at 1 thread torch's short calls ran slower straight after NumPy's); "
                             f"default {SETTLE_S:g}. Roughly doubles a row's time against timing back to back")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement (it starts "
                                                                     "fresh processes)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time by the wall clock (default) or by the process's CPU time; cpu needs "
                             "--threads 1 and is the steadier measure on a busy machine")
    parser.add_argument("--recompute", action="store_true",
                        help="also time the NumPy layer without stored attention weights (store_attention=False: "
                             "recomputed block by block in the backward); on by default for the full run, off "
                             "with --quick")
    parser.add_argument("--busy-study", action="store_true",
                        help="instead of the table: thread count 1/2 x 0/1/2 busy-loop processes (started and "
                             "stopped by the command) on --shape (default bert-base), float32 fwd+bwd; a few minutes")
    parser.add_argument("--profile", choices=("minilm",), default=None,
                        help="instead of the table: where MiniLM's encode spends its time (tokenisation, "
                             "embeddings, the six layers, pooling), next to sentence-transformers on the same "
                             "sentences; with --threads and --clock as for the table, --rounds (default 3)")
    parser.add_argument("--minilm", action="store_true",
                        help="also the MiniLM encode throughput vs sentence-transformers (on by default "
                             "for the full run, off with --quick)")


def _starting(args) -> None:
    """Say at once what happens (the arguments are checked): importing PyTorch and reading the machine take
    seconds before the first row's line."""
    if not args.json:
        print("bench: loading PyTorch and reading the machine's load …", file=sys.stderr, flush=True)


def run(args) -> int:
    rounds = args.rounds if args.rounds is not None else (5 if args.quick else 7)
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    if args.max_rounds is not None and args.max_rounds < rounds:
        raise ValueError(f"--max-rounds must be at least --rounds ({rounds}), got {args.max_rounds}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if not 0 <= args.settle <= 60:
        raise ValueError(f"--settle must be a number of seconds from 0 to 60, got {args.settle}")
    if args.clock == "cpu" and args.threads != 1:
        raise ValueError(f"--clock cpu needs --threads 1 (CPU time of several threads counts their waiting), "
                         f"got --threads {args.threads}")
    if args.profile == "minilm":
        _starting(args)
        from ..perf.profile import format_minilm_profile, minilm_profile
        doc = minilm_profile(rounds=args.rounds or 3, threads=args.threads, clock=args.clock, settle=args.settle,
                             log=None if args.json else (lambda s: print(s, file=sys.stderr, flush=True)))
        print(json.dumps({"minilm_profile": doc}, indent=1) if args.json else format_minilm_profile(doc))
        return 0
    shapes = [parse_shape(s) for s in (args.shape or (["bert-base"] if args.quick else list(SHAPES)))]
    if args.busy_study:
        shapes = [parse_shape(s) for s in (args.shape or ["bert-base"])]
        if len(shapes) != 1:
            raise ValueError(f"--busy-study runs one shape, got {len(shapes)} --shape values")
    _starting(args)
    if args.busy_study:
        rows = busy_study(shapes[0][1], (args.dtype or ["float32"])[0], rounds=args.rounds or 5, settle=args.settle,
                          log=None if args.json else (lambda s: print(s, file=sys.stderr, flush=True)))
        print(json.dumps({"busy_study": rows}, indent=1) if args.json else format_busy_study(rows))
        return 0
    dtypes = args.dtype or (["float32"] if args.quick else list(DTYPES))
    memory = not (args.no_memory or args.quick)
    log = None if args.json else (lambda s: print(s, file=sys.stderr, flush=True))
    recompute = args.recompute or not (args.quick or args.shape or args.dtype)
    if args.clock == "cpu" and args.threads != 1:
        raise ValueError(f"--clock cpu needs --threads 1 (CPU time of several threads counts their waiting), "
                         f"got --threads {args.threads}")
    doc = run_benchmark(shapes, dtypes, MODES, rounds, memory, args.threads, log, recompute, args.clock,
                        args.max_rounds, args.settle)
    if args.minilm or not (args.quick or args.shape or args.dtype):
        if log:
            log("MiniLM encode against sentence-transformers …")
        try:
            doc["minilm"] = minilm_throughput(threads=doc["machine"]["threads"], clock=args.clock,
                                              settle=args.settle)
        except ImportError as e:
            doc["minilm"] = {"unavailable": str(e)}
        if "unavailable" in doc["minilm"] and not args.json:
            print(f"MiniLM throughput not measured: {doc.pop('minilm')['unavailable']}", file=sys.stderr)
    print(json.dumps(doc, indent=1) if args.json else format_table(doc))
    if args.json:                                     # the table prints them itself
        for w in doc.get("warnings", []):
            print(f"warning: {w}", file=sys.stderr)
    return 0
