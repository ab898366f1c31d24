r"""The grade of record of a course exercise: each submission's code run in its own restricted process.

:func:`grade_notebook` grades one notebook, :func:`grade_submissions` a class (``transformer-np grade``).
For each submission:

1. the notebook is read as data (a regular file of at most 20 MB, JSON, nbformat 4) — never executed here;
   its code cells are taken in order; IPython magics and shell lines (``%pip …``, ``!ls``, ``%%time`` cells) are
   not run, and the report says so;
2. a child process (:class:`~transformer_np.grader.sandbox.Sandbox`) runs the cells one by one. It can read
   only NumPy and the standard library (so neither this project nor any framework), write only its own folder,
   and reach no other process or the network; the functions the notebook hands out are run by the grader (see
   :mod:`~transformer_np.grader.sandbox`). A cell that raises, prints, writes
   in its own folder or calls ``exit()`` costs nothing by itself; a cell that hangs or kills its process is
   skipped and the others run again in a fresh process;
3. every point-carrying check of the assignment (:func:`~transformer_np.grader.grading.graded_checks`: the
   points attach to named checks, not to positions) runs *in the grader*: the grader draws the hidden cases
   from its own fresh seed, sends the inputs, receives the student's outputs as numbers, and computes the
   reference and the comparison itself — the same checks as the notebook's own (``grade_forward`` /
   ``grade_backward``), so honest work gets the same verdict in both. A backward is graded against the
   student's own forward (asked of the child at perturbed inputs) when that forward is wrong;
4. a crash, a timeout, a memory limit or a non-finite output costs that check only, with one line naming the
   cause; the next check starts a fresh process if the last one died.

The child runs behind a boundary the kernel enforces (:mod:`~transformer_np.grader.confine`: Landlock,
seccomp-bpf, a user namespace without capabilities, the parent-death signal); where the machine lacks it, grading
is refused unless ``sandbox=False`` (formative grades, marked ``unsandboxed``). What this does **not**
guarantee: code copied from the library's
source into the notebook is the student's code as far as a machine can tell: the similarity report
(``--similarity``, :mod:`~transformer_np.grader.similarity`) flags it for the instructor; it never changes a mark.
"""

from __future__ import annotations

import ast
import os
import secrets
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputValueError
from . import confine
from .gradebook import feedback_why, one_line, question_why
from .grading import POINTS, grade_backward, grade_forward, graded_checks
from .sandbox import Limits, Sandbox, SandboxGone
from .source import parse_untrusted
from .specs import EXERCISES
from .timing import Budget

__all__ = ["CheckGrade", "SubmissionGrade", "grade_notebook", "grade_submissions", "require_boundary",
           "submission_paths", "read_code_cells"]

MAX_NOTEBOOK_BYTES = 20 << 20
_MAX_RESTARTS = 4


@dataclass
class CheckGrade:
    """One point-carrying check of one submission."""

    question: str
    kind: str                     # "forward" | "backward"
    exercise: str                 # the check's name, e.g. "encoder_layer_post"
    points: float                 # what it is worth
    earned: float                 # what the submission earned (0 or points)
    feedback: str = ""            # empty when it passed
    codes: list[str] = field(default_factory=list)
    why: str = ""                 # the cause of the lost mark in one line (the gradebook's <q>_why); "" if passed


@dataclass
class SubmissionGrade:
    """The grade of one submission: the total, each check, and what the instructor should know."""

    file: str
    assignment: str
    score: float
    out_of: float
    checks: list[CheckGrade] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)       # cell errors, skipped magics, restarts
    flags: list[str] = field(default_factory=list)       # e.g. "unreadable", "similar:<other>"
    output: str = ""                                     # what the student's code printed (truncated)
    seed: int | None = None                              # the hidden cases' seed (None: not drawn)
    error: str | None = None                             # the file could not be graded at all: what was wrong
    sandbox: str = "kernel"                              # "kernel": the kernel boundary held; "unsandboxed"

    def questions(self) -> dict[str, tuple[float, float]]:
        """{question: (earned, out of)}, in order."""
        out: dict[str, tuple[float, float]] = {}
        for c in self.checks:
            e, o = out.get(c.question, (0.0, 0.0))
            out[c.question] = (e + c.earned, o + c.points)
        if not out:
            for q, pts in POINTS.get(self.assignment, {}).items():
                out[q] = (0.0, float(pts))
        return out

    def why(self) -> dict[str, str]:
        """{question: the one-line cause of its lost marks ("" when full)}, in order: each failed check's
        :attr:`CheckGrade.why` (named by its exercise when the question has several checks), or the reason
        the file could not be graded."""
        return question_why(self)

    def to_dict(self) -> dict:
        d = asdict(self)
        why = self.why()
        d["questions"] = {q: {"earned": e, "out_of": o, "why": why.get(q, "")}
                          for q, (e, o) in self.questions().items()}
        return d


