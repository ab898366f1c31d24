r"""The grader's side of a submission's process: start it, send it cells and calls, keep it on a short lead.

A :class:`Sandbox` is one child process (:mod:`transformer_np.grader.child`) that runs one student's
notebook. The grader

* starts it as ``python -I -S -B`` with ``sys.path`` = a folder of links to the standard library's entries
  (not its site-packages), ``lib-dynload`` and a folder holding NumPy alone, an environment with nothing but
  ``PATH``, ``HOME``/``TMPDIR`` (inside its own empty working folder), the BLAS thread counts and the machine's
  OpenBLAS settings (no ``TRANSFORMER_NP_*``, no ``PYTHON*``), its own session (process group), standard input
  from ``/dev/null``, and resource limits (:class:`Limits`: address space, CPU time, file size, open files; no
  core dumps); the child then confines itself (:mod:`~transformer_np.grader.confine`) and says so in its first
  message, and a child whose account falls short is refused;
* keeps every folder of a run (each child's working folder, the two folders of links) in one run folder under
  the temporary folder, removed at exit — and by a janitor process of its own session when the grader is killed
  (it waits for the end of a pipe only the grader holds); run folders whose grader is gone are swept at start;
* sends it the cells one at a time, then calls of the student's functions (:meth:`Sandbox.function` returns a
  proxy callable), with arguments and results as ``.npy`` bytes inside framed messages (no pickle: see the
  wire module, :mod:`transformer_np.grader.wire`, for the format and the checks on every array received);
* serves, during a call, the student's calls of the functions the notebook hands out (``Exercise.allowed``):
  the library's function runs here, on the arrays received, and its cache stays here behind a numbered handle;
* reads and writes every message with a deadline — per call (``Limits.call_timeout``, the whole exchange with
  its handed-out calls) and per submission (``Limits.submission_timeout``), both CPU seconds with wall-clock
  caps ``Limits.wall_factor`` times larger (:mod:`transformer_np.grader.timing`) — and on a timeout, a crash, a
  pipe the child does not read or a reply that breaks the format kills the child's whole process group and
  raises :class:`SandboxGone` (a ``BaseException``: it ends the check that was running and nothing in the
  checks catches it);
* drains what the student prints (standard output and error) in a thread, keeping the first
  ``Limits.output_chars`` characters and counting the rest.

Nothing the child sends is executed or unpickled here: a reply is numbers, strings, containers of them, opaque
type names and handle numbers, bounded in size before it is read (:data:`REPLY_LIMIT`) and its header before it
is parsed (:func:`transformer_np.grader.wire.check_header`). The handed-out functions' caches are bounded in
bytes per submission (:data:`HANDOUT_CACHE_BYTES`) and a handed-out call in the arrays it would make
(:data:`HANDOUT_WORK`), so the grader's memory per worker is bounded (docs/guide/instructors.md says by what).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..io.jsonfile import scan_json
from . import child as _child_program
from . import confine, wire
from .timing import Budget, CallClock, CpuMeter

__all__ = ["Limits", "Sandbox", "SandboxGone", "StudentError"]

_CHILD = Path(_child_program.__file__).resolve()
_PASS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LANG", "LC_ALL")   # the machine's, never set by us
_MAX_HANDOUT_CACHES = 50_000
REPLY_LIMIT = wire.MAX_REPLY    # bytes of one message from the child (16 MB): far above any exercise's arrays
HANDOUT_LIMIT = 1 << 20         # array elements a handed-out function may be given in one call
HANDOUT_WORK = 4 << 20          # elements of the largest array a handed-out call makes (B·h·n·n for attention)
HANDOUT_CACHE_BYTES = 64 << 20  # bytes of handed-out caches kept per submission (the oldest dropped first)


@dataclass(frozen=True)
class Limits:
    """The limits of one submission's process."""

    call_timeout: float = 10.0          # CPU seconds for one cell or one call of a student's function
    submission_timeout: float = 300.0   # CPU seconds for the whole submission (its cells and every check)
    wall_factor: float = 4.0            # each has a wall-clock cap of wall_factor × its CPU seconds
    memory_mb: int = 1024               # address space of the child (RLIMIT_AS), NumPy included
    cpu_seconds: int = 600              # CPU time of one child (RLIMIT_CPU): a backstop behind the timeouts
    file_mb: int = 16                   # the largest file it may write in its working folder (RLIMIT_FSIZE)
    output_chars: int = 20_000          # characters kept of what the student's code prints


