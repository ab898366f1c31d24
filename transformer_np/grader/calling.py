"""Calling a student's functions during a check, so that honest work never loses a mark to the checks.

While a student's function runs (:func:`_student_call`):

- what it prints (stdout and stderr) goes to a bounded buffer, not into the notebook: an otter test cell
  expects no output, and a ``print`` left in a correct function must not change its verdict. A failed
  check's feedback says how many characters were printed;
- floating-point warnings are silenced and NumPy's error state is ``ignore`` (non-finite results are
  reported by the checks), and the state the function leaves (``np.seterr(all="raise")``, a warnings
  filter) is undone when it returns. The checks' own computations (the reference, the known mistakes, the
  comparisons) run under :func:`grader_state`, so a student's ``np.seterr`` at the top of a notebook
  does not make them raise;
- whatever it raises — an ``Exception``, and also ``KeyboardInterrupt`` and ``SystemExit`` — becomes a
  one-line :class:`~.feedback.Problem` for that check (``_Stop``). Other ``BaseException`` subclasses
  (e.g. the grade-of-record sandbox's "process timed out") propagate untouched.

The grade of record (``transformer-np grade``) calls the student's functions through proxies that run
them in another process; an exception there arrives as an ``Exception`` whose ``student_type`` (the
original class name) and ``student_where`` (the line, formatted as :func:`.diagnosis._where` does) are
used here, so it reads exactly like a local one.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import io
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .diagnosis import _kind, _where
from .exercise_base import Exercise
from .feedback import Feedback, Problem, _Stop

__all__ = ["STUDENT_EXCEPTIONS", "grader_state", "printed_note", "student_type", "with_grader_state"]

# What a student's code may raise and still be reported as one line. Never BaseException: a grader's own
# BaseException (a sandbox timeout, a dead child process) must pass through the checks untouched.
STUDENT_EXCEPTIONS = (Exception, KeyboardInterrupt, SystemExit)
_KEEP = 2000          # characters of a student's printed output kept (the rest is counted only)


class _Printed(io.TextIOBase):
    """Where a student's prints go during a check: every character counted, the first ``_KEEP`` kept."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.head = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self.count += len(s)
        if len(self.head) < _KEEP:
            self.head += s[:_KEEP - len(self.head)]
        return len(s)


_PRINTED: contextvars.ContextVar[_Printed | None] = contextvars.ContextVar("transformer_np_printed", default=None)


_CAPTURE: contextvars.ContextVar[_Printed | None] = contextvars.ContextVar("transformer_np_capture", default=None)


