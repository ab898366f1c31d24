"""Issue 16, checkpoints: the schema is checked in full before anything is assigned; corrupt or foreign
files, a mismatching run, and hostile values are one-line CheckpointErrors naming the entry; interrupted
or failed saves never cost the last good checkpoint, and resume just works afterwards."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from transformer_np.errors import CheckpointError, ResourceLimitError
from transformer_np.training import checkpoint as ckpt
from transformer_np.training.loop import RunConfig, load_checkpoint, save_checkpoint, train

W = "param/layers.0.attn.W_Q"


def _cfg(**kw):
    base = dict(task="sort", layers=2, d_model=16, heads=2, steps=8, eval_every=4, batch_size=4, eval_batches=1,
                seed=3, grad_norm_steps=4)
    base.update(kw)
    return RunConfig(**base)


@pytest.fixture
def run_dir(tmp_path):
    out = tmp_path / "run"
    train(_cfg(), out=out)
    return out


def _members(path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _rewrite(path, mutate) -> None:
    arrays = _members(path)
    mutate(arrays)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _refused(path, match, **kw) -> str:
    with pytest.raises(CheckpointError, match=match) as info:
        load_checkpoint(path, **kw)
    msg = str(info.value)
    assert isinstance(info.value, ValueError) and "\n" not in msg and "allow_pickle" not in msg
    return msg


# ----------------------------------------------------------------------------- the stored arrays
def test_a_clean_checkpoint_round_trips(run_dir):
    state = load_checkpoint(run_dir / "checkpoint.npz")
    assert state.step == state.start_step == 8
    ref = _members(run_dir / "checkpoint.npz")
    for k, v in state.params.items():
        np.testing.assert_array_equal(v, ref["param/" + k])   # exact: the file's own arrays, read back


@pytest.mark.parametrize("value, found", [
    (np.float32(7.0), r"found shape \(\) dtype float32"),                         # was broadcast to a 16×16 of 7s
    (np.zeros(16, np.float32), r"found shape \(16,\) dtype float32"),             # was copied into every row
    (np.zeros((16, 16), np.float64), r"found shape \(16, 16\) dtype float64"),    # was cast
    (np.zeros((16, 16), np.int64), r"found shape \(16, 16\) dtype int64"),
    (np.zeros((16, 17), np.float32), r"found shape \(16, 17\) dtype float32"),
])
def test_wrong_shape_or_dtype_names_the_entry(run_dir, value, found):
    path = run_dir / "checkpoint.npz"
    _rewrite(path, lambda a: a.update({W: np.asarray(value)}))
    _refused(path, rf"entry '{W}': expected shape \(16, 16\) dtype float32, {found}")


def test_extra_and_missing_arrays_are_listed(run_dir):
    path = run_dir / "checkpoint.npz"
    _rewrite(path, lambda a: a.update({"param/layers.7.attn.W_Q": np.zeros((16, 16), np.float32)}))
    _refused(path, r"does not match its config \(unexpected \['param/layers.7.attn.W_Q'\]\)")
    _rewrite(path, lambda a: (a.pop("param/layers.7.attn.W_Q"), a.pop(W)))
    _refused(path, rf"missing \['{W}'\]")


@pytest.mark.parametrize("key", ["step", "history", "config", "optim/t"])
def test_missing_bookkeeping_entries(run_dir, key):
    path = run_dir / "checkpoint.npz"
    _rewrite(path, lambda a: a.pop(key))
    _refused(path, rf"'{key}'" if key != "config" else "has no 'config' entry")


@pytest.mark.parametrize("value, match", [
    (np.array(1_000_000, np.int64), r"entry 'step': expected a step in 0 … 8 \(the config's steps\), found 1000000"),
    (np.array(1e6), r"entry 'step': expected shape \(\) dtype int64, found shape \(\) dtype float64"),
    (np.array(12.7), r"entry 'step': expected shape \(\) dtype int64, found shape \(\) dtype float64"),
    (np.array(-1, np.int64), r"entry 'step': expected a step in 0 … 8"),
    (np.array(5, np.int64), r"entry 'optim/t': expected 0 … 5"),
])
def test_step_values(run_dir, value, match):
    path = run_dir / "checkpoint.npz"
    _rewrite(path, lambda a: a.update(step=value))
    _refused(path, match)


def test_step_disagreeing_with_the_history(run_dir):
    path = run_dir / "checkpoint.npz"
    def fewer_updates(a):                             # t < step is legal: diverged steps do not update
        for k in a:
            if k == "optim/t" or k.startswith("optim/step."):
                a[k] = np.array(6, np.int64)
    _rewrite(path, fewer_updates)
    state = load_checkpoint(path)
    assert state.opt.t == 6 and state.step == 8
    h = json.loads(str(_members(path)["history"]))
    h["loss"] = h["loss"][:5]
    _rewrite(path, lambda a: a.update(history=np.array(json.dumps(h))))
    _refused(path, r"entry 'history': 'loss' has 5 entries, but the checkpoint's step is 8")


@pytest.mark.parametrize("key, value, match", [
    ("optim/step.layers.0.attn.W_Q", np.array(-1, np.int64), r"optim/….*'step.layers.0.attn.W_Q' must be >= 0"),
    ("optim/step.layers.0.attn.W_Q", np.array(9, np.int64), r"must be <= t = 8, got 9"),
    ("optim/exp_avg_sq.layers.0.attn.W_Q", -np.ones((16, 16), np.float32), r"exp_avg_sq.layers.0.attn.W_Q' must be >="),
    ("optim/exp_avg.layers.0.attn.W_Q", np.full((16, 16), np.nan, np.float32), r"contains NaN/inf"),
])
def test_optimiser_entries(run_dir, key, value, match):
    path = run_dir / "checkpoint.npz"
    _rewrite(path, lambda a: a.update({key: value}))
    _refused(path, match)


def test_nan_parameters_are_refused(run_dir):
    path = run_dir / "checkpoint.npz"
    _rewrite(path, lambda a: a[W].__setitem__((0, 0), np.nan))
    _refused(path, rf"entry '{W}' contains NaN/inf values")


def test_object_arrays_are_never_unpickled(run_dir):
    path = run_dir / "checkpoint.npz"
    arrays = _members(path)
    arrays[W] = np.array([{"a": 1}], dtype=object)
    with open(path, "wb") as f:
        np.savez(f, **arrays)                         # np.savez pickles the object array
    _refused(path, rf"entry '{W}' holds Python objects .* refused")


# ----------------------------------------------------------------------------- the config
def test_config_nested_100k_deep(run_dir):
    path = run_dir / "checkpoint.npz"
    _rewrite(path, lambda a: a.update(config=np.array('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")))
    _refused(path, r"entry 'config': JSON nested 100001 levels deep")


@pytest.mark.parametrize("config, match", [
    ('[1, 2]', r"entry 'config': the file must hold a JSON object"),
    ('{"layers": "2"}', r"entry 'config' is not a valid run config: layers must be an int"),
    ('{"layers": 2.5}', r"layers must be an int"),
    ('{"lr": NaN}', r"entry 'config': lr is NaN"),
    ('{"nonsense": 1}', r"unknown run config fields \['nonsense'\]"),
    ('{"betas": 3}', r"betas must be a pair"),
])
def test_bad_config_values(run_dir, config, match):
    path = run_dir / "checkpoint.npz"
    _rewrite(path, lambda a: a.update(config=np.array(config)))
    _refused(path, match)


def test_crafted_config_with_a_million_layers_is_refused_at_once(run_dir, probe):
    path = run_dir / "checkpoint.npz"
    cfg = json.loads(str(_members(path)["config"]))
    cfg["layers"] = 10 ** 6
    _rewrite(path, lambda a: a.update(config=np.array(json.dumps(cfg))))
    rep = probe(f"""
        from transformer_np.training.loop import load_checkpoint
        load_checkpoint({str(path)!r})
    """)
    assert rep["error"] == "ResourceLimitError" and "train would need an estimated" in rep["message"], rep
    assert rep["seconds"] < 5 and rep["max_rss_mb"] < 300, rep


@pytest.mark.parametrize("flag, value, field", [("--layers", 3, "layers"), ("--d-model", 32, "d_model"),
                                                ("--task", "tag", "task"), ("--dtype", "float64", "dtype")])
def test_resume_with_different_settings_is_refused(run_dir, refused_cli, flag, value, field):
    line = refused_cli("train", "--resume", "--out", run_dir, flag, value, "--quiet")
    # the command line names its flags only (the API below names the field)
    assert f"with {flag} = " in line and f"({flag})" in line and "checkpoint" in line
    assert not re.search(rf"(?<![\w-]){field} = ", line), line
    with pytest.raises(CheckpointError, match=rf"written by a run with {field} = "):
        train(_cfg(**{field: value}), out=run_dir, resume=True)


def test_resume_reports_the_steps_it_ran(run_dir, cli):
    code, out, err = cli("train", "--resume", "--out", run_dir, "--steps", 12, "--quiet")
    assert code == 0, err
    assert "resumed at step 8, ran 4 steps to step 12" in out
    code, out, err = cli("train", "--resume", "--out", run_dir, "--steps", 12, "--quiet")
    assert code == 0 and "resumed at step 12, ran 0 steps" in out and "already at --steps 12" in out


# ----------------------------------------------------------------------------- corrupt and foreign files
def test_empty_file(tmp_path):
    p = tmp_path / "checkpoint.npz"
    p.write_bytes(b"")
    _refused(p, r"is empty \(0 bytes\)")


def test_random_bytes(tmp_path):
    p = tmp_path / "checkpoint.npz"
    p.write_bytes(np.random.default_rng(0).bytes(4096))
    _refused(p, r"is not an \.npz \(zip\) archive")


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9, 0.999])
def test_truncated_zip(run_dir, keep):
    p = run_dir / "checkpoint.npz"
    data = p.read_bytes()
    p.write_bytes(data[: int(len(data) * keep)])
    _refused(p, r"damaged|truncated")


def test_crc_damaged_zip(run_dir):
    p = run_dir / "checkpoint.npz"
    with zipfile.ZipFile(p) as z:
        info = z.getinfo(W + ".npy")
    data = bytearray(p.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 200   # inside the data
    data[start] ^= 0xFF
    p.write_bytes(bytes(data))
    _refused(p, rf"entry '{W}' is damaged \(Bad CRC-32")


def test_a_zip_that_is_not_a_checkpoint(tmp_path):
    p = tmp_path / "checkpoint.npz"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("hello.txt", "hi")
    _refused(p, r"holds 'hello.txt', which is not an \.npy array")


def test_missing_file(tmp_path, refused_cli):
    _refused(tmp_path / "nope.npz", "checkpoint not found")
    assert "no checkpoint at" in refused_cli("train", "--resume", "--out", tmp_path / "nope")


# ----------------------------------------------------------------------------- interrupted and failed saves
def test_full_disk_keeps_the_last_checkpoint_and_resume_continues(tmp_path, monkeypatch, refused_cli, cli):
    out = tmp_path / "run"
    train(_cfg(), out=out)                                           # a good checkpoint at step 8
    good = (out / "checkpoint.npz").read_bytes()

    def full_disk(f, arrays):
        f.write(b"PK\x03\x04 half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "_write_npz", full_disk)
    line = refused_cli("train", "--resume", "--out", out, "--steps", 16, "--quiet")
    assert "No space left on device" in line and "the previous checkpoint is kept" in line
    assert (out / "checkpoint.npz").read_bytes() == good
    assert sorted(os.listdir(out)) == ["checkpoint.npz", "loss_curve.json"]        # no temporary left
    monkeypatch.undo()
    monkeypatch.setenv("TRANSFORMER_NP_MAX_BYTES", "8G")
    code, msg, err = cli("train", "--resume", "--out", out, "--steps", 16, "--quiet")  # no manual step
    assert code == 0 and "resumed at step 8, ran 8 steps to step 16" in msg, err
    ref = train(_cfg(steps=16), out=tmp_path / "ref")
    back = load_checkpoint(out / "checkpoint.npz")
    for k in ref.params:
        np.testing.assert_array_equal(back.params[k], ref.params[k])   # exact: resume = the same steps in one process


_KILLED_SAVE = """
import os, signal, sys
from transformer_np.training import checkpoint as ckpt
from transformer_np.training.loop import RunConfig, train

