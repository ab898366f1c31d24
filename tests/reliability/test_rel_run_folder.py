"""Issue 37, item 4: a run folder is one run. `train --overwrite` removes the earlier run's files before the new
run writes anything (a new run that diverges before its first save no longer leaves the old checkpoint beside
its own loss curve), and every output path is checked before the first step (a refused run changes nothing)."""

from __future__ import annotations

import os

import numpy as np

from transformer_np.training.loop import load_checkpoint

SMALL = ["--task", "sort", "--layers", "1", "--d-model", "16", "--heads", "2", "--batch-size", "4",
         "--eval-every", "2", "--steps", "4", "--quiet"]


def _snapshot(folder):
    return {p.name: (p.is_symlink(), os.readlink(p) if p.is_symlink() else p.read_bytes())
            for p in sorted(folder.iterdir())}


def test_overwrite_that_diverges_before_its_first_save_leaves_no_earlier_checkpoint(tmp_path, cli):
    out = tmp_path / "run"
    assert cli("train", *SMALL, "--out", out)[0] == 0
    assert (out / "checkpoint.npz").exists()
    # a new run that blows up at once: its first evaluation finds non-finite parameters, so it never saves
    code, msg, err = cli("train", *SMALL, "--lr", "1e39", "--eval-every", "100", "--out", out, "--overwrite")
    assert code == 0, err
    assert "DIVERGED" in msg
    if (out / "checkpoint.npz").exists():                       # only a checkpoint the new run wrote
        assert load_checkpoint(out / "checkpoint.npz").cfg.lr == 1e39
    assert "there is no earlier checkpoint" in msg


def test_a_symlinked_loss_curve_is_refused_before_the_first_step(tmp_path, cli, refused_cli):
    out = tmp_path / "run"
    assert cli("train", *SMALL, "--out", out)[0] == 0
    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    (out / "loss_curve.json").unlink()
    (out / "loss_curve.json").symlink_to(victim)
    before = _snapshot(out)
    line = refused_cli("train", "--resume", "--steps", "8", "--out", out, "--quiet")
    assert str(out / "loss_curve.json") in line and "symbolic link" in line
    assert _snapshot(out) == before                              # exact: the checkpoint did not advance
    assert load_checkpoint(out / "checkpoint.npz").step == 4
    assert victim.read_text() == "precious"


def test_a_folder_at_an_output_name_is_refused_before_the_first_step(tmp_path, refused_cli):
    out = tmp_path / "run"
    (out / "checkpoint.npz").mkdir(parents=True)
    line = refused_cli("train", *SMALL, "--out", out, "--overwrite")
    assert str(out / "checkpoint.npz") in line and "is a folder" in line
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.npz"]


def test_overwrite_keeps_nothing_of_the_earlier_run(tmp_path, cli):
    out = tmp_path / "run"
    assert cli("train", *SMALL, "--seed", "3", "--out", out)[0] == 0
    assert cli("train", *SMALL, "--seed", "5", "--out", out, "--overwrite")[0] == 0
    state = load_checkpoint(out / "checkpoint.npz")
    assert state.cfg.seed == 5 and np.isfinite(state.history["loss"]).all()
