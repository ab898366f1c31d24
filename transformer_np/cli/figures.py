"""The ``figures`` command: regenerate every figure (see :mod:`transformer_np.course.figures`)."""

from __future__ import annotations

import argparse
import sys

from ..course import figures

# --only names of 0.1, whose figures moved with their study code
OLD_NAMES = {"pretrained": "contextual", "train": "stability"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="figures", metavar="DIR",
                        help="directory to write the PNGs into (default: figures)")
    parser.add_argument("--only", action="append", metavar="MODULE", default=None,
                        help="only this module (e.g. anatomy or transformer_np.course.anatomy); repeatable")
    parser.add_argument("--timings", action="store_true",
                        help="also draw figures from measured timings (these differ run to run)")


def run(args: argparse.Namespace) -> int:
    modules = figures.FIGURE_MODULES
    if args.only:
        by_leaf = {m.split(".")[-1]: m for m in figures.FIGURE_MODULES}
        by_leaf.update({old: by_leaf[new] for old, new in OLD_NAMES.items() if new in by_leaf})
        wanted = [m if m.startswith("transformer_np.") else by_leaf.get(m, f"transformer_np.{m}") for m in args.only]
        unknown = [m for m in wanted if m not in figures.FIGURE_MODULES]
        if unknown:
            raise ValueError(f"--only must name one of {', '.join(m.split('.')[-1] for m in figures.FIGURE_MODULES)}; "
                             f"got {', '.join(unknown)}")
        modules = tuple(m for m in figures.FIGURE_MODULES if m in wanted)     # always the canonical order
    try:
        done = figures.generate(args.out, modules, timings=args.timings)
    except figures.FigureError as e:
        total = sum(len(v) for v in e.done.values())
        print(f"{total} figure(s) written to {args.out}; {len(e.failed)} module(s) failed: "
              f"{', '.join(e.failed)}", file=sys.stderr)
        return 1
    total = sum(len(v) for v in done.values())
    print(f"{total} figure(s) written to {args.out}")
    return 0
