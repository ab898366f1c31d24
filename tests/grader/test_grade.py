"""The grade of record (issue 35): each submission's cells run in a child process that cannot reach the grader.

Submissions are built from the solution notebooks in ``exercises/`` (the solution cells as the student would
fill them) and from their student versions (the code between ``# BEGIN SOLUTION`` and ``# END SOLUTION``
replaced by ``...``, as ``otter assign`` does). Then:

* cheats — top-level tampering with the grading module, NumPy, the display hook, the import hook or files in
  the working folder; the library reached from a thread or through the caller's frames; the seed variable set
  by the notebook with a lookup table made at home; an autograd import — earn nothing for the affected question;
* broken code — an endless loop, a 1 GB allocation, KeyboardInterrupt or SystemExit in the backward — costs that
  question only, with one line naming the cause, and a class run goes on;
* honest work — try-out globals, prints (50 MB included, kept truncated), ``sys``, ``np.seterr``, warnings as
  errors, a random seed, top-level cells that raise, write or delete files in their folder, allocate or call
  ``exit()`` after the answers, loops — scores full marks;
* exercise 6's four placements are graded by name.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from transformer_np.course import grade_notebook, grade_submissions
from transformer_np.errors import InputValueError
from transformer_np.grader.grading import POINTS
from transformer_np.grader.hidden_cases import hidden_cases
from transformer_np.grader.sandbox import Limits, Sandbox, SandboxGone
from transformer_np.grader.specs import EXERCISES

REPO = Path(__file__).resolve().parents[2]
ASSIGNMENTS = sorted(POINTS)
FAST = Limits(call_timeout=3.0, submission_timeout=90.0)
SEED = 20261203


def _cells(name: str) -> list[str]:
    nb = json.loads((REPO / "exercises" / f"{name}.ipynb").read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def solution_cells(name: str) -> list[str]:
    return _cells(name)


def student_cells(name: str) -> list[str]:
    """The untouched student version: each solution block replaced by `...` (as otter assign does)."""
    out = []
    for src in _cells(name):
        out.append(re.sub(r"( *)# BEGIN SOLUTION\n.*?# END SOLUTION\n?", r"\1...\n", src, flags=re.S))
    return out


def notebook(path: Path, cells: list[str]) -> Path:
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
          "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                     "source": src.splitlines(keepends=True)} for src in cells]}
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def grade(tmp_path: Path, cells: list[str], name: str = "01_softmax", limits: Limits = FAST):
    return grade_notebook(notebook(tmp_path / f"{name}.ipynb", cells), name, seed=SEED, limits=limits)


def points(g) -> dict[str, float]:
    return {q: e for q, (e, _) in g.questions().items()}


# ----------------------------------------------------------------------------- the baseline
@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_solutions_score_full_marks_and_untouched_notebooks_zero(name, tmp_path):
    good = grade(tmp_path, solution_cells(name), name)
    assert good.error is None
    assert good.score == good.out_of == sum(POINTS[name].values()), [c.feedback for c in good.checks]
    empty = grade(tmp_path, student_cells(name), name)
    assert empty.score == 0, [c.feedback for c in empty.checks if c.earned]
    assert all(c.feedback for c in empty.checks)          # each says why, in words


def test_the_child_cannot_import_the_project_or_a_framework(tmp_path):
    # every standard-library module imports (issue 43); what reaches beyond the child's folder fails at its use
    with Sandbox(limits=FAST) as sb:
        for stmt in ("import transformer_np.ops.softmax", "import torch", "import jax", "import autograd",
                     "import ctypes; assert ctypes.CDLL(None).fork() >= 0",
                     "import subprocess; subprocess.run(['true'])",
                     "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)",
                     "import os; assert os.system('true') == 0", "open('/etc/hostname').read()",
                     "open(os.path.join(os.path.dirname(os.getcwd()), 'x'), 'w')",
                     "import os; os.kill(os.getppid(), 9)", "import os; os.fork()"):
            r = sb.run_cell(0, "import os\n" + stmt)
            assert not r["ok"], stmt
        assert "TRANSFORMER_NP" not in sb.run_cell(1, "import os\nprint(sorted(os.environ))") or True
        assert sb.run_cell(2, "import os\nassert not [k for k in os.environ if k.startswith('TRANSFORMER_NP')]")["ok"]
        assert sb.run_cell(3, "import sys\nassert not any('site-packages' in p for p in sys.path[:-1])")["ok"]
        assert sb.run_cell(4, "open('mine.txt', 'w').write('ok'); import os; os.remove('mine.txt')")["ok"]


# ----------------------------------------------------------------------------- cheats earn nothing
EMPTY = student_cells("01_softmax")
TAMPERING = {
    "grading module": "import transformer_np.grader.grading as g\ng.grade_forward = g.grade_backward = "
                      "lambda *a, **k: None",
    "numpy": "import numpy as np\nnp.max = np.abs = lambda *a, **k: 0.0\nnp.allclose = lambda *a, **k: True",
    "display hook": "import sys\nsys.displayhook = lambda value: None",
    "import hook": "import builtins\n_real = builtins.__import__\n"
                   "builtins.__import__ = lambda name, *a, **k: _real('numpy') if 'transformer' in name else "
                   "_real(name, *a, **k)",
    "files in the working folder": "import os\nos.makedirs('tests', exist_ok=True)\n"
                                   "open('tests/q1.py', 'w').write('test = {\"name\": \"q1\", \"points\": 1, "
                                   "\"suites\": []}')",
    "seed variable": "import os\nos.environ['TRANSFORMER_NP_GRADING_SEED'] = '0'",
    "autograd import": "%pip install autograd\nimport autograd.numpy as anp",
}


@pytest.mark.parametrize("how", list(TAMPERING))
def test_top_level_tampering_earns_nothing(how, tmp_path):
    g = grade(tmp_path, EMPTY[:1] + [TAMPERING[how]] + EMPTY[1:])
    assert g.score == 0, (how, [c.feedback for c in g.checks])


def test_the_library_from_a_thread_or_through_the_callers_frames_earns_nothing(tmp_path):
    thread = """
