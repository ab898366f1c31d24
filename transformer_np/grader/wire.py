r"""The wire format between the grader and a submission's child process.

A frame is an 8-byte big-endian length and a payload; a payload is a JSON header (4-byte length first) describing a
value tree, followed by the ``.npy`` bytes of the arrays it holds. No pickle anywhere: an array travels as NumPy's
``.npy`` format with ``allow_pickle=False``, and the reader checks the dtype (numbers only), the shape and the byte
count against the frame before it builds the array.

Both sides use this file: the grader imports it as :mod:`transformer_np.grader.wire`; the child program
(:mod:`transformer_np.grader.child`) loads it by its path before it confines itself, so this module imports
nothing but the standard library and NumPy — never ``transformer_np`` — and must stay so.
"""

from __future__ import annotations

import io
import json
import struct

MAX_FRAME = 256 << 20          # bytes in one frame (a request or a reply); larger is refused before it is read
MAX_REPLY = 16 << 20           # bytes in one message from the child (the grader refuses more before reading it)
MAX_NODES = 50_000             # values in one tree (arrays, numbers, containers)
MAX_DEPTH = 32                 # nesting of containers
MAX_NDIM = 32                  # an array's dimensions
MAX_ARRAYS = 10_000            # arrays (and NumPy scalars) in one message: each has its own .npy header to parse
MAX_STR = 10_000               # characters of a string value from the child (longer ones are cut); None: uncut
# A received header's bounds, checked on its bytes before it is parsed (the child's messages; see check_header).
# An encoded node takes at most 74 bytes of JSON (a complex number in hex, with its comma) and 8 structural
# tokens ("{" ":" "," "[" …: 7 for a complex number; an array adds 1 in the "blobs" list); only a string's
# characters (cut to MAX_STR) can be longer.
HEADER_BYTES_PER_NODE = 80
MAX_HEADER = HEADER_BYTES_PER_NODE * MAX_NODES          # 4 MB of JSON
MAX_HEADER_TOKENS = 8 * MAX_NODES + 64                  # ~30 MB of Python objects at most when parsed
MAX_HEADER_DEPTH = 3 * (MAX_DEPTH + 1) + 4              # a dict node nests 3 JSON levels per level of values
_NUMBER_KINDS = "biufc"        # bool, int, uint, float, complex: the only dtypes an array may have


class WireError(ValueError):
    """A frame or a value that does not follow the format (too large, malformed, a disallowed dtype)."""


class Opaque:
    """A value that cannot travel (a function, a module, an object of the student's class): its type name only."""

    type_name = "object"

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


_OPAQUE_TYPES: dict[str, type] = {}


def opaque(type_name: str) -> Opaque:
    """An :class:`Opaque` whose class is named ``type_name`` (so ``type(v).__name__`` reads as the original)."""
    name = "".join(c for c in str(type_name)[:60] if c.isalnum() or c == "_") or "object"
    cls = _OPAQUE_TYPES.get(name)
    if cls is None:
        cls = _OPAQUE_TYPES[name] = type(name, (Opaque,), {"type_name": name})
    return cls()


class Handle:
    """A reference to a value kept on the other side (a student's cache in the child, a handed-out function's
    cache in the grader): only its number travels."""

    __slots__ = ("id", "kind")

    def __init__(self, kind: str, id: int):
        self.kind, self.id = kind, id

    def __repr__(self) -> str:
        return f"<cache #{self.id}>"


def _npy_bytes(a) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(a), allow_pickle=False)     # keeps 0-d arrays 0-d
    return buf.getvalue()


def _one_more_array(blobs: list) -> None:
    if len(blobs) >= MAX_ARRAYS:
        raise WireError(f"the value is too large to send (more than {MAX_ARRAYS} arrays or NumPy scalars)")


