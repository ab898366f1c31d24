"""The docs: every ```python block of a guide runs (lane marker per block, as for the README); the docstring
rule of docs/_ext/plaintext_docstrings.py shows plain-text maths as written and leaves valid reStructuredText
untouched (pure Python: runs in the fast lane without Sphinx)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import BLOCKS, FAST_LANE_IMPORTS, LANE_OF_IMPORT, _imported_modules, lanes_of, python_blocks

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


# A fragment that cannot run on its own (it names the reader's own file, say) opts out, visibly, with a first
# line "# not run: <why>"; every other block must run.
GUIDE_BLOCKS = [(f"{page.stem}:{name}", code) for page in sorted((ROOT / "docs" / "guide").glob("*.md"))
                for name, code in python_blocks(page.read_text(encoding="utf-8"))
                if not code.lstrip().startswith("# not run:")]


def test_every_import_of_a_runnable_block_has_a_lane():
    """A block importing a package the fast lane lacks must map it to a lane marker (LANE_OF_IMPORT)."""
    known = FAST_LANE_IMPORTS | set(LANE_OF_IMPORT) | set(sys.stdlib_module_names)
    unmapped = {(name, m) for name, code in GUIDE_BLOCKS + BLOCKS for m in _imported_modules(code) if m not in known}
    assert not unmapped, f"blocks import packages with no lane marker (add them to LANE_OF_IMPORT): {sorted(unmapped)}"


@pytest.mark.parametrize("code", [pytest.param(code, id=name, marks=[getattr(pytest.mark, m) for m in lanes_of(code)])
                                  for name, code in GUIDE_BLOCKS])
def test_guide_python_block_runs(code):
    env = {**os.environ, "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # python -c puts the working directory (the repository root) first on sys.path
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"guide block failed\n--- code ---\n{code}--- stderr ---\n{proc.stderr}"


def test_bars_in_a_simple_table_keep_the_columns():
    row = "``context``  [A_1 | A_2]   same"
    assert pd.escape_bars_in_table_row(row) == r"``context``  [A_1 \| A_2]  same"   # "same" stays in its column
    table = ["=====  ====", "x      |x|", "=====  ===="]
    assert pd.normalise(table) == ["=====  ====", r"x      \|x\|", "=====  ===="]
