"""Progress of a long command on stderr: a bar redrawn in place on a terminal, one line per step otherwise.

The library functions take a ``progress`` callback and print nothing themselves; a command passes
:class:`Progress` (or nothing under ``--json`` / ``--quiet``), so stdout keeps only the result.
"""

from __future__ import annotations

import shutil
import sys


class Progress:
    """``progress(i, total, label)``: step ``i`` of ``total`` (1-based) is starting; ``close()`` when done.

    On a terminal: ``what [#####.....] i/total label`` redrawn on one line and erased by ``close()``.
    Elsewhere (a pipe, a log file, CI): one line ``what [i/total] label`` per step, flushed at once.
    """

    def __init__(self, what: str, stream=None):
        self.what = what
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.drawn = False

    def __call__(self, i: int, total: int, label: str) -> None:
        if self.tty:
            width = shutil.get_terminal_size((80, 24)).columns
            filled = int(20 * (i - 1) / max(total, 1))
            line = f"{self.what} [{'#' * filled}{'.' * (20 - filled)}] {i}/{total} {label}"
            if len(line) > width - 1:
                line = line[:width - 2] + "…"
            self.stream.write("\r\033[K" + line)
            self.drawn = True
        else:
            self.stream.write(f"{self.what} [{i}/{total}] {label}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\r\033[K")                 # erase the bar: the result follows on stdout
            self.stream.flush()
            self.drawn = False