class SandboxGone(BaseException):
    """The child process is gone: it ran past a time limit, crashed (a memory limit, ``os._exit``), or sent
    something that breaks the format. ``reason`` says which, in one line. A ``BaseException`` on purpose: it
    must pass through the checks' ``except Exception`` and end the check that was running."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class StudentError(Exception):
    """An exception raised by the student's code in the child, as the checks report a local one:
    ``student_type`` (its class name), ``student_where`` (the student's line, formatted as
    :func:`transformer_np.grader.diagnosis._where` does) and the message."""

    def __init__(self, student_type: str, message: str, student_where: str = ""):
        super().__init__(message)
        self.student_type = student_type
        self.student_where = student_where


class RemoteCache(wire.Handle):
    """A student's cache, kept in the child; only its number is here."""

    __slots__ = ()


_run_lock = threading.Lock()
_run: dict[str, Any] = {}
_RUN_PREFIX = "tnp-grade-run-"

# The janitor: a process of its own session (a Ctrl-C or a kill of the grader's process group does not reach it)
# that waits for the end of a pipe only the grader holds open, then removes the run folder. The pipe ends when the
# grader ends, however it ends (SIGKILL included), so the students' folders never outlive it.
_JANITOR = r"""
import os, shutil, sys, time
try:
    while os.read(0, 4096):
        pass
except OSError:
    pass
path = sys.argv[1]
def fix(func, p, exc):
    try:
        os.chmod(os.path.dirname(p), 0o700)
        os.chmod(p, 0o700)
        func(p)
    except OSError:
        pass
for _ in range(40):
    if not os.path.lexists(path):
        break
    shutil.rmtree(path, onerror=fix)
    time.sleep(0.25)
"""


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _sweep_stale_runs(base: str) -> None:
    """Remove the run folders whose grader is gone (one killed before its janitor could finish, or a machine that
    rebooted): each holds an ``owner`` file with its grader's pid and start time."""
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            path = os.path.join(base, name)
            if not name.startswith(_RUN_PREFIX) or os.path.islink(path):
                continue
            try:
                if os.stat(path).st_uid != os.geteuid():
                    continue
                with open(os.path.join(path, "owner"), encoding="ascii") as f:
                    pid, started = f.read().split()
            except (OSError, ValueError):
                continue
            if _start_time(int(pid)) != started:
                _remove_tree(path)


def _run_folder() -> dict[str, Any]:
    """This grader process's run folder (made on first use): every child's working folder, the folder of links to
    NumPy and the folder of links to the standard library live in it, and its janitor removes it when the grader
    ends. Returns {"path", "numpy_dir", "stdlib_dir", "read"}: ``read`` the paths a child may read."""
    with _run_lock:
        if _run.get("pid") == os.getpid():
            return _run
        base = tempfile.gettempdir()
        _sweep_stale_runs(base)
        path = tempfile.mkdtemp(prefix=f"{_RUN_PREFIX}{os.getpid()}-", dir=base)
        with open(os.path.join(path, "owner"), "w", encoding="ascii") as f:
            f.write(f"{os.getpid()} {_start_time(os.getpid())}\n")
        r, w = os.pipe()
        try:
            janitor = subprocess.Popen([sys.executable, "-I", "-S", "-B", "-c", _JANITOR, path], stdin=r,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                       close_fds=True)
        finally:
            os.close(r)
        # NumPy alone, as links (the child's sys.path entry for it), with the real folders it may read
        real = os.path.dirname(os.path.realpath(np.__file__))
        numpy_dir = os.path.join(path, "numpy-path")
        os.mkdir(numpy_dir)
        os.symlink(real, os.path.join(numpy_dir, "numpy"))
        read = [numpy_dir, real]
        libs = os.path.join(os.path.dirname(real), "numpy.libs")
        if os.path.isdir(libs):
            os.symlink(libs, os.path.join(numpy_dir, "numpy.libs"))
            read.append(os.path.realpath(libs))
        # the standard library's entries, as links, without its site-packages (Landlock grants whole subtrees)
        layout = confine.stdlib_layout()
        stdlib_dir = os.path.join(path, "stdlib-path")
        os.mkdir(stdlib_dir)
        for entry in layout["entries"]:       # the child reads each link's target (confine.restrict)
            os.symlink(os.path.join(layout["stdlib"], entry), os.path.join(stdlib_dir, entry))
        read += [stdlib_dir, layout["dynload"], "/dev/urandom", *confine.SYSTEM_LIBRARY_PATHS]
        _run.clear()
        _run.update(pid=os.getpid(), path=path, numpy_dir=numpy_dir, stdlib_dir=stdlib_dir,
                    sys_path=[stdlib_dir, layout["dynload"], numpy_dir], read=read, janitor=janitor, pipe=w)
        atexit.register(_end_run, dict(_run))
        return _run


