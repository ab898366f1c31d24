"""Hostile files for the reliability suite (issue 37): safetensors headers of every JSON shape and size, lying
shapes and offsets, sparse tensors of many GiB that cost no disk, long vocabularies, and special files (FIFOs,
devices, sockets, folders, /proc files) in place of a file. Used by tests/reliability and by
scripts/hostile_set.py, which runs the whole set and reports the slowest and the largest refusal."""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path

import numpy as np

MB = 10 ** 6
GIB = 2 ** 30


# ----------------------------------------------------------------------------- safetensors
def st_header_bytes(header: dict | bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(raw)) + raw


def write_st(path: Path, header: dict | bytes, data: bytes = b"", data_len: int | None = None) -> Path:
    """A safetensors file: ``header`` (a dict or raw JSON bytes), then ``data``; with ``data_len`` the file is
    extended (sparsely: no disk used) to a data buffer of that many bytes."""
    head = st_header_bytes(header)
    with open(path, "wb") as f:
        f.write(head + data)
        if data_len is not None:
            f.truncate(len(head) + data_len)
    return path


def write_st_sparse(path: Path, real: dict[str, np.ndarray], huge: dict[str, tuple[str, tuple]]) -> Path:
    """The tensors ``real`` (written, sorted by name, as dumps_safetensors would), then the ``huge`` ones
    ``{name: (dtype, shape)}`` declared after them and left as a hole in a sparse file."""
    sizes = {"F32": 4, "F16": 2, "F64": 8, "I64": 8, "U8": 1}
    header, chunks, offset = {}, [], 0
    for name in sorted(real):
        raw = np.ascontiguousarray(real[name], dtype=real[name].dtype.newbyteorder("<")).tobytes()
        st_dt = {np.dtype("float32"): "F32", np.dtype("float64"): "F64", np.dtype("int64"): "I64",
                 np.dtype("float16"): "F16"}[real[name].dtype]
        header[name] = {"dtype": st_dt, "shape": list(real[name].shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    for name, (dt, shape) in huge.items():
        n = int(np.prod(shape, dtype=object)) * sizes[dt]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    return write_st(path, header, b"".join(chunks), data_len=offset)


def header_shapes(size: int) -> dict[str, bytes]:
    """Safetensors header JSON of about ``size`` bytes in each hostile shape, every one a JSON object."""
    n = max(size // 2, 1)
    zeros = b'{"a":{"dtype":"F32","shape":[' + b",".join([b"0"] * (size // 2)) + b'],"data_offsets":[0,0]}}'
    entry = b'"t%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}'
    count = max(size // 55, 1)
    return {
        "zeros in a shape": zeros,
        "empty arrays": b'{"a":[' + b",".join([b"[]"] * (n // 2)) + b"]}",
        "empty objects": b'{"a":[' + b",".join([b"{}"] * (n // 2)) + b"]}",
        "many keys": b"{" + b",".join(b'"k%d":0' % i for i in range(max(size // 10, 1))) + b"}",
        "one long string": b'{"__metadata__":{"k":"' + b"x" * size + b'"}}',
        "escaped quotes": b'{"__metadata__":{"k":"' + b'\\"' * n + b'"}}',
        "deep nesting": b'{"a":' + b"[" * n + b"]" * n + b"}",
        "many empty tensors": b"{" + b",".join(entry % i for i in range(count)) + b"}",
    }


# ----------------------------------------------------------------------------- special files
def special_kinds() -> list[str]:
    return ["fifo", "dev-zero", "socket", "folder", "proc-pagemap"]


def make_special(path: Path, kind: str) -> socket.socket | None:
    """Replace ``path`` by a special file of ``kind``; returns the bound socket for "socket" (keep it open)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        import shutil
        shutil.rmtree(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "proc-pagemap":
        path.symlink_to("/proc/self/pagemap")
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        return s
    else:
        raise ValueError(kind)
    return None


def write_long_vocab(path: Path, lines: int = 10_000_000, width: int = 6) -> Path:
    """A vocab.txt of ``lines`` lines of ``width`` bytes each (10 M lines: 64 MB at width 6 + newline)."""
    line = b"x" * (width - 1) + b"\n"
    block = line * 100_000
    with open(path, "wb") as f:
        for _ in range(lines // 100_000):
            f.write(block)
        f.write(line * (lines % 100_000))
    return path
