"""Bounded reads and non-destructive writes: the one place the library touches files it does not control.

* :func:`open_regular` is the one way the library opens a file it reads: regular files only, checked without
  blocking (opened ``O_NONBLOCK``, then ``fstat``) — a FIFO, a device, a socket or a folder is refused in one line
  naming the file, never waited on;
* :func:`read_bytes_bounded` reads at most ``max_bytes`` (+1 to detect "more") from a regular file, counting the
  bytes actually read, so a file that says it is empty (``/proc/self/pagemap``) or grows while it is read is
  refused as soon as it passes the bound, never read to the end first.
* :func:`confined_path` turns a user-given *name* into a path inside a folder: names are names, not paths
  (no separator, no ``..``, not absolute), and a symlink at the target is refused rather than followed.
* :func:`replace_atomically` is the one atomic-write routine: a writer callable fills a temporary sibling
  (``.<name>.<pid>.tmp``, :func:`temporary_name`), which is flushed and fsynced, then renamed over the target in
  one step (``os.replace``): a reader sees the old file or the new one, never half of one. Whatever goes wrong
  (an ``OSError``, an exception in the writer, an interrupt) removes the temporary file and leaves the target as
  it was. The checkpoint writer (a zip written member by member) calls it directly;
* :func:`write_atomic` is that routine for a ``bytes``/``str`` payload, with a symlink at the target refused and
  an ``OSError`` turned into the caller's ``error`` class;
* :func:`write_all_or_none` writes several files so that either all of them are written or none is changed;
* :func:`read_regular_bounded` reads a file only if it is a regular file, never blocking (a FIFO, a socket, a
  device or a folder is refused from its ``fstat``, opened with ``O_NONBLOCK``).

Every failure of the reading and naming helpers and of :func:`write_atomic` raises the ``error`` class the caller
chooses (a :class:`~transformer_np.errors.FileFormatError` subclass, usually) with a message naming the file;
:func:`replace_atomically` lets the exception through for its caller to word.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import FileFormatError, InputValueError


def _kind(mode: int) -> str:
    """What a non-regular file is, for a message."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _not_regular(where: str, mode: int, error: type, what: str):
    return error(f"{where}: is {_kind(mode)}, not a regular file; a {what} must be a regular file")


_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))


