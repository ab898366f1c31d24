r"""The grade of record where a course grades: Gradescope autograders and PrairieLearn external-grader questions.

Both platforms run each submission in a container of their own and post the score to the course's LMS; here
each runs :func:`~transformer_np.grader.grade.grade_notebook` (the grade of record, with the kernel's boundary
around the student's code) on the submitted notebook and writes the platform's results file:

* **Gradescope** (:func:`write_gradescope_zip`, :func:`run_gradescope`): an autograder zip per exercise with
  ``setup.sh`` (a venv with this project's wheel and the NumPy it was built with, pinned) and ``run_autograder``,
  which grades ``<root>/submission/*.ipynb`` and writes ``<root>/results/results.json``: a test per question
  (``name``, ``score``, ``max_score``, ``status``, ``output`` — the one-line cause of a lost mark —
  ``visibility``), the overall ``score``, the notebook's notes as ``output`` and the seed in ``extra_data``.
* **PrairieLearn** (:func:`write_prairielearn_course`, :func:`run_prairielearn`): a course folder with a question
  per exercise (``info.json`` with ``externalGradingOptions``, a ``pl-file-upload`` of the notebook) and, in
  ``serverFilesCourse``, this library and the entrypoint, which grades ``<root>/student/`` and writes
  ``<root>/results/results.json`` (``succeeded``, ``score`` in 0–1, ``message``, ``tests`` with ``name``,
  ``points``, ``max_points``, ``message``).

The root (``/autograder``, ``/grade``) is the argument ``root`` or the environment variable ``AUTOGRADER_ROOT`` /
``GRADE_ROOT``, so the layout can be made in a temporary folder. A student sees per question the points and the
one line the gradebook's ``<q>_why`` holds (the first problem, in words; no hidden case's values). When the
container cannot confine the student's code, nothing is graded: Gradescope gets no results file and reports the
autograder failed (the message is in its stdout), PrairieLearn gets ``"succeeded": false`` with the reason.

    python -m transformer_np.grader.platforms gradescope-zip EXERCISE OUT_DIR WHEEL
    python -m transformer_np.grader.platforms prairielearn-course OUT_DIR EXERCISE ...
    python -m transformer_np.grader.platforms gradescope-run EXERCISE        (inside the container)
    python -m transformer_np.grader.platforms prairielearn-run EXERCISE      (inside the container)
"""

from __future__ import annotations

import json
import os
import stat
import sys
import uuid
import zipfile
from pathlib import Path
from typing import Any

from ..errors import InputValueError
from ..worksheets.prairielearn import copy_library
from .grading import POINTS

__all__ = ["find_notebook", "gradescope_results", "prairielearn_results", "run_gradescope", "run_prairielearn",
           "write_gradescope_zip", "write_prairielearn_course"]

GRADESCOPE_ROOT = "/autograder"
PRAIRIELEARN_ROOT = "/grade"
PRAIRIELEARN_IMAGE = "prairielearn/grader-python"
PRAIRIELEARN_TIMEOUT = 300                     # seconds; the grade of record's own submission limit is below it
_UUID_NS = uuid.UUID("5b1f3c1e-47a0-4c6e-9a51-7472616e7366")   # fixed: a rebuilt question keeps its uuid


def _exercise(exercise: str) -> str:
    if exercise not in POINTS:
        raise InputValueError(f"exercise must be one of {', '.join(POINTS)}; got {exercise!r}")
    return exercise


def find_notebook(folder: Path, exercise: str) -> Path | None:
    """The submitted notebook in ``folder``: ``<exercise>.ipynb`` if present, else the only ``.ipynb`` there
    (searched recursively, hidden files left out); None when there is none or more than one to choose from."""
    named = folder / f"{exercise}.ipynb"
    if named.is_file():
        return named
    found = sorted(p for p in folder.rglob("*.ipynb")
                   if not any(part.startswith(".") for part in p.relative_to(folder).parts))
    return found[0] if len(found) == 1 else None


def _no_notebook(folder: Path, exercise: str) -> str:
    found = sorted(p.name for p in folder.rglob("*.ipynb")) if folder.is_dir() else []
    if found:
        return (f"no notebook graded: expected {exercise}.ipynb, or a single .ipynb file; the submission has "
                f"{', '.join(found[:5])}")
    return f"no notebook graded: the submission holds no .ipynb file (expected {exercise}.ipynb)"


def _notes(grade: Any) -> str:
    lines = [f"{grade.score:g} / {grade.out_of:g} points (the grade of record)"]   # no seed: it remakes the cases
    if grade.error:
        lines.append(f"not graded: {grade.error}")
    lines.extend(grade.notes)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- results files
