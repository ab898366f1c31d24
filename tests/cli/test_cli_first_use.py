"""The command line at first use: ``--version``; Ctrl-C in the two long commands says in one line what was kept
and how to go on (exit 130, as a shell reports SIGINT); errors name the flags a person typed, never the Python
parameter behind them (``embed --model`` said ``path_or_name``, ``train --d-model`` said ``d_model``) and never
the system's "[Errno 2] …" for an --out that cannot be made."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from transformer_np import __version__
from transformer_np.cli import main

ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}     # cwd = ROOT: this checkout's package


def _sigint_as_at_a_terminal() -> None:
    """In the child, before Python starts: Ctrl-C's default disposition. A test run started in the background of a
    non-interactive shell (``cmd &``) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt: the
    command would run on as it should there, but these tests are about a user pressing Ctrl-C at a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(*argv: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "transformer_np", *argv], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_sigint_as_at_a_terminal, **kw)


def test_version():
    r = subprocess.run([sys.executable, "-m", "transformer_np", "--version"], cwd=ROOT, env=ENV, text=True,
                       capture_output=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"transformer-np {__version__}\n", "")


# ----------------------------------------------------------------------------- Ctrl-C
def test_ctrl_c_in_train_says_which_checkpoint_is_kept_and_the_resume_command_works(tmp_path):
    out = tmp_path / "run"
    p = _cli("train", "--out", str(out), "--task", "sort", "--layers", "1", "--d-model", "16", "--heads", "2",
             "--schedule", "constant", "--steps", "1000000", "--eval-every", "1", "--quiet")
    deadline = time.monotonic() + 600           # a generous bound on a busy machine, not a speed test
    while not (out / "checkpoint.npz").is_file():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 130 and stdout == "", (p.returncode, stdout, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    m = re.fullmatch(r"transformer-np train: interrupted; the checkpoint of step (\d+) is kept in (.+): continue "
                     r"with transformer-np train --out (\S+) --resume", lines[0])
    assert m and m[2] == str(out / "checkpoint.npz") and m[3] == str(out), lines[0]
    step = int(m[1])
    # the command it gives continues from that step (two more steps, so that the test ends)
    r = subprocess.run([sys.executable, "-m", "transformer_np", "train", "--out", m[3], "--resume", "--steps",
                        str(step + 2), "--quiet"], cwd=ROOT, env=ENV, text=True, capture_output=True, timeout=600)
    assert r.returncode == 0 and f"resumed at step {step}, ran 2 steps" in r.stdout, (r.stdout, r.stderr)


def test_ctrl_c_in_train_before_a_checkpoint_says_nothing_was_kept(tmp_path, monkeypatch, capsys):
    import transformer_np.cli.train as cli_train

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_train, "train", interrupted)       # Ctrl-C before the first evaluation
    assert main(["train", "--out", str(tmp_path / "run"), "--quiet"]) == 130
    out, err = capsys.readouterr()
    assert out == "" and err == ("transformer-np train: interrupted before the first checkpoint (written every "
                                 "--eval-every steps): nothing was kept; run the command again to start over\n")


def test_ctrl_c_in_gradcheck_says_where_it_stopped_and_that_nothing_is_kept():
    p = _cli("gradcheck")
    first = p.stderr.readline()                            # "gradcheck [1/42] linear": the checks have begun
    assert first.startswith("gradcheck [1/"), first
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 130 and stdout == "", (p.returncode, stdout, stderr)   # no half table on stdout
    last = stderr.splitlines()[-1]
    assert re.fullmatch(r"transformer-np gradcheck: interrupted at check \d+ of \d+ \(\S+\); nothing is kept "
                        r"\(gradcheck writes no file and its table is printed at the end\): run it again to check "
                        r"everything \(--max-coords 4 is quicker\)", last), last


# ----------------------------------------------------------------------------- errors name flags
TRAIN = ["train", "--quiet", "--out"]
# (argv, the flag the error must name, what it said before); {tmp} is the test's folder
NAMING = [
    (["embed", "--model", "{tmp}/no-such-model", "hi"], "--model", "path_or_name"),
    ([*TRAIN, "{tmp}/r", "--d-model", "30", "--heads", "4"], "--d-model must be divisible by --heads", "d_model"),
    ([*TRAIN, "{tmp}/r", "--batch-size", "0"], "--batch-size must be >= 1", "batch_size"),
    ([*TRAIN, "{tmp}/r", "--eval-every", "0"], "--eval-every must be >= 1", "eval_every"),
    ([*TRAIN, "{tmp}/r", "--seq-len", "1"], "--seq-len must be >= 2", "seq_len"),
    ([*TRAIN, "{tmp}/r", "--weight-decay", "-1"], "--weight-decay must be >= 0", "weight_decay"),
    ([*TRAIN, "{tmp}/r", "--adam-eps", "0"], "--adam-eps must be > 0", "error: eps"),
    ([*TRAIN, "{tmp}/r", "--betas", "0.9", "1"], "--betas B2 must be < 1", "betas[1]"),
    ([*TRAIN, "{tmp}/r", "--lr", "nan"], "--lr must be finite", "error: lr"),
    ([*TRAIN, "{tmp}/r", "--layers", "0"], "--layers must be >= 1", "error: layers"),
    ([*TRAIN, "{tmp}/a-file"], "--out: {tmp}/a-file exists and is not a folder", "error: out:"),
    ([*TRAIN, "{tmp}/a-file/run", "--steps", "1"], "--out {tmp}/a-file/run: cannot write {tmp}/a-file/run:", "Errno"),
    pytest.param(["figures", "--out", "{tmp}/a-file/figs", "--only", "trace", "--quiet"],
                 "--out {tmp}/a-file/figs: cannot write", "Errno", marks=pytest.mark.plot),   # figures needs matplotlib
    (["bench", "--shape", "nope"], "--shape must be one of", "error: shape"),
]


@pytest.mark.parametrize("argv, says, said", NAMING, ids=[" ".join(a[:1] + a[3:] if a[0] == "train" else a[:3])
                                                          for a, _, _ in (getattr(p, "values", p) for p in NAMING)])
def test_errors_name_the_flag_not_the_python_parameter(argv, says, said, tmp_path, capsys):
    (tmp_path / "a-file").write_text("not a folder")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"transformer-np {argv[0]}: error: "), err
    assert says.replace("{tmp}", str(tmp_path)) in err and said not in err, err


def test_flag_names_leaves_prose_and_paths_alone():
    from transformer_np.cli import flag_names

    flags = {"steps": "--steps", "d_model": "--d-model", "out": "--out"}
    assert flag_names("steps must be >= 1; the warm-up steps are kept", flags) == \
        "--steps must be >= 1; the warm-up steps are kept"
    assert flag_names("no file at /runs/d_model/out: try again", flags) == "no file at /runs/d_model/out: try again"
    assert flag_names("got d_model = 30", flags) == "got --d-model = 30"
