"""The autograder zips, graded where a course grades (issue 24, acceptance): no Docker engine here, so the
steps of otter's image are run in a fresh venv instead.

``scripts/build_exercises.sh`` builds the six assignments. A new venv (``python -m venv``, no system
site-packages) gets exactly what the zip's ``environment.yml`` lists under ``pip`` — otter-grader and the
wheel of this project shipped inside the zip (so NumPy as its only dependency) — with ``/autograder``
mapped to the directory the zip was unpacked in, as otter's ``setup.sh`` would. That venv's ``otter run``
then grades, with no PYTHONPATH: each solution notebook (full marks, as POINTS says), each untouched
student notebook (0, with feedback in words) and a submission with a forward slip and the derivative of
that slip (the backward's points). Under otter the score is formative (the student's code runs in the
grading kernel); the grade of record is ``transformer-np grade``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import KERNEL_DID_NOT_START, execute_notebook, retry_kernel_start
from transformer_np.grader.grading import POINTS

pytestmark = [pytest.mark.slow, pytest.mark.notebooks]

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p.stem for p in (REPO / "exercises").glob("[0-9]*.ipynb"))


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)
    assert proc.returncode == 0, f"{cmd}\n{_ends(proc.stdout)}\n{_ends(proc.stderr)}"
    return proc


def _ends(text: str, keep: int = 3000) -> str:
    """The head and the tail of a long output: a kernel's own error comes first, the runner's traceback last."""
    return text if len(text) <= 2 * keep else f"{text[:keep]}\n[… {len(text) - 2 * keep} characters …]\n{text[-keep:]}"


def _otter_run(venv: Path, zip_path: Path, submission: Path, out: Path) -> subprocess.CompletedProcess:
    """``otter run`` of ``submission``; a grading whose kernel died before it answered (jupyter_client's port
    race) is a failure to start, not a grade, and only it is run again (helpers.retry_kernel_start)."""
    cmd = [str(venv / "bin" / "otter"), "run", "-a", str(zip_path), "-o", str(out), "--no-logo", str(submission)]

    def run() -> subprocess.CompletedProcess:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_clean_env(venv), cwd=out,
                              timeout=600)
        if proc.returncode != 0 and KERNEL_DID_NOT_START in proc.stderr:
            raise RuntimeError(_ends(proc.stderr, 1500))
        return proc

    try:
        proc = retry_kernel_start(run, "otter run")
    except RuntimeError as e:                          # the third start failed too
        raise AssertionError(f"{cmd}\n{e}") from e
    assert proc.returncode == 0, f"{cmd}\n{_ends(proc.stdout)}\n{_ends(proc.stderr)}"
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    pytest.importorskip("otter", reason="building the assignments needs otter-grader: pip install 'otter-grader>=7'")
    out = tmp_path_factory.mktemp("built")
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    _run(["bash", str(REPO / "scripts" / "build_exercises.sh"), "-o", str(out), "--no-run-tests"], cwd=REPO,
         env=env, timeout=900)
    return out


def _zip(built: Path, name: str) -> Path:
    (path,) = (built / name / "autograder").glob(f"{name}-autograder_*.zip")
    return path


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory) -> Path:
    """A fresh venv with the zip's own pip requirements installed, as otter's image would."""
    import yaml

    root = tmp_path_factory.mktemp("image")
    source = root / "autograder" / "source"
    with zipfile.ZipFile(_zip(built, "01_softmax")) as zf:
        zf.extractall(source)
    env_yml = yaml.safe_load((source / "environment.yml").read_text())
    pip = next(d["pip"] for d in env_yml["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert any(p.startswith("otter-grader") for p in pip) and any(p.endswith(".whl") for p in pip), pip
    assert not any(p.split("[")[0].split("=")[0].strip() in ("torch", "jax", "transformers") for p in pip), pip
    reqs = [p.replace("/autograder/", f"{root}/autograder/", 1) if p.startswith("/autograder/") else p for p in pip]
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *reqs], timeout=1200, env=_clean_env(venv))
    where = _run([str(venv / "bin" / "python"), "-c", "import transformer_np, numpy; print(transformer_np.__file__)"],
                 env=_clean_env(venv), cwd=root).stdout.strip()
    assert where.startswith(str(venv)), where                     # the wheel's copy, not this checkout
    return venv


def _clean_env(venv: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = str(venv)
    env.pop("TRANSFORMER_NP_FEEDBACK", None)
    return env


def _grade(venv: Path, zip_path: Path, submission: Path, out: Path) -> dict[str, dict]:
    out.mkdir(parents=True)
    _otter_run(venv, zip_path, submission, out)
    tests = json.loads((out / "results.json").read_text())["tests"]
    return {t["name"]: t for t in tests if t.get("max_score")}


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_zip_gives_solutions_full_marks_and_untouched_notebooks_zero(name, built, venv, tmp_path):
    zip_path = _zip(built, name)
    solution = built / name / "autograder" / f"{name}.ipynb"
    student = built / name / "student" / f"{name}.ipynb"
    with ThreadPoolExecutor(2) as pool:              # the two gradings side by side (2 cores)
        graded = pool.map(lambda s: _grade(venv, zip_path, s[0], tmp_path / s[1]),
                          [(solution, "solution"), (student, "student")])
        scores, student_scores = list(graded)
    assert {q: t["max_score"] for q, t in scores.items()} == POINTS[name]
    assert all(t["score"] == t["max_score"] for t in scores.values()), scores
    scores = student_scores
    assert all(t["score"] == 0 for t in scores.values()), scores
    for q, t in scores.items():
        assert "✗ " in t["output"] and "Traceback" not in t["output"], (q, t["output"])


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_grade_gives_the_built_solutions_full_marks_and_the_student_notebooks_zero(name, built):
    """The grade of record on what otter built: the autograder's solution notebook (with its hidden-check
    cells, whose imports fail in the grader's child process and cost nothing) and the handed-out notebook
    (otter's init, check and export cells run as no-ops)."""
    from transformer_np.course import grade_notebook
    from transformer_np.grader.sandbox import Limits

    limits = Limits(call_timeout=30, submission_timeout=600)
    good = grade_notebook(built / name / "autograder" / f"{name}.ipynb", name, limits=limits)
    assert good.score == good.out_of == sum(POINTS[name].values()), [c.feedback for c in good.checks]
    empty = grade_notebook(built / name / "student" / f"{name}.ipynb", name, limits=limits)
    assert empty.score == 0 and all(c.feedback for c in empty.checks)
    assert not any("otter" in n for n in empty.notes), empty.notes     # otter's own cells ran (as no-ops)


def _edit(nb_path: Path, out: Path, replace: list[tuple[str, str]]) -> Path:
    nb = json.loads(nb_path.read_text())
    for old, new in replace:
        hits = [c for c in nb["cells"] if c["cell_type"] == "code" and old in "".join(c["source"])]
        assert len(hits) == 1, (old, len(hits))
        hits[0]["source"] = "".join(hits[0]["source"]).replace(old, new, 1)
    out.write_text(json.dumps(nb))
    return out


def test_the_zip_follows_a_forward_slip(built, venv, tmp_path):
    """A forward slip costs the forward only. (A forward that calls the library is not refused under otter:
    its score is formative; ``transformer-np grade`` runs the student's code where the library cannot be
    imported.)"""
    name = "03_attention"
    (tmp_path / "slip").mkdir()
    slip = _edit(built / name / "autograder" / f"{name}.ipynb", tmp_path / "slip" / f"{name}.ipynb",
                 [("scores = Q @ K.swapaxes(-1, -2) / np.sqrt(d_k)", "scores = Q @ K.swapaxes(-1, -2)"),
                  ("scale = 1.0 / np.sqrt(Q.shape[-1])", "scale = 1.0")])
    scores = _grade(venv, _zip(built, name), slip, tmp_path / "slip-results")
    assert scores["q1"]["score"] == 0 and "does not scale the scores" in scores["q1"]["output"], scores["q1"]
    assert scores["q2"]["score"] == scores["q2"]["max_score"] == POINTS[name]["q2"], scores["q2"]


def test_an_export_zip_is_verified_against_its_log_and_a_bare_notebook_is_not(built, venv, tmp_path, monkeypatch):
    """What the instructors' page says about otter's "No log found…": a student's export zip (from the
    notebook's last cell) carries the log of the student's own check runs and otter reports no
    discrepancy; the bare .ipynb has no log and otter says so, with the same scores."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    name = "01_softmax"
    solution = nbformat.read(built / name / "autograder" / f"{name}.ipynb", as_version=4)
    bodies = {c.source.split("(")[0]: c.source for c in solution.cells
              if c.cell_type == "code" and c.source.startswith("def ")}
    student = nbformat.read(built / name / "student" / f"{name}.ipynb", as_version=4)
    for cell in student.cells:                      # the student fills in the two functions …
        if cell.cell_type == "code" and cell.source.startswith("def "):
            cell.source = bodies[cell.source.split("(")[0]]
    work = tmp_path / "alice"
    work.mkdir()
    nbformat.write(student, work / f"{name}.ipynb")
    monkeypatch.setenv("PYTHONPATH", str(REPO))     # … in an environment that has transformer_np
    execute_notebook(student, work, timeout=600)    # … and runs every cell
    (export,) = work.glob(f"{name}_*.zip")
    for submission, says in ((export, "No discrepancies found while verifying scores against the log."),
                             (work / f"{name}.ipynb", "No log found with which to verify student scores.")):
        out = tmp_path / f"graded-{submission.suffix[1:]}"
        out.mkdir()
        proc = _otter_run(venv, _zip(built, name), submission, out)
        assert says in proc.stdout, proc.stdout[-2000:]
        tests = json.loads((out / "results.json").read_text())["tests"]
        assert all(t["score"] == t["max_score"] for t in tests if t.get("max_score")), tests


def _fake_otter(tmp_path: Path, script: str) -> Path:
    """A venv whose ``otter`` is ``script``: counts its calls in ``calls`` and fails as it is told."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    otter = venv / "bin" / "otter"
    otter.write_text(f'#!/usr/bin/env bash\necho x >> "{tmp_path}/calls"\n{script}\n')
    otter.chmod(0o755)
    return venv


def test_a_kernel_that_did_not_start_is_graded_again_and_reported(tmp_path):
    venv = _fake_otter(tmp_path, f'[ "$(wc -l < "{tmp_path}/calls")" -ge 2 ] && exit 0\n'
                                 f'echo "zmq.error.ZMQError: Address already in use" >&2\n'
                                 f'echo "RuntimeError: {KERNEL_DID_NOT_START}" >&2; exit 1')
    with pytest.warns(UserWarning, match="(?s)the kernel did not start.*Address already in use"):
        _otter_run(venv, tmp_path / "a.zip", tmp_path / "a.ipynb", tmp_path)
    assert (tmp_path / "calls").read_text().count("x") == 2


def test_a_grading_that_fails_otherwise_fails_at_once(tmp_path):
    venv = _fake_otter(tmp_path, 'echo "NameError: softmax_forward" >&2; exit 1')
    with pytest.raises(AssertionError, match="NameError: softmax_forward"):
        _otter_run(venv, tmp_path / "a.zip", tmp_path / "a.ipynb", tmp_path)
    assert (tmp_path / "calls").read_text().count("x") == 1


def test_a_kernel_that_never_starts_fails_after_three_attempts(tmp_path):
    venv = _fake_otter(tmp_path, f'echo "RuntimeError: {KERNEL_DID_NOT_START}" >&2; exit 1')
    with pytest.warns(UserWarning), pytest.raises(AssertionError, match=KERNEL_DID_NOT_START):
        _otter_run(venv, tmp_path / "a.zip", tmp_path / "a.ipynb", tmp_path)
    assert (tmp_path / "calls").read_text().count("x") == 3


def test_a_notebook_whose_kernel_did_not_start_is_run_again(monkeypatch):
    """helpers.execute_notebook: a kernel that died before it answered is started again (a warning), with the
    cells as they were; any other error, and a third death, are raised."""
    import nbclient
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    calls = []

    class Client:
        def __init__(self, nb, **kw):
            self.nb = nb

        def execute(self):
            calls.append(self.nb.cells[0].source)
            self.nb.cells[0].source = "changed by a run"
            if len(calls) < fail_times + 1:
                raise RuntimeError(error)

    monkeypatch.setattr(nbclient, "NotebookClient", Client)
    fail_times, error = 1, KERNEL_DID_NOT_START
    with pytest.warns(UserWarning, match="the kernel did not start"):
        execute_notebook(nb, ".")
    assert calls == ["x = 1", "x = 1"]                 # run again from the cells as they were
    calls.clear()
    nb.cells[0].source = "x = 1"
    fail_times, error = 1, "Kernel died while waiting for execute reply"
    with pytest.raises(RuntimeError, match="execute reply"):
        execute_notebook(nb, ".")                      # a death while running a cell is a result: raised
    assert len(calls) == 1
    calls.clear()
    nb.cells[0].source = "x = 1"
    fail_times, error = 3, KERNEL_DID_NOT_START
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match=KERNEL_DID_NOT_START):
        execute_notebook(nb, ".")
    assert len(calls) == 3


