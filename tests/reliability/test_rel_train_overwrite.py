"""Issue 26, writes that never destroy: `train` refuses an --out holding an earlier run unless --resume or
--overwrite; every file is written atomically inside --out (symlinks replaced or refused, never written through);
a decaying schedule is not silently restarted by a larger --steps; a diverged run never saves inf parameters."""

from __future__ import annotations

import os

import numpy as np
import pytest

from transformer_np.errors import CheckpointError, InputValueError, NonFiniteError
from transformer_np.training.loop import RunConfig, load_checkpoint, save_checkpoint, save_loss_curve, train

SMALL = ["--task", "sort", "--layers", "1", "--d-model", "16", "--heads", "2", "--batch-size", "4",
         "--eval-every", "2", "--steps", "4", "--quiet"]


def _cfg(**kw):
    base = dict(task="sort", layers=1, d_model=16, heads=2, steps=4, eval_every=2, batch_size=4, eval_batches=1,
                seed=1)
    return RunConfig(**{**base, **kw})


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_second_plain_run_into_the_same_out_is_refused_and_changes_nothing(tmp_path, cli, refused_cli):
    out = tmp_path / "run"
    code, _, err = cli("train", *SMALL, "--out", out)
    assert code == 0, err
    before = _snapshot(out)
    assert {"checkpoint.npz", "loss_curve.json"} <= set(before)
    line = refused_cli("train", *SMALL, "--seed", "7", "--out", out)
    assert f"{out / 'checkpoint.npz'} already exists" in line and "--resume" in line and "--overwrite" in line
    assert _snapshot(out) == before                                   # exact: not one byte rewritten


def test_a_loss_curve_alone_also_counts_as_an_earlier_result(tmp_path, refused_cli):
    out = tmp_path / "run"
    out.mkdir()
    (out / "loss_curve.json").write_text("{}")
    assert "loss_curve.json already exists" in refused_cli("train", *SMALL, "--out", out)
    assert (out / "loss_curve.json").read_text() == "{}"


def test_overwrite_replaces_the_earlier_run(tmp_path, cli):
    out = tmp_path / "run"
    assert cli("train", *SMALL, "--out", out)[0] == 0
    first = load_checkpoint(out / "checkpoint.npz")
    code, msg, err = cli("train", *SMALL, "--seed", "7", "--out", out, "--overwrite")
    assert code == 0, err
    second = load_checkpoint(out / "checkpoint.npz")
    assert second.cfg.seed == 7 and first.cfg.seed == 0
    assert not [n for n in os.listdir(out) if n.endswith(".tmp") or n.endswith(".tmp.png")]


def test_resume_and_overwrite_together_are_refused(tmp_path, cli, refused_cli):
    out = tmp_path / "run"
    assert cli("train", *SMALL, "--out", out)[0] == 0
    assert "contradict" in refused_cli("train", "--resume", "--overwrite", "--out", out, "--quiet")


def test_the_api_refuses_too_naming_the_file(tmp_path):
    train(_cfg(), out=tmp_path)
    with pytest.raises(InputValueError, match="checkpoint.npz already exists"):
        train(_cfg(seed=2), out=tmp_path)
    assert train(_cfg(seed=2), out=tmp_path, overwrite=True).cfg.seed == 2
    assert load_checkpoint(tmp_path / "checkpoint.npz").cfg.seed == 2


def test_a_run_writes_only_its_three_files_inside_out(tmp_path, cli):
    out = tmp_path / "deep" / "run"
    assert cli("train", *SMALL, "--out", out)[0] == 0
    names = set(os.listdir(out))
    assert names <= {"checkpoint.npz", "loss_curve.json", "loss_curve.png"} and "checkpoint.npz" in names
    assert sorted(os.listdir(tmp_path)) == ["deep"] and os.listdir(tmp_path / "deep") == ["run"]


