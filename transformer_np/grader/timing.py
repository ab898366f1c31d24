r"""The grader's clocks: a submission's time counted in CPU seconds, with wall-clock caps several times larger.

A loaded machine slows every process down, so a wall-clock limit would cost a correct solution its marks when
the machine is busy. The limits (:class:`~transformer_np.grader.sandbox.Limits`) are therefore CPU budgets:

* what counts: the CPU time of the child process (user + system, all its threads, read from
  ``/proc/<pid>/stat``; where there is no ``/proc`` the child's wall time stands in for it) **plus** the grader's
  own CPU time while it talks to the child during a request — serving the functions the notebook hands out
  (``Exercise.allowed``) and reading and writing its messages — so handing work to the grader gains no time;
* per call (``Limits.call_timeout``): one cell or one call of a student's function, from the request to its
  reply, every handed-out call it makes included;
* per submission (``Limits.submission_timeout``): every process started for it, their start-up included;
* each has a wall-clock cap of ``Limits.wall_factor`` (default 4) times its CPU budget, for a child that waits
  instead of computing (a sleep, a pipe it does not read).

:class:`Budget` is one submission's account; :class:`CallClock` one call's. The sandbox brings the account up
to date (:meth:`Budget.charge`) each time it looks at the child, at most every ``poll()`` seconds, so a limit
is noticed within ~0.05 s of CPU time (the kernel counts CPU time in ticks of 10 ms).
"""

from __future__ import annotations

import os
import time

__all__ = ["Budget", "CallClock", "CpuMeter"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_MIN_POLL, _MAX_POLL = 0.05, 0.5


class CpuMeter:
    """The CPU seconds a process has used so far (utime + stime of every thread); its wall time since the meter
    was made where ``/proc`` cannot be read (then the limits are wall-clock limits)."""

    def __init__(self, pid: int):
        self.path = f"/proc/{pid}/stat"
        self.t0 = time.monotonic()
        self.proc = self._read() is not None

    def _read(self) -> float | None:
        try:
            with open(self.path, "rb") as f:
                stat = f.read(4096)
        except OSError:
            return None
        fields = stat[stat.rfind(b")") + 2:].split()      # after "pid (comm) ": state is field 3 of stat(5)
        try:
            return (int(fields[11]) + int(fields[12])) / _TICK          # fields 14 and 15: utime, stime
        except (IndexError, ValueError):
            return None

    def seconds(self) -> float | None:
        """CPU seconds so far; None once the process is gone (its last reading stands)."""
        if not self.proc:
            return time.monotonic() - self.t0
        return self._read()


class Budget:
    """One submission's time: ``cpu`` seconds (its children's CPU time and the grader's time serving them), and
    a wall-clock cap of ``wall_factor`` × ``cpu`` seconds from now."""

    def __init__(self, cpu: float, wall_factor: float):
        self.cpu, self.wall_factor = float(cpu), float(wall_factor)
        self.wall = self.cpu * self.wall_factor
        self.wall_deadline = time.monotonic() + self.wall
        self.spent = 0.0

    def charge(self, seconds: float) -> None:
        self.spent += max(0.0, seconds)

    def over(self) -> str | None:
        """None while time is left; else a line naming the limit that ran out (CPU or wall-clock)."""
        if self.spent >= self.cpu:
            return f"the submission's time limit ({self.cpu:g} s of CPU time) ran out"
        if time.monotonic() >= self.wall_deadline:
            return (f"the submission's wall-clock time limit ({self.wall:g} s, {self.wall_factor:g}× its "
                    f"{self.cpu:g} s of CPU time) ran out")
        return None


class CallClock:
    """One call's time within a submission's :class:`Budget`: at most ``cpu`` seconds of it, and ``wall_factor``
    × ``cpu`` seconds of wall-clock time."""

    def __init__(self, budget: Budget, cpu: float):
        self.budget, self.cpu = budget, float(cpu)
        self.start = budget.spent
        self.wall = self.cpu * budget.wall_factor
        self.wall_deadline = time.monotonic() + self.wall

    def used(self) -> float:
        return self.budget.spent - self.start

    def over(self, doing: str) -> str | None:
        """None while time is left; else a line saying which limit ran out while ``doing``."""
        whole = self.budget.over()
        if whole is not None:
            return f"{whole} while {doing}"
        if self.used() >= self.cpu:
            return f"{doing} took longer than {self.cpu:g} s of CPU time (an endless loop?)"
        if time.monotonic() >= self.wall_deadline:
            return (f"{doing} took longer than {self.wall:g} s of wall-clock time ({self.budget.wall_factor:g}× its "
                    f"{self.cpu:g} s of CPU time): it waited without computing (a sleep? a pipe it does not read?)")
        return None

    def poll(self) -> float:
        """How long to wait before looking again: the CPU time left (the child uses at most about one CPU
        second per second), within [0.05, 0.5] s and never past a wall-clock cap."""
        now = time.monotonic()
        cpu_left = min(self.cpu - self.used(), self.budget.cpu - self.budget.spent)
        wall_left = min(self.wall_deadline, self.budget.wall_deadline) - now
        return max(0.0, min(wall_left, max(cpu_left, _MIN_POLL), _MAX_POLL))
