r"""Grading the course exercises: hidden cases drawn at grading time, and the one table of points.

The assignments in ``exercises/`` have, per question, a **public** check (``check_forward`` /
``check_backward`` of :mod:`transformer_np.grader.exercises`: fixed cases the student sees and loops on,
worth 0 points) and a **hidden** check that carries the question's points (an otter hidden test: it is
not in the student's notebook). The hidden checks call :func:`grade_forward` / :func:`grade_backward`,
which run the same checks on the public cases *and* on cases drawn at grading time from a seed
(:func:`grading_seed`) — shapes varied (n_q ≠ n_k, n ≠ d, several heads, a batch larger than one),
so outputs stored for the public inputs do not pass. As in the public checks:

- a backward is graded against the library's gradients when the student's forward is right, at
  ``exercises.BACKWARD_TOLERANCE``: it must be analytic (a finite-difference backward cannot get that
  close: ``not_analytic``); and against finite differences of the student's *own* forward when that
  forward is wrong but recognisably the op (error carried forward: a forward slip, or an overflow on
  some cases, costs the forward's points only);
- feedback names the problem in words; the corrected formula is added only with
  ``TRANSFORMER_NP_FEEDBACK=instructor`` (or read ``Feedback.instructor_text``).

Under otter these checks run in the student's own kernel, next to the student's code: their score is
formative (code in the notebook can change it, e.g. by calling the library or patching this module).
The grade of record is ``transformer-np grade``: the student's cells run in a separate process where
this library cannot be imported, and the grader calls the student's functions through proxies, with the
same :func:`~transformer_np.grader.exercises.run_forward` / ``run_backward`` checks and
:func:`graded_checks`' points.

:data:`POINTS` is the one table of points: ``scripts/build_exercises.sh`` writes it into each
notebook's questions when it builds the autograder, and the instructors' page prints it.
"""

from __future__ import annotations

import ast
import json
import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputValueError
from .exercises import Feedback, _exercise, run_backward, run_forward
from .hidden_cases import hidden_cases

__all__ = ["CHECKS", "POINTS", "SEED_ENV", "GradedCheck", "grade_backward", "grade_forward", "graded_checks",
           "grading_seed", "points_table", "stage_notebook"]

SEED_ENV = "TRANSFORMER_NP_GRADING_SEED"

# assignment → question → (what the question's checks grade, exercise names): one check cell per name
CHECKS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "01_softmax": {"q1": ("forward", ("softmax",)), "q2": ("backward", ("softmax",))},
    "02_layernorm": {"q1": ("forward", ("layernorm",)), "q2": ("backward", ("layernorm",))},
    "03_attention": {"q1": ("forward", ("attention",)), "q2": ("backward", ("attention",))},
    "04_multihead_attention": {"q1": ("forward", ("mha",)), "q2": ("backward", ("mha",))},
    "05_gelu_ffn": {"q1": ("forward", ("gelu",)), "q2": ("backward", ("gelu",)), "q3": ("forward", ("ffn",)),
                    "q4": ("backward", ("ffn",))},
    "06_encoder_layer": {"q1": ("forward", ("encoder_layer_post", "encoder_layer_pre")),
                         "q2": ("backward", ("encoder_layer_post", "encoder_layer_pre"))},
}

# assignment → question → points (all on the hidden checks; the public checks are worth 0)
POINTS: dict[str, dict[str, int]] = {
    "01_softmax": {"q1": 1, "q2": 2},
    "02_layernorm": {"q1": 1, "q2": 2},
    "03_attention": {"q1": 1, "q2": 2},
    "04_multihead_attention": {"q1": 1, "q2": 2},
    "05_gelu_ffn": {"q1": 1, "q2": 1, "q3": 1, "q4": 2},
    "06_encoder_layer": {"q1": 2, "q2": 2},
}


@dataclass(frozen=True)
class GradedCheck:
    """One hidden, point-carrying check of an assignment: question ``question`` ("q1") grades the
    ``kind`` ("forward" or "backward") of the exercise ``exercise`` (a name of
    :data:`~transformer_np.grader.exercises.EXERCISE_NAMES`, e.g. "encoder_layer_post") for ``points``."""

    question: str
    kind: str
    exercise: str
    points: float


def graded_checks(assignment: str) -> list[GradedCheck]:
    """Every hidden, point-carrying check of ``assignment`` (an ``exercises/`` notebook's name, e.g.
    "06_encoder_layer"), from :data:`POINTS` and :data:`CHECKS`: a question's points shared equally by
    its exercise names. In question order, then in the order of the names in :data:`CHECKS`.
    Raises :class:`~transformer_np.errors.InputValueError` for an unknown assignment."""
    if not isinstance(assignment, str) or assignment not in POINTS:
        raise InputValueError(f"assignment must be one of {', '.join(POINTS)}; got {assignment!r}")
    checks = []
    for question, (kind, names) in CHECKS[assignment].items():
        share = POINTS[assignment][question] / len(names)
        checks += [GradedCheck(question, kind, name, share) for name in names]
    return checks


