"""The kernel's boundary around a submission's child (issue 43, item 1): what a student's code cannot do, even
after switching the child's audit hook off.

Each attack first removes the audit hook by a route a student has (``HOOK_OFF``: the hook function's
``__code__`` replaced through ``gc.get_objects()``, which switched the old hook off entirely), or by the
tests-only knob ``Sandbox(_audit_hook=False)`` that no student can reach (it stands for the third route, a write
through NumPy's ``__array_interface__``: whatever removes the hook, the kernel still refuses). Then: importing the
library from the grader's install, reading a classmate's notebook, reading the grader's memory, command line or
environment, a detached helper rewriting the gradebook, killing the grader, the network, programs, ptrace,
writing outside the working folder — each earns nothing. A grader killed mid-run leaves no process and no folder;
honest notebooks importing standard-library modules score full marks; a machine without the mechanisms is
refused in one line, and ``--no-sandbox`` marks every row ``unsandboxed``.
"""

from __future__ import annotations

import csv
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_grade import FAST, SEED, _cli, grade, notebook, solution_cells, student_cells

from transformer_np.course import grade_notebook, grade_submissions
from transformer_np.grader import confine
from transformer_np.grader import grade as grade_module
from transformer_np.grader.sandbox import Sandbox

REPO = Path(__file__).resolve().parents[2]
SOL = solution_cells("01_softmax")
EMPTY = student_cells("01_softmax")

# the routes around the audit hook a student's code has (the first two were measured on the old hook)
GLOBALS_ROUTE = ("import sys\nm = sys.modules['__main__']\nm._REFUSED_EVENTS = ()\nm._DENIED_MODULES = frozenset()\n"
                 "m._PATH_EVENTS = {}\n")
CODE_ROUTE = '''
import gc
def _noop_code(code):
    names = code.co_freevars        # the same number of free variables, or __code__ cannot be replaced
    src = "def outer():\\n" + "".join(f"    {n} = None\\n" for n in names) + "    def hook(event, args):\\n"
    src += ("        " + ", ".join(names) + "\\n" if names else "") + "        return None\\n    return hook\\n"
    ns = {}
    exec(src, ns)
    return ns["outer"]().__code__
for _f in gc.get_objects():
    if type(_f).__name__ == "function" and _f.__name__ == "hook" and _f.__code__.co_argcount == 2:
        _f.__code__ = _noop_code(_f.__code__)
'''
HOOK_OFF = ["code", "knob"]          # how each attack below removes the hook first


def _sandbox(route: str, **kw) -> Sandbox:
    return Sandbox(limits=FAST, _audit_hook=route != "knob", **kw)


def _prelude(route: str) -> list[str]:
    return {"globals": [GLOBALS_ROUTE], "code": [CODE_ROUTE], "knob": []}[route]


@pytest.fixture
def hook_off(monkeypatch):
    """route → the cells that switch the hook off; for "knob", every Sandbox the grader makes has none."""
    def use(route: str) -> list[str]:
        if route == "knob":
            monkeypatch.setattr(grade_module, "Sandbox", functools.partial(Sandbox, _audit_hook=False))
        return _prelude(route)
    return use


def _refused(r: dict) -> bool:
    """A cell that failed because the kernel said no (EPERM / EACCES as PermissionError), or the message hook."""
    return not r["ok"] and r["error"]["type"] in ("PermissionError", "Refused")


# ----------------------------------------------------------------------------- the hook routes
@pytest.mark.parametrize("route", ["globals", "code", "knob"])
def test_the_three_routes_around_the_hook_leave_the_kernel_in_charge(route):
    with _sandbox(route) as sb:
        for i, cell in enumerate(_prelude(route)):
            assert sb.run_cell(i, cell)["ok"]
        # a program started in the child's place (the old hook let it through once switched off)
        r = sb.run_cell(5, "import os\nos.execv('/bin/sh', ['sh', '-c', 'exit 0'])")
        assert _refused(r), r
        assert sb.alive
        assert sb.sandbox_state["seccomp"] is True and sb.sandbox_state["landlock_abi"] >= 1