import threading
def softmax_forward(x):
    box = {}
    def work():
        from transformer_np.ops.softmax import softmax_forward as f
        box["r"] = f(x)
    t = threading.Thread(target=work); t.start(); t.join()
    return box["r"]
"""
    frames = """
import sys
def softmax_forward(x):
    f = sys._getframe(1)
    while f is not None:                        # look for the grader's reference in every caller's globals
        for v in list(f.f_globals.values()) + list(f.f_locals.values()):
            ref = getattr(v, "reference", None)
            if callable(ref):
                return ref({"x": x}, {})
        f = f.f_back
    raise RuntimeError("no grader here")
"""
    for src in (thread, frames):
        g = grade(tmp_path, EMPTY + [src])
        assert points(g)["q1"] == 0, [c.feedback for c in g.checks]


def test_a_lookup_table_made_at_home_for_a_pinned_seed_earns_nothing(tmp_path):
    # the student computes, at home with the library, the answers for the public cases and for the hidden cases
    # of the seed the notebook pins; the grade of record draws its own seed
    from transformer_np.ops.softmax import softmax_forward as lib

    ex = EXERCISES["softmax"]
    table = {}
    for case in ex.cases() + hidden_cases("softmax", 0):
        x = case.arrays["x"]
        table[x.tobytes().hex()] = lib(x)[0].tolist()
    src = ("import os, numpy as np\nos.environ['TRANSFORMER_NP_GRADING_SEED'] = '0'\n"
           f"TABLE = {json.dumps(table)}\n"
           "def softmax_forward(x):\n    return np.array(TABLE[x.tobytes().hex()]), None\n")
    g = grade(tmp_path, EMPTY + [src])
    assert g.seed != 0
    assert points(g)["q1"] == 0
    (fwd,) = [c for c in g.checks if c.kind == "forward"]
    assert "KeyError" in fwd.feedback and "hidden:" in fwd.feedback


def test_an_autograd_or_framework_backward_earns_nothing(tmp_path):
    sol = solution_cells("01_softmax")
    src = ("def softmax_backward(dout, cache):\n    import torch\n"
           "    s = torch.tensor(cache['s'], requires_grad=True)\n    return s.numpy()\n")
    g = grade(tmp_path, sol + [src])
    assert points(g) == {"q1": 1, "q2": 0}
    (bwd,) = [c for c in g.checks if c.kind == "backward"]
    assert "torch is not available when grading" in bwd.feedback


# ----------------------------------------------------------------------------- broken code costs that question
SOL = solution_cells("01_softmax")
BROKEN_BACKWARD = {
    "endless loop": ("def softmax_backward(dout, cache):\n    while True:\n        pass\n", "longer than 3 s"),
    "1 GB allocation": ("def softmax_backward(dout, cache):\n    big = np.ones((1 << 27,))\n    return dout * 0 + "
                        "big[:1]\n", "MemoryError"),
    "KeyboardInterrupt": ("def softmax_backward(dout, cache):\n    raise KeyboardInterrupt\n", "KeyboardInterrupt"),
    "SystemExit": ("def softmax_backward(dout, cache):\n    raise SystemExit(3)\n", "SystemExit"),
    "os._exit": ("def softmax_backward(dout, cache):\n    import os\n    os._exit(0)\n", "ended"),
}


@pytest.mark.parametrize("how", list(BROKEN_BACKWARD))
def test_broken_code_costs_that_question_only_with_one_line_naming_the_cause(how, tmp_path):
    src, cause = BROKEN_BACKWARD[how]
    t0 = time.monotonic()
    g = grade(tmp_path, SOL + [src])
    assert time.monotonic() - t0 < 60
    assert points(g) == {"q1": 1, "q2": 0}, [c.feedback for c in g.checks]
    (bwd,) = [c for c in g.checks if c.kind == "backward"]
    assert cause in bwd.feedback, bwd.feedback


def test_a_class_run_goes_on_after_a_broken_submission(tmp_path):
    loop = notebook(tmp_path / "a_loop.ipynb", SOL[:1] + ["while True:\n    pass\n"] + SOL[1:]
                    + [BROKEN_BACKWARD["endless loop"][0]])
    good = notebook(tmp_path / "b_good.ipynb", SOL)
    junk = tmp_path / "c_junk.ipynb"
    junk.write_text("{not json", encoding="utf-8")
    grades = grade_submissions("01_softmax", [tmp_path], workers=2, seed=SEED, limits=FAST)
    assert [Path(g.file).name for g in grades] == ["a_loop.ipynb", "b_good.ipynb", "c_junk.ipynb"]
    assert points(grades[0]) == {"q1": 1, "q2": 0}            # the top-level loop is skipped, the answers graded
    assert any("cell 1 was skipped" in n for n in grades[0].notes)
    assert grades[1].score == 3
    assert grades[2].score == 0 and grades[2].flags == ["unreadable"] and "not valid JSON" in grades[2].error
    assert loop.exists() and good.exists()


def test_a_fifo_submission_gets_an_error_row_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.ipynb"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    g = grade_notebook(fifo, "01_softmax", seed=SEED, limits=FAST)
    assert time.monotonic() - t0 < 5
    assert g.error is not None and "not a regular file" in g.error


# ----------------------------------------------------------------------------- honest work: full marks
HONEST_EXTRAS = {
    "try-out globals": "x = np.array([[1.0, 2.0, 3.0]])\nout, cache = softmax_forward(x)\nout",
    "prints": "print('hello')\nprint('x' * 50_000_000)",
    "sys": "import sys\nEPS = sys.float_info.min",
    "np.seterr": "np.seterr(all='raise')",
    "warnings as errors": "import warnings\nwarnings.simplefilter('error')",
    "random seed": "np.random.seed(0)\nrng = np.random.default_rng(1)\nrng.normal(size=3)",
    "a cell that raises": "1 / 0",
    "files in its folder": "open('notes.txt', 'w').write('mine')\nimport os\nos.remove('notes.txt')\n"
                           "os.makedirs('out/sub', exist_ok=True)\nimport shutil\nshutil.rmtree('out')",
    "allocates": "big = np.ones((2_000_000,))\nbig.sum()",
}


@pytest.mark.parametrize("how", list(HONEST_EXTRAS))
def test_honest_top_level_cells_keep_full_marks(how, tmp_path):
    g = grade(tmp_path, SOL + [HONEST_EXTRAS[how]])
    assert g.score == 3, (how, [c.feedback for c in g.checks], g.notes)


def test_honest_functions_written_differently_keep_full_marks(tmp_path):
    loops = """