def gradescope_results(grade: Any, visibility: str = "visible") -> dict:
    """The ``results.json`` Gradescope documents for one :class:`~transformer_np.grader.grade.SubmissionGrade`:
    one test per question (earned points, the question's points, ``passed``/``failed``, the one-line cause)."""
    why = grade.why()
    tests = [{"name": q, "score": earned, "max_score": out_of,
              "status": "passed" if earned >= out_of else "failed",
              "output": why.get(q, "") or "full marks", "visibility": visibility}
             for q, (earned, out_of) in grade.questions().items()]
    return {"score": float(grade.score), "output": _notes(grade), "visibility": visibility,
            "stdout_visibility": "hidden", "tests": tests,
            "extra_data": {"seed": grade.seed, "sandbox": grade.sandbox, "exercise": grade.assignment}}


def prairielearn_results(grade: Any) -> dict:
    """The ``results.json`` PrairieLearn documents for one graded submission: ``score`` is the fraction earned."""
    why = grade.why()
    tests = [{"name": q, "points": earned, "max_points": out_of, "message": why.get(q, "") or "full marks"}
             for q, (earned, out_of) in grade.questions().items()]
    score = grade.score / grade.out_of if grade.out_of else 0.0
    return {"succeeded": True, "gradable": True, "score": min(1.0, max(0.0, float(score))),
            "message": _notes(grade), "tests": tests}


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def _grade(notebook: Path | None, folder: Path, exercise: str, seed: int | None) -> Any:
    from .grade import SubmissionGrade, grade_notebook

    if notebook is None:
        return SubmissionGrade(str(folder), exercise, 0.0, float(sum(POINTS[exercise].values())), seed=seed,
                               error=_no_notebook(folder, exercise), flags=["unreadable"])
    return grade_notebook(notebook, exercise, seed=seed, sandbox=True)


def run_gradescope(exercise: str, root: str | os.PathLike | None = None, *, seed: int | None = None) -> dict:
    """Grade ``<root>/submission`` and write ``<root>/results/results.json`` (root: ``AUTOGRADER_ROOT`` or
    ``/autograder``). Raises :class:`~transformer_np.grader.confine.ConfinementUnavailable` (and writes nothing)
    when the container cannot confine the student's code."""
    _exercise(exercise)
    base = Path(root or os.environ.get("AUTOGRADER_ROOT") or GRADESCOPE_ROOT)
    folder = base / "submission"
    grade = _grade(find_notebook(folder, exercise) if folder.is_dir() else None, folder, exercise, seed)
    results = gradescope_results(grade)
    _write_json(base / "results" / "results.json", results)
    return results


def run_prairielearn(exercise: str, root: str | os.PathLike | None = None, *, seed: int | None = None) -> dict:
    """Grade ``<root>/student`` and write ``<root>/results/results.json`` (root: ``GRADE_ROOT`` or ``/grade``).
    When the container cannot confine the student's code the file says ``"succeeded": false`` and why."""
    from .confine import ConfinementUnavailable

    _exercise(exercise)
    base = Path(root or os.environ.get("GRADE_ROOT") or PRAIRIELEARN_ROOT)
    folder = base / "student"
    try:
        grade = _grade(find_notebook(folder, exercise) if folder.is_dir() else None, folder, exercise, seed)
        results = prairielearn_results(grade)
    except ConfinementUnavailable as e:
        results = {"succeeded": False, "gradable": False, "score": 0.0, "tests": [],
                   "message": f"not graded (the grader could not run here): {e}"}
    _write_json(base / "results" / "results.json", results)
    return results


# ----------------------------------------------------------------------------- building
_SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
set -euo pipefail
apt-get install -y python3 python3-venv python3-pip
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --no-cache-dir -r /autograder/source/requirements.txt
"""

_RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: the grade of record of {exercise} on /autograder/submission,
# written to /autograder/results/results.json. AUTOGRADER_ROOT and AUTOGRADER_PYTHON override the paths.
set -euo pipefail
export AUTOGRADER_ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
exec "${{AUTOGRADER_PYTHON:-/autograder/venv/bin/python}}" -m transformer_np.grader.platforms gradescope-run {exercise}
"""


def _numpy_pin() -> str:
    import numpy

    return f"numpy=={numpy.__version__}"


def write_gradescope_zip(exercise: str, out_dir: str | os.PathLike, wheel: str | os.PathLike) -> Path:
    """Write ``out_dir/<exercise>-gradescope.zip``: ``setup.sh``, ``run_autograder``, ``requirements.txt``
    (the wheel and ``numpy==`` the version this build ran with) and ``wheels/<the wheel>``."""
    _exercise(exercise)
    wheel = Path(wheel)
    if not wheel.is_file() or wheel.suffix != ".whl":
        raise InputValueError(f"wheel must be a .whl file of this project; got {str(wheel)!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{exercise}-gradescope.zip"
    requirements = f"{_numpy_pin()}\n/autograder/source/wheels/{wheel.name}\n"

    def add(z: zipfile.ZipFile, name: str, data: bytes, executable: bool = False) -> None:
        info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, data)

    with zipfile.ZipFile(path, "w") as z:
        add(z, "setup.sh", _SETUP_SH.encode(), executable=True)
        add(z, "run_autograder", _RUN_AUTOGRADER.format(exercise=exercise).encode(), executable=True)
        add(z, "requirements.txt", requirements.encode())
        add(z, f"wheels/{wheel.name}", wheel.read_bytes())
    return path