def _end_run(run: dict[str, Any]) -> None:
    """At the grader's exit: remove the run folder, and let the janitor go."""
    if run.get("pid") != os.getpid():
        return
    _remove_tree(run["path"])
    with contextlib.suppress(OSError):
        os.close(run["pipe"])
    with contextlib.suppress(subprocess.TimeoutExpired):
        run["janitor"].wait(2)


def _handout_modules(allowed: Iterable[str]) -> dict[str, list[str]]:
    """{module: [function names]} of the dotted names an exercise hands out."""
    out: dict[str, list[str]] = {}
    for dotted in allowed:
        mod, fn = dotted.rsplit(".", 1)
        out.setdefault(mod, []).append(fn)
    return out


def _builtin_base(exc: BaseException) -> str:
    """The name of the first built-in exception class in ``exc``'s class hierarchy (ValueError for the library's
    InputValueError): what the child raises in the student's code."""
    import builtins

    for cls in type(exc).__mro__:
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
    return "RuntimeError"


class _Output:
    """Drains a pipe in a thread: keeps the first ``keep`` characters, counts every byte."""

    def __init__(self, fd: int, keep: int):
        self.keep, self.total, self._chunks, self._kept = keep, 0, [], 0
        self._thread = threading.Thread(target=self._drain, args=(fd,), daemon=True)
        self._thread.start()

    def _drain(self, fd: int) -> None:
        with contextlib.suppress(OSError):
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                self.total += len(chunk)
                if self._kept < self.keep:
                    part = chunk[: self.keep - self._kept]
                    self._chunks.append(part)
                    self._kept += len(part)
        with contextlib.suppress(OSError):
            os.close(fd)

    def text(self, wait: float = 1.0) -> str:
        self._thread.join(wait)
        kept = b"".join(self._chunks).decode("utf-8", "replace")
        if self.total > self._kept:
            kept += f"\n[… {self.total - self._kept:,} more bytes of output not kept]"
        return kept


