"""The ``check`` command: mark a hand calculation written as a worksheet (see :mod:`transformer_np.worksheets`).

Every step of the worksheet's problem is computed with the library's own ops; each answer is marked
correct / follows (wrong, but right from your own earlier answers) / wrong / missing, and the first
mistake is diagnosed. ``--json`` prints ``{"steps": [...], "first_mistake": {...} or null}``.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE",
                        help="a worksheet (TOML); 'example' checks the article's 'the cat sat' sheet")
    parser.add_argument("--json", action="store_true", help="print one JSON object (full precision)")
    parser.add_argument("--full", action="store_true", help="show your rows next to the correct ones for every answer")
    parser.add_argument("--key", action="store_true", help="also print the correct value of every unanswered step")


def run(args) -> int:
    from ..worksheets import check, example_path

    path = example_path("the_cat_sat") if args.file == "example" else args.file
    report = check(path)
    if args.json:
        print(report.to_json())
    else:
        print(report.format(full=args.full, key=args.key))
    return 0