def encode(value, blobs: list, keep=None, depth: int = 0, count: list | None = None, max_str: int | None = MAX_STR):
    """``value`` as a JSON-able tree; arrays appended to ``blobs`` as ``.npy`` bytes. ``keep(value)`` (the
    sender's choice) may return a :class:`Handle` for a value to keep on this side instead of sending it.
    Strings are cut to ``max_str`` characters (the child's side); ``None`` sends them whole (the grader's cells)."""
    import numpy as np

    count = count if count is not None else [0]
    count[0] += 1
    if count[0] > MAX_NODES or depth > MAX_DEPTH:
        raise WireError(f"the value is too large to send (more than {MAX_NODES} values or {MAX_DEPTH} levels)")
    if value is None:
        return {"t": "none"}
    if isinstance(value, Handle):
        return {"t": "handle", "kind": value.kind, "id": value.id}
    if isinstance(value, bool):
        return {"t": "bool", "v": value}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _NUMBER_KINDS or value.dtype.fields is not None or value.ndim > MAX_NDIM:
            return {"t": "opaque", "type": f"ndarray[{value.dtype}]"}
        _one_more_array(blobs)
        blobs.append(_npy_bytes(value))
        return {"t": "array", "i": len(blobs) - 1}
    if isinstance(value, np.generic):
        if value.dtype.kind not in _NUMBER_KINDS:
            return {"t": "opaque", "type": type(value).__name__}
        _one_more_array(blobs)
        blobs.append(_npy_bytes(np.asarray(value)))
        return {"t": "npscalar", "i": len(blobs) - 1}
    if isinstance(value, int) and type(value) is int:
        if abs(value) < 1 << 63:
            return {"t": "int", "v": value}
        return {"t": "opaque", "type": "int"}
    if isinstance(value, float) and type(value) is float:
        return {"t": "float", "v": value.hex()}
    if isinstance(value, complex) and type(value) is complex:
        return {"t": "complex", "v": [value.real.hex(), value.imag.hex()]}
    if isinstance(value, str) and type(value) is str:
        return {"t": "str", "v": value if max_str is None else value[:max_str]}
    if type(value) in (tuple, list):
        return {"t": type(value).__name__, "v": [encode(v, blobs, keep, depth + 1, count, max_str) for v in value]}
    if type(value) is dict:
        items = []
        for k, v in value.items():
            if not (type(k) is str or type(k) is int):
                return {"t": "opaque", "type": "dict"}
            items.append([encode(k, blobs, None, depth + 1, count, max_str),
                          encode(v, blobs, keep, depth + 1, count, max_str)])
        return {"t": "dict", "v": items}
    if keep is not None:
        handle = keep(value)
        if handle is not None:
            return encode(handle, blobs)
    return {"t": "opaque", "type": type(value).__name__}


def _read_npy(data: memoryview):
    """An array from ``.npy`` bytes, with its dtype, shape and size checked before anything is allocated."""
    import numpy as np

    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise WireError(f"an array in version {version} of the .npy format")
    except WireError:
        raise
    except Exception as e:       # NumPy's header parser raises ValueError and others on a malformed header
        raise WireError(f"a malformed array header ({type(e).__name__}: {e})") from None
    if dtype.kind not in _NUMBER_KINDS or dtype.fields is not None or dtype.hasobject:
        raise WireError(f"an array of dtype {dtype} (only numbers travel)")
    if len(shape) > MAX_NDIM or any((not isinstance(n, int)) or n < 0 for n in shape):
        raise WireError(f"an array of shape {shape}")
    size = 1
    for n in shape:
        size *= n
    offset = f.tell()
    if size * dtype.itemsize != len(data) - offset:
        raise WireError(f"an array of shape {shape} and dtype {dtype} whose data has {len(data) - offset} bytes, "
                        f"not {size * dtype.itemsize}")
    arr = np.frombuffer(data, dtype=dtype, count=size, offset=offset)
    return arr.reshape(shape, order="F" if fortran else "C").copy()


def decode(tree, blobs: list, resolve=None, depth: int = 0, count: list | None = None,
           max_str: int | None = MAX_STR):
    """The value of a tree made by :func:`encode`. ``resolve(handle)`` maps a received handle to what it stands
    for on this side (default: the :class:`Handle` itself). At most :data:`MAX_NODES` values and
    :data:`MAX_DEPTH` levels; strings cut to ``max_str`` characters (``None``: whole)."""
    count = count if count is not None else [0]
    count[0] += 1
    if depth > MAX_DEPTH or count[0] > MAX_NODES or not isinstance(tree, dict):
        raise WireError("a malformed value" if isinstance(tree, dict) or depth <= MAX_DEPTH else "a value too deep")
    t = tree.get("t")
    if t == "none":
        return None
    if t == "bool":
        return bool(tree["v"])
    if t == "int":
        v = tree["v"]
        if type(v) is not int or abs(v) >= 1 << 63:
            raise WireError("a malformed integer")
        return v
    if t == "float":
        return float.fromhex(str(tree["v"])[:64])
    if t == "complex":
        re, im = tree["v"]
        return complex(float.fromhex(str(re)[:64]), float.fromhex(str(im)[:64]))
    if t == "str":
        v = tree["v"]
        if type(v) is not str:
            raise WireError("a malformed string")
        return v if max_str is None else v[:max_str]
    if t in ("array", "npscalar"):
        i = tree.get("i")
        if type(i) is not int or not 0 <= i < len(blobs):
            raise WireError("an array reference out of range")
        arr = _read_npy(blobs[i])
        return arr if t == "array" else (arr[()] if arr.ndim == 0 else arr)
    if t in ("tuple", "list"):
        items = [decode(v, blobs, resolve, depth + 1, count, max_str) for v in tree["v"]]
        return tuple(items) if t == "tuple" else items
    if t == "dict":
        out = {}
        for pair in tree["v"]:
            k = decode(pair[0], blobs, None, depth + 1, count, max_str)
            if not isinstance(k, (str, int)):
                raise WireError("a dict key that is not a string or an integer")
            out[k] = decode(pair[1], blobs, resolve, depth + 1, count, max_str)
        return out
    if t == "handle":
        h = Handle(str(tree.get("kind", ""))[:40], int(tree["id"]))
        return resolve(h) if resolve is not None else h
    if t == "opaque":
        return opaque(tree.get("type", "object"))
    raise WireError(f"an unknown value type {t!r}")