import sys
from typing import Any

def _row_softmax(row: np.ndarray) -> np.ndarray:
    m = max(row.tolist())
    e = np.array([np.exp(v - m) for v in row])
    print("row done")                                   # a print inside a graded function
    return e / max(e.sum(), sys.float_info.min)

def softmax_forward(x: np.ndarray) -> tuple[np.ndarray, Any]:
    flat = x.reshape(-1, x.shape[-1])
    out = np.stack([_row_softmax(r) for r in flat]).reshape(x.shape)
    return out, (out,)

def softmax_backward(dout, cache):
    (s,) = cache
    return s * (dout - np.einsum("...i,...i->...", dout, s)[..., None])
exit()
"""
    g = grade(tmp_path, SOL[:1] + [loops])
    assert g.score == 3, [c.feedback for c in g.checks]
    assert "row done" in g.output
    assert any("raised SystemExit" in n for n in g.notes), g.notes      # exit() ends its cell, as in IPython


def test_output_is_kept_truncated(tmp_path):
    g = grade(tmp_path, SOL + ["print('y' * 50_000_000)"])
    assert FAST.output_chars <= len(g.output) < FAST.output_chars + 500
    assert "more bytes of output not kept" in g.output


@pytest.mark.parametrize("mask_style", ["np.where(mask < -1e30, -np.inf, scores)", "scores + np.maximum(mask, -1e9)",
                                        "scores + mask"])
def test_attention_masks_written_in_other_ways_keep_full_marks(mask_style, tmp_path):
    src = f"""
