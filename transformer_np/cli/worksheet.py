"""The ``worksheet`` command: ``worksheet new`` writes a fresh problem for hand calculation.

Four files: the problem as TOML (the student fills in its [answers] and runs ``transformer-np
check``), a student sheet in Markdown with a blank table per step, the answer key in Markdown, and
the key as TOML (``check`` marks it all correct). Each seed gives a different problem.
"""

from __future__ import annotations

import argparse

from .._text import printable
from ..worksheets.format import LIMITS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Write worksheets for hand calculation. 'worksheet new' writes a fresh problem (TOML), a "
                          "student sheet and an answer key (Markdown and TOML).")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))
    sub.required = True
    p = sub.add_parser("new", help="write a fresh problem, a student sheet and an answer key",
                       description="Write a fresh problem chosen for hand calculation: the TOML, a student sheet "
                                   "(Markdown, with blanks) and an answer key (Markdown and TOML).")
    p.add_argument("--tokens", type=int, default=3, help=f"number of tokens, 2 to {LIMITS['tokens']} (default 3)")
    p.add_argument("--d-model", type=int, default=4, help=f"model width, 2 to {LIMITS['d_model']} (default 4)")
    p.add_argument("--heads", type=int, default=1, help="attention heads, dividing the width (default 1)")
    p.add_argument("--norm", choices=("post", "pre"), default="post", help="LayerNorm placement (default post)")
    p.add_argument("--backward", action="store_true", help="also ask for the backward pass (gives dH)")
    p.add_argument("--seed", type=int, default=0, help="different seeds give different problems (default 0)")
    p.add_argument("--out", default=".", help="directory to write into (default: the current one)")
    p.add_argument("--layers", type=int, default=1, help=f"encoder layers, 1 to {LIMITS['layers']} (default 1)")
    p.add_argument("--d-ff", type=int, default=None,
                   help=f"feed-forward width, 1 to {LIMITS['d_ff']} (default: d_model)")
    p.add_argument("--activation", choices=("relu", "gelu", "gelu_tanh"), default="relu",
                   help="feed-forward activation (default relu: the easiest by hand)")
    p.add_argument("--decimals", type=int, default=2,
                   help=f"decimals of the answers, 1 to {LIMITS['decimals']} (default 2)")
    p.add_argument("--name", default=None,
                   help="file name stem, a name not a path (default worksheet_seed<SEED>)")
    p.add_argument("--force", action="store_true", help="overwrite existing files (never through a symbolic link)")


def run(args) -> int:
    from ..worksheets.generate import new_worksheet, write_worksheet

    raw = new_worksheet(tokens=args.tokens, d_model=args.d_model, heads=args.heads, norm=args.norm,
                        backward=args.backward, seed=args.seed, layers=args.layers, d_ff=args.d_ff,
                        activation=args.activation, decimals=args.decimals)
    for path in write_worksheet(raw, args.out, args.name, force=args.force):
        print(printable(path))
    return 0
