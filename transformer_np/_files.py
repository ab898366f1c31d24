"""Bounded reads and non-destructive writes: the one place the library touches files it does not control.

* :func:`read_bytes_bounded` reads at most ``max_bytes`` (+1 to detect "more") from a path, counting the bytes
  actually read, so a pipe, a device (``/dev/zero``) or a file that grows while it is read is refused as soon as it
  passes the bound, never read to the end first.
* :func:`confined_path` turns a user-given *name* into a path inside a folder: names are names, not paths
  (no separator, no ``..``, not absolute), and a symlink at the target is refused rather than followed.
* :func:`replace_atomically` is the one atomic-write routine: a writer callable fills a temporary sibling
  (``.<name>.<pid>.tmp``, :func:`temporary_name`), which is flushed and fsynced, then renamed over the target in
  one step (``os.replace``): a reader sees the old file or the new one, never half of one. Whatever goes wrong
  (an ``OSError``, an exception in the writer, an interrupt) removes the temporary file and leaves the target as
  it was. The checkpoint writer (a zip written member by member) calls it directly;
* :func:`write_atomic` is that routine for a ``bytes``/``str`` payload, with a symlink at the target refused and
  an ``OSError`` turned into the caller's ``error`` class.

Every failure of the reading and naming helpers and of :func:`write_atomic` raises the ``error`` class the caller
chooses (a :class:`~transformer_np.errors.FileFormatError` subclass, usually) with a message naming the file;
:func:`replace_atomically` lets the exception through for its caller to word.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .errors import FileFormatError, InputValueError

__all__ = ["read_bytes_bounded", "confined_path", "temporary_name", "replace_atomically", "write_atomic"]

_CHUNK = 1 << 16


def read_bytes_bounded(path: str | os.PathLike, max_bytes: int, *, error: type = FileFormatError,
                       what: str = "file") -> bytes:
    """The bytes of ``path``, refused with ``error`` once more than ``max_bytes`` have been read.

    The bound is checked on the bytes read, chunk by chunk, so it holds for pipes, character devices and files
    that grow; nothing larger than ``max_bytes + 64 KiB`` is ever held in memory. ``what`` names the kind of file
    in the message ("worksheet", "JSON file", …)."""
    where = os.fspath(path)
    chunks: list[bytes] = []
    total = 0
    try:
        with open(where, "rb") as f:
            while True:
                chunk = f.read(min(_CHUNK, max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
                if total > max_bytes:
                    raise error(f"{where}: more than the {max_bytes} bytes a {what} may have")
    except FileNotFoundError:
        raise error(f"{where}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{where}: is a folder, not a {what}") from None
    except OSError as e:
        raise error(f"{where}: cannot be read ({e.strerror or e})") from None
    return b"".join(chunks)


def confined_path(folder: str | os.PathLike, name: str, *, argument: str = "name",
                  error: type = InputValueError) -> Path:
    """``folder / name`` for a plain file name: refused (naming ``argument``) if ``name`` is empty, absolute,
    contains a path separator or is ``.``/``..``, or if the target exists as a symlink (followed, it could write
    anywhere)."""
    if not isinstance(name, str) or not name or name in (".", "..") or os.path.isabs(name) \
            or "/" in name or (os.sep != "/" and os.sep in name) or (os.altsep and os.altsep in name) \
            or "\0" in name:
        raise error(f"{argument}: expected a plain file name (no folder, no '..'), got {name!r}")
    target = Path(folder) / name
    if target.is_symlink():
        raise error(f"{target}: is a symbolic link; refusing to write through it (remove it or choose another "
                    f"{argument})")
    return target


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:          # not possible on every platform / file system: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temporary_name(path: str | os.PathLike, pid: int | None = None) -> Path:
    """The temporary sibling :func:`replace_atomically` writes ``path`` through: ``.<name>.<pid>.tmp`` (this
    process's pid unless ``pid`` is given), hidden, and distinct per process so two writers never share one."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid() if pid is None else pid}.tmp")


def replace_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """Replace ``path`` with what ``write(f)`` writes to the binary file ``f``, atomically.

    ``write`` fills a fresh temporary sibling (:func:`temporary_name`; anything already at that name, e.g. this
    pid's leftover, is unlinked first, never written through), which is flushed, fsynced and renamed over ``path``
    (``os.replace``); the folder is then fsynced where the platform allows. If anything raises (an ``OSError``,
    the writer's own exception, ``KeyboardInterrupt``), the temporary file is removed, ``path`` is untouched and
    the exception propagates unchanged: turning it into the caller's error is the caller's business. Returns
    ``path``."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def write_atomic(path: str | os.PathLike, data: bytes | str, *, error: type = FileFormatError) -> Path:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` atomically (:func:`replace_atomically`).

    A symlink at ``path`` is refused, not followed. On failure the temporary file is removed, the previous
    content of ``path`` (if any) is untouched, and an ``OSError`` becomes ``error`` naming the file."""
    path = Path(path)
    if path.is_symlink():
        raise error(f"{path}: is a symbolic link; refusing to write through it")
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    try:
        return replace_atomically(path, lambda f: f.write(raw))
    except OSError as e:
        raise error(f"{path}: cannot be written ({e.strerror or e})") from None