def attention_forward(Q, K, V, mask=None):
    scores = np.einsum("...qd,...kd->...qk", Q, K) / np.sqrt(Q.shape[-1])
    if mask is not None:
        scores = {mask_style}
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - m)
    A = e / e.sum(axis=-1, keepdims=True)
    return A @ V, (Q, K, V, A)

def attention_backward(dout, cache):
    Q, K, V, A = cache
    dV = A.swapaxes(-1, -2) @ dout
    dA = dout @ V.swapaxes(-1, -2)
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True)) / np.sqrt(Q.shape[-1])
    return dS @ K, dS.swapaxes(-1, -2) @ Q, dV
"""
    g = grade(tmp_path, solution_cells("03_attention") + [src], "03_attention")
    assert g.score == 3, [c.feedback for c in g.checks]


# ----------------------------------------------------------------------------- exercise 6 by name
LAYER_NOT_PRE = """
_fwd, _bwd = encoder_layer_forward, encoder_layer_backward
def encoder_layer_forward(x, p, norm, n_heads, mask=None, eps=1e-5):
    if norm == "{other}":
        raise NotImplementedError("{other}-LN is not done yet")
    return _fwd(x, p, norm, n_heads, mask, eps)
"""


@pytest.mark.parametrize("done", ["post", "pre"])
def test_exercise_6_grades_each_placement_by_name(done, tmp_path):
    other = "pre" if done == "post" else "post"
    g = grade(tmp_path, solution_cells("06_encoder_layer") + [LAYER_NOT_PRE.format(other=other)], "06_encoder_layer")
    earned = {(c.kind, c.exercise): c.earned for c in g.checks}
    assert earned == {("forward", f"encoder_layer_{done}"): 1, ("forward", f"encoder_layer_{other}"): 0,
                      ("backward", f"encoder_layer_{done}"): 1, ("backward", f"encoder_layer_{other}"): 0}
    assert g.score == 2


# ----------------------------------------------------------------------------- reading submissions
def test_magics_and_shell_lines_are_not_run_and_the_report_says_so(tmp_path):
    g = grade(tmp_path, ["%pip install torch\n!touch pwned\n" + SOL[0], "%%bash\necho hi\n"] + SOL[1:])
    assert g.score == 3
    assert any("not run" in n and "%pip install torch" in n and "%%bash" in n for n in g.notes)


def test_a_missing_function_is_named_with_the_cell_that_failed_to_define_it(tmp_path):
    src = "import torch\n" + next(s for s in SOL if "def softmax_forward" in s)
    cells = [s for s in SOL if "def softmax_forward" not in s] + [src]
    g = grade(tmp_path, cells)
    (fwd,) = [c for c in g.checks if c.kind == "forward"]
    assert fwd.earned == 0
    assert "softmax_forward is not defined" in fwd.feedback and "torch is not available" in fwd.feedback


def test_float32_is_named(tmp_path):
    src = ("def softmax_forward(x):\n    x = x.astype(np.float32)\n    e = np.exp(x - x.max(axis=-1, keepdims=True))\n"
           "    s = e / e.sum(axis=-1, keepdims=True)\n    return s, {'s': s.astype(np.float64)}\n")
    g = grade(tmp_path, SOL + [src])
    (fwd,) = [c for c in g.checks if c.kind == "forward"]
    assert fwd.earned == 0 and "float32" in fwd.feedback, fwd.feedback


def test_unknown_exercise_and_missing_submission_are_refused(tmp_path):
    with pytest.raises(InputValueError, match="exercise must be one of"):
        grade_notebook(tmp_path / "x.ipynb", "07_nothing")
    with pytest.raises(InputValueError, match="no such submission"):
        grade_submissions("01_softmax", [tmp_path / "nope.ipynb"])
    with pytest.raises(InputValueError, match="holds no .ipynb"):
        grade_submissions("01_softmax", [tmp_path])


def test_a_dead_child_raises_sandbox_gone_not_an_exception_the_checks_would_swallow():
    assert not issubclass(SandboxGone, Exception)
    with Sandbox(limits=Limits(call_timeout=1.0)) as sb:
        sb.run_cell(0, "def f(x):\n    while True:\n        pass\n")
        with pytest.raises(SandboxGone, match="longer than (1 s of CPU time|4 s of wall-clock time)"):
            sb.function("f", "forward")(np.zeros(3))
        assert not sb.alive


def test_the_wire_refuses_what_is_not_numbers():
    from transformer_np.grader import wire

    obj = np.array([object()], dtype=object)
    tree = wire.encode(obj, [])
    assert tree["t"] == "opaque"
    # a hand-made .npy of object dtype is refused when read, before anything is built
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|O", "fortran_order": False, "shape": (1,)})
    with pytest.raises(wire.WireError, match="dtype"):
        wire._read_npy(memoryview(buf.getvalue() + b"\0" * 8))
    # lying sizes are refused
    good = wire.pack({"op": "x"}, np.zeros(4))
    with pytest.raises(wire.WireError):
        wire.unpack(good[:-8])
    assert sys.getrecursionlimit() > wire.MAX_DEPTH


# ----------------------------------------------------------------------------- the command
def _cli(*argv):
    from transformer_np.cli import main

    return main(list(argv))


def test_the_command_writes_a_gradebook_a_spreadsheet_cannot_execute(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)                    # relative names: the file cell begins with the name itself
    notebook(tmp_path / "=HYPERLINK(1).ipynb", SOL)
    notebook(tmp_path / "@bob.ipynb", EMPTY)
    notebook(tmp_path / "carol.ipynb", SOL)
    out = tmp_path / "grades.csv"
    assert _cli("grade", "01_softmax", "=HYPERLINK(1).ipynb", "@bob.ipynb", "carol.ipynb", "--csv", str(out),
                "--seed", "7", "--timeout", "5") == 0
    import csv

    rows = list(csv.reader(out.read_text(encoding="utf-8").splitlines()))
    assert rows[0] == ["file", "score", "out_of", "q1", "q2", "q1_why", "q2_why", "flags", "seed", "sandbox",
                       "error"]
    assert [r[:5] for r in rows[1:]] == [["'=HYPERLINK(1).ipynb", "3", "3", "1", "2"],
                                         ["'@bob.ipynb", "0", "3", "0", "0"], ["carol.ipynb", "3", "3", "1", "2"]]
    text = capsys.readouterr().out
    assert "3 submissions: mean 2.00/3" in text and "seed 7" in text
    # an existing gradebook is not replaced without --force; '-' is standard output
    assert _cli("grade", "01_softmax", "carol.ipynb", "--csv", str(out)) == 2
    assert "exists; add --force" in capsys.readouterr().err
    assert _cli("grade", "01_softmax", "@bob.ipynb", "--csv", "-", "--seed", "7") == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("'@bob.ipynb,0,3")
    assert not (tmp_path / "-").exists()


def test_csv_cells_are_escaped():
    from transformer_np.cli.grade import csv_cell, terminal_text

    for bad in ("=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx"):   # a leading quote; TAB and CR escaped too (textout)
        assert csv_cell(bad) == "'" + bad.replace("\t", "\\t").replace("\r", "\\r")
    assert csv_cell("alice.ipynb") == "alice.ipynb"
    assert terminal_text("a\x1b[31mb\x07") == "a\\x1b[31mb\\x07"


def test_the_command_json_and_similarity(tmp_path, capsys):
    a = notebook(tmp_path / "a.ipynb", SOL)
    b = notebook(tmp_path / "b.ipynb", SOL)                    # the same code twice: flagged, not penalised
    assert _cli("grade", "01_softmax", str(a), str(b), "--json", "--similarity", "--seed", "3") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["seed"] == 3 and [s["score"] for s in doc["submissions"]] == [3, 3]
    assert {doc["similar"][0]["a"], doc["similar"][0]["b"]} == {str(a), str(b)}
    assert all(any(f.startswith("similar:") for f in s["flags"]) for s in doc["submissions"])
    assert set(doc["submissions"][0]["questions"]) == {"q1", "q2"}


@pytest.mark.parametrize("argv, words", [
    (["07_x", "a.ipynb"], "EXERCISE must be one of"),
    (["01_softmax", "missing.ipynb"], "no such submission"),
    (["01_softmax", "a.ipynb", "--timeout", "0"], "--timeout must be a positive"),
    (["01_softmax", "a.ipynb", "--workers", "0"], "--workers must be at least 1"),
    (["01_softmax", "a.ipynb", "--memory-mb", "10"], "--memory-mb must be at least 256"),
])
def test_bad_arguments_get_one_line_and_status_2(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    notebook(tmp_path / "a.ipynb", SOL)
    assert _cli("grade", *argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_handed_out_functions_refuse_huge_arguments_and_caches_not_their_own(tmp_path):
    allowed = EXERCISES["mha"].allowed
    with Sandbox(allowed, limits=FAST) as sb:
        r = sb.run_cell(0, "import numpy as np\nfrom transformer_np.ops.attention import attention_forward, "
                           "attention_backward\nQ = np.zeros((1, 1, 1100, 1000))\nattention_forward(Q, Q, Q)")
        assert not r["ok"] and "at most" in r["error"]["message"]
        r = sb.run_cell(1, "Q = np.ones((2, 3, 4))\nout, c = attention_forward(Q, Q, Q)\n"
                           "attention_backward(out, {'not': 'a cache'})")
        assert not r["ok"]
        assert sb.run_cell(2, "dQ, dK, dV = attention_backward(out, c)\nassert dQ.shape == Q.shape")["ok"]


SOFTMAX_VARIANTS = {
    "correct": next(s for s in SOL if "def softmax_forward" in s),
    "no max": "def softmax_forward(x):\n    e = np.exp(x)\n    s = e / e.sum(axis=-1, keepdims=True)\n"
              "    return s, {'s': s}\n",
    "wrong axis": "def softmax_forward(x):\n    e = np.exp(x - x.max(axis=0, keepdims=True))\n"
                  "    s = e / e.sum(axis=0, keepdims=True)\n    return s, {'s': s}\n",
    "diagonal backward": "def softmax_backward(dout, cache):\n    s = cache['s']\n    return dout * s * (1 - s)\n",
    "raises": "def softmax_backward(dout, cache):\n    raise NotImplementedError\n",
}


@pytest.mark.parametrize("variant", list(SOFTMAX_VARIANTS))
def test_the_notebooks_own_checks_and_grade_give_the_same_verdicts(variant, tmp_path):
    """otter's hidden checks (grade_forward / grade_backward in the student's process) and the grade of record
    agree on honest and slipped work: same pass/fail and the same problem codes, for the same seed."""
    from transformer_np.grader.grading import grade_backward, grade_forward

    cells = SOL + [SOFTMAX_VARIANTS[variant]]
    g = grade(tmp_path, cells)
    namespace: dict = {}
    for src in cells:
        if "transformer_np.grader.grading" not in src:
            exec(compile(src, "<cell>", "exec"), namespace)
    fwd, bwd = namespace["softmax_forward"], namespace["softmax_backward"]
    local = {"forward": grade_forward("softmax", fwd, seed=SEED), "backward": grade_backward("softmax", fwd, bwd,
                                                                                           seed=SEED)}
    for check in g.checks:
        fb = local[check.kind]
        assert (check.earned == check.points) == (fb is None), (variant, check.kind, check.feedback, fb)
        assert check.codes == ([] if fb is None else fb.codes), (variant, check.kind)


def test_the_submission_time_limit_ends_every_remaining_check(tmp_path):
    # the limits count CPU time: each call computes for 1.5 CPU-seconds (a sleep would count against the wall cap)
    slow = SOL + ["import time\n_f = softmax_forward\ndef softmax_forward(x):\n    t = time.process_time()\n"
                  "    while time.process_time() - t < 1.5:\n        pass\n    return _f(x)\n"]
    limits = Limits(call_timeout=3.0, submission_timeout=4.0)
    t0 = time.monotonic()
    g = grade(tmp_path, slow, limits=limits)
    assert time.monotonic() - t0 < 4 * 4 + 15                       # the wall-clock cap is 4× the CPU seconds
    assert g.score == 0
    assert all("time limit (4 s of CPU time) ran out" in c.feedback or "wall-clock time limit (16 s" in c.feedback
               for c in g.checks), [c.feedback for c in g.checks]


def test_a_finite_difference_backward_is_refused_as_not_analytic(tmp_path):
    numerical = """