class Sandbox:
    """One student's notebook in a child process (see the module doc). Use as a context manager."""

    def __init__(self, allowed: Iterable[str] = (), limits: Limits | None = None, budget: Budget | None = None,
                 confine: bool = True, *, _audit_hook: bool = True, _only: tuple[str, ...] | None = None):
        """``confine``: run the child behind the kernel's boundary (:mod:`~transformer_np.grader.confine`);
        False only for formative grading (``--no-sandbox``). ``_audit_hook`` is for the project's tests alone
        (False: no message hook in the child, to show that the kernel's boundary holds without it), and so is
        ``_only`` (the mechanisms of ``confine.MECHANISMS`` to apply, to measure what each one closes: such a
        child is not checked)."""
        self.limits = limits or Limits()
        self.confine = bool(confine)
        self._audit_hook = bool(_audit_hook)
        self._only = tuple(_only) if _only is not None else None
        self.sandbox_state: dict | None = None
        self.allowed = tuple(allowed)
        # the submission's time (shared by every process started for it; see timing.py): CPU seconds, wall cap
        self.budget = budget if budget is not None else Budget(self.limits.submission_timeout,
                                                               self.limits.wall_factor)
        self._meter: CpuMeter | None = None
        self._cpu_seen = 0.0                     # the child's CPU seconds already charged to the budget
        self._clock: CallClock | None = None     # the request being served, if any
        self._proc: subprocess.Popen | None = None
        self._handouts: OrderedDict[int, _HandoutCache] = OrderedDict()
        self._handout_bytes = 0
        self._next_handout = 0
        self._output: _Output | None = None
        self._work: str | None = None
        self.gone: str | None = None

    # ------------------------------------------------------------------ life cycle
    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        run = _run_folder()
        self._work = tempfile.mkdtemp(prefix="work-", dir=run["path"])
        os.mkdir(os.path.join(self._work, "tmp"))
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        out_r, out_w = os.pipe()
        mb = 1 << 20
        config = {
            "req_fd": req_r, "rep_fd": rep_w, "workdir": self._work, "sys_path": run["sys_path"],
            "confine": self.confine, "grader_pid": os.getpid(), "audit_hook": self._audit_hook, "only": self._only,
            "read": run["read"], "stdlib_dir": run["stdlib_dir"], "read_write_files": ["/dev/null"],
            "handouts": _handout_modules(self.allowed), "max_caches": 4096,
            "limits": {"RLIMIT_AS": self.limits.memory_mb * mb, "RLIMIT_CPU": int(self.limits.cpu_seconds),
                       "RLIMIT_FSIZE": self.limits.file_mb * mb, "RLIMIT_NOFILE": 64, "RLIMIT_CORE": 0},
        }
        env = {"PATH": "/usr/bin:/bin", "HOME": self._work, "TMPDIR": os.path.join(self._work, "tmp"),
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONIOENCODING": "utf-8"}
        env.update({k: os.environ[k] for k in _PASS_ENV if k in os.environ})
        import json

        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", str(_CHILD), json.dumps(config)], stdin=subprocess.DEVNULL,
                stdout=out_w, stderr=out_w, pass_fds=(req_r, rep_w), cwd=self._work, env=env,
                start_new_session=True, close_fds=True)
        except OSError as e:            # no Python to run (a broken environment): the grader's problem, said once
            for fd in (req_w, rep_r, out_r):
                os.close(fd)
            self.gone = f"the process running the notebook could not be started: {e}"
            raise SandboxGone(self.gone) from None
        finally:
            for fd in (req_r, rep_w, out_w):
                os.close(fd)
        self._req, self._rep = req_w, rep_r
        self._output = _Output(out_r, self.limits.output_chars)
        header, _ = self._receive(self.limits.call_timeout + 20, "starting the process")
        if header.get("op") != "ready":
            self._die("the process did not start")
        self.sandbox_state = header.get("sandbox") if isinstance(header.get("sandbox"), dict) else None
        if self.confine and self._only is None:
            problem = confine.state_problem(self.sandbox_state, os.geteuid() == 0)
            if problem is not None:
                self._die(f"the process running the notebook did not confine itself: {problem}")

    def close(self) -> None:
        if self._proc is not None:
            self._kill()
        self._handouts.clear()                   # the handed-out caches die with the submission's process
        self._handout_bytes = 0
        for fd in ("_req", "_rep"):
            with contextlib.suppress(AttributeError, OSError):
                os.close(getattr(self, fd))
            with contextlib.suppress(AttributeError):
                delattr(self, fd)
        if self._work is not None:
            _remove_tree(self._work)
            self._work = None

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)

    def _die(self, reason: str) -> None:
        """Kill the child and end the running check with ``reason``."""
        code = None
        if self._proc is not None:
            code = self._proc.poll()
        self._kill()
        if code is not None and code < 0 and reason.startswith("the process"):
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            reason += f" (killed by {name}" + (": its CPU time limit" if name == "SIGXCPU" else "") + ")"
        self.gone = reason
        raise SandboxGone(reason)

    @property
    def output(self) -> str:
        """What the student's code printed (kept up to ``Limits.output_chars``)."""
        return self._output.text() if self._output is not None else ""

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ------------------------------------------------------------------ messages
    def _charge(self) -> None:
        """Bring the submission's budget up to date with the child's CPU time (and, during a request, the
        grader's own time on it: serving handed-out functions, reading and writing messages)."""
        if self._meter is None and self._proc is not None:
            self._meter = CpuMeter(self._proc.pid)
        cpu = self._meter.seconds() if self._meter is not None else None
        if cpu is not None:
            self.budget.charge(cpu - self._cpu_seen)
            self._cpu_seen = max(self._cpu_seen, cpu)
        if self._clock is not None:
            now = time.thread_time()
            self.budget.charge(now - self._grader_seen)
            self._grader_seen = now

    def _wait(self, fd: int, writing: bool, clock: CallClock, doing: str) -> None:
        """Wait until ``fd`` is ready, charging the time used meanwhile; past a limit the child is killed."""
        while True:
            self._charge()
            reason = clock.over(doing)
            if reason is not None:
                self._die(reason)
            ready = select.select([] if writing else [fd], [fd] if writing else [], [], clock.poll())
            if ready[0] or ready[1]:
                return

    def _send(self, header: dict, value: Any = None, doing: str = "sending a request") -> None:
        """Send one request, never blocking past the call's limits: a child that does not read its requests
        (a full pipe) is killed when they run out."""
        if self._proc is None:
            raise SandboxGone(self.gone or "the process is not running")
        clock = self._clock or CallClock(self.budget, self.limits.call_timeout)
        payload = wire.pack(header, value, max_str=None)      # cells of any size travel whole
        try:
            os.set_blocking(self._req, False)
            wire.write_frame(self._req, payload, lambda fd: self._wait(fd, True, clock, doing))
        except (BrokenPipeError, OSError):
            self._die("the process running the notebook ended")

    def _receive(self, timeout: float, doing: str, clock: CallClock | None = None) -> tuple[dict, Any]:
        """The child's next message, within ``clock`` (default: a fresh one of ``timeout`` CPU seconds). The
        frame is bounded (:data:`REPLY_LIMIT`) before it is read, its header (bytes, depth, values) before it is
        parsed."""
        clock = clock or CallClock(self.budget, timeout)
        try:
            frame = wire.read_frame(self._rep, lambda: self._wait(self._rep, False, clock, doing), limit=REPLY_LIMIT)
            return wire.unpack(frame, self._resolve, scan=scan_json)
        except EOFError:
            self._die(f"the process running the notebook ended while {doing} (a memory limit of "
                      f"{self.limits.memory_mb} MB, os._exit or a crash)")
        except (wire.WireError, KeyError, TypeError, ValueError, AttributeError, RecursionError, MemoryError) as e:
            detail = f": {e}" if isinstance(e, wire.WireError) else ""
            self._die(f"the process sent a malformed reply while {doing}: {type(e).__name__}{detail}"[:300])
        raise AssertionError("unreachable")

    def _resolve(self, handle: wire.Handle) -> Any:
        if handle.kind == "student":
            return RemoteCache("student", handle.id)
        if handle.kind == "handout" and handle.id in self._handouts:
            return self._handouts[handle.id]
        return _UnknownHandle(handle.id)

    def _request(self, header: dict, value: Any, doing: str) -> tuple[dict, Any]:
        """Send a request and wait for its reply, serving handed-out functions meanwhile: the whole exchange is
        one call's time (:class:`~transformer_np.grader.timing.CallClock`), handed-out calls included."""
        self._clock = clock = CallClock(self.budget, self.limits.call_timeout)
        self._grader_seen = time.thread_time()
        try:
            self._send(header, value, doing)
            while True:
                reply, result = self._receive(self.limits.call_timeout, doing, clock)
                if reply.get("op") == "handout":
                    self._serve_handout(str(reply.get("name", "")), result, doing)
                    continue
                if reply.get("op") != "reply":
                    self._die(f"the process sent an unexpected message while {doing}")
                return reply, result
        finally:
            if self._proc is not None:
                self._charge()
            self._clock = None

    # ------------------------------------------------------------------ what the grader asks
    def run_cell(self, index: int, source: str) -> dict:
        """Run one code cell; {"ok": True} or {"ok": False, "error": {"type", "message", "where"}}."""
        reply, _ = self._request({"op": "cell", "index": index}, source, f"running cell {index}")
        return {"ok": reply.get("ok") is True, "error": _error_of(reply.get("error"))}

    def lookup(self, names: Iterable[str]) -> dict[str, str]:
        """{name: "function" | "missing" | a type name} of names in the notebook's namespace."""
        reply, kinds = self._request({"op": "lookup"}, list(names), "looking up the functions")
        return {str(k): str(v) for k, v in (kinds or {}).items()}

    def function(self, name: str, role: str) -> Callable:
        """A callable that runs the student's ``name`` in the child. ``role`` "forward": a returned pair's
        second element (the cache) stays in the child and a :class:`RemoteCache` comes back in its place."""
        sandbox = self

        def proxy(*args: Any, **kwargs: Any) -> Any:
            originals = wire.arrays_in([list(args), kwargs])
            reply, value = sandbox._request({"op": "call", "name": name, "role": role}, [list(args), kwargs],
                                            f"calling {name}")
            if reply.get("ok") is not True:
                err = _error_of(reply.get("error"))
                raise StudentError(err["type"], err["message"], err["where"])
            if not (isinstance(value, list) and len(value) == 3 and isinstance(value[2], dict)):
                sandbox._die(f"the process sent a malformed reply while calling {name}")
            step = reply.get("complex_step")      # the call evaluated a cell function at complex inputs
            proxy.complex_step = step[:100] if isinstance(step, str) else None
            result, cache, mutated = value
            for key, new in mutated.items():          # the student changed an input in place: so do we
                i = int(key)
                if 0 <= i < len(originals) and isinstance(new, np.ndarray) and new.shape == originals[i].shape:
                    np.copyto(originals[i], new, casting="unsafe")
            return (result, cache) if cache is not None else result

        proxy.__name__ = proxy.__qualname__ = name
        return proxy

    def _serve_handout(self, name: str, value: Any, doing: str) -> None:
        """Run the library's handed-out function ``name`` on the arrays the student passed; reply to the child.
        Its time is the call's (:meth:`_request`); its cache is kept here within :data:`HANDOUT_CACHE_BYTES`."""
        if name not in self.allowed:
            self._reply_error("ImportError", f"{name} is not handed out by this assignment", doing)
            return
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], dict)):
            self._die("the process sent a malformed request")
        args, kwargs = value
        module, fn_name = name.rsplit(".", 1)
        fn = getattr(importlib.import_module(module), fn_name)
        size = sum(a.size for a in wire.arrays_in([args, kwargs]))
        if size > HANDOUT_LIMIT:
            self._reply_error("ValueError", f"{fn_name} was given {size:,} array elements; when grading, a handed-out "
                              f"function takes at most {HANDOUT_LIMIT:,}", doing)
            return
        work = _handout_work(fn_name, args, kwargs)
        if work > HANDOUT_WORK:
            self._reply_error("ValueError", f"{fn_name} would make an array of about {work:,} elements; when "
                              f"grading, a handed-out function makes at most {HANDOUT_WORK:,}", doing)
            return
        try:
            for a in list(args) + list(kwargs.values()):
                if isinstance(a, _UnknownHandle):
                    raise ValueError(f"{fn_name} was given a cache that is no longer kept (or was never made)")
            args = [self._unwrap_cache(fn_name, a) for a in args]
            kwargs = {k: self._unwrap_cache(fn_name, v) for k, v in kwargs.items()}
            with np.errstate(all="ignore"):
                result = fn(*args, **kwargs)
        except Exception as e:     # the library refusing the student's arguments: the student's error, in the child
            self._reply_error(_builtin_base(e), str(e).splitlines()[0] if str(e) else "", doing)
            return
        if fn_name.endswith("_forward") and isinstance(result, tuple) and len(result) == 2:
            self._keep_handout(_HandoutCache(fn_name, result[1]))
            result = (result[0], wire.Handle("handout", self._next_handout))
        self._send({"op": "reply", "ok": True}, result, doing)

    def _keep_handout(self, cache: _HandoutCache) -> None:
        """Keep a handed-out forward's cache; drop the oldest while more than :data:`HANDOUT_CACHE_BYTES` (or
        ``_MAX_HANDOUT_CACHES``) are kept. The newest is always kept: a backward asked for a dropped one says so."""
        self._next_handout += 1
        self._handouts[self._next_handout] = cache
        self._handout_bytes += cache.nbytes
        while len(self._handouts) > 1 and (self._handout_bytes > HANDOUT_CACHE_BYTES
                                           or len(self._handouts) > _MAX_HANDOUT_CACHES):
            _, old = self._handouts.popitem(last=False)
            self._handout_bytes -= old.nbytes

    @staticmethod
    def _unwrap_cache(fn_name: str, value: Any) -> Any:
        """A handed-out function's cache for its own backward (``mha_forward``'s for ``mha_backward``)."""
        if isinstance(value, _HandoutCache):
            if value.maker.replace("_forward", "_backward") != fn_name:
                raise ValueError(f"{fn_name} was given the cache of {value.maker}")
            return value.cache
        if isinstance(value, RemoteCache):
            raise ValueError(f"{fn_name} was given a cache of your own function, not the one its forward returned")
        return value

    def _reply_error(self, type_name: str, message: str, doing: str) -> None:
        self._send({"op": "reply", "ok": False, "error": {"type": type_name, "message": message[:500]}}, None, doing)


