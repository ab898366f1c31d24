"""``transformer-np worksheet serve SHEET``: a local page to fill in a worksheet and see each step marked.

Registered by :mod:`transformer_np.cli.worksheet`; the server is :mod:`transformer_np.worksheets.serve`.
"""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    from ..worksheets.serve import IDLE_TIMEOUT

    p = sub.add_parser(
        "serve", help="a local page to fill in a sheet and see each step marked as you go",
        description="Serve a local page (127.0.0.1 only) where you type your numbers into the sheet's tables: "
                    "each change is saved into the sheet's TOML and marked with the same check as "
                    "'transformer-np check', step by step, with the first mistake diagnosed. The address "
                    "printed carries a random token that every request must present. Ctrl-C stops the server.")
    p.add_argument("sheet", metavar="SHEET", help="the worksheet (TOML) to fill in; its answers are saved into it")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default 0: any free port)")
    p.add_argument("--no-browser", action="store_true", help="print the address but do not open a browser")
    p.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT, metavar="SECONDS",
                   help=f"stop after this many seconds without a request (default {IDLE_TIMEOUT:g})")
    return p


def run(args) -> int:
    from ..worksheets.serve import serve

    serve(args.sheet, port=args.port, open_browser=not args.no_browser, idle_timeout=args.idle_timeout)
    return 0
