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
MAX_NODES = 200_000            # values in one tree (arrays, numbers, containers)
MAX_DEPTH = 32                 # nesting of containers
MAX_NDIM = 32                  # an array's dimensions
MAX_STR = 10_000               # characters of a string value (longer ones are cut)
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


def encode(value, blobs: list, keep=None, depth: int = 0, count: list | None = None):
    """``value`` as a JSON-able tree; arrays appended to ``blobs`` as ``.npy`` bytes. ``keep(value)`` (the
    sender's choice) may return a :class:`Handle` for a value to keep on this side instead of sending it."""
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
        blobs.append(_npy_bytes(value))
        return {"t": "array", "i": len(blobs) - 1}
    if isinstance(value, np.generic):
        if value.dtype.kind not in _NUMBER_KINDS:
            return {"t": "opaque", "type": type(value).__name__}
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
        return {"t": "str", "v": value[:MAX_STR]}
    if type(value) in (tuple, list):
        return {"t": type(value).__name__, "v": [encode(v, blobs, keep, depth + 1, count) for v in value]}
    if type(value) is dict:
        items = []
        for k, v in value.items():
            if not (type(k) is str or type(k) is int):
                return {"t": "opaque", "type": "dict"}
            items.append([encode(k, blobs, None, depth + 1, count), encode(v, blobs, keep, depth + 1, count)])
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


def decode(tree, blobs: list, resolve=None, depth: int = 0):
    """The value of a tree made by :func:`encode`. ``resolve(handle)`` maps a received handle to what it stands
    for on this side (default: the :class:`Handle` itself)."""
    if depth > MAX_DEPTH or not isinstance(tree, dict):
        raise WireError("a malformed value")
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
        return float.fromhex(str(tree["v"]))
    if t == "complex":
        re, im = tree["v"]
        return complex(float.fromhex(str(re)), float.fromhex(str(im)))
    if t == "str":
        return str(tree["v"])[:MAX_STR]
    if t in ("array", "npscalar"):
        i = tree.get("i")
        if type(i) is not int or not 0 <= i < len(blobs):
            raise WireError("an array reference out of range")
        arr = _read_npy(blobs[i])
        return arr if t == "array" else (arr[()] if arr.ndim == 0 else arr)
    if t in ("tuple", "list"):
        items = [decode(v, blobs, resolve, depth + 1) for v in tree["v"]]
        return tuple(items) if t == "tuple" else items
    if t == "dict":
        out = {}
        for pair in tree["v"]:
            k = decode(pair[0], blobs, None, depth + 1)
            if not isinstance(k, (str, int)):
                raise WireError("a dict key that is not a string or an integer")
            out[k] = decode(pair[1], blobs, resolve, depth + 1)
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


def pack(header: dict, value=None, keep=None) -> bytes:
    """One payload: ``header`` (a dict) with ``value`` encoded under the key "value"."""
    blobs: list = []
    if value is not None or "value" not in header:
        header = dict(header, value=encode(value, blobs, keep))
    header["blobs"] = [len(b) for b in blobs]
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([struct.pack(">I", len(head)), head] + blobs)


def unpack(payload: bytes, resolve=None) -> tuple[dict, object]:
    """(header, value) of a payload made by :func:`pack`; every length checked against the payload."""
    view = memoryview(payload)
    if len(view) < 4:
        raise WireError("a truncated message")
    (n,) = struct.unpack(">I", view[:4])
    if n > len(view) - 4:
        raise WireError("a message header longer than the message")
    try:
        header = json.loads(bytes(view[4:4 + n]))
    except ValueError:
        raise WireError("a message header that is not JSON") from None
    if not isinstance(header, dict):
        raise WireError("a message header that is not an object")
    sizes = header.get("blobs", [])
    if not isinstance(sizes, list) or not all(type(s) is int and s >= 0 for s in sizes):
        raise WireError("malformed array sizes")
    if 4 + n + sum(sizes) != len(view):
        raise WireError("array sizes that do not add up to the message")
    blobs, at = [], 4 + n
    for s in sizes:
        blobs.append(view[at:at + s])
        at += s
    value = decode(header["value"], blobs, resolve) if "value" in header else None
    return header, value


def write_frame(fd: int, payload: bytes) -> None:
    import os

    data = memoryview(struct.pack(">Q", len(payload)) + payload)
    while data:
        n = os.write(fd, data)
        data = data[n:]


def read_exact(fd: int, n: int, wait=None) -> bytes:
    """``n`` bytes from ``fd``; ``wait()`` (the grader's deadline check) is called before each read."""
    import os

    chunks, left = [], n
    while left:
        if wait is not None:
            wait()
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, wait=None, limit: int = MAX_FRAME) -> bytes:
    (n,) = struct.unpack(">Q", read_exact(fd, 8, wait))
    if n > limit:
        raise WireError(f"a message of {n} bytes (the limit is {limit})")
    return read_exact(fd, n, wait)