def _error_of(err: Any) -> dict[str, str]:
    """The child's account of an exception as three bounded strings, whatever it sent."""
    err = err if isinstance(err, dict) else {}
    return {"type": str(err.get("type", "Exception"))[:80], "message": str(err.get("message", ""))[:500],
            "where": str(err.get("where", ""))[:600]}


class _HandoutCache:
    """A handed-out forward's cache, kept by the grader: the child holds only its number."""

    def __init__(self, maker: str, cache: Any):
        self.maker, self.cache = maker, cache
        self.nbytes = _nbytes(cache)


def _nbytes(value: Any, depth: int = 0) -> int:
    """The bytes of the arrays in a cache (dicts, lists, tuples walked), plus a little for everything else."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes) + 112
    if depth < 8 and type(value) in (dict, list, tuple):
        items = value.values() if type(value) is dict else value
        return 64 + sum(_nbytes(v, depth + 1) for v in items)
    return 64


def _handout_work(fn_name: str, args: list, kwargs: dict) -> int:
    """The elements of the largest array a handed-out call would make, estimated from its arguments' shapes
    before it runs (so a small request cannot make the grader allocate gigabytes): attention's scores are
    batch × heads × n × n, the feed-forward's hidden layer rows × d_ff; elementwise ops their input."""
    arrays = wire.arrays_in([args, kwargs])
    largest = max((a.size for a in arrays), default=0)
    first = args[0] if args and isinstance(args[0], np.ndarray) else None
    if fn_name == "attention_forward" and len(arrays) >= 2 and arrays[0].ndim >= 1 and arrays[1].ndim >= 2:
        q, k = arrays[0], arrays[1]
        return max(largest, int(np.prod(q.shape[:-1], dtype=np.float64) * k.shape[-2]))
    if fn_name == "mha_forward" and first is not None and first.ndim >= 2:
        heads = args[2] if len(args) > 2 else kwargs.get("n_heads", 1)
        heads = heads if isinstance(heads, int) and heads > 0 else 1
        n = first.shape[-2]
        return max(largest, int(np.prod(first.shape[:-1], dtype=np.float64) * n * heads))
    if fn_name == "ffn_forward" and first is not None and first.ndim >= 1:
        widest = max((a.shape[-1] for a in arrays if a.ndim >= 1), default=1)
        return max(largest, int(np.prod(first.shape[:-1], dtype=np.float64) * widest))
    return largest


class _UnknownHandle:
    """A handle number the child sent that this grader never issued (or has dropped)."""

    def __init__(self, id: int):
        self.id = id


def _remove_tree(path: str) -> None:
    """Remove the child's working folder, whatever permissions the student's code left on it."""
    def onerror(func: Callable, p: str, exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=onerror)
    else:
        shutil.rmtree(path, onerror=onerror)
