"""Progress of a long command on stderr: a bar redrawn in place on a terminal, one line per step otherwise.

The library functions take a ``progress`` callback and print nothing themselves; a command passes
:class:`Progress` (or nothing under ``--json`` / ``--quiet``), so stdout keeps only the result.
"""

from __future__ import annotations

import shutil
import sys
import time

from ..textout import terminal

_now = time.monotonic              # the clock (a test replaces it)


class Progress:
    """``progress(i, total, label)``: step ``i`` of ``total`` (1-based) is starting; ``close()`` when done.

    On a terminal: ``what [#####.....] i/total label`` redrawn on one line and erased by ``close()``.
    Elsewhere (a pipe, a log file, CI): one line ``what [i/total] label`` per step, flushed at once; with
    ``every`` > 0 seconds, only the first call, the first call of the last step and any call at least
    ``every`` seconds after the last line written (a class of 200 sheets, a figure set's 52 sub-steps: a
    line every few seconds, not a screenful). With ``delay`` > 0 seconds nothing is shown before that long
    has passed since the start: a run that ends sooner (a class of five sheets) stays quiet.
    """

    def __init__(self, what: str, stream=None, every: float = 0.0, delay: float = 0.0, clock=None):
        self.what = what
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.drawn = False
        self.every, self.delay, self.clock = every, delay, clock or _now
        self._start = self.clock()
        self._last = None                 # (time, i) of the last line written elsewhere than on a terminal

    def __call__(self, i: int, total: int, label: str) -> None:
        now = self.clock()
        if now - self._start < self.delay:
            return
        if self.tty:
            width = shutil.get_terminal_size((80, 24)).columns
            filled = int(20 * (i - 1) / max(total, 1))
            line = f"{self.what} [{'#' * filled}{'.' * (20 - filled)}] {i}/{total} {terminal(label)}"
            if len(line) > width - 1:
                line = line[:width - 2] + "…"
            self.stream.write("\r\033[K" + line)
            self.drawn = True
        else:
            if self.every > 0 and self._last is not None and now - self._last[0] < self.every \
                    and not (i == total and self._last[1] != i):
                return
            self._last = (now, i)
            self.stream.write(f"{self.what} [{i}/{total}] {terminal(label)}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\r\033[K")                 # erase the bar: the result follows on stdout
            self.stream.flush()
            self.drawn = False
