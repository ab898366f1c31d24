"""nbval checks the notebooks' printed numbers at their printed precision: a changed digit fails, a zero
printed with a minus sign (-0.000, whose sign is the round-off's and so the BLAS kernel's) does not.

Each test runs nbval, in a subprocess, on a copy of the first three code cells of notebook 05b (they
print 0.000 and 0.975) with one stored output edited, next to copies of notebooks/conftest.py and
notebooks/nbval_sanitize.cfg, so that the rules and their wiring are the ones ``pytest notebooks --nbval``
uses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.notebooks, pytest.mark.slow, pytest.mark.plot]

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOURCE = NOTEBOOKS / "05b_encoder_anatomy.ipynb"
STORED = ("positional=none     order sensitivity of H^(3): 0.000\n"
          "positional=learned  order sensitivity of H^(3): 0.975\n")
N_CODE_CELLS = 3   # imports; the causal-mask pitfall; the line above (nbval's Cell 0, 1, 2)


def _copy(tmp_path: Path, old: str, new: str) -> Path:
    """The first N_CODE_CELLS code cells of notebook 05b (with the markdown between them), with ``old``
    replaced by ``new`` in the last one's stored output, in tmp_path/notebooks beside the sanitize rules."""
    pytest.importorskip("nbval")
    pytest.importorskip("matplotlib")
    nb = json.loads(SOURCE.read_text(encoding="utf-8"))
    cells, code = [], 0
    for cell in nb["cells"]:
        cells.append(cell)
        code += cell["cell_type"] == "code"
        if code == N_CODE_CELLS:
            break
    last = cells[-1]
    text = "".join(last["outputs"][0]["text"])
    assert text == STORED, f"notebook 05b's third code cell no longer prints what this test edits: {text!r}"
    assert text.count(old) == 1, f"{old!r} must occur once in {text!r}"
    last["outputs"][0]["text"] = text.replace(old, new)
    nb["cells"] = cells
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for name in ("conftest.py", "nbval_sanitize.cfg"):
        shutil.copy(NOTEBOOKS / name, folder / name)
    path = folder / "copy.ipynb"
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    return path


def _nbval(path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "pytest", str(path.name), "--nbval", "-p", "no:cacheprovider",
                           "-q"], cwd=path.parent, env=env, capture_output=True, text=True,
                          timeout=900)


def test_a_changed_printed_digit_fails(tmp_path):
    run = _nbval(_copy(tmp_path, "0.975", "0.976"))
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "copy.ipynb::Cell 2" in out and "1 failed, 2 passed" in out, out
    assert "0.976" in out and "0.975" in out, out          # the diff shows both numbers


def test_a_zero_printed_with_a_minus_sign_passes(tmp_path):
    run = _nbval(_copy(tmp_path, "0.000", "-0.000"))
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "3 passed" in out, out


def test_without_the_sanitize_rules_the_minus_sign_fails(tmp_path):
    """The control: the rules are what makes -0.000 pass (the copy is compared, not skipped)."""
    path = _copy(tmp_path, "0.000", "-0.000")
    (path.parent / "conftest.py").unlink()
    run = _nbval(path)
    out = run.stdout + run.stderr
    assert run.returncode == 1 and "copy.ipynb::Cell 2" in out, out
