"""The grade of record on Gradescope and PrairieLearn (issue 47, items 1 and 2), run in laid-out temporary roots.

For every exercise, three submissions go through each platform's entrypoint as the platform runs it
(Gradescope: ``bash <root>/run_autograder`` with the working folder at the root; PrairieLearn: the entrypoint
script of ``serverFilesCourse`` with the question's ``tests/`` at ``<root>/tests``): the solution notebook (full
marks), the untouched student notebook (0) and an attack (the library imported from the checkout's folder on
the disk, then the notebook's process killing its parent: nothing gained, and the results file is still
written). Each ``results.json`` is validated against a schema written from the platform's documentation:

* Gradescope, "Autograder Specifications" (gradescope-autograders.readthedocs.io/en/latest/specs/, "Output
  format"): top level ``score`` (number), ``output`` (string), ``visibility`` and ``stdout_visibility``
  (``hidden``/``after_due_date``/``after_published``/``visible``), ``extra_data`` (object), ``tests`` (array);
  each test ``name`` (string), ``score`` and ``max_score`` (numbers), ``status`` (``passed``/``failed``),
  ``output`` (string), ``visibility`` (as above).
* PrairieLearn, "External Grading" (prairielearn.readthedocs.io/en/latest/externalGrading/, "Grading
  results"): ``succeeded`` (boolean), ``gradable`` (boolean), ``score`` (number in [0, 1]), ``message``
  (string), ``tests`` (array); each test ``name`` (string), ``points`` and ``max_points`` (numbers),
  ``message`` (string).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from transformer_np.errors import InputValueError
from transformer_np.grader.grading import POINTS
from transformer_np.grader.platforms import find_notebook, write_gradescope_zip, write_prairielearn_course

REPO = Path(__file__).resolve().parents[2]
EXERCISE = "01_softmax"
EXERCISES = sorted(POINTS)                      # every exercise, through both platforms

VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
GRADESCOPE_SCHEMA = {
    "type": "object", "required": ["score", "tests"],
    "properties": {
        "score": {"type": "number"}, "output": {"type": "string"}, "visibility": VISIBILITY,
        "stdout_visibility": VISIBILITY, "extra_data": {"type": "object"}, "execution_time": {"type": "number"},
        "tests": {"type": "array", "items": {
            "type": "object", "required": ["name", "score", "max_score", "output", "visibility"],
            "properties": {"name": {"type": "string"}, "score": {"type": "number"},
                           "max_score": {"type": "number"}, "status": {"enum": ["passed", "failed"]},
                           "output": {"type": "string"}, "visibility": VISIBILITY},
            "additionalProperties": False}}},
    "additionalProperties": False}
PRAIRIELEARN_SCHEMA = {
    "type": "object", "required": ["succeeded", "score", "message", "tests"],
    "properties": {
        "succeeded": {"type": "boolean"}, "gradable": {"type": "boolean"},
        "score": {"type": "number", "minimum": 0, "maximum": 1}, "message": {"type": "string"},
        "tests": {"type": "array", "items": {
            "type": "object", "required": ["name", "points", "max_points", "message"],
            "properties": {"name": {"type": "string"}, "points": {"type": "number"},
                           "max_points": {"type": "number"}, "message": {"type": "string"}},
            "additionalProperties": False}}},
    "additionalProperties": False}

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def validate(value, schema, where="results.json") -> None:
    """A small JSON-schema check (type, required, properties, additionalProperties, items, enum, bounds)."""
    kind = schema.get("type")
    if kind == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: not a number: {value!r}"
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), f"{where}: out of range"
    elif kind:
        assert isinstance(value, _TYPES[kind]), f"{where}: expected {kind}, got {value!r}"
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"
    for key in schema.get("required", []):
        assert key in value, f"{where}: missing {key!r}"
    props = schema.get("properties", {})
    if isinstance(value, dict) and props:
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(props), f"{where}: undocumented fields {set(value) - set(props)}"
        for key, sub in props.items():
            if key in value:
                validate(value[key], sub, f"{where}.{key}")
    if "items" in schema:
        for i, item in enumerate(value):
            validate(item, schema["items"], f"{where}[{i}]")


def test_the_validator_can_fail():
    with pytest.raises(AssertionError):
        validate({"score": 1.0, "tests": [{"name": "q1", "score": 1, "max_score": 1, "output": "",
                                           "visibility": "shown"}]}, GRADESCOPE_SCHEMA)
    with pytest.raises(AssertionError):
        validate({"succeeded": True, "score": 1.5, "message": "", "tests": []}, PRAIRIELEARN_SCHEMA)


# ----------------------------------------------------------------------------- the three submissions
def _cells(name: str) -> list[str]:
    nb = json.loads((REPO / "exercises" / f"{name}.ipynb").read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _student(name: str) -> list[str]:
    return [re.sub(r"( *)# BEGIN SOLUTION\n.*?# END SOLUTION\n?", r"\1...\n", src, flags=re.S)
            for src in _cells(name)]


ATTACK = [f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
          "from transformer_np.ops.softmax import softmax_forward, softmax_backward\n",
          "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"]
WHICH = ("solution", "untouched", "attack")


def submission(exercise: str, which: str) -> list[str]:
    """The solution notebook's cells, the student version's (solutions cut), or the student version with the
    attack cells appended (import the library from the checkout, then kill the grader)."""
    return {"solution": _cells, "untouched": _student}.get(which, lambda e: _student(e) + ATTACK)(exercise)


SUBMISSIONS = {which: submission(EXERCISE, which) for which in WHICH}


def _notebook(path: Path, cells: list[str]) -> None:
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
          "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                     "source": src.splitlines(keepends=True)} for src in cells]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb), encoding="utf-8")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOGRADER_", "GRADE_ROOT"))}
    env["PYTHONPATH"] = str(REPO)                   # stands for the wheel setup.sh installs
    env.update(extra)
    return env


def _check_marks(which: str, results_points: dict[str, tuple[float, float]], outputs: dict[str, str],
                 exercise: str = EXERCISE) -> None:
    full = POINTS[exercise]
    assert {q: m for q, (_, m) in results_points.items()} == {q: float(p) for q, p in full.items()}
    earned = {q: e for q, (e, _) in results_points.items()}
    if which == "solution":
        assert earned == {q: float(p) for q, p in full.items()}, outputs
        assert all(o == "full marks" for o in outputs.values()), outputs
    else:
        assert all(e == 0 for e in earned.values()), (which, outputs)
        assert all(o and "\n" not in o and o != "full marks" for o in outputs.values()), outputs


@pytest.fixture(scope="module")
def gradescope_zips(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gs")
    wheel = out / "transformer_np-0.0.0-py3-none-any.whl"      # a stand-in: the test runs on the checkout
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("transformer_np-0.0.0.dist-info/METADATA", "Name: transformer_np\n")
    return {e: write_gradescope_zip(e, out / e, wheel) for e in EXERCISES}


@pytest.fixture(scope="module")
def gradescope_zip(gradescope_zips) -> Path:
    return gradescope_zips[EXERCISE]


def test_the_gradescope_zip_holds_setup_and_run_autograder_at_its_root(gradescope_zip):
    import numpy

    with zipfile.ZipFile(gradescope_zip) as z:
        names = set(z.namelist())
        assert {"setup.sh", "run_autograder", "requirements.txt",
                "wheels/transformer_np-0.0.0-py3-none-any.whl"} == names
        assert z.getinfo("run_autograder").external_attr >> 16 & 0o111        # executable
        req = z.read("requirements.txt").decode().split()
        assert f"numpy=={numpy.__version__}" in req
        assert "/autograder/source/wheels/transformer_np-0.0.0-py3-none-any.whl" in req
        assert "requirements.txt" in z.read("setup.sh").decode()


@pytest.mark.parametrize("exercise", EXERCISES)
@pytest.mark.parametrize("which", WHICH)
def test_gradescope_run_autograder_grades_in_a_laid_out_root(which, exercise, gradescope_zips, tmp_path):
    root = tmp_path / "autograder"
    with zipfile.ZipFile(gradescope_zips[exercise]) as z:
        z.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")   # as Gradescope's image build does
    (root / "results").mkdir()
    _notebook(root / "submission" / f"{exercise}.ipynb", submission(exercise, which))
    proc = subprocess.run(["bash", str(root / "run_autograder")], cwd=root, capture_output=True, text=True,
                          env=_env(AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable), timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    validate(results, GRADESCOPE_SCHEMA)
    tests = results["tests"]
    _check_marks(which, {t["name"]: (t["score"], t["max_score"]) for t in tests},
                 {t["name"]: t["output"] for t in tests}, exercise)
    assert results["score"] == sum(t["score"] for t in tests)
    assert results["extra_data"]["sandbox"] == "kernel"
    seed = str(results["extra_data"]["seed"])       # the seed remakes the hidden cases: never shown to the student
    assert seed not in results["output"] and not any(seed in t["output"] for t in tests)


def _pl_root(course: Path, tmp_path: Path, exercise: str = EXERCISE) -> Path:
    """/grade as PrairieLearn's external grader lays it out for a question of ``course``."""
    root = tmp_path / "grade"
    shutil.copytree(course / "serverFilesCourse", root / "serverFilesCourse")
    shutil.copytree(course / "questions" / exercise / "tests", root / "tests")
    (root / "results").mkdir()
    (root / "data").mkdir()
    (root / "data" / "data.json").write_text("{}", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    return write_prairielearn_course(tmp_path_factory.mktemp("pl") / "course", EXERCISES)


def test_the_prairielearn_course_has_an_externally_graded_upload_question_per_exercise(course):
    for name in (EXERCISE, "02_layernorm"):
        q = course / "questions" / name
        info = json.loads((q / "info.json").read_text(encoding="utf-8"))
        opts = info["externalGradingOptions"]
        assert info["gradingMethod"] == "External" and opts["enabled"] is True
        assert opts["image"] and opts["timeout"] > 0
        assert opts["entrypoint"].startswith("/grade/serverFilesCourse/")
        entry = course / "serverFilesCourse" / opts["entrypoint"].removeprefix("/grade/serverFilesCourse/")
        assert entry.is_file() and os.access(entry, os.X_OK)
        assert f'<pl-file-upload file-names="{name}.ipynb">' in (q / "question.html").read_text(encoding="utf-8")
        assert (q / "tests" / "exercise.txt").read_text(encoding="utf-8").strip() == name
    uuids = {json.loads((course / "questions" / n / "info.json").read_text())["uuid"]
             for n in (EXERCISE, "02_layernorm")}
    assert len(uuids) == 2
    assert (course / "serverFilesCourse" / "transformer_np" / "grader" / "grade.py").is_file()


@pytest.mark.parametrize("exercise", EXERCISES)
@pytest.mark.parametrize("which", WHICH)
def test_prairielearn_entrypoint_grades_in_a_laid_out_root(which, exercise, course, tmp_path):
    root = _pl_root(course, tmp_path, exercise)
    _notebook(root / "student" / f"{exercise}.ipynb", submission(exercise, which))
    env = _env(GRADE_ROOT=str(root))
    env.pop("PYTHONPATH")                             # the library comes from serverFilesCourse alone
    proc = subprocess.run([sys.executable, str(root / "serverFilesCourse" / "transformer_np_grade.py")],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    validate(results, PRAIRIELEARN_SCHEMA)
    assert results["succeeded"] is True
    tests = results["tests"]
    _check_marks(which, {t["name"]: (t["points"], t["max_points"]) for t in tests},
                 {t["name"]: t["message"] for t in tests}, exercise)
    total = sum(t["points"] for t in tests) / sum(t["max_points"] for t in tests)
    assert abs(results["score"] - total) < 1e-12


def test_a_missing_or_ambiguous_notebook_is_named_and_scores_zero(tmp_path):
    from transformer_np.grader.platforms import run_gradescope

    assert find_notebook(tmp_path, EXERCISE) is None
    for name in ("a.ipynb", "b.ipynb"):
        _notebook(tmp_path / "submission" / name, ["x = 1"])
    assert find_notebook(tmp_path / "submission", EXERCISE) is None
    results = run_gradescope(EXERCISE, tmp_path)
    validate(results, GRADESCOPE_SCHEMA)
    assert results["score"] == 0
    assert "a.ipynb" in results["output"] and f"{EXERCISE}.ipynb" in results["output"]
    with pytest.raises(InputValueError, match="exercise must be one of"):
        run_gradescope("07_nope", tmp_path)


def test_without_the_boundary_nothing_is_graded_and_the_platform_is_told(tmp_path, monkeypatch, capsys):
    from transformer_np.grader import confine, platforms

    monkeypatch.setattr(confine, "probe", lambda: ["Landlock (test)"])
    _notebook(tmp_path / "gs" / "submission" / f"{EXERCISE}.ipynb", SUBMISSIONS["solution"])
    monkeypatch.setenv("AUTOGRADER_ROOT", str(tmp_path / "gs"))
    assert platforms.main(["gradescope-run", EXERCISE]) == 2
    assert "Landlock (test)" in capsys.readouterr().err
    assert not (tmp_path / "gs" / "results" / "results.json").exists()     # Gradescope reports a failed run
    _notebook(tmp_path / "pl" / "student" / f"{EXERCISE}.ipynb", SUBMISSIONS["solution"])
    results = platforms.run_prairielearn(EXERCISE, tmp_path / "pl")
    validate(results, PRAIRIELEARN_SCHEMA)
    assert results["succeeded"] is False and results["score"] == 0 and "Landlock (test)" in results["message"]
    assert json.loads((tmp_path / "pl" / "results" / "results.json").read_text()) == results
