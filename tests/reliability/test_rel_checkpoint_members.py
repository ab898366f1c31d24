"""Issue 37, item 3: checkpoints as this project writes them — members stored (not compressed), not encrypted, their
declared sizes consistent with the zip directory; every history field type-checked; the memory estimate compared
with the smallest of the available memory, RLIMIT_AS and the cgroup limit; a MemoryError in the loader a one-line
error. Each refusal from `train --resume`: exit 2, one line naming the file and the entry, the run folder
byte-identical."""

from __future__ import annotations

import json
import struct
import zipfile

import numpy as np
import pytest
from hostile import GIB, make_special

from transformer_np.errors import CheckpointError, ResourceLimitError
from transformer_np.training import checkpoint as ckpt_module
from transformer_np.training.checkpoint import load_checkpoint
from transformer_np.training.loop import RunConfig, train

AS_LIMIT = 4 * GIB


def _cfg(**kw):
    base = dict(task="sort", layers=1, d_model=16, heads=2, steps=4, eval_every=2, batch_size=4, eval_batches=1,
                seed=1)
    return RunConfig(**{**base, **kw})


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _arrays(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture
def run(tmp_path):
    out = tmp_path / "run"
    train(_cfg(), out=out)
    return out


def _resume_refused(refused_cli, out, *match):
    before = _snapshot(out)
    line = refused_cli("train", "--resume", "--steps", "6", "--out", out, "--quiet")
    assert str(out / "checkpoint.npz") in line, line
    for text in match:
        assert text in line, (text, line)
    assert _snapshot(out) == before                       # exact: not one byte of the run folder changed
    return line


def test_a_compressed_checkpoint_is_refused_naming_the_entry(run, refused_cli):
    arrays = _arrays(run / "checkpoint.npz")
    with open(run / "checkpoint.npz", "wb") as f:
        np.savez_compressed(f, **arrays)                  # valid, but never what this library writes
    _resume_refused(refused_cli, run, "is compressed", "refused before anything is decompressed")


def test_a_2mb_checkpoint_of_deflated_zeros_is_refused_fast_and_small(run, probe):
    # the finding: deflated zeros of a large model resumed at GBs; here param arrays of 1 GiB of zeros, 1 MB on disk
    arrays = _arrays(run / "checkpoint.npz")
    cfg = json.loads(str(arrays["config"]))
    cfg.update(d_model=8192, heads=2, steps=4)             # ~1 GiB of float32 parameters per copy
    (run / "loss_curve.json").unlink()
    with zipfile.ZipFile(run / "checkpoint.npz", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("config.npy", _npy(np.array(json.dumps(cfg))))
        z.writestr("param/embeddings.word.npy", _npy(np.zeros((2 ** 13, 2 ** 15), np.float32)))
    assert (run / "checkpoint.npz").stat().st_size < 2 * 2 ** 20
    before = _snapshot(run)
    rep = probe(f"""
        import contextlib, io
        from transformer_np.cli import build_parser, main
        build_parser()
        err = io.StringIO()
        t1 = time.process_time()
        with contextlib.redirect_stderr(err):
            out["exit"] = main(["train", "--resume", "--out", {str(run)!r}, "--quiet"])
        out["refusal_seconds"] = time.process_time() - t1
        out["message"] = err.getvalue()
    """, rlimit_as=AS_LIMIT, limit=None)
    lines = rep["message"].strip().splitlines()
    assert rep["exit"] == 2 and len(lines) == 1, rep
    assert str(run / "checkpoint.npz") in lines[0] and "compressed" in lines[0], rep
    assert rep["refusal_seconds"] < 1.0 and rep["max_rss_mb"] < 200, rep
    assert _snapshot(run) == before


def _npy(a):
    import io
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, allow_pickle=False)
    return buf.getvalue()


def _patch_central(path, key, fn):
    """Apply ``fn(fields) -> fields`` to the central-directory record of member ``key`` (the struct of
    zipfile's structCentralDir)."""
    data = bytearray(path.read_bytes())
    name = (key + ".npy").encode()
    fmt = "<4s4B4HL2L5H2L"
    start = 0
    while True:
        i = data.index(b"PK\x01\x02", start)
        fields = list(struct.unpack_from(fmt, data, i))
        n = fields[12]
        if bytes(data[i + 46:i + 46 + n]) == name:
            struct.pack_into(fmt, data, i, *fn(fields))
            path.write_bytes(bytes(data))
            return
        start = i + 4


def test_the_encrypted_bit_is_refused_in_one_line(run, refused_cli):
    def encrypted(f):
        f[5] |= 0x1                                       # general purpose flag bit 0: encrypted
        return f
    _patch_central(run / "checkpoint.npz", "history", encrypted)
    _resume_refused(refused_cli, run, "'history' is encrypted")


def test_declared_sizes_past_the_end_of_the_file_are_refused(run, refused_cli):
    def huge(f):
        f[10] = f[11] = 2 ** 31                           # compressed and uncompressed size: 2 GiB
        return f
    _patch_central(run / "checkpoint.npz", "param/layers.0.attn.W_Q", huge)
    _resume_refused(refused_cli, run, "'param/layers.0.attn.W_Q'", "past the end")


def test_stored_sizes_that_disagree_are_refused(run, refused_cli):
    def disagree(f):
        f[11] += 1000                                     # uncompressed size != stored size
        return f
    _patch_central(run / "checkpoint.npz", "config", disagree)
    _resume_refused(refused_cli, run, "'config' is stored but the zip directory declares")


@pytest.mark.parametrize("field, value, text", [
    ("loss", "oops", "'eval.loss' must hold numbers only"),
    ("accuracy", None, "'eval.accuracy' must hold numbers only"),
])
def test_every_history_eval_field_is_type_checked(run, refused_cli, field, value, text):
    arrays = _arrays(run / "checkpoint.npz")
    h = json.loads(str(arrays["history"]))
    h["eval"][field][0] = value
    arrays["history"] = np.array(json.dumps(h))
    with open(run / "checkpoint.npz", "wb") as f:
        np.savez(f, **arrays)
    _resume_refused(refused_cli, run, text)


def test_layer_grad_norms_must_be_numbers(run):
    arrays = _arrays(run / "checkpoint.npz")
    h = json.loads(str(arrays["history"]))
    h["layer_grad_norms"][0][0] = "x"
    arrays["history"] = np.array(json.dumps(h))
    with open(run / "checkpoint.npz", "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(CheckpointError, match="'layer_grad_norms' must hold"):
        load_checkpoint(run / "checkpoint.npz")


def test_a_fifo_in_place_of_the_checkpoint_is_refused_without_blocking(run, refused_cli):
    make_special(run / "checkpoint.npz", "fifo")
    line = refused_cli("train", "--resume", "--out", run, "--quiet")
    assert str(run / "checkpoint.npz") in line and "FIFO" in line


def test_a_memory_error_in_the_loader_is_one_line(run, monkeypatch):
    def no_memory(*a, **k):
        raise MemoryError
    monkeypatch.setattr(ckpt_module.np.lib.format, "read_array", no_memory)
    with pytest.raises(ResourceLimitError, match=r"checkpoint .*checkpoint\.npz: loading it ran out of the memory"):
        load_checkpoint(run / "checkpoint.npz")


def test_the_estimate_is_compared_with_rlimit_as(run, probe):
    # the run's estimate (a batch of 100,000) fits the machine's memory but not a 1 GB address-space limit
    arrays = _arrays(run / "checkpoint.npz")
    cfg = json.loads(str(arrays["config"]))
    cfg["batch_size"] = 100_000
    arrays["config"] = np.array(json.dumps(cfg))
    with open(run / "checkpoint.npz", "wb") as f:
        np.savez(f, **arrays)
    before = _snapshot(run)
    rep = probe(f"""
        import contextlib, io
        from transformer_np.cli import main
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            out["exit"] = main(["train", "--resume", "--steps", "6", "--out", {str(run)!r}, "--quiet"])
        out["message"] = err.getvalue()
    """, rlimit_as=GIB, limit=None)
    lines = rep["message"].strip().splitlines()
    assert rep["exit"] == 2 and len(lines) == 1 and "RLIMIT_AS" in lines[0], rep
    assert rep["max_rss_mb"] < 200, rep
    assert _snapshot(run) == before
