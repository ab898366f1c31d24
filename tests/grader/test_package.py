"""The grader is its own package; every old import path under ``transformer_np.course`` still imports it."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

OLD_TO_NEW = {
    "course.sandbox": "grader.sandbox", "course.grade": "grader.grade", "course.grading": "grader.grading",
    "course.exercises": "grader.exercises", "course.feedback": "grader.feedback",
    "course.similarity": "grader.similarity", "course._calling": "grader.calling",
    "course._diagnosis": "grader.diagnosis", "course._exercise_base": "grader.exercise_base",
    "course._exercise_specs": "grader.specs", "course._specs_blocks": "grader.specs_blocks",
    "course._specs_ops": "grader.specs_ops", "course._hidden_cases": "grader.hidden_cases",
    "course._source": "grader.source", "course._sandbox_child": "grader.child",
}


@pytest.mark.parametrize("old", sorted(OLD_TO_NEW))
def test_old_path_imports_the_same_module(old):
    old_mod = importlib.import_module(f"transformer_np.{old}")
    new_mod = importlib.import_module(f"transformer_np.{OLD_TO_NEW[old]}")
    assert old_mod is new_mod


def test_old_package_exports_still_work():
    from transformer_np.course import grade_notebook, grade_submissions
    from transformer_np.grader import grade

    assert grade_notebook is grade.grade_notebook and grade_submissions is grade.grade_submissions


def test_lesson_studies_do_not_load_the_grader():
    """course/ (the lesson studies) and grader/ never import each other: importing a study loads no grader module."""
    code = ("import sys, transformer_np.course.trace, transformer_np.course.gradflow; "
            "print(sorted(m for m in sys.modules if m.startswith('transformer_np.grader')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