def open_regular(path: str | os.PathLike, *, error: type = FileFormatError, what: str = "file") -> BinaryIO:
    """``path`` opened for binary reading — if it is a regular file; anything else refused without blocking.

    The file is opened non-blocking (``O_NONBLOCK``: opening a FIFO without a writer returns at once instead of
    waiting forever, and a device's open does not wait for it either), then ``fstat`` on the open descriptor
    says what it is: a folder, a FIFO, a character or block device or a socket (which cannot even be opened)
    is refused with ``error`` in one line naming the file. A symbolic link is followed and judged by its
    target. The size ``fstat`` reports is *not* a bound (``/proc`` files say 0 and hold gigabytes): callers
    count the bytes they read (:func:`read_bytes_bounded`). The caller closes the file (``with``)."""
    where = os.fspath(path)
    try:
        fd = os.open(where, _OPEN_FLAGS)
    except FileNotFoundError:
        raise error(f"{where}: no such {what}") from None
    except OSError as e:
        try:                                  # a socket cannot be opened (ENXIO): say what it is when stat can
            mode = os.stat(where).st_mode
        except OSError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):
            raise _not_regular(where, mode, error, what) from None
        raise error(f"{where}: cannot be read ({e.strerror or e})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(where, mode, error, what)
        if _OPEN_FLAGS & getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)         # a regular file: ordinary reads from here on
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_open_bounded(f: BinaryIO, max_bytes: int, where: str, *, error: type = FileFormatError,
                      what: str = "file") -> bytes:
    """The rest of the open regular file ``f``, refused with ``error`` once more than ``max_bytes`` have been read.

    A file whose ``fstat`` size already passes the bound is refused without reading; otherwise one read of at
    most ``max_bytes + 1`` bytes decides, so a file that says it is smaller than it is (``/proc`` files say 0)
    or that grows is refused on the bytes it really gave, and nothing larger than ``max_bytes + 1`` bytes is
    ever held (one buffer, not chunks joined into a second copy)."""
    try:
        left = os.fstat(f.fileno()).st_size - f.tell()
        if left > max_bytes:
            raise error(f"{where}: more than the {max_bytes} bytes a {what} may have ({left} bytes)")
        data = f.read(max_bytes + 1)
    except OSError as e:
        raise error(f"{where}: cannot be read ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise error(f"{where}: more than the {max_bytes} bytes a {what} may have")
    return data


def read_bytes_bounded(path: str | os.PathLike, max_bytes: int, *, error: type = FileFormatError,
                       what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, refused with ``error`` once more than ``max_bytes`` have been read.

    The file is opened by :func:`open_regular` (a FIFO, a device, a socket or a folder is refused at once,
    without blocking) and read by :func:`read_open_bounded`: the bound is checked on the bytes read, so it holds
    for files whose reported size is wrong (``/proc``) and files that grow; nothing larger than
    ``max_bytes + 1`` bytes is ever held in memory. ``what`` names the kind of file in the message
    ("worksheet", "JSON file", …)."""
    where = os.fspath(path)
    with open_regular(where, error=error, what=what) as f:
        return read_open_bounded(f, max_bytes, where, error=error, what=what)


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


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back for the block and deliver it after: a file the block writes is finished whole
    before the ``KeyboardInterrupt`` is raised. An interrupt in the middle of a library's writer can leave the
    writer's objects half open (NumPy before 1.26's ``np.savez`` does not close its ``ZipFile`` on an exception,
    whose ``__del__`` then prints "Exception ignored … seek of closed file" when Python exits).

    The handler is swapped, not the signal mask: a process-directed signal goes to any thread that does not
    block it (OpenBLAS's among them), and Python runs every handler in the main thread. Off the main thread,
    where no handler can be set, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if held:                                               # delivered now, to what was there before
            if callable(old):
                old(signal.SIGINT, None)                       # default_int_handler: KeyboardInterrupt
            elif old == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


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


def write_all_or_none(files: list[tuple[str | os.PathLike, bytes | str]], *,
                      error: type = FileFormatError) -> list[Path]:
    """Write every ``(path, data)`` of ``files``, or none of them.

    Each file is first written in full to its temporary sibling (:func:`temporary_name`) and fsynced; only when
    all are written are they renamed into place, one by one. If a write fails, the temporary files are removed
    and no target has changed; if a rename fails, the renames already done are undone (a file that existed before
    is put back from the copy it was moved to). A symlink at a target is refused, not followed. An ``OSError``
    becomes ``error`` naming the file; any other exception (an interrupt) propagates after the same clean-up.
    Returns the paths, in order."""
    plan = [(Path(p), d.encode("utf-8") if isinstance(d, str) else bytes(d)) for p, d in files]
    for path, _ in plan:
        if path.is_symlink():
            raise error(f"{path}: is a symbolic link; refusing to write through it")
        if os.path.lexists(path) and not path.is_file():
            raise error(f"{path}: exists and is not a file (a folder?); nothing was written")
    temps: list[Path] = []
    done: list[tuple[Path, Path | None]] = []            # (target, its previous file moved aside, or None)
    current = plan[0][0] if plan else None
    try:
        for path, raw in plan:
            current = path
            tmp = temporary_name(path)
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
            temps.append(tmp)
            with open(tmp, "xb") as f:
                f.write(raw)
                f.flush()
                os.fsync(f.fileno())
        for (path, _), tmp in zip(plan, temps):
            current = path
            backup = None
            if os.path.lexists(path):
                backup = path.with_name(f".{path.name}.{os.getpid()}.old")
                os.replace(path, backup)
            done.append((path, backup))
            os.replace(tmp, path)
    except BaseException as e:
        for path, backup in reversed(done):              # undo: the targets as they were
            try:
                if backup is not None:
                    os.replace(backup, path)
                elif os.path.lexists(path):
                    path.unlink()
            except OSError:
                pass
        for tmp in temps:
            try:
                tmp.unlink()
            except OSError:
                pass
        if isinstance(e, OSError):
            raise error(f"{current}: cannot be written ({e.strerror or e}); no file was written") from None
        raise
    for _, backup in done:
        if backup is not None:
            try:
                backup.unlink()
            except OSError:
                pass
    for folder in {p.parent for p, _ in plan}:
        _fsync_dir(folder)
    return [p for p, _ in plan]
