"""Reading TOML (stdlib ``tomllib``; ``tomli`` on Python 3.10) and writing the small subset worksheets use."""

from __future__ import annotations

import math
import os
import re

from .._files import read_bytes_bounded
from ..errors import WorksheetError

__all__ = ["read_toml", "parse_toml", "scan_toml", "toml_value", "MAX_FILE_BYTES", "MAX_DEPTH", "MAX_ENTRIES",
           "MAX_NUMBER_CHARS"]

MAX_FILE_BYTES = 1 << 20     # a hand-calculation worksheet is a few kB; refuse anything past 1 MiB unread


def _toml_module():
    try:
        import tomllib  # Python >= 3.11
        return tomllib
    except ModuleNotFoundError:
        try:
            import tomli  # the same parser, packaged for Python 3.10
            return tomli
        except ModuleNotFoundError as e:
            raise ImportError("reading a worksheet on Python 3.10 needs the 'tomli' package "
                              "(pip install tomli, or pip install 'transformer_np[worksheets]')") from e


def parse_toml(text: str, source: str) -> dict:
    """Parse TOML text; a syntax error becomes a :class:`WorksheetError` naming ``source`` and the line."""
    toml = _toml_module()
    try:
        return toml.loads(text)
    except toml.TOMLDecodeError as e:     # its message ends "(at line L, column C)"
        raise WorksheetError(f"{source}: not valid TOML: {e}") from None


def read_toml(path: str | os.PathLike) -> dict:
    """Read and parse a worksheet file: at most ``MAX_FILE_BYTES`` read (pipes and devices included), UTF-8 (a
    leading byte-order mark is allowed), and :func:`scan_toml`'s bounds checked before the parser runs."""
    source = os.fspath(path)
    data = read_bytes_bounded(source, MAX_FILE_BYTES, error=WorksheetError, what="worksheet file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WorksheetError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    text = text.removeprefix("\ufeff")          # a byte-order mark, as some editors write: not part of the TOML
    scan_toml(text, source)
    return parse_toml(text, source)


# ----------------------------------------------------------------------------- the bounds, before parsing
MAX_DEPTH = 4            # arrays / inline tables inside one another: a matrix keyed by token needs 2
MAX_ENTRIES = 150_000    # commas inside arrays and inline tables, over the whole file
MAX_NUMBER_CHARS = 64    # the longest number literal (a 4,300-digit integer would stall Python's int parser)

_TOKEN = re.compile(r"""
    (?P<ml>"{3}|'{3})                                   # a multi-line string opens
  | (?P<key>^[ \t]*+[A-Za-z0-9_\-."' \t]+?[ \t]*=)      # key = ... at the start of a line
  | (?P<str>"(?:[^"\\\n]|\\.)*+(?:"|$)|'[^'\n]*+(?:'|$))  # a string, to its end or the end of its line
  | (?P<comment>\#[^\n]*+)
  | (?P<open>[\[{])
  | (?P<close>[\]}])
  | (?P<comma>,)
  | (?P<nl>\n)
  | (?P<number>(?<![\w.+\-])[+\-]?[0-9][0-9_.eE+\-]{MAXN,})
""".replace("MAXN", str(MAX_NUMBER_CHARS)), re.VERBOSE | re.MULTILINE)
_HEADER = re.compile(r"\[\[?[ \t]*([^\]\n]*?)[ \t]*\]")


def scan_toml(text: str, source: str) -> None:
    """Refuse, in one linear pass and before any parser allocates, a worksheet whose arrays nest deeper than
    ``MAX_DEPTH``, that holds more than ``MAX_ENTRIES`` entries or a number literal of more than
    ``MAX_NUMBER_CHARS`` characters. The message names the file, the key and the line. Strings and comments
    are skipped (an unterminated string is skipped to the end of its line and left to the parser to report)."""
    depth, entries, table, key = 0, 0, "", None
    pos, n = 0, len(text)
    while pos < n:
        m = _TOKEN.search(text, pos)
        if m is None:
            break
        kind, pos = m.lastgroup, m.end()
        if kind == "ml":                      # skip to the closing delimiter (or the end: the parser reports it)
            end = text.find(m.group(), pos)
            pos = n if end < 0 else end + 3
        elif kind == "key":
            if depth == 0:
                key = m.group().strip()[:-1].strip()
        elif kind == "open":
            if depth == 0 and key is None and m.group() == "[":          # a table header
                h = _HEADER.match(text, m.start())
                if h is not None:
                    table, pos = h.group(1), h.end()
                    continue
            depth += 1
            if depth > MAX_DEPTH:
                raise WorksheetError(f"{source}: {_where(table, key)}: arrays nested more than {MAX_DEPTH} deep "
                                     f"(line {_line(text, m.start())}); a worksheet needs at most 2")
        elif kind == "close":
            depth = max(depth - 1, 0)
        elif kind == "comma":
            if depth:
                entries += 1
                if entries > MAX_ENTRIES:
                    raise WorksheetError(f"{source}: {_where(table, key)}: more than {MAX_ENTRIES} entries in the "
                                         f"file (line {_line(text, m.start())}); a hand-calculation worksheet has "
                                         f"far fewer")
        elif kind == "nl":
            if depth == 0:
                key = None
        elif kind == "number":
            raise WorksheetError(f"{source}: {_where(table, key)}: a number of {len(m.group())} characters "
                                 f"(line {_line(text, m.start())}); at most {MAX_NUMBER_CHARS} are accepted")


def _where(table: str, key: str | None) -> str:
    t = f"[{table}]" if table else "the top level"
    return f"{t}.{key}" if key else t


def _line(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def _number(x: float, decimals: int | None) -> str:
    if decimals is not None:
        s = f"{x:.{decimals}f}"
        return s.replace("-", "") if float(s) == 0 else s          # no "-0.00"
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    if not math.isfinite(x):
        raise ValueError(f"cannot write the non-finite number {x!r} to a worksheet")
    return repr(float(x))


def toml_value(v, decimals: int | None = None, indent: str = "") -> str:
    """A TOML literal for a string, number, bool or (nested) list of numbers.

    Numbers are written exactly (``repr``) unless ``decimals`` is given; matrices get one row
    per line.
    """
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (int, float)):
        return _number(float(v), decimals) if isinstance(v, float) or decimals is not None else str(v)
    if hasattr(v, "tolist"):
        return toml_value(v.tolist(), decimals, indent)
    if isinstance(v, (list, tuple)):
        if v and isinstance(v[0], (list, tuple)):
            rows = [toml_value(r, decimals) for r in v]
            inner = ",\n".join(indent + "  " + r for r in rows)
            return "[\n" + inner + ",\n" + indent + "]"
        return "[" + ", ".join(toml_value(x, decimals) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")
