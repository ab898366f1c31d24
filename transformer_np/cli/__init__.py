"""The command line: ``python -m transformer_np COMMAND`` or ``transformer-np COMMAND``.

Each command lives in its own module, which provides ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported only when present, and heavy optional
dependencies (torch, matplotlib, …) are imported inside ``run``, so ``--help`` is fast.
Bad arguments and bad input (``ValueError``/``TypeError``) print one line on stderr and
exit with status 2 — no traceback.

A command's ``--help`` shows its module's docstring and its flags' help strings as plain text:
:func:`plain_text` strips the reStructuredText markup the docstrings are written in for the API
reference (````literals````, ``:func:`` roles, ``**bold**``), so the command modules keep one
docstring for both readers.

The commands: :mod:`.check` (mark worksheets), :mod:`.worksheet` (``worksheet new``, ``class``, …) and
:mod:`.worksheet_serve` (``worksheet serve``), :mod:`.grade` (the exercises' grade of record), :mod:`.trace`
(the worked example), :mod:`.gradcheck`, :mod:`.gradflow`, :mod:`.train`, :mod:`.embed`, :mod:`.figures` and
:mod:`.bench`. Shared by several: ``_gradebook`` (the class gradebooks of ``check`` and ``grade``: what is
shown, opened and written), ``_roster`` (``check --roster``: the gradebook in roster order and the files made
from it) and ``_progress`` (a long command's progress on stderr).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import textwrap

from .. import __version__
from ..textout import terminal

__all__ = ["COMMANDS", "build_parser", "flag_names", "main", "plain_text"]

# command -> (module, one-line help). Order is the order shown by --help.
COMMANDS = {
    "trace": ("transformer_np.cli.trace", "the article's 'the cat sat' worked example, recomputed"),
    "check": ("transformer_np.cli.check", "check a hand calculation written as a worksheet (TOML)"),
    "worksheet": ("transformer_np.cli.worksheet", "write a fresh worksheet for hand calculation (worksheet new)"),
    "grade": ("transformer_np.cli.grade", "grade course exercises: each submission run in its own restricted process"),
    "gradcheck": ("transformer_np.cli.gradcheck", "finite-difference gradient checks of every op (float64)"),
    "gradflow": ("transformer_np.cli.gradflow", "gradient flow through deep Pre-LN / Post-LN stacks"),
    "embed": ("transformer_np.cli.embed", "sentence embeddings with all-MiniLM-L6-v2 in NumPy"),
    "bench": ("transformer_np.cli.bench", "speed and memory against PyTorch"),
    "train": ("transformer_np.cli.train", "train a small encoder in NumPy"),
    "figures": ("transformer_np.cli.figures", "regenerate every figure into figures/"),
}

# ----------------------------------------------------------------------------- docstring -> plain text
# :role:`target`, :role:`~pkg.mod.name`, :role:`title <target>` (any Sphinx role, domain-qualified or not)
_ROLE = re.compile(r":(?:\w+:)*\w+:`(~?)([^`<]*?)\s*(?:<([^`>]*)>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*<([^`>]+)>`_{1,2}")                 # `text <url>`_
_LITERAL = re.compile(r"``(.+?)``", re.S)
_INTERPRETED = re.compile(r"`([^`\n]+)`")                            # `default role`
_STRONG = re.compile(r"\*\*(\S(?:.*?\S)?)\*\*")
_EMPHASIS = re.compile(r"(?<![\w*\\])\*(?=[^\s*])([^*\n]*?[^\s*\\])\*(?![\w*])")
_COMMAND_PREFIX = re.compile(r"^The (?:``)?([\w-]+)(?:``)? command: ")


def _role(m: re.Match) -> str:
    tilde, text, target = m.group(1), m.group(2), m.group(3)
    if target is not None and text:                                 # :ref:`the guide <guide-section>`
        return text
    name = (target or text).strip()
    return name.rsplit(".", 1)[-1] if tilde else name


def _literal(m: re.Match) -> str:
    code = " ".join(m.group(1).split())
    return f"'{code}'" if " " in code else code                     # 'python -m x' reads as one thing


def plain_text(text: str) -> str:
    """``text`` (reStructuredText, as the docstrings are written) as plain text for a terminal.

    Roles become their target (``:func:`run_all``` → run_all, ``~a.b`` → b, ``title <target>`` →
    title), ````literals```` lose their backticks (quoted when they hold a space), ```text <url>`_``
    becomes ``text (url)``, ``**bold**`` and ``*emphasis*`` lose their stars, a paragraph-ending
    ``::`` becomes ``:``, and ``\\|`` becomes ``|``. Line breaks and indentation are kept.
    """
    text = _ROLE.sub(_role, text)
    text = _LINK.sub(r"\1 (\2)", text)
    text = _LITERAL.sub(_literal, text)
    text = _INTERPRETED.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = re.sub(r"(\S)::[ \t]*$", r"\1:", text, flags=re.M)
    text = re.sub(r"^[ \t]*::[ \t]*$\n?", "", text, flags=re.M)
    return text.replace("\\|", "|").replace("\\*", "*")


def flag_names(message: str, flags: dict[str, str]) -> str:
    """``message`` of an error raised by the Python API, with the parameter names a command's flags stand for
    (its module's ``PARAMETER_FLAGS``, e.g. ``{"path_or_name": "--model"}``) written as those flags: a person
    at the command line never typed ``path_or_name``. A name with an underscore is replaced wherever it stands
    as a whole word; a plain word (``lr``, ``steps``) only where the message names it as the argument — before
    ``must``, ``=``, ``[`` or ``:``."""
    for name, flag in sorted(flags.items(), key=lambda kv: -len(kv[0])):
        tail = "" if "_" in name else r"(?=\s+must\b|\s*=|\[|:)"
        message = re.sub(rf"(?<![\w./\-]){re.escape(name)}(?![\w/]){tail}", flag, message)
    return message


def _os_error(e: Exception, args: argparse.Namespace) -> str:
    """An error's message; the system's own "[Errno 2] No such file or directory: 'x'" becomes "x: No such file or
    directory", led by "--out DIR:" when x is in the command's --out folder (the flag the reader can change)."""
    text = str(e)
    if not (isinstance(e, OSError) and e.filename is not None and e.strerror and text.startswith("[Errno")):
        return text
    text = f"{e.filename}: {e.strerror}"
    out = getattr(args, "out", None)
    if isinstance(out, str) and out:
        try:
            inside = os.path.commonpath([os.path.abspath(out), os.path.abspath(e.filename)]) == os.path.abspath(out)
        except ValueError:                          # different drives, or a relative and an absolute path
            inside = False
        if inside:
            text = f"--out {out}: cannot write {text}"
    return text


def _description(name: str, doc: str | None, help_text: str) -> str:
    """A command's --help text: its module docstring in plain text, without the "The ``name`` command: " that
    introduces it in the API reference."""
    text = plain_text(textwrap.dedent(doc or help_text).strip())
    m = _COMMAND_PREFIX.match(text)
    if m and m.group(1) == name:
        text = text[m.end():]
        text = text[:1].upper() + text[1:]
    return text


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps each paragraph of a description on its own (argparse joins them all into one) and keeps
    indented lines (a formula, an example command) as they are written."""

    def __init__(self, prog, indent_increment=2, max_help_position=30, width=None):
        super().__init__(prog, indent_increment, max_help_position, width)

    def add_argument(self, action):
        super().add_argument(action)
        if action.help is not argparse.SUPPRESS and isinstance(action, argparse._SubParsersAction):
            # argparse measures the command names one indent short of where it prints them, so a name as long
            # as the column ("worksheet", "gradcheck") would push its help onto the next line
            for sub in action._get_subactions():
                need = len(self._format_action_invocation(sub)) + self._current_indent + self._indent_increment
                self._action_max_length = max(self._action_max_length, need)

    def _fill_text(self, text, width, indent):
        out = []
        for para in re.split(r"\n[ \t]*\n", text.strip("\n")):
            lines = para.splitlines()
            if lines and all(line.startswith((" ", "\t")) for line in lines[1:]) and lines[0].startswith(" "):
                out.append("\n".join(indent + line for line in lines))           # an indented block: verbatim
                continue
            head = [ln for ln in lines if not ln.startswith((" ", "\t"))]
            block = [ln for ln in lines if ln.startswith((" ", "\t"))]
            filled = textwrap.fill(" ".join(" ".join(head).split()), width, initial_indent=indent,
                                   subsequent_indent=indent)
            out.append("\n".join([filled] + [indent + ln for ln in block]) if block else filled)
        return "\n\n".join(out)


def _plain_actions(parser: argparse.ArgumentParser) -> None:
    """Every flag's help string as plain text, in ``parser`` and in its sub-commands (``worksheet new``)."""
    for action in parser._actions:
        if action.help and action.help is not argparse.SUPPRESS:
            action.help = plain_text(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = plain_text(choice.help or "")
            for sub in action.choices.values():
                if sub.description:
                    sub.description = plain_text(sub.description)
                sub.formatter_class = _HelpFormatter
                _plain_actions(sub)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # argparse's own usage errors: one line, status 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="transformer-np",
                     description="A pure-NumPy Transformer encoder stack: checks, traces and experiments.",
                     epilog="Run 'transformer-np COMMAND --help' for what a command does and its options.")
    parser.add_argument("--version", action="version", version=f"transformer-np {__version__}",
                        help="print the version and exit")
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
        p = sub.add_parser(name, help=help_text, description=_description(name, mod.__doc__, help_text))
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _flags=getattr(mod, "PARAMETER_FLAGS", {}))
    _plain_actions(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. A reader that closes the pipe early (``transformer-np check example
    --json | head``) ends the command quietly with status 141 (128 + SIGPIPE), as Unix tools do."""
    try:
        status = _main(argv)
        sys.stdout.flush()                    # a closed pipe shows here, not in the interpreter's exit
        return status
    except BrokenPipeError:
        try:                                  # nothing more reaches the closed pipe, not even at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):         # a stdout without a file descriptor (a test's capture)
            pass
        return 141


def _main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:                   # a reader closed the pipe: main ends quietly
        raise
    except (ValueError, TypeError) as e:   # one line, its file names and keys shown escaped (textout)
        print(f"transformer-np {args.command}: error: {terminal(flag_names(str(e), args._flags))}", file=sys.stderr)
        return 2
    except (ImportError, OSError) as e:  # a missing optional package, an unwritable --out
        print(f"transformer-np {args.command}: error: {terminal(flag_names(_os_error(e, args), args._flags))}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