def arrays_in(value) -> list:
    """The arrays in a call's arguments (lists, tuples and dicts walked in order): both sides number them alike, so
    the child can say which input the student's code changed in place."""
    import numpy as np

    found: list = []

    def walk(v) -> None:
        if isinstance(v, np.ndarray):
            found.append(v)
        elif type(v) in (list, tuple):
            for x in v:
                walk(x)
        elif type(v) is dict:
            for x in v.values():
                walk(x)

    walk(value)
    return found


def pack(header: dict, value=None, keep=None, max_str: int | None = MAX_STR) -> bytes:
    """One payload: ``header`` (a dict) with ``value`` encoded under the key "value" (strings cut to
    ``max_str`` characters; ``None``: whole)."""
    blobs: list = []
    if value is not None or "value" not in header:
        header = dict(header, value=encode(value, blobs, keep, max_str=max_str))
    header["blobs"] = [len(b) for b in blobs]
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([struct.pack(">I", len(head)), head] + blobs)


def check_header(head, scan) -> None:
    """Refuse a received JSON header before it is parsed: at most :data:`MAX_HEADER` bytes, and — counted by
    ``scan(head, max_depth=, max_tokens=)`` (one linear pass that builds nothing; the grader passes
    :func:`transformer_np.io.jsonfile.scan_json`) — at most :data:`MAX_HEADER_DEPTH` levels and
    :data:`MAX_HEADER_TOKENS` structural tokens. So what :func:`json.loads` then builds is bounded (~30 MB)."""
    if len(head) > MAX_HEADER:
        raise WireError(f"a message header of {len(head):,} bytes (the limit is {MAX_HEADER:,})")
    found = scan(head, max_depth=MAX_HEADER_DEPTH, max_tokens=MAX_HEADER_TOKENS)
    if found.depth > MAX_HEADER_DEPTH:
        raise WireError(f"a message header nested more than {MAX_HEADER_DEPTH} levels")
    if found.tokens > MAX_HEADER_TOKENS:
        raise WireError(f"a message header of more than {MAX_HEADER_TOKENS:,} values")


def unpack(payload, resolve=None, max_str: int | None = MAX_STR, scan=None) -> tuple[dict, object]:
    """(header, value) of a payload made by :func:`pack`; every length checked against the payload. With
    ``scan`` (the grader's side), the header is bounded by :func:`check_header` before it is parsed, and a
    message holds at most :data:`MAX_ARRAYS` arrays."""
    view = memoryview(payload)
    if len(view) < 4:
        raise WireError("a truncated message")
    (n,) = struct.unpack(">I", view[:4])
    if n > len(view) - 4:
        raise WireError("a message header longer than the message")
    head = bytes(view[4:4 + n])
    if scan is not None:
        check_header(head, scan)
    try:
        header = json.loads(head)
    except ValueError:
        raise WireError("a message header that is not JSON") from None
    del head
    if not isinstance(header, dict):
        raise WireError("a message header that is not an object")
    sizes = header.get("blobs", [])
    if not isinstance(sizes, list) or not all(type(s) is int and s >= 0 for s in sizes):
        raise WireError("malformed array sizes")
    if scan is not None and len(sizes) > MAX_ARRAYS:
        raise WireError(f"a message of {len(sizes):,} arrays (the limit is {MAX_ARRAYS:,})")
    if 4 + n + sum(sizes) != len(view):
        raise WireError("array sizes that do not add up to the message")
    blobs, at = [], 4 + n
    for s in sizes:
        blobs.append(view[at:at + s])
        at += s
    value = decode(header["value"], blobs, resolve, max_str=max_str) if "value" in header else None
    return header, value


def write_frame(fd: int, payload: bytes, wait=None) -> None:
    """Write one frame. With ``wait(fd)`` (the grader's side, on a non-blocking descriptor) a full pipe is waited
    on through ``wait``, which enforces the deadline; without it the write blocks (the child's side)."""
    import os

    data = memoryview(struct.pack(">Q", len(payload)) + payload)
    while data:
        try:
            n = os.write(fd, data)
        except BlockingIOError:
            if wait is None:
                raise
            wait(fd)
            continue
        data = data[n:]


def read_exact(fd: int, n: int, wait=None) -> bytearray:
    """``n`` bytes from ``fd``, read into one buffer; ``wait()`` (the grader's deadline check) is called before
    each read."""
    import os

    buf = bytearray(n)
    view, at = memoryview(buf), 0
    while at < n:
        if wait is not None:
            wait()
        got = os.readv(fd, [view[at:at + (1 << 20)]])
        if not got:
            raise EOFError("the other side closed the connection")
        at += got
    return buf


def read_frame(fd: int, wait=None, limit: int = MAX_FRAME) -> bytearray:
    (n,) = struct.unpack(">Q", read_exact(fd, 8, wait))
    if n > limit:
        raise WireError(f"a message of {n:,} bytes (the limit is {limit:,})")
    return read_exact(fd, n, wait)