_fwd = softmax_forward
def softmax_forward(x):
    out, _ = _fwd(x)
    return out, {"x": x}

def softmax_backward(dout, cache):
    x, h = cache["x"], 1e-5
    dx = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        dx[i] = np.sum(dout * (_fwd(x + e)[0] - _fwd(x - e)[0])) / (2 * h)
    return dx
"""
    g = grade(tmp_path, SOL + [numerical])
    assert points(g) == {"q1": 1, "q2": 0}
    (bwd,) = [c for c in g.checks if c.kind == "backward"]
    assert "not_analytic" in bwd.codes and "finite differences" in bwd.feedback, bwd.feedback


def test_an_input_changed_in_place_in_the_child_is_seen_by_the_grader(tmp_path):
    inplace = ("def softmax_forward(x):\n    x -= x.max(axis=-1, keepdims=True)\n    np.exp(x, out=x)\n"
               "    x /= x.sum(axis=-1, keepdims=True)\n    return x.copy(), {'s': x.copy()}\n")
    g = grade(tmp_path, SOL + [inplace])
    (fwd,) = [c for c in g.checks if c.kind == "forward"]
    assert fwd.codes == ["mutated_input"] and "in place" in fwd.feedback, fwd.feedback


def test_a_file_name_that_is_not_utf8_gets_its_row_escaped(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = os.fsdecode(b"caf\xe9.ipynb")                     # Latin-1 bytes: not UTF-8
    notebook(tmp_path / name, SOL)
    assert _cli("grade", "01_softmax", ".", "--csv", "-", "--seed", "1") == 0
    out = capsys.readouterr().out
    assert "caf\\xe9.ipynb" in out and ",3,3," in out     # the byte as \xNN, as check shows it (one policy)
    assert _cli("grade", "01_softmax", ".", "--seed", "1") == 0
    assert "caf\\xe9.ipynb: 3/3" in capsys.readouterr().out


def test_a_cell_too_deep_to_parse_costs_nothing_and_breaks_nothing(tmp_path):
    deep = "x = " + "+".join(["1"] * 200_000) + "\n"           # the parser gives up (RecursionError or MemoryError)
    g = grade(tmp_path, SOL + [deep])
    assert g.score == 3 and g.error is None


@pytest.mark.parametrize("n", [900, 5_000, 200_000])
def test_the_similarity_report_survives_a_cell_too_deep_to_parse(n):
    """200,000 ``+`` in one expression crash Python 3.10's ast.parse (a segmentation fault, not an exception): the
    grader never hands it such a cell. Fewer parse, or raise RecursionError (3.11: 5,000), or parse and are deeper
    than ast.unparse's recursion (900): each is handled."""
    from transformer_np.grader.similarity import function_sources, normalised_tokens
    from transformer_np.grader.source import parse_untrusted

    deep = "def softmax_forward(x):\n    return " + "+".join(["x"] * n) + "\n"
    if n > 20_000:
        assert parse_untrusted(deep) is None                # refused before ast.parse sees it
    found = function_sources([deep], ["softmax_forward"])
    assert isinstance(found, dict)
    for src in found.values():
        assert normalised_tokens(src)


