r"""Strict, bounded JSON reading for files the library does not control.

Model folders (``config.json``, ``tokenizer.json``, ``modules.json``, …) and checkpoints carry JSON
that may be hand-edited, truncated or hostile. :func:`loads_strict` and :func:`read_json` read it
with bounds and rules Python's ``json`` module does not have:

* size: at most ``max_bytes`` (64 MiB by default; a BERT ``tokenizer.json`` is about 0.7 MB),
  counted on the bytes actually read (:func:`transformer_np._files.read_bytes_bounded`), so a pipe
  or a device is refused at the bound;
* one linear pre-scan (:func:`scan_json`) before parsing: nesting of objects/arrays at most
  ``max_depth`` (64) and at most ``max_tokens`` (2²² ≈ 4.2 million) values and keys, counted as the
  commas, colons and opening brackets outside strings — so a 200,000-deep file or a file of
  millions of empty objects is refused without recursion and before Python builds any object.
  The scan costs the same for every input of a given size (about 10 ms per MB), including an
  unterminated string of escaped quotes;
* no duplicate keys in an object, no ``NaN`` / ``Infinity`` / ``-Infinity`` (not JSON; Python
  accepts them), no number that overflows to infinity (``1e400``), and no integer of more than
  :data:`MAX_INT_DIGITS` digits (Python would refuse it with advice about
  ``sys.set_int_max_str_digits``) — the error names the key path, e.g. ``hidden_size`` or
  ``model.vocab``;
* optionally, the top level must be an object (``kind=dict``) or an array (``kind=list``).

Every failure raises ``error`` (a :class:`~transformer_np.errors.FileFormatError` subclass chosen
by the caller) with the file name, so a command line reports one line naming the file and key.
"""

from __future__ import annotations

import gc
import json
import math
import os
from typing import NamedTuple

import numpy as np

from .._files import read_bytes_bounded
from ..errors import FileFormatError

__all__ = ["MAX_JSON_DEPTH", "MAX_JSON_BYTES", "MAX_JSON_TOKENS", "MAX_INT_DIGITS", "JsonScan", "scan_json",
           "json_depth", "loads_strict", "read_json"]

MAX_JSON_DEPTH = 64
MAX_JSON_BYTES = 64 * 2 ** 20
MAX_JSON_TOKENS = 2 ** 22
MAX_INT_DIGITS = 4300              # Python's own default limit for int(str)
_SCAN_CHUNK = 1 << 20              # bytes per vectorised block: bounded temporaries for any file size
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_STEP = np.zeros(256, np.int8)                     # a structural byte's change of depth
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


