"""Issue 26, decompression bombs in checkpoints: a ~1 MB checkpoint whose entry unpacks to 1 GiB is refused in
under a second, in one line naming the file and the entry, with the process staying under 500 MB — whether the
.npy header, the zip entry's declared size or only the deflate stream itself carries the lie."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest

from transformer_np.errors import CheckpointError
from transformer_np.training.checkpoint import _history_limits, load_checkpoint
from transformer_np.training.loop import RunConfig, train

GIB = 2 ** 30
SEG = 16 * 2 ** 20                     # one flushed deflate segment: 16 MiB of data in ~16 kB


def _cfg(**kw):
    base = dict(task="sort", layers=2, d_model=16, heads=2, steps=8, eval_every=4, batch_size=4, eval_batches=1,
                seed=3, grad_norm_steps=4)
    base.update(kw)
    return RunConfig(**base)


@pytest.fixture(scope="module")
def members(tmp_path_factory):
    """The .npy bytes of every entry of a real checkpoint (a finished 8-step run)."""
    out = tmp_path_factory.mktemp("bomb") / "run"
    train(_cfg(), out=out)
    raw = {}
    with np.load(out / "checkpoint.npz", allow_pickle=False) as z:
        for k in z.files:
            buf = io.BytesIO()
            np.lib.format.write_array(buf, z[k], allow_pickle=False)
            raw[k] = buf.getvalue()
    return raw


def _npy_header(descr: str, shape: tuple) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _deflated(header: bytes, fill: bytes, total: int) -> bytes:
    """A raw deflate stream of ``header`` followed by ``total`` bytes of ``fill`` (repeated), built from one
    flushed 16 MiB segment repeated: after Z_FULL_FLUSH a segment refers to nothing before it."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(header) + c.flush(zlib.Z_FULL_FLUSH)
    seg = c.compress(fill * (SEG // len(fill))) + c.flush(zlib.Z_FULL_FLUSH)
    return head + seg * (total // SEG) + c.flush()


def _write_zip(path, entries) -> None:
    """A zip archive written by hand, so entries can lie: entries are (name, method, stream, crc, declared size).
    The CRC of a bomb is not its data's: the data must never be decompressed far enough to check it."""
    local, central = io.BytesIO(), io.BytesIO()
    for name, method, stream, crc, size in entries:
        fname = (name + ".npy").encode()
        offset = local.tell()
        local.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(stream), size,
                                len(fname), 0) + fname + stream)
        central.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc, len(stream),
                                  size, len(fname), 0, 0, 0, 0, 0, offset) + fname)
    cd = central.getvalue()
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(cd), local.tell(), 0)
    path.write_bytes(local.getvalue() + cd + end)


def _stored(name, data):
    return (name, 0, data, zlib.crc32(data), len(data))


def _bomb_checkpoint(folder, members, victim: str, how: str):
    """``folder/checkpoint.npz``: every entry as written, except ``victim``, which inflates to 1 GiB. ``how``:
    "header" — its .npy header says 1 GiB (history: 2^28 characters); "declared" — the header says what the
    schema expects but the zip entry declares 1 GiB; "stream" — header and declared size are small and honest,
    only the deflate stream goes on for 1 GiB."""
    entries = [_stored(k, v) for k, v in members.items() if k != victim]
    if victim == "history":
        small = _npy_header("<U100", ())
        big = _npy_header(f"<U{GIB // 4}", ())
        fill, small_data = b" \0\0\0", 400
    else:
        a = np.lib.format.read_array(io.BytesIO(members[victim]))
        small = big = _npy_header(np.lib.format.dtype_to_descr(a.dtype), a.shape)
        fill, small_data = b"\0" * a.dtype.itemsize, a.nbytes
    header = big if how == "header" else small
    declared = len(header) + (GIB if how in ("header", "declared") else small_data)
    entries.append((victim, 8, _deflated(header, fill, GIB), 0, declared))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "checkpoint.npz"
    _write_zip(path, entries)
    return path


def test_the_hand_written_archive_is_a_valid_checkpoint(members, tmp_path):
    # The zip writer itself is sound: the same entries, stored honestly, load as a checkpoint.
    path = tmp_path / "checkpoint.npz"
    _write_zip(path, [_stored(k, v) for k, v in members.items()])
    assert load_checkpoint(path).step == 8


# Every bomb here is a deflated member, which np.savez never writes: since issue 37 each is refused from the zip
# directory ("is compressed"), before its .npy header or its stream is looked at. The lies a stored member can
# tell (its .npy header, its declared size) are tested in test_rel_checkpoint_members.py.
CASES = [("history", "header", "is compressed"), ("history", "declared", "is compressed"),
         ("history", "stream", "is compressed"), ("param/layers.0.attn.W_Q", "declared", "is compressed"),
         ("param/layers.0.attn.W_Q", "stream", "is compressed")]


@pytest.mark.parametrize("victim, how, match", CASES)
def test_a_1gib_bomb_is_refused_naming_the_entry(members, tmp_path, victim, how, match):
    path = _bomb_checkpoint(tmp_path / "run", members, victim, how)
    assert path.stat().st_size < 2 * 2 ** 20
    with pytest.raises(CheckpointError, match=match) as info:
        load_checkpoint(path)
    msg = str(info.value)
    assert str(path) in msg and f"'{victim}'" in msg and "\n" not in msg


@pytest.mark.parametrize("victim, how", [(v, h) for v, h, _ in CASES])
def test_train_resume_refuses_the_bomb_fast_in_little_memory(members, tmp_path, probe, victim, how):
    out = tmp_path / "run"
    _bomb_checkpoint(out, members, victim, how)
    # The imports and the parser (a fixed cost of every command, ~1 s on a busy machine) are timed apart from
    # the refusal, in CPU seconds of the child (not wall time: the machine may be busy); the peak memory covers
    # both.
    rep = probe(f"""
        from transformer_np.cli import build_parser, main
        build_parser()
        t1 = time.process_time()
        out["exit"] = main(["train", "--resume", "--out", {str(out)!r}, "--quiet"])
        out["refusal_seconds"] = time.process_time() - t1
    """)
    lines = [ln for ln in rep["stderr"].splitlines() if ln.strip()]
    assert rep["exit"] == 2, rep
    assert len(lines) == 1 and "Traceback" not in rep["stderr"], rep["stderr"]
    assert str(out / "checkpoint.npz") in lines[0] and f"'{victim}'" in lines[0]
    assert rep["refusal_seconds"] < 1.0, rep
    assert rep["max_rss_mb"] < 500, rep
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.npz"]      # nothing written next to it


def test_the_history_limit_follows_the_step_and_the_config():
    cfg = _cfg(layers=3, grad_norm_steps=5)
    chars0, tokens0 = _history_limits(0, cfg)
    chars9, tokens9 = _history_limits(9, cfg)
    assert chars0 < chars9 and tokens0 < tokens9
    # the limit holds a real worst case: a history of 9 steps with the longest floats json.dumps writes
    longest = -2.2250738585072014e-308
    h = {"step": list(range(9)), "loss": [longest] * 9, "lr": [longest] * 9, "grad_norm": [longest] * 9,
         "layer_grad_norms": [[longest] * 3] * 5, "eval": {"step": list(range(1, 10)), "loss": [longest] * 9,
                                                           "accuracy": [longest] * 9}, "diverged_at": None}
    import json

    from transformer_np.io.jsonfile import scan_json
    text = json.dumps(h)
    assert len(text) <= chars9 and scan_json(text.encode()).tokens <= tokens9
