"""The docs' docstring rule (docs/_ext/plaintext_docstrings.py): plain-text maths is shown as written, valid
reStructuredText passes through untouched. Pure Python: runs in the fast lane without Sphinx."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_EXT = ROOT / "docs" / "_ext" / "plaintext_docstrings.py"
_spec = importlib.util.spec_from_file_location("plaintext_docstrings", _EXT)
pd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pd)


def test_bars_are_escaped_outside_literals_and_roles():
    assert pd.escape_bars("max |a − n| over i") == r"max \|a − n\| over i"
    assert pd.escape_bars("``|x|`` and :math:`|x|`") == "``|x|`` and :math:`|x|`"
    assert pd.escape_bars(r"already \|x\|") == r"already \|x\|"
    assert pd.escape_bars("+-----+-----+") == "+-----+-----+"


def test_formula_under_a_paragraph_line_becomes_a_literal_block():
    lines = ["Each coordinate is checked against", "    (f(x + h) − f(x − h)) / 2h,", "computed in float64."]
    assert pd.normalise(lines) == ["Each coordinate is checked against", "", "::", "",
                                   "    (f(x + h) − f(x − h)) / 2h,", "", "computed in float64."]


def test_formula_inside_a_bullet_uses_the_bullets_text_column():
    lines = ["* mean pooling:", "      m = Σ H / n", "  backward: dH = dm / n."]
    assert pd.normalise(lines) == ["* mean pooling:", "", "  ::", "", "      m = Σ H / n", "",
                                   "  backward: dH = dm / n."]


def test_valid_rst_is_left_alone():
    lines = [
        "Parameters", "", ":param x: the input,", "    of shape (B, n, d).", ":param y: other.", "",
        "term", "    a definition list item followed by a blank line", "",
        "A literal block::", "", "    |x| stays as written", "",
        "====  =====", "kind  when", "====  =====", "A     first line", "      continued", "====  =====", "",
        "- a bullet", "  continued at its text column",
    ]
    assert pd.normalise(lines) == lines


def test_readme_is_the_docs_landing_page():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert "```{include} ../README.md" in index and ":relative-docs: docs/" in index