def die_half_way(f, arrays):
    f.write(b"PK\\x03\\x04" + b"x" * 1000)
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)

ckpt._write_npz = die_half_way
cfg = RunConfig(task="sort", layers=2, d_model=16, heads=2, steps=16, eval_every=4, batch_size=4, eval_batches=1,
                seed=3, grad_norm_steps=4)
train(cfg, out=sys.argv[1], resume=True)
"""


def test_sigkill_during_a_save_then_resume_continues(tmp_path, cli):
    out = tmp_path / "run"
    train(_cfg(), out=out)
    good = (out / "checkpoint.npz").read_bytes()
    env = {**os.environ, "PYTHONPATH": str(ckpt.Path(ckpt.__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(out)], env=env, capture_output=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr.decode()[-2000:]
    left = [n for n in os.listdir(out) if n.endswith(".tmp")]
    assert len(left) == 1 and left[0].startswith(".checkpoint.npz.")          # the killed writer's file
    assert (out / "checkpoint.npz").read_bytes() == good                     # the last good one is intact
    code, msg, err = cli("train", "--resume", "--out", out, "--steps", 16, "--quiet")
    assert code == 0 and "resumed at step 8, ran 8 steps to step 16" in msg, err
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]             # cleaned up
    assert load_checkpoint(out / "checkpoint.npz").step == 16


def test_a_stale_temporary_of_0_1_does_not_block_resume(run_dir, cli):
    (run_dir / "checkpoint.npz.tmp.npz").write_bytes(b"half")
    (run_dir / ".checkpoint.npz.999999999.tmp").write_bytes(b"half")        # a pid that cannot exist
    code, msg, err = cli("train", "--resume", "--out", run_dir, "--steps", 12, "--quiet")
    assert code == 0 and "ran 4 steps" in msg, err
    assert not (run_dir / "checkpoint.npz.tmp.npz").exists()
    assert not (run_dir / ".checkpoint.npz.999999999.tmp").exists()


def test_an_interrupt_during_a_save_removes_its_temporary(run_dir, monkeypatch):
    state = load_checkpoint(run_dir / "checkpoint.npz")
    good = (run_dir / "checkpoint.npz").read_bytes()

    def interrupted(f, arrays):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt, "_write_npz", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(run_dir / "checkpoint.npz", state)
    assert (run_dir / "checkpoint.npz").read_bytes() == good
    assert not [n for n in os.listdir(run_dir) if n.endswith(".tmp")]


def test_a_writer_error_midway_keeps_the_checkpoint_and_leaves_no_temporary(run_dir, monkeypatch):
    """Not an OSError: an exception from inside the zip writer (a bug, a refused array) propagates as it is,
    after the shared atomic-write routine removed the half-written temporary."""
    state = load_checkpoint(run_dir / "checkpoint.npz")
    good = (run_dir / "checkpoint.npz").read_bytes()

    def half_written(f, arrays):
        ckpt.np.savez(f, **dict(list(arrays.items())[:3]))           # some members really written
        raise RuntimeError("the writer failed after 3 members")

    monkeypatch.setattr(ckpt, "_write_npz", half_written)
    with pytest.raises(RuntimeError, match="after 3 members"):
        save_checkpoint(run_dir / "checkpoint.npz", state)
    assert (run_dir / "checkpoint.npz").read_bytes() == good
    assert not [n for n in os.listdir(run_dir) if n.endswith(".tmp")]


def test_a_failed_first_save_says_no_checkpoint_was_written(run_dir, tmp_path, monkeypatch):
    state = load_checkpoint(run_dir / "checkpoint.npz")
    fresh = tmp_path / "fresh"
    fresh.mkdir()

    def full_disk(f, arrays):
        f.write(b"PK\x03\x04 half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "_write_npz", full_disk)
    with pytest.raises(OSError, match=r"writing the checkpoint .*fresh/checkpoint\.npz failed \(No space left on "
                                      r"device\); no checkpoint was written") as info:
        save_checkpoint(fresh / "checkpoint.npz", state)
    assert info.value.errno == errno.ENOSPC
    assert os.listdir(fresh) == []


def test_resource_limit_is_not_a_checkpoint_error(run_dir, monkeypatch):
    monkeypatch.setenv("TRANSFORMER_NP_MAX_BYTES", "1000")
    with pytest.raises(ResourceLimitError, match=r"more than the limit of 1000 B \(TRANSFORMER_NP_MAX_BYTES=1000\)"):
        load_checkpoint(run_dir / "checkpoint.npz")