# ----------------------------------------------------------------------------- reading a submission
def submission_paths(items: Iterable[str | os.PathLike]) -> list[Path]:
    """The notebooks named: each item an ``.ipynb`` file, or a folder whose ``*.ipynb`` files are taken (sorted,
    not recursively). A missing item is an :class:`InputValueError` naming it."""
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.suffix == ".ipynb" and not q.name.startswith("."))
            if not found:
                raise InputValueError(f"the folder {str(p)!r} holds no .ipynb file")
            out.extend(found)
        elif p.exists() or p.is_symlink():
            out.append(p)
        else:
            raise InputValueError(f"no such submission file or folder: {str(p)!r}")
    if not out:
        raise InputValueError("no submission given: name one or more .ipynb files or folders of them")
    return out


def _read_bounded(path: Path) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_NOTEBOOK_BYTES`, opened without blocking (a FIFO or a
    device is refused, never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputValueError(f"cannot open {str(path)!r}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InputValueError(f"{str(path)!r} is not a regular file")
        data = f.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise InputValueError(f"{str(path)!r} is larger than {MAX_NOTEBOOK_BYTES >> 20} MB")
    return data


def read_code_cells(path: str | os.PathLike) -> tuple[list[tuple[int, str]], list[str]]:
    """(cells, notes): the notebook's code cells as (index among code cells, source) with magics and shell lines
    removed, and notes saying what was removed. Raises :class:`InputValueError` naming the file when it is not a
    readable notebook."""
    from ..io.jsonfile import loads_strict

    path = Path(path)
    # the project's JSON reader: depth and size bounded before parsing (a notebook of 10^5 nested brackets is an
    # error row, not a RecursionError), control bytes and duplicate keys refused
    nb = loads_strict(_read_bounded(path), f"{str(path)!r} (a notebook is JSON)", error=InputValueError)
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise InputValueError(f"{str(path)!r} is not a notebook: no list of cells (nbformat 4)")
    cells, removed = [], []
    code_index = 0
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(s for s in src if isinstance(s, str)) if isinstance(src, list) else str(src)
        lines = src.splitlines()
        if lines and lines[0].lstrip().startswith("%%"):
            removed.append(f"cell {code_index} (a {lines[0].split()[0]} cell magic)")
            lines = []
        kept = []
        for n, line in enumerate(lines, 1):
            if line.lstrip().startswith(("%", "!")):
                removed.append(f"cell {code_index} line {n} `{line.strip()[:60]}`")
                kept.append("")                    # keep the line numbers of the rest
            else:
                kept.append(line)
        cells.append((code_index, "\n".join(kept) + "\n"))
        code_index += 1
    notes = []
    if removed:
        notes.append("not run (IPython magics and shell commands are not run when grading): "
                     + "; ".join(removed[:10]) + (f"; and {len(removed) - 10} more" if len(removed) > 10 else ""))
    return cells, notes


def _defining_cells(cells: Sequence[tuple[int, str]], name: str) -> list[int]:
    """The cells whose top level binds ``name`` (a def, an assignment, an import)."""
    found = []
    for i, src in cells:
        tree = parse_untrusted(src)
        if tree is None:
            if f"def {name}" in src:
                found.append(i)
            continue
        for node in tree.body:
            names: list[str] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [(a.asname or a.name).split(".")[0] for a in node.names]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            if name in names:
                found.append(i)
                break
    return found


def require_boundary() -> None:
    """Raise :class:`~transformer_np.grader.confine.ConfinementUnavailable` naming what this machine lacks for the
    kernel's boundary (:func:`~transformer_np.grader.confine.probe`), and how to grade instead."""
    missing = confine.probe()
    if missing:
        raise confine.ConfinementUnavailable(f"this machine cannot confine the students' code: it lacks "
                                             f"{' and '.join(missing)}; {confine.HOW_TO_GRADE_ELSEWHERE}")


# ----------------------------------------------------------------------------- grading one submission
class _Run:
    """One submission's process(es): the cells run once, again in a fresh process after a crash."""

    def __init__(self, cells: list[tuple[int, str]], allowed: tuple[str, ...], limits: Limits, confine: bool = True):
        self.cells, self.allowed, self.limits, self.confine = cells, allowed, limits, confine
        self.budget = Budget(limits.submission_timeout, limits.wall_factor)    # CPU seconds, with a wall cap
        self.sandbox: Sandbox | None = None
        self.skip: dict[int, str] = {}                     # cells that hung or ended their process
        self.errors: dict[int, dict] = {}                  # cells that raised
        self.starts = 0
        self.output: list[str] = []

    def ready(self) -> Sandbox:
        while self.sandbox is None or not self.sandbox.alive:
            self._retire()
            if self.budget.over() is not None:
                raise SandboxGone(self.budget.over())
            if self.starts >= _MAX_RESTARTS:
                raise SandboxGone(f"the notebook's process died {self.starts} times; the remaining checks are not run")
            self.starts += 1
            sandbox = Sandbox(self.allowed, self.limits, self.budget, confine=self.confine)
            self.sandbox = sandbox
            sandbox.start()
            for i, src in self.cells:
                if i in self.skip:
                    continue
                try:
                    result = sandbox.run_cell(i, src)
                except SandboxGone as gone:
                    if self.budget.over() is not None:
                        raise
                    self.skip[i] = gone.reason
                    break                                   # a fresh process, without this cell
                if result["ok"]:
                    self.errors.pop(i, None)
                else:
                    self.errors[i] = result["error"] or {}
        return self.sandbox

    def _retire(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            text = self.sandbox.output
            if text:
                self.output.append(text)
            self.sandbox = None

    def close(self) -> None:
        self._retire()


def _error_line(err: dict) -> str:
    msg = err.get("message", "")
    return f"{err.get('type', 'Exception')}{': ' + msg if msg else ''}{err.get('where', '')}"


def _not_defined(run: _Run, name: str, kind: str) -> str:
    """Why the student's function ``name`` cannot be called, naming the cell that failed to define it."""
    cells = _defining_cells(run.cells, name)
    if kind not in ("missing", "function"):
        return f"{name} is a {kind}, not a function"
    for i in reversed(cells):
        if i in run.skip:
            return f"{name} is not defined: cell {i}, which defines it, was not run ({run.skip[i]})"
        if i in run.errors:
            return f"{name} is not defined: cell {i}, which defines it, raised {_error_line(run.errors[i])}"
    if cells:
        return f"{name} is not defined (its cell ran, but the name was removed or is not a function)"
    return f"{name} is not defined anywhere in the notebook"


def _import_hint(run: _Run, feedback: str) -> str:
    """A line naming a failed import when the check failed on a name that import would have bound."""
    for i, err in run.errors.items():
        if err.get("type") in ("ModuleNotFoundError", "ImportError"):
            tree = parse_untrusted(dict(run.cells).get(i, ""))
            if tree is None:
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    for a in node.names:
                        bound = (a.asname or a.name).split(".")[0]
                        if f"name '{bound}' is not defined" in feedback:
                            return f"\n(cell {i}'s import failed: {_error_line(err)})"
    return ""


def _check(run: _Run, check: Any, seed: int) -> CheckGrade:
    ex = EXERCISES[check.exercise]
    result = CheckGrade(check.question, check.kind, check.exercise, float(check.points), 0.0)
    names = [ex.forward] + ([ex.backward] if check.kind == "backward" else [])
    try:
        sandbox = run.ready()
        kinds = sandbox.lookup(names)
        missing = [n for n in names if kinds.get(n) != "function"]
        if missing:
            result.feedback = _not_defined(run, missing[0], kinds.get(missing[0], "missing"))
            result.codes = ["not_callable"]
            result.why = one_line(result.feedback)
            return result
        forward = sandbox.function(ex.forward, "forward")
        if check.kind == "forward":
            fb = grade_forward(check.exercise, forward, seed=seed)
        else:
            fb = grade_backward(check.exercise, forward, sandbox.function(ex.backward, "backward"), seed=seed)
    except SandboxGone as gone:
        result.feedback = f"{ex.forward if check.kind == 'forward' else ex.backward}: {gone.reason}"
        result.codes = ["timeout" if "longer than" in gone.reason or "time limit" in gone.reason else "crashed"]
        result.why = one_line(result.feedback)
        return result
    if fb is None:
        result.earned = result.points
        return result
    result.feedback = fb.text + _import_hint(run, fb.text)
    result.codes = list(fb.codes)
    result.why = feedback_why(fb)
    return result


def grade_notebook(path: str | os.PathLike, exercise: str, *, seed: int | None = None,
                   limits: Limits | None = None, sandbox: bool = True) -> SubmissionGrade:
    """Grade one submission of the assignment ``exercise`` (a name as in ``exercises/``: ``01_softmax`` …
    ``06_encoder_layer``). The hidden cases come from ``seed`` (default: a fresh random one, drawn here).
    ``sandbox``: run the student's code behind the kernel's boundary (:mod:`~transformer_np.grader.confine`);
    False grades without it (formative only: the row's ``sandbox`` is ``"unsandboxed"``).

    Never raises for anything in the submission: an unreadable file gets ``error`` and 0 points. Raises
    :class:`~transformer_np.grader.confine.ConfinementUnavailable` when ``sandbox`` and the machine lacks the
    boundary's mechanisms.
    """
    if exercise not in POINTS:
        raise InputValueError(f"exercise must be one of {', '.join(POINTS)}; got {exercise!r}")
    limits = limits or Limits()
    seed = secrets.randbits(32) if seed is None else int(seed)
    checks = graded_checks(exercise)
    out_of = float(sum(c.points for c in checks))
    if sandbox:
        require_boundary()
    grade = SubmissionGrade(str(path), exercise, 0.0, out_of, seed=seed,
                            sandbox="kernel" if sandbox else "unsandboxed")
    try:
        cells, grade.notes = read_code_cells(path)
    except InputValueError as e:
        grade.error, grade.flags = str(e), ["unreadable"]
        return grade
    allowed = tuple(dict.fromkeys(a for c in checks for a in EXERCISES[c.exercise].allowed))
    run = _Run(cells, allowed, limits, confine=sandbox)
    try:
        for check in checks:
            grade.checks.append(_check(run, check, seed))
    finally:
        run.close()
    grade.score = float(sum(c.earned for c in grade.checks))
    for i, reason in sorted(run.skip.items()):
        grade.notes.append(f"cell {i} was skipped: {reason}")
    for i, err in sorted(run.errors.items()):
        grade.notes.append(f"cell {i} raised {_error_line(err)} (the cells after it still ran)")
    if run.starts > 1:
        grade.notes.append(f"the notebook's process was started {run.starts} times")
    grade.output = "".join(run.output)[: limits.output_chars + 200]
    return grade


# ----------------------------------------------------------------------------- a class
def grade_submissions(exercise: str, submissions: Iterable[str | os.PathLike], *, workers: int = 1,
                      seed: int | None = None, limits: Limits | None = None,
                      progress: Callable[[int, int, str], None] | None = None,
                      sandbox: bool = True) -> list[SubmissionGrade]:
    """Grade every submission (files, or folders of ``.ipynb`` files) with ``workers`` at once; the results in
    the order of the files. One seed for the run (fresh unless given), so every student gets cases drawn alike.
    ``progress(i, total, file)`` is called as each one finishes. ``sandbox`` as for :func:`grade_notebook`."""
    if exercise not in POINTS:
        raise InputValueError(f"exercise must be one of {', '.join(POINTS)}; got {exercise!r}")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise InputValueError(f"workers must be a positive integer; got {workers!r}")
    paths = submission_paths(submissions)
    if sandbox:
        require_boundary()
    seed = secrets.randbits(32) if seed is None else int(seed)
    done, lock = [0], threading.Lock()

    def one(path: Path) -> SubmissionGrade:
        try:
            g = grade_notebook(path, exercise, seed=seed, limits=limits, sandbox=sandbox)
        except Exception as e:    # a bug of the grader's on one submission: that row says so, the class goes on
            g = SubmissionGrade(str(path), exercise, 0.0, float(sum(POINTS[exercise].values())), seed=seed,
                                sandbox="kernel" if sandbox else "unsandboxed",
                                error=f"the grader failed on this submission ({type(e).__name__}: {e}); "
                                      f"please report it", flags=["grader_error"])
        if progress is not None:
            with lock:
                done[0] += 1
                progress(done[0], len(paths), str(path))
        return g

    if workers == 1:
        return [one(p) for p in paths]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, paths))