# ----------------------------------------------------------------------------- reading what is not the child's
CHEAT_ARGV = """
import os, sys
for k in [k for k in sys.modules if k == "transformer_np" or k.startswith("transformer_np.")]:
    del sys.modules[k]
sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", "") != "StubFinder"]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0])))))
from transformer_np.ops.softmax import softmax_forward, softmax_backward
"""
CHEAT_SITE = """
import os, sys, site, numpy
for k in [k for k in sys.modules if k == "transformer_np" or k.startswith("transformer_np.")]:
    del sys.modules[k]
sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", "") != "StubFinder"]
site.addsitedir(os.path.dirname(os.path.dirname(os.path.realpath(numpy.__file__))))   # its .pth files too
from transformer_np.ops.softmax import softmax_forward, softmax_backward
"""


@pytest.mark.parametrize("route", HOOK_OFF)
@pytest.mark.parametrize("cheat", [CHEAT_ARGV, CHEAT_SITE], ids=["three-folders-above-argv0", "site-packages"])
def test_importing_the_library_from_the_graders_install_earns_nothing(cheat, route, tmp_path, hook_off):
    g = grade(tmp_path, EMPTY + hook_off(route) + [cheat])
    assert g.score == 0, [c.feedback for c in g.checks]


@pytest.mark.parametrize("route", HOOK_OFF)
def test_a_classmates_cells_cannot_be_read(route, tmp_path, hook_off):
    subs = tmp_path / "submissions"
    subs.mkdir()
    alice = notebook(subs / "alice.ipynb", SOL)
    copy = (f"import json\nnb = json.load(open({str(alice)!r}))\n"
            "for c in nb['cells']:\n    if c['cell_type'] == 'code':\n        exec(''.join(c['source']), globals())\n")
    notebook(subs / "bob.ipynb", EMPTY + hook_off(route) + [copy])
    alice_g, bob_g = grade_submissions("01_softmax", [subs], seed=SEED, limits=FAST)
    assert alice_g.score == 3
    assert bob_g.score == 0, [c.feedback for c in bob_g.checks]
    assert any("Permission denied" in n for n in bob_g.notes), bob_g.notes


@pytest.mark.parametrize("route", HOOK_OFF)
def test_the_graders_memory_command_line_and_environment_are_refused(route):
    with _sandbox(route) as sb:
        for i, cell in enumerate(_prelude(route)):
            assert sb.run_cell(i, cell)["ok"]
        for what in ("cmdline", "environ", "maps"):
            r = sb.run_cell(5, f"import os\ndata = open(f'/proc/{{os.getppid()}}/{what}', 'rb').read()\nassert data")
            assert _refused(r), (what, r)
        mem = ("import os\nf = open(f'/proc/{os.getppid()}/mem', 'rb')\n"
               "f.seek(int(open(f'/proc/{os.getppid()}/maps').readline().split('-')[0], 16))\nassert f.read(64)")
        assert _refused(sb.run_cell(6, mem))
        # the child's own /proc is closed too: nothing there to find the grader by
        assert _refused(sb.run_cell(7, "import os\nos.listdir('/proc')"))


@pytest.mark.parametrize("route", HOOK_OFF)
def test_only_the_working_folder_is_writable(route, tmp_path):
    gradebook = tmp_path / "grades.csv"
    gradebook.write_text("file,score\n", encoding="utf-8")
    with _sandbox(route) as sb:
        for i, cell in enumerate(_prelude(route)):
            assert sb.run_cell(i, cell)["ok"]
        assert sb.run_cell(3, "open('mine.txt', 'w').write('ok')\nimport os\nos.makedirs('a/b')\nos.rename('mine.txt', "
                              "'a/b/m.txt')\nos.remove('a/b/m.txt')")["ok"]
        for target in (str(gradebook), "/tmp/tnp-boundary-probe", "/dev/shm/tnp-boundary-probe",
                       "os.path.join(os.path.dirname(os.getcwd()), 'x')"):
            path = target if target.startswith("os.") else repr(target)
            assert _refused(sb.run_cell(4, f"import os\nopen({path}, 'w').write('x')")), target
    assert gradebook.read_text(encoding="utf-8") == "file,score\n"
    assert not os.path.exists("/tmp/tnp-boundary-probe")


