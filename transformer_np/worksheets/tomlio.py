"""Reading TOML (stdlib ``tomllib``; ``tomli`` on Python 3.10) and writing the small subset worksheets use."""

from __future__ import annotations

import math
import os
import re

from .._files import read_bytes_bounded
from .._optional import require
from ..errors import WorksheetError

__all__ = ["read_toml", "decode_toml", "parse_toml", "scan_toml", "toml_value", "MAX_FILE_BYTES", "MAX_DEPTH",
           "MAX_ENTRIES", "MAX_NUMBER_CHARS", "MAX_STRING_CHARS", "MAX_LINES", "MAX_LINE_CHARS", "MAX_KEYS",
           "MAX_TABLES"]

MAX_FILE_BYTES = 1 << 19     # a hand-calculation worksheet is a few kB (the largest: ~150 kB); 512 KiB at most


def _toml_module():
    try:
        import tomllib  # Python >= 3.11
        return tomllib
    except ModuleNotFoundError:                      # the same parser, packaged for Python 3.10
        return require("tomli", "reading a worksheet on Python 3.10 needs the 'tomli' package "
                                "(pip install tomli, or pip install 'transformer_np[worksheets]')")


class _Unstorable(Exception):
    """A float literal that a float cannot hold as written (raised inside the parser, named outside it)."""


def _float(literal: str) -> float:
    """TOML's float, refusing a nonzero literal that would be read as 0.0 (``1e-400``): nothing is changed
    without a word."""
    x = float(literal)
    if x == 0 and any(c in "123456789" for c in re.split(r"[eE]", literal)[0]):
        raise _Unstorable(literal)
    return x


def parse_toml(text: str, source: str) -> dict:
    """Parse TOML text; a syntax error becomes a :class:`WorksheetError` naming ``source`` and the line, and a
    number too small for a float (it would be read as 0.0) one naming ``source``, the number and its line."""
    toml = _toml_module()
    try:
        return toml.loads(text, parse_float=_float)
    except toml.TOMLDecodeError as e:     # its message ends "(at line L, column C)"
        raise WorksheetError(f"{source}: not valid TOML: {e}") from None
    except _Unstorable as e:
        literal = str(e)
        line = next((i for i, t in enumerate(text.splitlines(), 1) if literal in t), None)
        raise WorksheetError(f"{source}{f', line {line}' if line else ''}: the number {literal} cannot be stored "
                             f"as written: it is too small for a float and would be read as 0.0; write 0, or the "
                             f"number to the sheet's decimals") from None


def read_toml(path: str | os.PathLike) -> dict:
    """Read and parse a worksheet file: at most ``MAX_FILE_BYTES`` read (pipes and devices included), UTF-8 (a
    leading byte-order mark is allowed), and :func:`scan_toml`'s bounds checked before the parser runs."""
    source = os.fspath(path)
    data = read_bytes_bounded(source, MAX_FILE_BYTES, error=WorksheetError, what="worksheet file")
    return decode_toml(data, source)


def decode_toml(data: bytes, source: str) -> dict:
    """The worksheet in ``data`` (bytes read by the caller, at most ``MAX_FILE_BYTES``): UTF-8 (a leading
    byte-order mark allowed), :func:`scan_toml`'s bounds checked, then parsed; errors name ``source``."""
    if len(data) > MAX_FILE_BYTES:
        raise WorksheetError(f"{source}: more than the {MAX_FILE_BYTES} bytes a worksheet file may have")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WorksheetError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    text = text.removeprefix("\ufeff")          # a byte-order mark, as some editors write: not part of the TOML
    scan_toml(text, source)
    return parse_toml(text, source)


# ----------------------------------------------------------------------------- the bounds, before parsing
MAX_DEPTH = 4            # arrays / inline tables inside one another: a matrix keyed by token needs 2
MAX_ENTRIES = 20_000     # commas inside arrays and inline tables, over the whole file (the largest sheet: ~12,300)
MAX_NUMBER_CHARS = 64    # the longest number literal (a 4,300-digit integer would stall Python's int parser)
MAX_STRING_CHARS = 256   # a worksheet's strings are words: tokens, "post", "gelu", "identity"
MAX_LINES = 20_000       # the largest sheet, one matrix row per line: ~2,500 lines
MAX_LINE_CHARS = 4_096   # its longest line: ~450 characters
MAX_KEYS = 2_000         # key = value lines (the largest sheet: ~200)
MAX_TABLES = 64          # [table] headers (setup, input, layers, answers, marks: about a dozen)

_SPECIAL = re.compile(r"""["'#\[\]{},\n]""")
# Each is only ever .match()-ed at one position, and its repeated classes are disjoint from what follows them, so a
# failed match backtracks at most once over the line it started on: linear overall. (No possessive quantifiers:
# they need Python 3.11, and Python 3.10 is supported.)
_KEY = re.compile(r"[ \t]*([A-Za-z0-9_\-.\"']+)[ \t]*=")
_BASIC = re.compile(r'"(?:[^"\\\n]|\\.)*(?:"|$)', re.MULTILINE)
_LITERAL = re.compile(r"'[^'\n]*(?:'|$)", re.MULTILINE)
_HEADER = re.compile(r"\[\[?([^\]\n]*)\]")
_LONG_INT = re.compile(r"(?<![\w.])[+\-]?[0-9][0-9_]{%d,}" % MAX_NUMBER_CHARS)   # noqa: UP031