@pytest.mark.parametrize("content", [b"[" * 100_000, b"{\"cells\": 1}", b"\x00\x01binary", b"\xff\xfe not utf-8"])
def test_a_file_that_is_not_a_notebook_gets_an_error_row(content, tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_bytes(content)
    g = grade_notebook(bad, "01_softmax", seed=SEED, limits=FAST)
    assert g.score == 0 and g.flags == ["unreadable"] and "bad.ipynb" in g.error, g.error


def test_forged_replies_from_the_students_code_cost_that_check_only(tmp_path):
    """The student's code can write to the reply pipe itself (its number is in the child's arguments): whatever it
    writes is read as data, bounded, and a frame that breaks the format ends that check only."""
    forge = """
import os, sys, json, struct
def softmax_forward(x):
    fd = json.loads(sys.argv[1])["rep_fd"]
    head = json.dumps({"op": "reply", "ok": False, "error": ["not", "a", "dict"], "value": {"t": "none"},
                       "blobs": []}).encode()
    payload = struct.pack(">I", len(head)) + head
    os.write(fd, struct.pack(">Q", len(payload)) + payload)
    deep = ("[" * 100000 + "]" * 100000).encode()
    payload = struct.pack(">I", len(deep)) + deep
    os.write(fd, struct.pack(">Q", len(payload)) + payload)
    return x, None
"""
    g = grade(tmp_path, SOL + [forge])
    assert points(g)["q1"] == 0 and g.error is None
    assert points(g)["q2"] == 0                              # the backward needs this forward
    assert all(c.feedback for c in g.checks)


def test_the_notebooks_own_checks_are_inert_stubs_in_the_child():
    """The solution notebooks' hidden-test cells import the formative checks (``course.grading``'s grade_forward,
    ``course.exercises``' check_forward): in the child those are inert stubs, so grading the solution leaves no note
    of a failed import (each such cell was reported as a ModuleNotFoundError)."""
    g = grade_notebook(REPO / "exercises" / "01_softmax.ipynb", "01_softmax", seed=0)
    assert g.score == g.out_of
    assert not [n for n in g.notes if "ModuleNotFoundError" in n], g.notes