def test_the_gradescope_zip_grades_with_what_its_setup_installs(built, tmp_path):
    """The build's Gradescope zip (issue 47): a fresh venv gets exactly its requirements.txt (the shipped wheel
    and the pinned NumPy), as its setup.sh does; its run_autograder, in a root laid out as Gradescope's, then
    grades with that venv alone (no PYTHONPATH): the built solution full marks, the student notebook 0."""
    name = "01_softmax"
    (zip_path,) = (built / name / "gradescope").glob("*-gradescope.zip")
    assert (built / "prairielearn" / "questions" / name / "info.json").is_file()
    root = tmp_path / "autograder"
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(root / "source")
    assert "requirements.txt" in (root / "source" / "setup.sh").read_text()
    reqs = [line.replace("/autograder/", f"{root}/", 1)
            for line in (root / "source" / "requirements.txt").read_text().split()]
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *reqs], timeout=1200, env=_clean_env(venv))
    (root / "source" / "run_autograder").chmod(0o755)
    for which, expected in (("autograder", sum(POINTS[name].values())), ("student", 0)):
        (root / "submission").mkdir(parents=True, exist_ok=True)
        for old in (root / "submission").iterdir():
            old.unlink()
        (root / "submission" / f"{name}.ipynb").write_bytes((built / name / which / f"{name}.ipynb").read_bytes())
        env = _clean_env(venv)
        env.update(AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=str(venv / "bin" / "python"))
        _run(["bash", str(root / "source" / "run_autograder")], cwd=tmp_path, env=env, timeout=600)
        results = json.loads((root / "results" / "results.json").read_text())
        assert results["score"] == expected, results
        assert results["extra_data"]["sandbox"] == "kernel"