_PL_ENTRYPOINT = """#!/usr/bin/env python3
# PrairieLearn's external grader runs this in the question's container: the grade of record of the exercise
# named in /grade/tests/exercise.txt on the notebook in /grade/student, written to /grade/results/results.json.
# GRADE_ROOT overrides /grade. The library comes from serverFilesCourse (it needs NumPy only).
import os
import sys
from pathlib import Path

root = Path(os.environ.get("GRADE_ROOT") or "/grade")
sys.path.insert(0, str(root / "serverFilesCourse"))
from transformer_np.grader.platforms import run_prairielearn  # noqa: E402

exercise = (root / "tests" / "exercise.txt").read_text(encoding="utf-8").strip()
run_prairielearn(exercise, root)
"""

_PL_QUESTION = """<pl-question-panel>
  <p>Upload your completed notebook <code>{exercise}.ipynb</code>. It is graded by running your functions on
  hidden cases in a restricted process; each question's points and, for a lost mark, its first cause are shown
  after grading.</p>
</pl-question-panel>

<pl-file-upload file-names="{exercise}.ipynb"></pl-file-upload>

<pl-submission-panel>
  <pl-external-grader-results></pl-external-grader-results>
  <pl-file-preview></pl-file-preview>
</pl-submission-panel>
"""


def write_prairielearn_course(out_dir: str | os.PathLike, exercises: list[str] | None = None) -> Path:
    """Write a PrairieLearn course folder ``out_dir``: ``questions/<exercise>/`` (``info.json``,
    ``question.html``, ``tests/exercise.txt``) per exercise (default: all) and ``serverFilesCourse/``
    (``transformer_np/`` and the entrypoint ``transformer_np_grade.py``). Returns ``out_dir``."""
    names = [_exercise(e) for e in (exercises or list(POINTS))]
    out = Path(out_dir)
    server = out / "serverFilesCourse"
    server.mkdir(parents=True, exist_ok=True)
    copy_library(server)
    entry = server / "transformer_np_grade.py"
    entry.write_text(_PL_ENTRYPOINT, encoding="utf-8")
    entry.chmod(0o755)
    for name in names:
        q = out / "questions" / name
        (q / "tests").mkdir(parents=True, exist_ok=True)
        info = {"uuid": str(uuid.uuid5(_UUID_NS, f"exercise/{name}")), "type": "v3",
                "title": f"Exercise {name}", "topic": "Transformer encoder", "tags": ["transformer_np"],
                "singleVariant": True, "gradingMethod": "External",
                "externalGradingOptions": {"enabled": True, "image": PRAIRIELEARN_IMAGE,
                                           "serverFilesCourse": ["transformer_np/", "transformer_np_grade.py"],
                                           "entrypoint": "/grade/serverFilesCourse/transformer_np_grade.py",
                                           "timeout": PRAIRIELEARN_TIMEOUT}}
        (q / "info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        (q / "question.html").write_text(_PL_QUESTION.format(exercise=name), encoding="utf-8")
        (q / "tests" / "exercise.txt").write_text(name + "\n", encoding="utf-8")
    return out


# ----------------------------------------------------------------------------- command line
_USAGE = ("usage: python -m transformer_np.grader.platforms gradescope-zip EXERCISE OUT_DIR WHEEL | "
          "prairielearn-course OUT_DIR [EXERCISE ...] | gradescope-run EXERCISE | prairielearn-run EXERCISE")


def main(argv: list[str] | None = None) -> int:
    from .confine import ConfinementUnavailable

    args = list(sys.argv[1:] if argv is None else argv)
    what = args[0] if args else ""
    try:
        if what == "gradescope-zip" and len(args) == 4:
            print(write_gradescope_zip(args[1], args[2], args[3]))
        elif what == "prairielearn-course" and len(args) >= 2:
            print(write_prairielearn_course(args[1], args[2:] or None))
        elif what == "gradescope-run" and len(args) == 2:
            results = run_gradescope(args[1])
            print(f"graded: {results['score']:g} points")
        elif what == "prairielearn-run" and len(args) == 2:
            results = run_prairielearn(args[1])
            print(f"graded: score {results['score']:g}")
        else:
            print(_USAGE, file=sys.stderr)
            return 2
    except (InputValueError, ConfinementUnavailable) as e:
        print(f"transformer_np.grader.platforms: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
