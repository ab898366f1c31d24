"""The class gradebooks of ``check`` and ``grade``, safe for its reader: what is shown, what is opened, what is written.

* :func:`shown` and :func:`cell` — a file name or a line of text as a terminal may show it, and a CSV cell a
  spreadsheet will not run: the project's one policy for untrusted text, :mod:`transformer_np.textout`.
* :func:`find_sheets` — the sheets to mark: a folder gives its ``*.toml`` entries (sorted by name); each entry
  knows the class folder it was found in, and :func:`read_sheet` follows a symbolic link only to a file inside
  that folder. Special files are refused without blocking (:func:`~transformer_np._files.read_bytes_bounded`).
* :class:`CsvSink` — the one CSV gradebook writer (``check``'s and ``grade``'s): rows written one by one to a
  temporary sibling and renamed into place at the end (or written to standard output for ``--csv -``), so
  nothing is kept in memory and no half-written gradebook is ever seen; an existing file is replaced only with
  ``--force``.
"""

from __future__ import annotations

import csv
import io
import os
import sys
from dataclasses import dataclass

from ..textout import csv_cell, terminal


def shown(text, keep_newlines: bool = False) -> str:
    """``text`` with every character a terminal would act on, or would not show, written as an escape: the
    project's one policy, :func:`transformer_np.textout.terminal`."""
    return terminal(text, newlines=keep_newlines)


#: a CSV cell a spreadsheet will not run: :func:`transformer_np.textout.csv_cell`
cell = csv_cell


@dataclass
class Entry:
    """A sheet to mark: its path, the class folder it belongs to (real path), and whether it was named on the
    command line or found in a folder."""

    path: str
    folder: str
    named: bool


def find_sheets(paths: list[str], example) -> list[Entry]:
    """The sheets to mark, sorted by path; a folder gives every ``*.toml`` in it that is not hidden (whatever it
    is: a special file gets its row, with its error); ``example`` maps ``"example"`` to the shipped sheet (or
    None). The same path given twice is marked once; two paths to one file (a symbolic link in the folder) are
    two rows."""
    from ..errors import InputValueError

    out: list[Entry] = []
    for p in paths:
        ex = example(p)
        if ex is not None:
            out.append(Entry(ex, os.path.realpath(os.path.dirname(ex)), True))
        elif os.path.isdir(p):
            folder = os.path.realpath(p)
            with os.scandir(p) as it:
                found = [os.path.join(p, e.name) for e in it if e.name.endswith(".toml") and not e.name.startswith(".")]
            if not found:
                raise InputValueError(f"{shown(p)}: a folder with no worksheets (*.toml) in it")
            out += [Entry(f, folder, False) for f in found]
        elif not os.path.lexists(p) and not p.endswith(".toml"):    # a missing folder, or a file without .toml
            raise InputValueError(f"{shown(p)}: no such file or folder")
        else:
            out.append(Entry(p, os.path.realpath(os.path.dirname(os.path.abspath(p))), True))
    seen: set[str] = set()
    unique = []
    for e in out:
        k = os.path.normpath(os.path.abspath(e.path))
        if k not in seen:
            seen.add(k)
            unique.append(e)
    return sorted(unique, key=lambda e: e.path)      # by path: the same class, the same gradebook, in any order


def _inside(target: str, folder: str) -> bool:
    try:
        return os.path.commonpath([target, folder]) == folder and target != folder
    except ValueError:                               # different drives
        return False


def read_sheet(entry: Entry, max_bytes: int) -> bytes:
    """The bytes of the sheet ``entry``, never blocking: a symbolic link is followed only to a file inside the
    class folder; anything but a regular file (a FIFO, socket, device, folder) is refused. Raises
    :class:`~transformer_np.errors.WorksheetError` naming the (escaped) path."""
    from .._files import read_bytes_bounded
    from ..errors import WorksheetError

    where = shown(entry.path)
    path = entry.path
    if os.path.islink(path):
        target = os.path.realpath(path)
        if not _inside(target, entry.folder):
            raise WorksheetError(f"{where}: a symbolic link to {shown(target)}, outside the class folder "
                                 f"{shown(entry.folder)}; not followed")
        path = target
    try:
        return read_bytes_bounded(path, max_bytes, error=WorksheetError, what="worksheet file")
    except WorksheetError as e:
        msg = str(e)
        raise WorksheetError(where + msg[len(path):] if msg.startswith(path) else f"{where}: {shown(msg)}") from None


class CsvSink:
    """The gradebook CSV, written as the rows come: ``-`` is standard output; a file is written to a temporary
    sibling, renamed over the target by :meth:`close` (refused if it exists, unless ``force``; never through a
    symbolic link) and removed by :meth:`abort`."""

    def __init__(self, target: str, columns: tuple[str, ...], force: bool = False):
        from .._files import temporary_name
        from ..errors import InputValueError

        self.target, self.columns, self.tmp = target, columns, None
        if target == "-":
            self.file = sys.stdout
        else:
            if os.path.islink(target):
                raise InputValueError(f"--csv: {shown(target)} is a symbolic link; refusing to write through it")
            if os.path.lexists(target) and not force:
                raise InputValueError(f"--csv: {shown(target)} already exists; give another name, or --force to "
                                      f"replace it")
            if os.path.lexists(target) and not os.path.isfile(target):
                raise InputValueError(f"--csv: {shown(target)} exists and is not a file")
            self.tmp = temporary_name(target)
            try:
                self.tmp.unlink()
            except FileNotFoundError:
                pass
            try:
                raw = open(self.tmp, "xb")
            except OSError as e:
                raise InputValueError(f"--csv: {shown(target)} cannot be written ({e.strerror or e})") from None
            self.file = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        self.writer = csv.writer(self.file, lineterminator="\n")
        self.writer.writerow(columns)

    def write(self, row: dict) -> None:
        self.writer.writerow([cell(row.get(k, "")) for k in self.columns])

    def close(self) -> None:
        if self.tmp is None:
            self.file.flush()
            return
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.target)

    def abort(self) -> None:
        if self.tmp is None:
            return
        try:
            self.file.close()
        except OSError:
            pass
        try:
            self.tmp.unlink()
        except OSError:
            pass