# ----------------------------------------------------------------------------- other processes, network, programs
@pytest.mark.parametrize("route", HOOK_OFF)
def test_no_network_no_programs_no_ptrace_no_signals_to_others(route):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        with _sandbox(route) as sb:
            for i, cell in enumerate(_prelude(route)):
                assert sb.run_cell(i, cell)["ok"]
            attacks = {
                "connect": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
                "exec": "import os\nos.execv('/bin/sh', ['sh', '-c', 'exit 0'])",
                "spawn": "import subprocess\nsubprocess.run(['/bin/true'], check=True)",
                "fork (native)": "import ctypes\nassert ctypes.CDLL(None).fork() >= 0",
                "ptrace": ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"       # PTRACE_SEIZE: no stop
                           "assert libc.ptrace(0x4206, os.getppid(), 0, 0) == 0, 'ptrace refused'"),
                "kill the grader": "import os, signal\nos.kill(os.getppid(), signal.SIGCONT)",
                "new session": "import os\nos.setsid()",
            }
            for what, cell in attacks.items():
                r = sb.run_cell(5, cell)
                assert not r["ok"], what
                assert r["error"]["type"] in ("PermissionError", "Refused", "AssertionError"), (what, r)
                assert sb.alive, what
            assert sb.run_cell(6, "import os, signal\nos.kill(os.getpid(), 0)")["ok"]   # itself: allowed
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def _grade_cli_process(args: list[str], route: str, env: dict | None = None) -> subprocess.Popen:
    """``transformer-np grade ARGS`` in a process of its own (so an attack that kills it cannot end the tests);
    with route "knob" every child it starts has no audit hook."""
    code = ("import functools, sys\nfrom transformer_np.grader import grade, sandbox\n"
            + ("grade.Sandbox = functools.partial(sandbox.Sandbox, _audit_hook=False)\n" if route == "knob" else "")
            + "from transformer_np.cli import main\nraise SystemExit(main(sys.argv[1:]))\n")
    return subprocess.Popen([sys.executable, "-c", code, "grade", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("route", HOOK_OFF)
def test_killing_the_grader_is_refused_and_the_class_run_finishes(route, tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    kill = "import os\nos.kill(os.getppid(), 9)\n"
    notebook(subs / "a_killer.ipynb", EMPTY + _prelude(route) + [kill])
    notebook(subs / "b_good.ipynb", SOL)
    out = tmp_path / "grades.csv"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _grade_cli_process(["01_softmax", str(subs), "--csv", str(out), "--seed", "5", "--timeout", "5"], route,
                              env=dict(os.environ, TMPDIR=str(tmp)))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    rows = list(csv.reader(out.read_text(encoding="utf-8").splitlines()))
    scores = {Path(r[0]).name: r[1] for r in rows[1:]}
    assert scores == {"a_killer.ipynb": "0", "b_good.ipynb": "3"}
    assert list(tmp.iterdir()) == [] and _child_processes(str(tmp)) == []      # after the run: nothing left


@pytest.mark.parametrize("route", HOOK_OFF)
def test_a_detached_helper_cannot_rewrite_the_gradebook(route, tmp_path, capsys, hook_off, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "grades.csv"
    helper = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(3)\n"
              f"        open({str(out)!r}, 'w').write('file,score\\nhelper.ipynb,3\\n')\n"
              f"    os._exit(0)\n")
    notebook(tmp_path / "helper.ipynb", EMPTY + hook_off(route) + [helper])
    assert _cli("grade", "01_softmax", "helper.ipynb", "--csv", str(out), "--seed", "5", "--timeout", "5") == 0
    written = out.read_text(encoding="utf-8")
    assert written.splitlines()[1].startswith("helper.ipynb,0,3") and "grader_error" not in written, written
    time.sleep(5)
    assert out.read_text(encoding="utf-8") == written       # exact: nobody wrote the file since


def _child_processes(marker: str) -> list[int]:
    """The pids of the child programs (``child.py``) whose command line names ``marker`` (a run's temp folder)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        if "child.py" in cmd and marker in cmd:
            found.append(int(pid))
    return found


def test_a_killed_grader_leaves_no_process_and_no_folder(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    notebook(tmp_path / "slow.ipynb", SOL + ["import time\ntime.sleep(120)\n"])
    env = dict(os.environ, TMPDIR=str(tmp))
    proc = _grade_cli_process(["01_softmax", str(tmp_path / "slow.ipynb"), "--timeout", "200",
                               "--submission-timeout", "300"], "code", env=env)
    try:
        end = time.monotonic() + 60
        while not _child_processes(str(tmp)) and time.monotonic() < end:
            time.sleep(0.2)
        assert _child_processes(str(tmp)), "the child never started"
        assert any(p.name.startswith("tnp-grade-run-") for p in tmp.iterdir())
        time.sleep(1.0)                                         # the child is inside its sleep now
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        end = time.monotonic() + 10
        while (_child_processes(str(tmp)) or list(tmp.iterdir())) and time.monotonic() < end:
            time.sleep(0.2)
        assert _child_processes(str(tmp)) == []
        assert list(tmp.iterdir()) == []
    finally:
        if proc.poll() is None:
            proc.kill()


# ----------------------------------------------------------------------------- honest work
@pytest.mark.parametrize("module", ["pathlib", "doctest", "unittest", "pdb", "glob", "shutil", "zipfile",
                                    "numpy.testing"])
def test_a_correct_notebook_importing_a_standard_module_scores_full_marks(module, tmp_path):
    use = {  # each module imported and used as a student would, inside the working folder
        "pathlib": "import pathlib\np = pathlib.Path('notes') / 'a.txt'\np.parent.mkdir()\np.write_text('mine')\n"
                   "assert [q.name for q in pathlib.Path('notes').iterdir()] == ['a.txt']\n",
        "doctest": "import doctest\ndef twice(x):\n    '''\n    >>> twice(2)\n    4\n    '''\n    return 2 * x\n"
                   "doctest.run_docstring_examples(twice, {'twice': twice})\n",
        "unittest": "import io, unittest\nclass T(unittest.TestCase):\n    def test_sums_to_one(self):\n"
                    "        self.assertAlmostEqual(float(softmax_forward(np.zeros((1, 3)))[0].sum()), 1.0)\n"
                    "r = unittest.TextTestRunner(stream=io.StringIO()).run("
                    "unittest.defaultTestLoader.loadTestsFromTestCase(T))\nassert r.wasSuccessful()\n",
        "pdb": "import pdb\nassert callable(pdb.set_trace)\n",
        "glob": "import glob\nopen('a.txt', 'w').close()\nassert glob.glob('*.txt') == ['a.txt']\n",
        "shutil": "import os, shutil\nos.makedirs('d')\nopen('d/a', 'w').close()\nshutil.copy('d/a', 'd/b')\n"
                  "shutil.copytree('d', 'e')\nshutil.rmtree('d')\nshutil.rmtree('e')\n",
        "zipfile": "import zipfile\nwith zipfile.ZipFile('a.zip', 'w') as z:\n    z.writestr('a.txt', 'x')\n"
                   "assert zipfile.ZipFile('a.zip').read('a.txt') == b'x'\n",
        "numpy.testing": "import numpy.testing as npt\nnpt.assert_allclose(softmax_forward(np.zeros((1, 4)))[0], "
                         "np.full((1, 4), 0.25))\n",
    }
    g = grade(tmp_path, SOL + [use[module]])
    assert g.score == g.out_of == 3, ([c.feedback for c in g.checks], g.notes)
    assert not any(f"cell {len(SOL)} raised" in n for n in g.notes), g.notes       # the import cell ran


# ----------------------------------------------------------------------------- where the kernel offers too little
def test_a_machine_without_the_mechanisms_is_refused_unless_no_sandbox(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    notebook(tmp_path / "a.ipynb", SOL)
    monkeypatch.setattr(confine, "probe", lambda: ["Landlock (Linux ≥ 5.13)"])
    assert _cli("grade", "01_softmax", "a.ipynb") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Landlock" in err and "--no-sandbox" in err, err
    with pytest.raises(confine.ConfinementUnavailable, match="Landlock"):
        grade_notebook(tmp_path / "a.ipynb", "01_softmax", seed=SEED, limits=FAST)
    assert _cli("grade", "01_softmax", "a.ipynb", "--no-sandbox", "--json", "--seed", "3") == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert [(s["score"], s["sandbox"]) for s in doc["submissions"]] == [(3, "unsandboxed")]
    assert "formative" in captured.err


def test_the_grader_refuses_a_child_that_did_not_confine_itself():
    full = {"pdeathsig": True, "userns": True, "caps": 0, "uid": 0, "no_new_privs": True, "landlock_abi": 1,
            "seccomp": True}
    assert confine.state_problem(full, root=True) is None
    for key, bad in (("landlock_abi", 0), ("seccomp", False), ("no_new_privs", False), ("pdeathsig", False),
                     ("caps", 1 << 21)):
        assert confine.state_problem(dict(full, **{key: bad}), root=True), key
    assert confine.state_problem(dict(full, userns=False, caps=None), root=True) == "it kept root's privileges"
    assert confine.state_problem(dict(full, userns=False, caps=None, uid=1000), root=False) is None
    assert confine.state_problem({"error": "no Landlock"}, root=False) == "no Landlock"
    assert confine.state_problem(None, root=False)