class _Router:
    """Stands in for ``sys.stdout`` / ``sys.stderr`` while checks run: what a student's function writes (in
    whichever thread runs it, see ``_CAPTURE``) goes to that check's :class:`_Printed`; everything else to the
    stream that was there before. One router serves every thread: ``contextlib.redirect_stdout`` would swap
    the process-wide stream per call, and checks run in parallel threads (``transformer-np grade --workers``)
    would then restore each other's streams out of order."""

    def __init__(self, original: Any) -> None:
        self._original = original

    def write(self, s: str) -> int:
        sink = _CAPTURE.get()
        if sink is not None:
            return sink.write(s)
        return self._original.write(s) if self._original is not None else len(s)

    def flush(self) -> None:
        if _CAPTURE.get() is None and self._original is not None:
            self._original.flush()

    def writable(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:     # encoding, isatty, fileno, … of the original stream
        return getattr(self._original, name)


_SHARED_LOCK = threading.Lock()
_shared: dict[str, Any] = {"active": 0}


@contextlib.contextmanager
def _process_wide() -> Iterator[None]:
    """The process-wide state a check changes — ``sys.stdout``/``sys.stderr`` routed through :class:`_Router`
    and the warnings filters set to ``ignore`` — installed by the first check to start (in any thread) and put
    back by the last one to end, under a lock (``warnings.catch_warnings`` is not thread-safe either)."""
    with _SHARED_LOCK:
        if _shared["active"] == 0:
            _shared["saved"] = (sys.stdout, sys.stderr, warnings.filters, warnings.showwarning)
            sys.stdout, sys.stderr = _Router(sys.stdout), _Router(sys.stderr)
            warnings.filters = warnings.filters[:]
            warnings.simplefilter("ignore")
        _shared["active"] += 1
    try:
        yield
    finally:
        with _SHARED_LOCK:
            _shared["active"] -= 1
            if _shared["active"] == 0:
                sys.stdout, sys.stderr, warnings.filters, warnings.showwarning = _shared.pop("saved")
                getattr(warnings, "_filters_mutated", lambda: None)()


@contextlib.contextmanager
def grader_state() -> Iterator[None]:
    """NumPy's error state ``ignore`` (per thread) and warnings silenced, whatever the student's code set
    before: the checks' own arithmetic (the reference, the known mistakes, the comparisons) never raises or
    warns because of a student's ``np.seterr(all="raise")`` or ``warnings.simplefilter("error")``."""
    with _process_wide(), np.errstate(all="ignore"):
        yield


def with_grader_state(run: Callable[..., Feedback | None]) -> Callable[..., Feedback | None]:
    """Decorates a check (``run_forward``, ``run_backward``): it runs under :func:`grader_state`, what the
    student's functions print is captured, and a failed check's feedback says how much was printed."""
    @functools.wraps(run)
    def checked(*args: Any, **kwargs: Any) -> Feedback | None:
        outer = _PRINTED.get() is None
        token = _PRINTED.set(_Printed()) if outer else None
        try:
            with grader_state():
                fb = run(*args, **kwargs)
            sink = _PRINTED.get()
            if outer and fb is not None and sink is not None and sink.count:
                fb.notes.append(printed_note(sink.count))
            return fb
        finally:
            if token is not None:
                _PRINTED.reset(token)
    return checked


def printed_note(count: int) -> str:
    return (f"(your functions printed {count} character{'s' if count != 1 else ''} while they were checked: "
            f"not shown, and not graded — only the returned values are)")


@contextlib.contextmanager
def _student_context() -> Iterator[None]:
    """Around one call of student code: its prints captured (into the check's :class:`_Printed`), NumPy
    errors ignored, warnings silenced; an error state the call sets is undone when it returns (a warnings
    filter, when the last running check ends)."""
    sink = _PRINTED.get()
    if sink is None:                       # called outside a decorated check: a private sink
        sink = _Printed()
    with _process_wide(), np.errstate(all="ignore"):
        token = _CAPTURE.set(sink)
        try:
            yield
        finally:
            _CAPTURE.reset(token)


def _student_call(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` in :func:`_student_context` (exceptions propagate: see :func:`_call`)."""
    with _student_context():
        return fn(*args)


def _call(ex: Exercise, function_name: str, fn: Callable, *args: Any) -> Any:
    """Run student code (:func:`_student_context`); anything it raises becomes a ``_Stop`` with a
    one-line explanation."""
    try:
        return _student_call(fn, *args)
    except STUDENT_EXCEPTIONS as e:
        _raise_stop(function_name, e)


def _library_roots() -> tuple[str, ...]:
    """Where code that is not the student's lives: NumPy, this package, the standard library and installed
    packages (a student's function is defined in a notebook cell, a script or a test file)."""
    import os
    import sysconfig

    import transformer_np

    paths = sysconfig.get_paths()
    roots = [os.path.dirname(np.__file__), os.path.dirname(transformer_np.__file__)]
    roots += [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)]
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots)


@functools.lru_cache(maxsize=4096)
def _is_student_file(filename: str, roots: tuple[str, ...]) -> bool:
    import os

    if filename.startswith(("<frozen", "<__array_function__")):     # the import system; NumPy < 1.25's dispatch
        return False
    return not (os.path.realpath(filename) + os.sep).startswith(roots) if not filename.startswith("<") else True


def _is_complex(value: Any) -> bool:
    return type(value) is complex or (issubclass(type(value), (np.ndarray, np.generic)) and np.iscomplexobj(value))


def _call_backward(ex: Exercise, function_name: str, fn: Callable, *args: Any) -> tuple[Any, str | None]:
    """:func:`_call` for a backward, and the name of a student function it evaluated at complex inputs (a
    complex-step derivative: numerical, refused like finite differences), or None. In this process a trace
    function looks at the arguments of every student function the backward calls (returning None: no line
    events); through a grade-of-record proxy the child does the same and the proxy reports it
    (``fn.complex_step``)."""
    found: list[str] = []
    roots = _library_roots()
    code = getattr(fn, "__code__", None)
    local = code is not None and _is_student_file(code.co_filename, roots)

    def probe(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and not found and _is_student_file(frame.f_code.co_filename, roots):
            for v in frame.f_locals.values():
                if any(_is_complex(w) for w in (v if type(v) in (tuple, list) else (v,))):
                    found.append(frame.f_code.co_name)
                    return None
        return None

    before = sys.gettrace()
    if local:
        sys.settrace(probe)
    try:
        result = _call(ex, function_name, fn, *args)
    finally:
        if local:
            sys.settrace(before)
    remote = getattr(fn, "complex_step", None)
    return result, (found[0] if found else remote if isinstance(remote, str) else None)


def student_type(e: BaseException) -> str:
    """The class name of a student's exception: ``e.student_type`` when it came from another process
    (a grade-of-record proxy), else its own."""
    remote = getattr(e, "student_type", None)
    return remote if isinstance(remote, str) and remote else type(e).__name__


def _raise_stop(function_name: str, e: BaseException) -> None:
    """A student's exception as a one-line problem (``not_implemented`` or ``exception``)."""
    kind = student_type(e)
    text = str(e)
    if isinstance(e, NotImplementedError) or kind == "NotImplementedError":
        detail = f": {text}" if text else ""
        raise _Stop(Problem(function_name, "not_implemented",
                            f"not written yet (it raised NotImplementedError{detail})")) from None
    msg = text.splitlines()[0] if text else ""
    raise _Stop(Problem(function_name, "exception", f"raised {kind}{': ' + msg if msg else ''}{_where(e)}")) from None


def _out_and_cache(ex: Exercise, result: Any) -> tuple[np.ndarray, Any]:
    if result is None:
        raise _Stop(Problem(ex.forward, "returned_none",
                            "returned None — the body is still `...`, or the `return out, cache` line is missing"))
    if not isinstance(result, tuple) or len(result) != 2:
        raise _Stop(Problem(ex.forward, "not_tuple",
                            f"must return the pair (out, cache), got {_kind(result)}"))
    return _as_array("out", result[0]), result[1]


def _as_array(label: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating):
        return value
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        arr = None
    if arr is None or value is None:
        raise _Stop(Problem(label, "not_array", f"must be a NumPy array, got {_kind(value)}"))
    return arr


def _unpack(ex: Exercise, result: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The student's backward result as {input name: gradient}, checked against the documented structure."""
    labels = [ex.grad_label(n) for n in names]
    if ex.returns == "array":
        if isinstance(result, tuple):
            raise _Stop(Problem(ex.backward, "wrong_count", f"must return {labels[0]} alone (an array), "
                                f"got {_kind(result)}"))
        if result is None:
            raise _Stop(Problem(ex.backward, "returned_none", f"returned None — the body is still `...`, or the "
                                f"`return {labels[0]}` line is missing"))
        return {names[0]: result}
    if ex.returns == "tuple":
        want = "(" + ", ".join(labels) + ")"
        if result is None:
            raise _Stop(Problem(ex.backward, "returned_none", f"returned None — the body is still `...`, or the "
                                f"`return {want[1:-1]}` line is missing"))
        if not isinstance(result, (tuple, list)) or len(result) != len(names):
            raise _Stop(Problem(ex.backward, "wrong_count", f"must return the {len(names)} gradients {want}, "
                                f"got {_kind(result)}"))
        return dict(zip(names, result))
    if result is None:
        raise _Stop(Problem(ex.backward, "returned_none",
                            "returned None — the body is still `...`, or the `return dx, grads` line is missing"))
    if not isinstance(result, (tuple, list)) or len(result) != 2 or not isinstance(result[1], dict):
        raise _Stop(Problem(ex.backward, "wrong_count", f"must return the pair (dx, grads) with grads a dict "
                            f"{{parameter name: gradient}}, got {_kind(result)}"))
    dx, grads = result
    params = [n for n in names if n != "x"]
    unexpected = [k for k in grads if k not in params]
    if unexpected:
        same_case = [k for k in params if k.lower() == str(unexpected[0]).lower()]
        near = same_case or difflib.get_close_matches(str(unexpected[0]), params, n=1)
        raise _Stop(Problem(ex.backward, "unexpected_gradient", f"grads has the unexpected key {unexpected[0]!r}"
                            + (f" (did you mean {near[0]!r}?)" if near else "") + f"; its keys are the parameter "
                            f"names of p: {', '.join(params)}"))
    missing = [k for k in params if k not in grads]
    if missing:
        raise _Stop(Problem(ex.backward, "missing_gradient", f"grads is missing {', '.join(map(repr, missing))}"))
    return {"x": dx, **grads}
