r"""A strict NumPy reader (and a small writer) for the safetensors format — no pickle, no torch.

The format (https://github.com/huggingface/safetensors):

    bytes [0, 8)          N, the header length: an unsigned 64-bit little-endian integer
    bytes [8, 8 + N)      the header: UTF-8 JSON, an object
                              {"__metadata__": {str: str},                   (optional)
                               name: {"dtype": "F32", "shape": [d0, d1, …],
                                      "data_offsets": [begin, end]}, …}
                          (it may be padded with trailing spaces)
    bytes [8 + N, EOF)    the data buffer: every tensor's raw little-endian, C-order bytes at
                          [begin, end) relative to the start of the buffer

Everything is validated before a single tensor byte is read, because a weight file is
untrusted input:

* the file is opened as a regular file only (:func:`transformer_np._files.open_regular`: a FIFO,
  a device, a socket or a folder is refused at once, never waited on), and its length is the
  ``fstat`` of the open file, so every offset is checked against the bytes that are really there;
* the header length must fit in the file and be at most :data:`MAX_HEADER_BYTES` (16 MiB — about
  100,000 tensors; the format itself allows 100 MB, :data:`MAX_HEADER_SIZE`);
* the header is read once and parsed once, through the same strict JSON reader as every other
  JSON file (:func:`transformer_np.io.jsonfile.loads_strict`: one linear scan before parsing, at
  most 3 levels of nesting — the format's own depth — and :data:`MAX_HEADER_TOKENS` values and
  keys, no duplicate keys, no NaN, no huge integers), so a 16 MiB header of empty arrays or
  zeros is refused by the scan before Python builds anything;
* every entry needs exactly ``dtype``, ``shape`` and ``data_offsets``; a shape has at most
  :data:`MAX_RANK` (8) dimensions, none larger than the number of elements the data buffer
  could hold; ``end − begin`` must equal prod(shape) · itemsize; sorted by offset the tensors
  must tile the buffer exactly (first begin = 0, each begin = the previous end, last end = the
  buffer length) — so offsets are in range and never overlap.

Every failure is a :class:`~transformer_np.errors.FileFormatError` (a ``ValueError``) naming the
file and the tensor — including a path that does not exist or cannot be read.
:func:`open_safetensors` gives the validated header (names, dtypes, shapes, byte counts) with the
file still open, so a caller can compare it with what it needs — and check the memory budget —
before it reads any tensor; :func:`load_safetensors` checks the memory of what it is asked to read
against :func:`transformer_np.model.budget.check_memory` first. A ``MemoryError`` while reading
becomes a :class:`~transformer_np.errors.ResourceLimitError` naming the file and the tensor.

Arrays are read into exactly the validated byte range (never past it) and returned in native
byte order. BF16 has no NumPy dtype: it is widened exactly to float32 (a bf16 is the top 16
bits of a float32).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping

import numpy as np

from .._files import open_regular
from ..errors import FileFormatError, ResourceLimitError
from ..model.budget import MemoryEstimate, check_memory
from .jsonfile import loads_strict

__all__ = ["load_safetensors", "loads_safetensors", "read_safetensors_header", "open_safetensors", "SafetensorsFile",
           "save_safetensors", "dumps_safetensors", "SAFETENSORS_DTYPES", "MAX_HEADER_SIZE", "MAX_HEADER_BYTES",
           "MAX_HEADER_TOKENS", "MAX_RANK"]

MAX_HEADER_SIZE = 100_000_000  # the reference implementation's bound (bytes)
MAX_HEADER_BYTES = 16 * 2 ** 20  # what this reader reads (the token bound below is met first by any real header)
MAX_HEADER_TOKENS = 2 ** 19      # values and keys of the header JSON: ~12 per tensor, so ~40,000 tensors
MAX_RANK = 8                     # dimensions of a tensor (a weight has 1 or 2)
_HEADER_DEPTH = 3                # {name: {"shape": [...]}}: the format's own nesting
_EMPTY_DIM = 1 << 16             # the other dimensions of an empty tensor may be up to this

# safetensors dtype name -> (little-endian NumPy dtype of the stored bytes, itemsize).
# "BF16" is stored as uint16 and widened to float32 on load.
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
# Defined by the format but not decodable here (no NumPy dtype): rejected with a clear message.
_KNOWN_UNSUPPORTED = ("F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64")

_NUMPY_TO_SAFETENSORS = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32",
                         np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
                         np.dtype(np.int32): "I32", np.dtype(np.int16): "I16", np.dtype(np.int8): "I8",
                         np.dtype(np.uint64): "U64", np.dtype(np.uint32): "U32",
                         np.dtype(np.uint16): "U16", np.dtype(np.uint8): "U8", np.dtype(bool): "BOOL"}


# ----------------------------------------------------------------------------- header
def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_entry(name: str, entry, where: str, data_len: int) -> tuple[str, tuple[int, ...], int, int]:
    """Validate one header entry against a data buffer of ``data_len`` bytes; return (dtype name, shape, begin,
    end)."""
    if not isinstance(entry, dict):
        raise FileFormatError(f"{where}: tensor {name!r}: header entry must be an object, got {type(entry).__name__}")
    keys = set(entry)
    if keys != {"dtype", "shape", "data_offsets"}:
        missing = sorted({"dtype", "shape", "data_offsets"} - keys)
        extra = sorted(keys - {"dtype", "shape", "data_offsets"})
        raise FileFormatError(f"{where}: tensor {name!r}: header entry must have exactly the keys dtype, shape, "
                         f"data_offsets (missing {missing}, unexpected {extra})")
    dt = entry["dtype"]
    if not isinstance(dt, str):
        raise FileFormatError(f"{where}: tensor {name!r}: dtype must be a string, got {dt!r}")
    if dt not in SAFETENSORS_DTYPES:
        if dt in _KNOWN_UNSUPPORTED:
            raise FileFormatError(f"{where}: tensor {name!r}: dtype {dt} is valid safetensors but has no NumPy "
                             f"equivalent; supported: {sorted(SAFETENSORS_DTYPES)}")
        raise FileFormatError(f"{where}: tensor {name!r}: unknown dtype {dt!r}; "
                              f"supported: {sorted(SAFETENSORS_DTYPES)}")
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
        raise FileFormatError(f"{where}: tensor {name!r}: shape must be a list of non-negative integers, "
                              f"got {shape!r:.80}")
    if len(shape) > MAX_RANK:
        raise FileFormatError(f"{where}: tensor {name!r}: shape has {len(shape)} dimensions; at most {MAX_RANK} are "
                              f"accepted")
    itemsize = SAFETENSORS_DTYPES[dt].itemsize
    fits = max(data_len // itemsize, _EMPTY_DIM)
    for i, s in enumerate(shape):
        if s > fits:
            raise FileFormatError(f"{where}: tensor {name!r}: shape[{i}] = {s} is more elements than the file's "
                                  f"{data_len}-byte data buffer can hold")
    offs = entry["data_offsets"]
    if not (isinstance(offs, list) and len(offs) == 2 and all(_is_int(o) and o >= 0 for o in offs)):
        raise FileFormatError(f"{where}: tensor {name!r}: data_offsets must be [begin, end] with non-negative "
                              f"integers, got {offs!r:.80}")
    begin, end = offs
    if end < begin:
        raise FileFormatError(f"{where}: tensor {name!r}: data_offsets end {end} < begin {begin}")
    nbytes = math.prod(shape) * itemsize
    if nbytes > data_len:
        raise FileFormatError(f"{where}: tensor {name!r}: shape {tuple(shape)} of {dt} needs {nbytes} bytes, more "
                              f"than the file's {data_len}-byte data buffer")
    if end - begin != nbytes:
        raise FileFormatError(f"{where}: tensor {name!r}: shape {tuple(shape)} of {dt} needs {nbytes} bytes, "
                         f"but data_offsets [{begin}, {end}] span {end - begin}")
    return dt, tuple(shape), begin, end


def _parse_header(raw: bytes, data_len: int, where: str) -> tuple[dict, dict]:
    """Decode and validate the JSON header against a data buffer of ``data_len`` bytes.

    Returns ``(tensors, metadata)``: tensors maps name -> (dtype, shape, begin, end) in
    file order of their offsets.
    """
    if not raw.startswith(b"{"):
        raise FileFormatError(f"{where}: the header must be a JSON object starting with '{{', got {raw[:20]!r}")
    header = loads_strict(raw, f"{where}: the header", kind=dict, max_depth=_HEADER_DEPTH, error=FileFormatError,
                          max_tokens=MAX_HEADER_TOKENS)
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FileFormatError(f"{where}: __metadata__ must be an object of string -> string, got {metadata!r:.80}")
    tensors = {name: _parse_entry(name, entry, where, data_len) for name, entry in header.items()}
    # The tensors must tile [0, data_len) exactly: in range, no overlap, no gap.
    expected = 0
    for name, (_, _, begin, end) in sorted(tensors.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if begin != expected:
            kind = "overlaps the previous tensor" if begin < expected else "leaves a gap after the previous tensor"
            raise FileFormatError(f"{where}: tensor {name!r}: data_offsets [{begin}, {end}] {kind} "
                                  f"(expected begin = {expected})")
        if end > data_len:
            raise FileFormatError(f"{where}: tensor {name!r}: data_offsets [{begin}, {end}] run past the end of the "
                                  f"data buffer ({data_len} bytes): the file is truncated or corrupt")
        expected = end
    if expected != data_len:
        raise FileFormatError(f"{where}: the data buffer has {data_len} bytes but the tensors cover {expected}: "
                              f"trailing bytes or a corrupt header")
    return tensors, metadata


def _header_length(prefix: bytes, total: int, where: str) -> int:
    if len(prefix) < 8:
        raise FileFormatError(f"{where}: the file is {total} bytes, too short for the 8-byte header length")
    n = int.from_bytes(prefix[:8], "little")
    if n > MAX_HEADER_SIZE:
        raise FileFormatError(f"{where}: header length {n} exceeds the limit of {MAX_HEADER_SIZE} bytes")
    if n > MAX_HEADER_BYTES:
        raise FileFormatError(f"{where}: header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes this reader "
                              f"accepts (about 100,000 tensors)")
    if n < 2:
        raise FileFormatError(f"{where}: header length {n} is too small for a JSON object")
    if 8 + n > total:
        raise FileFormatError(f"{where}: header length {n} runs past the end of the {total}-byte file "
                         f"(truncated or corrupt)")
    return n


def _finish(a: np.ndarray, dt: str, name: str, where: str) -> np.ndarray:
    """The stored array ``a`` (little-endian, the file's dtype) as returned: native order, BF16 widened, BOOL
    checked."""
    if dt == "BF16":                      # bf16 = the high half of a float32: widen exactly
        return (a.astype(np.uint32) << 16).view(np.float32)
    if dt == "BOOL":                      # only the bytes 0 and 1 are booleans
        u8 = a.view(np.uint8)
        if u8.size and u8.max() > 1:
            raise FileFormatError(f"{where}: tensor {name!r}: BOOL data must be bytes 0 or 1, got {int(u8.max())}")
        return a
    native = a.dtype.newbyteorder("=")
    return a if a.dtype == native else a.astype(native)


def _decode(buf, dt: str, shape: tuple[int, ...], offset: int, name: str, where: str) -> np.ndarray:
    """A copy of exactly [offset, offset + nbytes) of ``buf``, native byte order."""
    a = np.frombuffer(buf, dtype=SAFETENSORS_DTYPES[dt], count=math.prod(shape), offset=offset).reshape(shape)
    return _finish(a.copy(), dt, name, where)


def _returned_bytes(dt: str, shape: tuple[int, ...]) -> int:
    """Bytes of the array :func:`_finish` returns (BF16 becomes float32)."""
    return math.prod(shape) * (4 if dt == "BF16" else SAFETENSORS_DTYPES[dt].itemsize)


def _check_names(names, tensors: dict, where: str) -> list[str]:
    if names is None:
        return list(tensors)
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(f"names must be an iterable of tensor names or None, got {type(names).__name__}")
    names = list(names)
    missing = [n for n in names if n not in tensors]
    if missing:
        raise FileFormatError(f"{where}: no tensor named {missing[:5]} (the file has {len(tensors)} tensors)")
    return names


# ----------------------------------------------------------------------------- public API
def _check_path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileFormatError(f"path {path!r} is not a file (it does not exist)")
    if os.path.isdir(path):
        raise FileFormatError(f"path {path!r} is not a file (it is a directory)")
    return path


class SafetensorsFile:
    """An open safetensors file whose header has been read, parsed and validated (once).

    ``tensors``: name -> (dtype name, shape, begin, end), the byte range relative to the data buffer;
    ``metadata``: the ``__metadata__`` strings. Nothing of the data buffer has been read: :meth:`read` reads
    the tensors asked for, each exactly its validated byte range. Use it as a context manager (the file is
    closed on exit)."""

    def __init__(self, path):
        self.path = _check_path(path)
        self._f = open_regular(self.path, what="safetensors file")
        try:
            total = os.fstat(self._f.fileno()).st_size
            self.data_start = 8 + _header_length(self._f.read(8), total, self.path)
            raw = self._f.read(self.data_start - 8)          # at most MAX_HEADER_BYTES, checked above
            if len(raw) != self.data_start - 8:
                raise FileFormatError(f"{self.path}: the header ends after {len(raw)} of {self.data_start - 8} bytes "
                                      f"(the file is truncated)")
            self.data_len = total - self.data_start
            self.tensors, self.metadata = _parse_header(raw, self.data_len, self.path)
        except OSError as e:
            self.close()
            raise _unreadable(self.path, e) from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def shapes(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """``{name: (dtype, shape)}`` in file order."""
        return {k: (dt, shape) for k, (dt, shape, _, _) in self.tensors.items()}

    def estimate(self, names: Iterable[str] | None = None) -> MemoryEstimate:
        """The memory :meth:`read` of ``names`` (all when None) allocates: the arrays as returned."""
        names = _check_names(names, self.tensors, self.path)
        return MemoryEstimate({"tensors": sum(_returned_bytes(*self.tensors[k][:2]) for k in names)})

    def read(self, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """``{name: array}`` for ``names`` (all when None; a name absent from the file is a FileFormatError),
        each read from exactly its byte range into a fresh array. A MemoryError becomes a
        :class:`~transformer_np.errors.ResourceLimitError` naming the file and the tensor."""
        out = {}
        for name in _check_names(names, self.tensors, self.path):
            dt, shape, begin, end = self.tensors[name]
            try:
                a = np.empty(shape, dtype=SAFETENSORS_DTYPES[dt])
                self._f.seek(self.data_start + begin)
                got = self._f.readinto(memoryview(a.reshape(-1).view(np.uint8))) if a.size else 0
                if got != end - begin:   # the file shrank under us
                    raise FileFormatError(f"{self.path}: tensor {name!r}: read {got} of {end - begin} bytes "
                                          f"(truncated)")
                out[name] = _finish(a, dt, name, self.path)
            except MemoryError:
                out.clear()
                raise ResourceLimitError(f"{self.path}: tensor {name!r} ({dt} {shape}) does not fit in the memory "
                                         f"left to this process (MemoryError); nothing was loaded") from None
            except OSError as e:
                raise _unreadable(self.path, e) from None
        return out


def open_safetensors(path) -> SafetensorsFile:
    """Open ``path`` and validate its header without reading any tensor data (see :class:`SafetensorsFile`).

    Raises:
        FileFormatError: (a ValueError) the path is missing, not a regular file, or the header is invalid.
    """
    return SafetensorsFile(path)


def _unreadable(path: str, e: OSError) -> FileFormatError:
    return FileFormatError(f"{path}: cannot be read ({e.strerror or e})")


def read_safetensors_header(path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], dict[str, str]]:
    """Validate a file's header and return ``({name: (dtype, shape)}, metadata)`` without
    reading any tensor data.

    Raises:
        FileFormatError: (a ValueError) the path is missing or not a file, or the header is invalid.
    """
    with open_safetensors(path) as st:
        return st.shapes(), st.metadata


def load_safetensors(path, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Read tensors from a ``.safetensors`` file into NumPy arrays.

    The header is validated first; then the memory of the arrays asked for is checked against the limit
    (:func:`transformer_np.model.budget.check_memory`, :class:`~transformer_np.errors.ResourceLimitError`)
    before any of them is read.

    Args:
        path: the file.
        names: only these tensors (all when None); a name absent from the file is a ValueError.

    Returns:
        ``{name: array}`` in native byte order (BF16 widened to float32).
    """
    with open_safetensors(path) as st:
        check_memory(st.estimate(names), f"reading {st.path}")
        return st.read(names)


def loads_safetensors(data: bytes, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Like :func:`load_safetensors`, from the bytes of a whole file."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    where = "<bytes>"
    n = _header_length(data[:8], len(data), where)
    tensors, _ = _parse_header(data[8:8 + n], len(data) - 8 - n, where)
    return {name: _decode(data, tensors[name][0], tensors[name][1], 8 + n + tensors[name][2], name, where)
            for name in _check_names(names, tensors, where)}


def dumps_safetensors(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialise ``{name: array}`` (float16/32/64, integer or bool) to safetensors bytes.

    Tensors are laid out in sorted-name order; the header is padded with spaces to a
    multiple of 8 bytes (as the reference writer does) so every buffer is aligned.
    """
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of name -> numpy array, got {type(tensors).__name__}")
    header: dict = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("metadata must map str -> str")
        header["__metadata__"] = dict(metadata)
    chunks, offset = [], 0
    for name in sorted(tensors):
        a = tensors[name]
        if not isinstance(name, str) or name == "__metadata__":
            raise FileFormatError(f"tensor names must be strings other than '__metadata__', got {name!r}")
        if not isinstance(a, np.ndarray):
            raise TypeError(f"tensors[{name!r}] must be a numpy array, got {type(a).__name__}")
        key = a.dtype.newbyteorder("=")
        if key not in _NUMPY_TO_SAFETENSORS:
            raise TypeError(f"tensors[{name!r}] has dtype {a.dtype}, which safetensors cannot store here; "
                            f"supported: {sorted(str(d) for d in _NUMPY_TO_SAFETENSORS)}")
        raw = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _NUMPY_TO_SAFETENSORS[key], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    return len(text).to_bytes(8, "little") + text + b"".join(chunks)


def save_safetensors(path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> None:
    """Write ``{name: array}`` to ``path`` in the safetensors format (see :func:`dumps_safetensors`)."""
    data = dumps_safetensors(tensors, metadata)
    with open(os.fspath(path), "wb") as f:
        f.write(data)