class _Constant:
    """Placeholder for a value refused after parsing (NaN/Infinity, an overflowing number, a huge
    integer); reported with its key path once the whole text is parsed."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


class JsonScan(NamedTuple):
    """What :func:`scan_json` found: the deepest nesting and the first byte offset at which it is
    reached, the number of tokens (commas, colons and opening brackets outside strings), and whether
    the text ends inside a string."""

    depth: int
    depth_at: int
    tokens: int
    unterminated: bool


def scan_json(raw: bytes, max_depth: int | None = None, max_tokens: int | None = None) -> JsonScan:
    """See :func:`_scan` (this is its result without the count of bytes scanned)."""
    return JsonScan(*_scan(raw, max_depth, max_tokens)[:4])


class _Scanned(NamedTuple):
    depth: int
    depth_at: int
    tokens: int
    unterminated: bool
    scanned: int                     # bytes scanned (less than the input when a bound stopped the scan)


def _scan(raw: bytes, max_depth: int | None = None, max_tokens: int | None = None) -> _Scanned:
    """One linear, vectorised pass over JSON bytes (no parsing, no recursion, no regular expression).

    Per block of 1 MiB, with three numbers carried from block to block (inside a string?, the parity
    of a backslash run that reaches the end of the block, the depth):

    1. a byte is *escaped* iff the run of backslashes right before it has odd length (``\\"`` is an
       escaped quote, ``\\\\"`` an escaped backslash and then a real quote): the runs are found from
       the edges of the backslash mask, and the byte after each odd run is marked;
    2. the unescaped quotes toggle "inside a string": a structural byte (``[]{},:``) is outside every
       string iff an even number of unescaped quotes come before it (a binary search in their
       positions, plus the carried state);
    3. outside strings ``[``/``{`` count +1 and ``]``/``}`` −1; the running sum is the depth, and
       ``[``, ``{``, ``,``, ``:`` are counted as tokens.

    Only whole-block comparisons touch every byte; the running sums run over the quotes and the
    structural bytes alone. Backslashes outside strings are invalid JSON, which the parser reports
    afterwards; the scan only has to be linear for every input and exact for valid ones.

    With ``max_depth`` / ``max_tokens`` the scan stops after the first block in which the depth or the
    token count passes that bound (the result then counts up to that block only, and is past the bound):
    a 64 MiB file of empty arrays is refused after its first few MiB."""
    b = np.frombuffer(raw, dtype=np.uint8)
    inside, odd_carry, depth = False, False, 0
    best, best_at, tokens, scanned = 0, -1, 0, 0
    for start in range(0, b.size, _SCAN_CHUNK):
        c = b[start:start + _SCAN_CHUNK]
        n = c.size
        quotes = np.flatnonzero(c == _QUOTE)
        bs = c == _BACKSLASH
        if odd_carry or bs.any():
            edges = np.diff(bs.view(np.int8), prepend=np.int8(0), append=np.int8(0))
            starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)    # runs [start, end)
            lengths = ends - starts
            if odd_carry and starts.size and starts[0] == 0:
                lengths[0] += 1                          # the run continues one that ended the last block
            escaped = np.zeros(n + 1, bool)
            escaped[ends[(lengths & 1).astype(bool)]] = True
            if odd_carry and not bs[0]:
                escaped[0] = True
            odd_carry = bool(escaped[n])
            quotes = quotes[~escaped[quotes]]
        struct = np.flatnonzero((c == 91) | (c == 93) | (c == 123) | (c == 125) | (c == 44) | (c == 58))
        before = np.searchsorted(quotes, struct)         # unescaped quotes before each structural byte
        out = struct[((before & 1).astype(bool)) == inside]
        step = _STEP[c[out]]                              # +1 for [ {, −1 for ] }, 0 for , :
        tokens += out.size - int(np.count_nonzero(step < 0))
        if step.size:
            d = np.cumsum(step, dtype=np.int64) + depth
            i = int(np.argmax(d))
            if d[i] > best:
                best, best_at = int(d[i]), start + int(out[i])
            depth = int(d[-1])
        inside ^= bool(quotes.size & 1)
        scanned = start + n
        if (max_depth is not None and best > max_depth) or (max_tokens is not None and tokens > max_tokens):
            break
    return _Scanned(best, best_at, tokens, inside, scanned)


# bytes no JSON text holds anywhere (RFC 8259: control characters other than tab, newline and carriage return
# must be escaped inside strings, and are not whitespace outside them)
_CONTROL = np.zeros(256, bool)
_CONTROL[[c for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)]] = True


def _first_control_byte(raw: bytes) -> int:
    """Offset of the first byte no JSON text may hold (a control character other than tab/newline/CR), or −1;
    vectorised per 1 MiB block, so binary data (a device, ``/proc/self/pagemap``) is refused at its first."""
    b = np.frombuffer(raw, dtype=np.uint8)
    for start in range(0, b.size, _SCAN_CHUNK):
        hits = np.flatnonzero(_CONTROL[b[start:start + _SCAN_CHUNK]])
        if hits.size:
            return start + int(hits[0])
    return -1


def json_depth(raw: bytes) -> int:
    """Maximum nesting depth of ``[``/``{`` outside strings (the linear :func:`scan_json`)."""
    return scan_json(raw).depth


def no_duplicate_keys(error, where):
    """A ``json.loads`` object_pairs_hook that raises ``error`` naming ``where`` on a repeated key (the dict is
    built in C; only an object whose dict came out shorter than its pairs is searched for the duplicate)."""
    def hook(pairs):
        out = dict(pairs)
        if len(out) != len(pairs):
            seen = set()
            for k, _ in pairs:
                if k in seen:
                    raise error(f"{where}: duplicate key {k!r} in one JSON object")
                seen.add(k)
        return out
    return hook


def _key_path(path: list) -> str:
    text = ""
    for p in path:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text or "the top level"


def _find_constant(value) -> tuple[list, str] | None:
    """(key path, name) of the first placeholder in document order: a depth-first walk that keeps one frame per
    open container (the depth is bounded by the scan) and allocates nothing per element."""
    if isinstance(value, _Constant):
        return [], value.name
    if not isinstance(value, (dict, list)):
        return None
    frames = [iter(value.items()) if isinstance(value, dict) else enumerate(value)]
    keys: list = []
    while frames:
        for k, x in frames[-1]:
            if isinstance(x, _Constant):
                return keys + [k], x.name
            if isinstance(x, (dict, list)) and x:
                frames.append(iter(x.items()) if isinstance(x, dict) else enumerate(x))
                keys.append(k)
                break
        else:
            frames.pop()
            if keys:
                keys.pop()
    return None


def _parse_int(text: str):
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else \
        _Constant(f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS} are accepted)")


def parse_int_bounded(text: str):
    """A ``json.loads`` parse_int: the int, or — beyond :data:`MAX_INT_DIGITS` digits — a placeholder that no
    integer check accepts and whose repr says what it was (so a caller's "must be an integer" names the key)."""
    return int(text) if len(text) <= MAX_INT_DIGITS else _parse_int(text)


def _parse_float(text: str):
    v = float(text)
    return v if math.isfinite(v) else _Constant(f"{text[:20]}{'…' if len(text) > 20 else ''}, which overflows "
                                                f"to infinity")


def _loads(text: str, hooks: dict):
    """json.loads with the cyclic garbage collector paused: parsing allocates one container per value and
    nothing cyclic, and a collection pass over millions of fresh dicts would make the parse quadratic."""
    was = gc.isenabled()
    gc.disable()
    try:
        return json.loads(text, **hooks)
    finally:
        if was:
            gc.enable()


def loads_strict(raw: bytes | str, where: str, kind: type | None = None, max_depth: int = MAX_JSON_DEPTH,
                 error: type = FileFormatError, allow_constants: bool = False, max_tokens: int = MAX_JSON_TOKENS):
    """Parse JSON text with the rules of the module docstring; ``where`` names the source in errors.

    ``allow_constants=True`` accepts NaN/Infinity (as Python's ``json.dumps`` writes them, e.g. the
    loss of a diverged run in a training log) and numbers that overflow to ±inf."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", errors="surrogatepass")
    bad = _first_control_byte(raw)
    if bad >= 0:
        raise error(f"{where}: not valid JSON (byte {bad} is the control character 0x{raw[bad]:02x}, which JSON "
                    f"text never holds: binary data?)")
    scan = _scan(raw, max_depth, max_tokens)
    if scan.depth > max_depth:
        raise error(f"{where}: JSON nested {scan.depth} levels deep (at byte {scan.depth_at}); at most {max_depth} "
                    f"are accepted")
    if scan.tokens > max_tokens:
        counted = "" if scan.scanned >= len(raw) else f" in its first {scan.scanned} bytes"
        raise error(f"{where}: JSON with {scan.tokens} values and keys (commas, colons and opening brackets)"
                    f"{counted}; at most {max_tokens} are accepted")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 text ({e})") from None
    made: list = []                                  # placeholders created while parsing (usually none)

    def note(v):
        if isinstance(v, _Constant):
            made.append(v)
        return v

    def parse_int(text):
        return int(text) if len(text) <= MAX_INT_DIGITS else note(_parse_int(text))

    def parse_float(text):
        v = float(text)
        return v if v - v == 0 else note(_parse_float(text))     # v − v is 0 exactly when v is finite

    try:
        value = _loads(text, dict(object_pairs_hook=no_duplicate_keys(error, where), parse_int=parse_int,
                                  parse_float=float if allow_constants else parse_float,
                                  parse_constant=float if allow_constants else (lambda name: note(_Constant(name)))))
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply") from None
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e})") from None
    found = _find_constant(value) if made else None
    if found is not None:
        path, name = found
        if name in ("NaN", "Infinity", "-Infinity"):
            name += ", which is not a JSON number (a finite number is required)"
        raise error(f"{where}: {_key_path(path)} is {name}")
    if kind is not None and not isinstance(value, kind):
        want = {dict: "a JSON object {…}", list: "a JSON array […]"}.get(kind, kind.__name__)
        got = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               type(None): "null"}.get(type(value), "a number")
        raise error(f"{where}: the file must hold {want}, got {got}")
    return value


def read_json(path, kind: type | None = dict, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH,
              error: type = FileFormatError, max_tokens: int = MAX_JSON_TOKENS):
    """Read and parse the JSON file ``path`` strictly (see :func:`loads_strict`); the size is bounded on
    the bytes read."""
    where = os.fspath(path)
    raw = read_bytes_bounded(where, max_bytes, error=error, what="JSON file")
    return loads_strict(raw, where, kind, max_depth, error, max_tokens=max_tokens)