def test_symlinks_in_out_are_never_written_through(tmp_path, cli):
    out = tmp_path / "run"
    assert cli("train", *SMALL, "--out", out)[0] == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (out / "loss_curve.png").unlink(missing_ok=True)
    (out / "loss_curve.png").symlink_to(victim)                      # replaced by the new plot, not written through
    os.symlink(victim, out / f".checkpoint.npz.{os.getpid()}.tmp")   # a planted temporary name
    code, _, err = cli("train", "--resume", "--steps", "6", "--out", out, "--quiet")
    # loss_curve.json is not a symlink here: the run completes
    assert code == 0, err
    assert victim.read_text() == "precious"
    assert load_checkpoint(out / "checkpoint.npz").step == 6
    # a symlink at the loss curve is refused by the atomic writer, naming it
    (out / "loss_curve.json").unlink()
    (out / "loss_curve.json").symlink_to(victim)
    state = load_checkpoint(out / "checkpoint.npz")
    with pytest.raises(ValueError, match="symbolic link"):
        save_loss_curve(out / "loss_curve.json", state)
    assert victim.read_text() == "precious"


def test_the_loss_curve_is_written_atomically(tmp_path, monkeypatch):
    from transformer_np import _files

    state = train(_cfg(), out=tmp_path)
    good = (tmp_path / "loss_curve.json").read_bytes()

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_files.os, "replace", fail)
    with pytest.raises(ValueError, match="No space left on device"):
        save_loss_curve(tmp_path / "loss_curve.json", state)
    assert (tmp_path / "loss_curve.json").read_bytes() == good      # exact: the old file untouched
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


# ----------------------------------------------------------------------------- schedules on resume
@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_a_decaying_schedule_keeps_its_steps_on_resume(tmp_path, schedule, cli, refused_cli):
    out = tmp_path / "run"
    assert cli("train", *SMALL, "--schedule", schedule, "--out", out)[0] == 0
    before = _snapshot(out)
    line = refused_cli("train", "--resume", "--steps", "8", "--out", out, "--quiet")
    assert f"{schedule} schedule decays the learning rate to 0 at step 4" in line and "--steps 8" in line
    assert _snapshot(out) == before
    code, msg, _ = cli("train", "--resume", "--out", out, "--quiet")  # same total: fine (nothing to do)
    assert code == 0 and f"where its {schedule} schedule ends" in msg


def test_an_interrupted_decaying_run_resumes_to_its_own_total(tmp_path):
    from transformer_np.training.loop import build, train_step

    cfg = _cfg(schedule="linear", steps=6)
    full = train(cfg)
    state = build(cfg)
    for _ in range(4):                                                # interrupted after step 4 of 6
        train_step(state)
    save_checkpoint(tmp_path / "checkpoint.npz", state)
    resumed = train(cfg, out=tmp_path, resume=True)
    assert resumed.step == 6
    assert resumed.history["lr"] == full.history["lr"]                # exact: the same schedule, same steps
    assert resumed.history["loss"] == full.history["loss"]


def test_a_constant_schedule_can_be_extended(tmp_path):
    train(_cfg(), out=tmp_path)
    assert train(_cfg(steps=6), out=tmp_path, resume=True).step == 6


# ----------------------------------------------------------------------------- diverged runs
def test_a_diverged_run_never_saves_inf_parameters(tmp_path, cli):
    out = tmp_path / "run"
    code, msg, err = cli("train", *SMALL, "--lr", "1e39", "--out", out)
    assert code == 0, err
    assert "DIVERGED" in msg and "is not finite" in msg and "no checkpoint was written" in msg
    if (out / "checkpoint.npz").exists():                             # only a checkpoint from before the blow-up
        state = load_checkpoint(out / "checkpoint.npz")
        assert all(np.isfinite(v).all() for v in state.params.values())


def test_save_checkpoint_refuses_a_non_finite_parameter_naming_it(tmp_path):
    state = train(_cfg())
    state.params["layers.0.ln1.gamma"][3] = np.inf
    with pytest.raises(NonFiniteError, match=r"entry 'param/layers\.0\.ln1\.gamma' contains NaN/inf"):
        save_checkpoint(tmp_path / "checkpoint.npz", state)
    assert not os.listdir(tmp_path)


def test_a_checkpoint_with_inf_written_by_hand_is_refused_on_resume_naming_the_parameter(tmp_path, refused_cli):
    train(_cfg(), out=tmp_path)
    with np.load(tmp_path / "checkpoint.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["param/layers.0.ln1.gamma"][0] = np.inf
    with open(tmp_path / "checkpoint.npz", "wb") as f:
        np.savez(f, **arrays)
    line = refused_cli("train", "--resume", "--steps", "6", "--out", tmp_path, "--quiet")
    assert "'param/layers.0.ln1.gamma' contains NaN/inf" in line
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "checkpoint.npz")