def grading_seed() -> int:
    """The seed of the hidden cases: ``TRANSFORMER_NP_GRADING_SEED`` if the instructor set it (to
    reproduce a grading run), else a fresh random one — a student cannot know it in advance."""
    raw = os.environ.get(SEED_ENV, "").strip()
    if not raw:
        return secrets.randbits(32)
    try:
        return int(raw)
    except ValueError:
        raise InputValueError(f"{SEED_ENV} must be an integer; got {raw!r}") from None


def _with_seed(fb: Feedback | None, seed: int) -> Feedback | None:
    if fb is not None:
        fb.notes.append(f"(hidden cases drawn at grading time with seed {seed})")
    return fb


def grade_forward(exercise: str, forward: Callable, seed: int | None = None) -> Feedback | None:
    """The hidden check of a forward: the public cases, then hidden ones drawn from ``seed`` (default
    :func:`grading_seed`). None when all pass, else the feedback."""
    ex = _exercise(exercise)
    seed = grading_seed() if seed is None else seed
    return _with_seed(run_forward(ex, forward, ex.cases() + hidden_cases(ex.name, seed)), seed)


def grade_backward(exercise: str, forward: Callable, backward: Callable, seed: int | None = None) -> Feedback | None:
    """The hidden check of a backward (graded against the student's own forward when that forward is
    wrong but recognisable). None when all pass, else the feedback."""
    ex = _exercise(exercise)
    seed = grading_seed() if seed is None else seed
    return _with_seed(run_backward(ex, forward, backward, ex.cases() + hidden_cases(ex.name, seed)), seed)


def points_table() -> str:
    """:data:`POINTS` as the Markdown table of the instructors' page."""
    lines = ["| assignment | " + " | ".join(f"q{i}" for i in range(1, 5)) + " | total |", "|---|---|---|---|---|---|"]
    for name, questions in POINTS.items():
        cells = [f"{questions[q]} ({CHECKS[name][q][0]})" if q in questions else "" for q in
                 (f"q{i}" for i in range(1, 5))]
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {sum(questions.values())} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- building the autograder
def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _set_source(cell: dict, text: str) -> None:
    cell["source"] = text.splitlines(keepends=True)


_CHECK_CALLS = {"check_forward": ("forward", False), "check_backward": ("backward", False),
                "grade_forward": ("forward", True), "grade_backward": ("backward", True)}


def _test_call(text: str, where: str) -> tuple[str, bool, str]:
    """The one check call a test cell makes: (kind, hidden, exercise name), read from its code (never run).
    ``check_forward("softmax", …)`` → ("forward", False, "softmax"); ``grade_backward("mha", …)`` →
    ("backward", True, "mha")."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise InputValueError(f"{where}: cannot be read as Python ({e.msg}, line {e.lineno})") from None
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id in _CHECK_CALLS]
    if len(calls) != 1:
        raise InputValueError(f"{where}: expected exactly one call of {', '.join(_CHECK_CALLS)}; got {len(calls)}")
    call = calls[0]
    first = call.args[0] if call.args else None
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        raise InputValueError(f"{where}: the first argument of {call.func.id} must be an exercise name written as "
                              f"a string literal; got {ast.unparse(first) if first is not None else 'nothing'}")
    kind, hidden = _CHECK_CALLS[call.func.id]
    return kind, hidden, first.value


def _points_text(value: float) -> int | float:
    return int(value) if value == int(value) else value


def _question_points(name: str, q: str, tests: list[str], graded: list[GradedCheck]) -> list[int | float]:
    """The points of question ``q``'s test cells (their sources, in notebook order): 0 for a public check,
    its named check's points for a hidden one. Refuses a question whose hidden checks are not exactly
    the ones :data:`CHECKS` lists (each once), or whose public cells grade another kind or exercise."""
    kind, names = CHECKS[name][q]
    mine = {c.exercise: c for c in graded if c.question == q}
    points, hidden_seen = [], []
    for i, text in enumerate(tests):
        where = f"{name}: question {q}, test cell {i + 1}"
        is_hidden = text.lstrip().startswith("# HIDDEN")
        call_kind, call_hidden, exercise = _test_call(text, where)
        if call_hidden != is_hidden:
            raise InputValueError(f"{where}: a {'hidden' if is_hidden else 'public'} cell must call "
                                  f"{'grade' if is_hidden else 'check'}_{kind}; it calls "
                                  f"{'grade' if call_hidden else 'check'}_{call_kind}")
        if call_kind != kind or exercise not in names:
            raise InputValueError(f"{where}: expected a {kind} check of {' or '.join(map(repr, names))} "
                                  f"(grading.CHECKS); got a {call_kind} check of {exercise!r}")
        if is_hidden:
            hidden_seen.append(exercise)
            points.append(_points_text(mine[exercise].points))
        else:
            points.append(0)
    if sorted(hidden_seen) != sorted(names):
        raise InputValueError(f"{name}: question {q}'s hidden cells grade {sorted(hidden_seen)}; grading.CHECKS "
                              f"says each of {sorted(names)} exactly once")
    return points


def _questions(nb: dict, name: str) -> dict[str, tuple[dict, list[str]]]:
    """{question: (its ``# BEGIN QUESTION`` cell, the sources of its test cells in order)}."""
    found: dict[str, tuple[dict, list[str]]] = {}
    current, in_tests = None, False
    for cell in nb["cells"]:
        text = _source(cell)
        if cell["cell_type"] == "raw" and text.startswith("# BEGIN QUESTION"):
            q = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("name:")), None)
            if q is None or q in found:
                what = "has no 'name:' line" if q is None else f"repeats the question name {q!r}"
                raise InputValueError(f"{name}: a '# BEGIN QUESTION' cell {what}")
            current = q
            found[q] = (cell, [])
        elif cell["cell_type"] == "raw" and text.startswith("# END QUESTION"):
            current, in_tests = None, False
        elif cell["cell_type"] == "raw" and text.startswith("# BEGIN TESTS"):
            in_tests = current is not None
        elif cell["cell_type"] == "raw" and text.startswith("# END TESTS"):
            in_tests = False
        elif in_tests and cell["cell_type"] == "code":
            found[current][1].append(text)
    return found


