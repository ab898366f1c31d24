r"""Grading the course exercises: hidden cases drawn at grading time, and the one table of points.

The assignments in ``exercises/`` have, per question, a **public** check (``check_forward`` /
``check_backward`` of :mod:`transformer_np.course.exercises`: fixed cases the student sees and loops on,
worth 0 points) and a **hidden** check that carries the question's points (an otter hidden test: it is
not in the student's notebook). The hidden checks call :func:`grade_forward` / :func:`grade_backward`,
which run the same checks on the public cases *and* on cases drawn at grading time from a seed
(:func:`grading_seed`) — shapes varied (n_q ≠ n_k, n ≠ d, several heads, a batch larger than one),
so outputs stored for the public inputs do not pass. As in the public checks:

- a backward is graded against the library's gradients when the student's forward is right, and
  against finite differences of the student's *own* forward when that forward is wrong but recognisably
  the op (error carried forward: a forward slip costs the forward's points only);
- feedback names the problem in words; the corrected formula is added only with
  ``TRANSFORMER_NP_FEEDBACK=instructor`` (or read ``Feedback.instructor_text``).

Under otter these checks run in the student's own kernel, next to the student's code: their score is
formative (code in the notebook can change it, e.g. by calling the library or patching this module).
The grade of record is ``transformer-np grade``: the student's cells run in a separate process where
this library cannot be imported, and the grader calls the student's functions through proxies, with the
same :func:`~transformer_np.course.exercises.run_forward` / ``run_backward`` checks and
:func:`graded_checks`' points.

:data:`POINTS` is the one table of points: ``scripts/build_exercises.sh`` writes it into each
notebook's questions when it builds the autograder, and the instructors' page prints it.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import InputValueError
from ._hidden_cases import hidden_cases
from .exercises import Feedback, _exercise, run_backward, run_forward

__all__ = ["CHECKS", "POINTS", "SEED_ENV", "grade_backward", "grade_forward", "grading_seed", "points_table",
           "stage_notebook"]

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


def stage_notebook(src: Path, dst: Path, wheel: str | None = None) -> None:
    """Write ``src`` (a solution notebook of ``exercises/``) to ``dst`` ready for ``otter assign``: each
    question's points from :data:`POINTS` (0 for each public check, the question's points shared by its
    hidden checks) and, with ``wheel`` (a file name in ``wheels/`` next to ``dst``), an autograder
    environment that installs that wheel of this project (and so NumPy) plus otter itself."""
    name = src.stem
    if name not in POINTS:
        raise InputValueError(f"no points for {name!r} in transformer_np.course.grading.POINTS "
                              f"(known: {', '.join(POINTS)})")
    nb = json.loads(src.read_text(encoding="utf-8"))
    questions = POINTS[name]
    seen = []
    for cell in nb["cells"]:
        text = _source(cell)
        if cell["cell_type"] == "raw" and text.startswith("# BEGIN QUESTION"):
            lines = [line for line in text.splitlines() if not line.startswith("points:")]
            q = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("name:"))
            if q not in questions:
                raise InputValueError(f"{name}: question {q!r} has no points in POINTS[{name!r}]")
            n = len(CHECKS[name][q][1])
            share = questions[q] / n
            pts = [0] * n + [int(share) if share == int(share) else share] * n
            _set_source(cell, "\n".join(lines + [f"points: {pts}"]))
            seen.append(q)
        elif cell["cell_type"] == "raw" and text.startswith("# ASSIGNMENT CONFIG") and wheel:
            lines = [line for line in text.splitlines()]
            lines += ["requirements: requirements.txt", "overwrite_requirements: true",
                      "autograder_files:", f"  - wheels/{wheel}"]
            _set_source(cell, "\n".join(lines))
    if sorted(seen) != sorted(questions):
        raise InputValueError(f"{name}: the notebook's questions {sorted(seen)} differ from POINTS' "
                              f"{sorted(questions)}")
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
    """``python -m transformer_np.course.grading stage SRC DST [WHEEL]`` (used by scripts/build_exercises.sh)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4) or args[0] != "stage":
        print("usage: python -m transformer_np.course.grading stage SRC.ipynb DST.ipynb [WHEEL_FILE_NAME]",
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
