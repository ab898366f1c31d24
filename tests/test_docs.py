"""The docs: every ```python block of a guide runs (lane marker per block, as for the README); the docstring
rule of docs/_ext/plaintext_docstrings.py shows plain-text maths as written and leaves valid reStructuredText
untouched (pure Python: runs in the fast lane without Sphinx)."""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
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


# ----------------------------------------------------------------------------- the site's sidebar and API index
# Read from the sources (the toctrees of docs/index.md and the docstrings), so these run in the fast lane without
# Sphinx; the sidebar (docs/_templates/site-nav.html) is exactly these toctrees, one entry per listed document.
DOCS = ROOT / "docs"
_TOCTREE = re.compile(r"```\{toctree\}\n(.*?)```", re.S)


def _title(doc: str) -> str:
    """The title Sphinx gives a document: its first heading (a notebook's first Markdown heading)."""
    path = DOCS / doc
    if path.with_suffix(".md").is_file():
        text = path.with_suffix(".md").read_text(encoding="utf-8")
        included = re.match(r"\s*```\{include\} (\S+)", text)         # a page that is another file (CHANGELOG.md)
        if included and not re.search(r"^# ", text, re.M):
            text = (path.parent / included.group(1)).read_text(encoding="utf-8")
    elif doc.startswith("api/"):                    # written by docs/conf.py at build time (not in git)
        return doc
    else:                                           # a notebook: generated copy of notebooks/NAME.ipynb
        nb = json.loads((ROOT / "notebooks" / (path.name + ".ipynb")).read_text(encoding="utf-8"))
        text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    return next(line.lstrip("#").strip() for line in text.splitlines() if line.startswith("# "))


def sidebar_entries() -> list[tuple[str, str, str]]:
    """(caption, document, title) of every entry of the site's toctrees, globs expanded as Sphinx expands them
    (matching documents in name order, minus those already listed in the same toctree)."""
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    sources = {p.relative_to(DOCS).with_suffix("").as_posix() for p in DOCS.rglob("*.md")
               if "_build" not in p.parts and "notebooks" not in p.parts}
    sources |= {f"notebooks/{p.stem}" for p in (ROOT / "notebooks").glob("*.ipynb")}
    entries = []
    for body in _TOCTREE.findall(index):
        options = dict(re.findall(r"^:(\w+):[ \t]*(.*)$", body, re.M))
        listed = [line.strip() for line in body.splitlines() if line.strip() and not line.startswith(":")]
        docs: list[str] = []
        for item in listed:
            if "glob" in options and any(ch in item for ch in "*?["):
                docs += [d for d in sorted(sources) if fnmatch.fnmatch(d, item) and d not in listed]
            else:
                docs.append(item)
        entries += [(options.get("caption", ""), d, _title(d)) for d in docs]
    return entries


def test_the_sidebar_lists_every_page_once_under_a_plain_title():
    """'Quick start' was listed twice (Getting started, and again by the Guides' glob); a page was titled
    'issue 7' (an internal tracker number); notebook 01 lacked the 'NN ·' prefix the others have."""
    entries = sidebar_entries()
    assert len(entries) >= 20, entries                                    # the pattern still reads the toctrees
    docs = Counter(d for _, d, _ in entries)
    titles = Counter(t for _, _, t in entries)
    assert not [d for d, n in docs.items() if n > 1], f"listed more than once: {docs.most_common(3)}"
    assert not [t for t, n in titles.items() if n > 1], f"two entries with one title: {titles.most_common(3)}"
    assert not [t for _, _, t in entries if re.search(r"\bissues? #?\d", t, re.I)], "a title names an issue"
    for caption, doc, title in entries:
        if caption == "Notebooks":
            number = doc.split("/")[-1].split("_")[0]                    # 01, 02, …, 05a
            assert title.startswith(f"{number} · "), (doc, title)


def _public_modules() -> list[Path]:
    """The source of every module and package the API reference lists (autosummary :recursive: over the public
    packages of docs/conf.py: no private ``_x`` module, no ``cli``)."""
    out = []
    for path in sorted((ROOT / "transformer_np").rglob("*.py")):
        parts = path.relative_to(ROOT / "transformer_np").with_suffix("").parts
        if parts[0] == "cli" or any(p.startswith("_") and p != "__init__" for p in parts) or parts == ("__init__",):
            continue
        out.append(path)
    return out


def test_every_module_of_the_api_reference_has_a_description():
    """The API index shows each module's first docstring line: course, io, perf and training had none (empty
    __init__.py), so their rows were blank."""
    modules = _public_modules()
    assert any(p.parts[-2:] == ("course", "__init__.py") for p in modules) and len(modules) > 50
    blank = [str(p.relative_to(ROOT)) for p in modules
             if not (ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or "").strip()]
    assert not blank, f"modules with no docstring (a blank row on the API index): {blank}"
