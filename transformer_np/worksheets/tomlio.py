"""Reading TOML (stdlib ``tomllib``; ``tomli`` on Python 3.10) and writing the small subset worksheets use."""

from __future__ import annotations

import math
import os

from ..errors import WorksheetError

__all__ = ["read_toml", "parse_toml", "toml_value", "MAX_FILE_BYTES"]

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
    """Read and parse a worksheet file (at most ``MAX_FILE_BYTES``, UTF-8)."""
    source = os.fspath(path)
    try:
        size = os.path.getsize(source)
    except OSError:
        raise WorksheetError(f"{source}: no such worksheet file") from None
    if size > MAX_FILE_BYTES:
        raise WorksheetError(f"{source}: {size} bytes is not a hand-calculation worksheet "
                             f"(at most {MAX_FILE_BYTES} bytes)")
    try:
        with open(source, "rb") as fh:
            text = fh.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise WorksheetError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise WorksheetError(f"{source}: cannot be read ({e.strerror})") from None
    return parse_toml(text, source)


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
