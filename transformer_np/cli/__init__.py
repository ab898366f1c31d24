"""The command line: ``python -m transformer_np COMMAND`` or ``transformer-np COMMAND``.

Each command lives in its own module, which provides ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported only when present, and heavy optional
dependencies (torch, matplotlib, …) are imported inside ``run``, so ``--help`` is fast.
Bad arguments and bad input (``ValueError``/``TypeError``) print one line on stderr and
exit with status 2 — no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, one-line help). Order is the order shown by --help.
COMMANDS = {
    "trace": ("transformer_np.cli.trace", "the article's 'the cat sat' worked example, recomputed"),
    "check": ("transformer_np.cli.check", "check a hand calculation written as a worksheet (TOML)"),
    "worksheet": ("transformer_np.cli.worksheet", "write a fresh worksheet for hand calculation (worksheet new)"),
    "gradcheck": ("transformer_np.cli.gradcheck", "finite-difference gradient checks of every op (float64)"),
    "gradflow": ("transformer_np.cli.gradflow", "gradient flow through deep Pre-LN / Post-LN stacks"),
    "embed": ("transformer_np.cli.embed", "sentence embeddings with all-MiniLM-L6-v2 in NumPy"),
    "bench": ("transformer_np.cli.bench", "speed and memory against PyTorch"),
    "train": ("transformer_np.cli.train", "train a small encoder in NumPy"),
    "figures": ("transformer_np.cli.figures", "regenerate every figure into figures/"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: one line, status 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="transformer-np",
                     description="A pure-NumPy Transformer encoder stack: checks, traces and experiments.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module, help_text) in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name == module:  # this command's module is not part of this version
                continue
            raise
        if not hasattr(mod, "add_arguments"):
            continue
        p = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip().split("\n\n")[0])
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except (ValueError, TypeError) as e:
        print(f"transformer-np {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (ImportError, OSError) as e:  # a missing optional package, an unwritable --out
        print(f"transformer-np {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