def stage_notebook(src: Path, dst: Path, wheel: str | None = None) -> None:
    """Write ``src`` (a solution notebook of ``exercises/``) to ``dst`` ready for ``otter assign``: each
    question's points list from :func:`graded_checks`, attached by name whatever the order of the test
    cells — a public ``check_forward/check_backward`` cell gets 0, a hidden ``grade_forward/
    grade_backward("name", …)`` cell gets that name's points (read from the cell's code, never run) —
    and, with ``wheel`` (a file name in ``wheels/`` next to ``dst``), an autograder environment that
    installs that wheel of this project (and so NumPy) plus otter itself. Raises InputValueError for a
    notebook whose questions or hidden checks differ from :data:`POINTS` / :data:`CHECKS`."""
    name = src.stem
    if name not in POINTS:
        raise InputValueError(f"no points for {name!r} in transformer_np.grader.grading.POINTS "
                              f"(known: {', '.join(POINTS)})")
    graded = graded_checks(name)
    nb = json.loads(src.read_text(encoding="utf-8"))
    questions = _questions(nb, name)
    if sorted(questions) != sorted(POINTS[name]):
        raise InputValueError(f"{name}: the notebook's questions {sorted(questions)} differ from POINTS' "
                              f"{sorted(POINTS[name])}")
    for q, (cell, tests) in questions.items():
        pts = _question_points(name, q, tests, graded)
        lines = [line for line in _source(cell).splitlines() if not line.startswith("points:")]
        _set_source(cell, "\n".join(lines + [f"points: {pts}"]))
    for cell in nb["cells"]:
        text = _source(cell)
        if cell["cell_type"] == "raw" and text.startswith("# ASSIGNMENT CONFIG") and wheel:
            lines = text.splitlines()
            lines += ["requirements: requirements.txt", "overwrite_requirements: true",
                      "autograder_files:", f"  - wheels/{wheel}"]
            _set_source(cell, "\n".join(lines))
    dst.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if wheel:
        from importlib.metadata import PackageNotFoundError, version

        try:
            otter_version = version("otter-grader")      # the grading image gets the otter that built the zip
        except PackageNotFoundError:
            raise InputValueError("otter-grader is not installed: pip install 'otter-grader>=7'") from None
        (dst.parent / "requirements.txt").write_text(
            f"otter-grader[grading]=={otter_version}\n/autograder/source/files/wheels/{wheel}\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """``python -m transformer_np.grader.grading stage SRC DST [WHEEL]`` (used by scripts/build_exercises.sh)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4) or args[0] != "stage":
        print("usage: python -m transformer_np.grader.grading stage SRC.ipynb DST.ipynb [WHEEL_FILE_NAME]",
              file=sys.stderr)
        return 2
    try:
        stage_notebook(Path(args[1]), Path(args[2]), args[3] if len(args) == 4 else None)
    except (InputValueError, OSError, ValueError) as e:
        print(f"grading stage: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