def scan_toml(text: str, source: str) -> None:
    """Refuse, in one linear pass and before any parser allocates, a worksheet whose arrays nest deeper than
    ``MAX_DEPTH``, that holds more than ``MAX_ENTRIES`` entries, an integer literal of more than
    ``MAX_NUMBER_CHARS`` digits or a string of more than ``MAX_STRING_CHARS`` characters. The message names
    the file, the key and the line. Strings and comments are skipped (an unterminated string is skipped to the
    end of its line and left to the parser to report)."""
    lines = text.count("\n") + 1
    if lines > MAX_LINES:
        _refuse(text, source, len(text), f"{lines} lines; a hand-calculation worksheet has at most {MAX_LINES}")
    split = text.split("\n")
    if max(map(len, split)) > MAX_LINE_CHARS:
        at = 0
        for line in split:                      # where the first long line starts
            if len(line) > MAX_LINE_CHARS:
                break
            at += len(line) + 1
        _refuse(text, source, at, f"a line of {len(line)} characters; at most {MAX_LINE_CHARS} are accepted")
    long_int = _LONG_INT.search(text)
    if long_int is not None:
        _refuse(text, source, long_int.start(), f"an integer of {len(long_int.group())} characters; at most "
                                                f"{MAX_NUMBER_CHARS} are accepted")
    depth = entries = keys = tables = 0
    k = _KEY.match(text, 0)
    key = None if k is None else k.group(1)
    table = ""
    pos, n = 0, len(text)
    while True:
        m = _SPECIAL.search(text, pos)
        if m is None:
            return
        c, at = m.group(), m.start()
        pos = at + 1
        if c == ",":
            if depth:
                entries += 1
                if entries > MAX_ENTRIES:
                    _refuse(text, source, at, f"more than {MAX_ENTRIES} entries in the file; a hand-calculation "
                                              f"worksheet has far fewer", table, key)
        elif c == "\n":
            if depth == 0:
                k = _KEY.match(text, pos)
                key = None if k is None else k.group(1).strip()
                if key is not None:
                    keys += 1
                    if keys > MAX_KEYS:
                        _refuse(text, source, pos, f"more than {MAX_KEYS} keys; a worksheet has a few hundred",
                                table, key)
        elif c == "[" or c == "{":
            if depth == 0 and key is None and c == "[":          # a table header
                h = _HEADER.match(text, at)
                if h is not None:
                    table, pos = h.group(1).strip(), h.end()
                    tables += 1
                    if tables > MAX_TABLES:
                        _refuse(text, source, at, f"more than {MAX_TABLES} [tables]; a worksheet has about a dozen",
                                table)
                    continue
            depth += 1
            if depth > MAX_DEPTH:
                _refuse(text, source, at, f"arrays nested more than {MAX_DEPTH} deep; a worksheet needs at most 2",
                        table, key)
        elif c == "]" or c == "}":
            depth = max(depth - 1, 0)
        elif c == "#":
            end = text.find("\n", pos)
            pos = n if end < 0 else end
        else:                                   # a string: ' or "
            if text.startswith(c * 3, at):      # multi-line: skip to its closing delimiter (the parser checks it)
                end = text.find(c * 3, at + 3)
                end = n if end < 0 else end + 3
            else:
                s = (_BASIC if c == '"' else _LITERAL).match(text, at)
                if s is not None:
                    end = s.end()
                else:                           # e.g. a backslash before the end of the line: to the line's end
                    end = text.find("\n", at)
                    end = n if end < 0 else end
            if end - at > MAX_STRING_CHARS + 2:
                _refuse(text, source, at, f"a string of {end - at - 2} characters; a worksheet's strings are words "
                                          f"(at most {MAX_STRING_CHARS})", table, key)
            pos = end


def _refuse(text: str, source: str, at: int, what: str, table: str | None = None, key: str | None = None):
    if table is None:                           # find the table and key of position ``at`` (rare: errors only)
        before = text[:at]
        heads = list(re.finditer(r"^[ \t]*\[\[?([^\]\n]*)\]", before, re.MULTILINE))
        table = heads[-1].group(1).strip() if heads else ""
        start = heads[-1].end() if heads else 0
        keys = list(re.finditer(r"^[ \t]*([A-Za-z0-9_\-.\"']+)[ \t]*=", before[start:], re.MULTILINE))
        key = keys[-1].group(1) if keys else None
        here = _KEY.match(text, text.rfind("\n", 0, at) + 1)        # a key on the line of ``at`` itself
        if here is not None:
            key = here.group(1).strip()
    line = text.count("\n", 0, at) + 1
    where = (f"[{table}]" if table else "the top level") + (f".{key}" if key else "")
    raise WorksheetError(f"{source}: {where}: {what} (line {line})")


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
