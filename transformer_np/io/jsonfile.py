r"""Strict, bounded JSON reading for files the library does not control.

Model folders (``config.json``, ``tokenizer.json``, ``modules.json``, …) and checkpoints carry JSON
that may be hand-edited, truncated or hostile. :func:`loads_strict` and :func:`read_json` read it
with bounds and rules Python's ``json`` module does not have:

* size: at most ``max_bytes`` (64 MiB by default; a BERT ``tokenizer.json`` is about 0.7 MB);
* depth: nesting of objects/arrays at most ``max_depth`` (64), found by a linear scan *before*
  parsing, so a 200,000-deep file is refused without recursion;
* no duplicate keys in an object, and no ``NaN`` / ``Infinity`` / ``-Infinity`` (not JSON; Python
  accepts them) — the error names the key path, e.g. ``hidden_size`` or ``model.vocab``;
* optionally, the top level must be an object (``kind=dict``) or an array (``kind=list``).

Every failure raises ``error`` (a :class:`~transformer_np.errors.FileFormatError` subclass chosen
by the caller) with the file name, so a command line reports one line naming the file and key.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from ..errors import FileFormatError

__all__ = ["MAX_JSON_DEPTH", "MAX_JSON_BYTES", "json_depth", "loads_strict", "read_json"]

MAX_JSON_DEPTH = 64
MAX_JSON_BYTES = 64 * 2 ** 20
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


class _Constant:
    """Placeholder for NaN/Infinity found while parsing; reported with its key path afterwards."""

    def __init__(self, name: str):
        self.name = name


def json_depth(raw: bytes) -> int:
    """Maximum nesting depth of ``[``/``{`` outside strings (a linear scan; no parsing)."""
    b = np.frombuffer(_STRING.sub(b"", raw), dtype=np.uint8)
    if not b.size:
        return 0
    step = (b == ord("[")).astype(np.int64) + (b == ord("{")) - (b == ord("]")) - (b == ord("}"))
    return int(max(0, np.cumsum(step).max()))


def no_duplicate_keys(error, where):
    """A ``json.loads`` object_pairs_hook that raises ``error`` naming ``where`` on a repeated key."""
    def hook(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise error(f"{where}: duplicate key {k!r} in one JSON object")
            out[k] = v
        return out
    return hook


def _key_path(path: list) -> str:
    text = ""
    for p in path:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text or "the top level"


def _find_constant(value) -> tuple[list, str] | None:
    """(key path, constant name) of the first NaN/Infinity placeholder, iteratively."""
    stack = [(value, [])]
    while stack:
        v, path = stack.pop()
        if isinstance(v, _Constant):
            return path, v.name
        if isinstance(v, dict):
            stack.extend((x, path + [k]) for k, x in v.items() if isinstance(x, (dict, list, _Constant)))
        elif isinstance(v, list):
            stack.extend((x, path + [i]) for i, x in enumerate(v) if isinstance(x, (dict, list, _Constant)))
    return None


def loads_strict(raw: bytes | str, where: str, kind: type | None = None, max_depth: int = MAX_JSON_DEPTH,
                 error: type = FileFormatError, allow_constants: bool = False):
    """Parse JSON text with the rules of the module docstring; ``where`` names the source in errors.

    ``allow_constants=True`` accepts NaN/Infinity (as Python's ``json.dumps`` writes them, e.g. the
    loss of a diverged run in a training log)."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", errors="surrogatepass")
    depth = json_depth(raw)
    if depth > max_depth:
        raise error(f"{where}: JSON nested {depth} levels deep; at most {max_depth} are accepted")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text ({e})") from None
    try:
        value = json.loads(text, object_pairs_hook=no_duplicate_keys(error, where),
                           parse_constant=float if allow_constants else _Constant)
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply") from None
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e})") from None
    found = None if allow_constants else _find_constant(value)
    if found is not None:
        path, name = found
        raise error(f"{where}: {_key_path(path)} is {name}, which is not a JSON number (a finite number "
                    f"is required)")
    if kind is not None and not isinstance(value, kind):
        want = {dict: "a JSON object {…}", list: "a JSON array […]"}.get(kind, kind.__name__)
        got = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               type(None): "null"}.get(type(value), "a number")
        raise error(f"{where}: the file must hold {want}, got {got}")
    return value


def read_json(path, kind: type | None = dict, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH,
              error: type = FileFormatError):
    """Read and parse the JSON file ``path`` strictly (see :func:`loads_strict`); size-bounded."""
    where = os.fspath(path)
    try:
        size = os.path.getsize(where)
        if size > max_bytes:
            raise error(f"{where}: {size} bytes is more than the {max_bytes} a JSON file here may have")
        with open(where, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise error(f"{where}: cannot be read ({e.strerror or e})") from None
    if len(raw) > max_bytes:   # grew while we looked
        raise error(f"{where}: more than the {max_bytes} bytes a JSON file here may have")
    return loads_strict(raw, where, kind, max_depth, error)

