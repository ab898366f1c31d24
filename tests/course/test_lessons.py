"""The lesson notebooks teach (issue 15): objectives first, a recap and 2-4 exercises with collapsed answers last,
"predict, then run" prompts, prose between plots, terms defined, and no figure without a word about it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ["02_gradient_flow", "03_contextual_embeddings", "04_training_stability", "05a_encoder_anatomy",
           "05b_encoder_anatomy"]


def _cells(name):
    return json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text(encoding="utf-8"))["cells"]


def _src(cell) -> str:
    return "".join(cell["source"])


def _is_plot(cell) -> bool:
    return cell["cell_type"] == "code" and any("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


@pytest.mark.parametrize("name", LESSONS)
def test_objectives_first_recap_and_exercises_last(name):
    cells = _cells(name)
    assert cells[0]["cell_type"] == "markdown" and "Learning objectives" in _src(cells[0])
    last = _src(cells[-1])
    assert "## Recap" in last and "## Exercises" in last
    exercises = last.split("## Exercises", 1)[1]
    n = len(re.findall(r"^\d+\. ", exercises.split("<details>")[0], flags=re.M))
    assert 2 <= n <= 4, f"{name}: {n} exercises"
    assert "<details>" in exercises and "</details>" in exercises, "answers must be collapsed"


@pytest.mark.parametrize("name", LESSONS)
def test_predict_then_run_prompts(name):
    text = "\n".join(_src(c) for c in _cells(name) if c["cell_type"] == "markdown")
    assert text.count("Predict, then run") + text.count("Predict:") >= 1


@pytest.mark.parametrize("name", LESSONS)
def test_every_plot_is_followed_by_prose(name):
    """No run of plot cells without commentary: the cell after a figure (if any) is markdown."""
    cells = _cells(name)
    for i, c in enumerate(cells[:-1]):
        if _is_plot(c):
            assert cells[i + 1]["cell_type"] == "markdown", f"{name}: cell {i} is a figure followed by code"


@pytest.mark.parametrize("name", LESSONS)
def test_the_notebooks_were_run_and_saved_with_outputs(name):
    code = [c for c in _cells(name) if c["cell_type"] == "code"]
    assert code and all(c.get("execution_count") for c in code)
    assert all(not any(o.get("output_type") == "error" for o in c.get("outputs", [])) for c in code)


def test_order_sensitivity_is_defined_where_first_used():
    cells = [c for c in _cells("05b_encoder_anatomy") if c["cell_type"] == "markdown"]
    flat = [" ".join(_src(c).replace("**", "").split()) for c in cells]
    first = next(t for t in flat if "order sensitivity" in t)
    assert "define the order sensitivity" in first and r"\|f(Px) - P f(x)\|" in first


def test_training_lesson_reads_its_numbers_and_verdicts_from_data():
    src = "\n".join(_src(c) for c in _cells("04_training_stability") if c["cell_type"] == "code")
    assert "STABILITY_JSON" in src and "ledger.tag" in src
    assert "does not reproduce" not in src
