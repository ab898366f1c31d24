"""The ``figures`` command: regenerate every figure of the course companion (PNG, 150 dpi) into --out.

The figure sets run in a fixed order; each says what it draws as it starts (on stderr: one line per set,
or a bar on a terminal) and which files it wrote. With fixed seeds and sizes a rerun writes the same
bytes, except the timing figure when --timings asks for fresh measurements. A set whose optional package
is missing (the MiniLM files for the contextual figures) is skipped with a notice; if a set fails, the
others still run and the command exits with status 1. Needs matplotlib.

Python API: :func:`transformer_np.course.figures.generate`.
"""

from __future__ import annotations

import argparse
import sys

from ..course import figures
from ..textout import terminal
from ._progress import Progress

# --only names of 0.1, whose figures moved with their study code
OLD_NAMES = {"pretrained": "contextual", "train": "stability"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="figures", metavar="DIR",
                        help="directory to write the PNGs into (default: figures)")
    parser.add_argument("--only", action="append", metavar="NAME", default=None,
                        help=f"only this figure set ({', '.join(figures.FIGURE_SETS)}: see below); repeatable")
    parser.add_argument("--timings", action="store_true",
                        help="draw the timing figure from fresh measurements (these differ run to run) instead "
                             "of the stored ones")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress on stderr: only the summary line, and a notice for a set skipped or failed")
    width = max(len(name) for name in figures.FIGURE_SETS)
    parser.epilog = "figure sets, in the order they run:\n" + "\n".join(
        f"  {name:{width}}  {text}" for name, (_, text) in figures.FIGURE_SETS.items())


def _selected(only: list[str] | None) -> tuple[str, ...]:
    """The modules --only names (a set's name, a 0.1 name, or a module path), in the canonical order."""
    if not only:
        return figures.FIGURE_MODULES
    names = {name: module for name, (module, _) in figures.FIGURE_SETS.items()}
    names.update({old: names[new] for old, new in OLD_NAMES.items() if new in names})
    wanted = [names.get(m, m) for m in only]
    unknown = [o for o, m in zip(only, wanted) if m not in figures.FIGURE_MODULES]
    if unknown:
        raise ValueError(f"--only must name one of {', '.join(figures.FIGURE_SETS)}; got {', '.join(unknown)}")
    return tuple(m for m in figures.FIGURE_MODULES if m in wanted)


def run(args: argparse.Namespace) -> int:
    modules = _selected(args.only)
    bar = None if args.quiet else Progress("figures", every=2.0)   # a long set's steps: a line every 2 s at most

    def log(line: str) -> None:
        if bar is not None:
            bar.close()
            print(f"  {terminal(line)}", file=sys.stderr, flush=True)
        elif not line.startswith("wrote "):          # --quiet: a skipped or failed set is still told
            print(terminal(line), file=sys.stderr, flush=True)

    try:
        done = figures.generate(args.out, modules, timings=args.timings, log=log, progress=bar)
    except figures.FigureError as e:
        total = sum(len(v) for v in e.done.values())
        print(f"{total} figure(s) written to {terminal(args.out)}; {len(e.failed)} figure set(s) failed: "
              f"{'; '.join(figures.title(m) for m in e.failed)}", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.close()
    total = sum(len(v) for v in done.values())
    print(f"{total} figure(s) written to {terminal(args.out)}")
    return 0
