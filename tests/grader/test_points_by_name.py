"""Points attach to named checks, not to positions (issue 35, item 3).

Exercise 6 orders its test cells public Post-LN, hidden Post-LN, public Pre-LN, hidden Pre-LN; staging
used to write ``points: [0, 0, 1, 1]`` (public checks assumed first), so the hidden Post-LN check carried
nothing and a public, fixed case carried a point. Here every staged notebook is read back: each test
cell's call and exercise name are found in its code (a regular expression, independent of the staging
code's parser) and its points compared with the points of the check it names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from transformer_np.course import grading
from transformer_np.course.exercises import EXERCISE_NAMES
from transformer_np.errors import InputValueError

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p.stem for p in (REPO / "exercises").glob("[0-9]*.ipynb"))
_CALL = re.compile(r'^(?!\s*#)\s*(check|grade)_(forward|backward)\("(\w+)"', flags=re.M)


def _staged_test_cells(path: Path) -> dict[str, tuple[list, list[tuple[str, str, str]]]]:
    """{question: (its points list, [(check|grade, kind, exercise) per test cell, in order])}."""
    cells = json.loads(path.read_text())["cells"]
    found, q, in_tests = {}, None, False
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "raw" and text.startswith("# BEGIN QUESTION"):
            q = re.search(r"^name: (\w+)$", text, flags=re.M).group(1)
            found[q] = (json.loads(re.search(r"^points: (.*)$", text, flags=re.M).group(1)), [])
        elif cell["cell_type"] == "raw" and text.startswith("# BEGIN TESTS"):
            in_tests = True
        elif cell["cell_type"] == "raw" and text.startswith("# END TESTS"):
            in_tests = False
        elif in_tests and cell["cell_type"] == "code":
            (call,) = _CALL.findall(text)
            assert (call[0] == "grade") == text.startswith("# HIDDEN"), text     # otter hides "# HIDDEN" cells
            found[q][1].append(call)
    return found


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_each_hidden_cell_carries_the_points_of_the_check_it_names(name, tmp_path):
    staged = tmp_path / f"{name}.ipynb"
    grading.stage_notebook(REPO / "exercises" / f"{name}.ipynb", staged)
    questions = _staged_test_cells(staged)
    assert sorted(questions) == sorted(grading.POINTS[name])
    for q, (points, calls) in questions.items():
        kind, names = grading.CHECKS[name][q]
        assert len(points) == len(calls), (name, q, points, calls)
        hidden = []
        for pts, (which, call_kind, exercise) in zip(points, calls):
            assert call_kind == kind and exercise in names, (name, q, which, call_kind, exercise)
            if which == "check":
                assert pts == 0, f"{name} {q}: the public check of {exercise} carries {pts} points"
            else:
                hidden.append(exercise)
                # exact: POINTS are small integers shared among 1 or 2 names (a half is exact in binary)
                assert pts == grading.POINTS[name][q] / len(names), \
                    f"{name} {q}: the hidden check of {exercise} carries {pts}, not its share"
        assert sorted(hidden) == sorted(names), (name, q, hidden)
        assert sum(points) == grading.POINTS[name][q]


def test_graded_checks_share_each_question_among_its_names():
    for name in NOTEBOOKS:
        checks = grading.graded_checks(name)
        want = [(q, kind, ex) for q, (kind, names) in grading.CHECKS[name].items() for ex in names]
        assert [(c.question, c.kind, c.exercise) for c in checks] == want
        assert all(c.exercise in EXERCISE_NAMES and c.kind in ("forward", "backward") for c in checks)
        for q, total in grading.POINTS[name].items():
            shares = [c.points for c in checks if c.question == q]
            assert len(set(shares)) == 1 and sum(shares) == total, (name, q, shares)
    six = grading.graded_checks("06_encoder_layer")
    assert [(c.question, c.exercise, c.points) for c in six] == [
        ("q1", "encoder_layer_post", 1), ("q1", "encoder_layer_pre", 1),
        ("q2", "encoder_layer_post", 1), ("q2", "encoder_layer_pre", 1)]
    assert "GradedCheck" in grading.__all__ and "graded_checks" in grading.__all__
    with pytest.raises(InputValueError, match="01_softmax.*06_encoder_layer.*'07_nope'"):
        grading.graded_checks("07_nope")


def _with_cells(tmp_path: Path, name: str, edit) -> Path:
    nb = json.loads((REPO / "exercises" / f"{name}.ipynb").read_text())
    nb["cells"] = edit(nb["cells"])
    path = tmp_path / "src" / f"{name}.ipynb"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(nb))
    return path


def _src(cell) -> str:
    return "".join(cell["source"])


def test_the_points_follow_the_names_whatever_the_cell_order(tmp_path):
    """Exercise 6 with its q1 test cells reversed: the points move with the cells."""
    def reverse_q1_tests(cells):
        start = next(i for i, c in enumerate(cells) if _src(c).startswith("# BEGIN TESTS"))
        end = next(i for i, c in enumerate(cells) if _src(c).startswith("# END TESTS"))
        return cells[:start + 1] + cells[start + 1:end][::-1] + cells[end:]

    src = _with_cells(tmp_path, "06_encoder_layer", reverse_q1_tests)
    grading.stage_notebook(src, tmp_path / "06_encoder_layer.ipynb")
    points, calls = _staged_test_cells(tmp_path / "06_encoder_layer.ipynb")["q1"]
    assert calls == [("grade", "forward", "encoder_layer_pre"), ("check", "forward", "encoder_layer_pre"),
                     ("grade", "forward", "encoder_layer_post"), ("check", "forward", "encoder_layer_post")]
    assert points == [1, 0, 1, 0]


@pytest.mark.parametrize("change, says", [
    (lambda s: s.replace('grade_forward("encoder_layer_pre"', 'grade_forward("encoder_layer_post"'),
     "each of"),                                                   # a name graded twice, the other never
    (lambda s: s.replace('grade_forward("encoder_layer_pre"', 'grade_forward("mha"'), "got a forward check of 'mha'"),
    (lambda s: s.replace('grade_forward("encoder_layer_pre"', 'grade_backward("encoder_layer_pre"'),
     "got a backward check"),
    (lambda s: s.replace("# HIDDEN", "# hidden?") if 'grade_forward("encoder_layer_pre"' in s else s,
     "a public cell must call check_forward"),
])
def test_a_question_whose_hidden_cells_differ_from_checks_is_refused(tmp_path, change, says):
    def edit(cells):
        return [{**c, "source": change(_src(c))} if c["cell_type"] == "code" else c for c in cells]

    src = _with_cells(tmp_path, "06_encoder_layer", edit)
    with pytest.raises(InputValueError, match=f"06_encoder_layer: question q1.*{re.escape(says)}"):
        grading.stage_notebook(src, tmp_path / "out.ipynb")


def test_a_missing_hidden_cell_is_refused(tmp_path):
    def drop_hidden_pre(cells):
        return [c for c in cells if 'grade_backward("encoder_layer_pre"' not in _src(c)]

    src = _with_cells(tmp_path, "06_encoder_layer", drop_hidden_pre)
    with pytest.raises(InputValueError, match=r"question q2's hidden cells grade \['encoder_layer_post'\]"):
        grading.stage_notebook(src, tmp_path / "out.ipynb")
