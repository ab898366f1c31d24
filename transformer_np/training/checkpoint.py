r"""Training checkpoints: one ``.npz`` file, written atomically, read only after a full schema check.

The file (a NumPy ``.npz``: a zip archive of ``.npy`` members, no pickles — it loads with
``np.load(path, allow_pickle=False)``):

    param/<name>           every parameter of the encoder and the task head, the run's dtype
    optim/t                int64 scalar, AdamW steps taken
    optim/step.<name>      int64 scalar per parameter that has been updated (0 <= step <= t)
    optim/exp_avg.<name>, optim/exp_avg_sq.<name>   AdamW's moments, like the parameter
    step                   int64 scalar, training steps done (t <= step <= config.steps)
    config                 the :class:`~transformer_np.training.state.RunConfig` as a JSON string
    history                the loss/lr/gradient-norm log as a JSON string

Reading (:func:`load_checkpoint`) never assigns anything before the whole file has been checked:

1. the file is a zip archive of ``.npy`` members (not empty, not random bytes, not truncated);
2. ``config`` is read first (bounded size and JSON depth) and must be a valid run config — and,
   when the run that resumes passes its own config, equal to it in every field except ``steps``
   and ``eval_every`` (a different ``--layers`` or ``--d-model`` is an error naming the field);
3. the memory the run needs is estimated and checked (:mod:`transformer_np.model.budget`)
   before any per-layer table is built, so a crafted config with 10⁶ layers is refused at once;
4. every member's ``.npy`` header (shape, dtype) is compared with the schema the config implies:
   missing and unexpected entries are listed, a wrong shape or dtype names the entry, what was
   expected and what was found — no broadcasting, no casting;
5. the data are read (a CRC or truncation error is reported as a damaged file), parameters and
   moments must be finite, the optimiser state is validated in full, and ``step`` and ``history``
   must agree with each other and with the config.

Nothing is decompressed beyond what the schema allows: each zip entry's declared size must match
its ``.npy`` header, the ``history`` text may be at most as long as a history of ``step`` steps of
this config can be (:func:`_history_limits`, also its JSON token count), and text entries are
decoded in 1 MiB chunks while the bytes are counted — so a 1 MB file whose ``history`` unpacks to
1 GiB is refused in milliseconds, before anything is allocated.

Only then is the :class:`~transformer_np.training.state.TrainState` built from the arrays. Every
failure is a :class:`~transformer_np.errors.CheckpointError` (a ``ValueError``) naming the file
and the entry.

Writing (:func:`save_checkpoint`, through ``transformer_np._files.replace_atomically``, the atomic-write
routine it shares with the library's other file writers) goes to a temporary file next to the target
(``.checkpoint.npz.<pid>.tmp``), flushed and fsynced, then renamed over the target in one step
(``os.replace``), so the previous checkpoint stays intact until the new one is complete. When the
write fails (a full disk, an interrupt) the temporary file is removed; a process killed while
writing (SIGKILL) leaves one behind, which the next save or run in that directory removes
(:func:`remove_stale_temporaries`) and which loading never reads.
"""

from __future__ import annotations

import codecs
import errno
import json
import math
import os
import re
import zipfile
from pathlib import Path

import numpy as np

from .._files import interrupts_deferred, open_regular, replace_atomically
from .._validate import all_finite, describe, mismatch_detail
from ..errors import CheckpointError, InputTypeError, NonFiniteError, ResourceLimitError, TransformerNPError
from ..io.jsonfile import loads_strict
from ..model.params import param_shapes
from .state import RunConfig, _assemble, _new_history, _setup
from .tasks import head_param_shapes

__all__ = ["CHECKPOINT", "save_checkpoint", "load_checkpoint", "read_checkpoint_config",
           "remove_stale_temporaries", "RESUMABLE_FIELDS"]

CHECKPOINT = "checkpoint.npz"
RESUMABLE_FIELDS = ("steps", "eval_every")     # what a resumed run may change
MAX_CONFIG_CHARS = 1 << 20                       # the config JSON (a few hundred characters in practice)
# The history JSON, as json.dumps writes it, is bounded by the step count and the config: per step at most
# one int and three floats (loss, lr, gradient norm) and one evaluation (an int, two floats); per recorded
# step one list of `layers` floats. A float is at most 24 characters (-2.2250738585072014e-308), an int 20,
# each with a ", " separator. _history_limits turns that into characters and tokens.
_CHARS_PER_STEP = 4 * 26 + 3 * 26
_CHARS_PER_NUMBER = 26
_HISTORY_SLACK = 1024
MAX_NPY_HEADER = 10_000
_TEXT_CHUNK = 1 << 20                             # bytes per read of a text entry
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_OPTIM_SLOTS = ("exp_avg", "exp_avg_sq")
_HISTORY_PER_STEP = ("step", "loss", "lr", "grad_norm")
_HISTORY_EVAL = ("step", "loss", "accuracy")


# ----------------------------------------------------------------------------- writing
def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True        # exists but not ours, or we cannot tell: leave its file alone
    return True


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove the temporary files an interrupted :func:`save_checkpoint` of ``path`` left behind
    (``.checkpoint.npz.<pid>.tmp`` of processes that no longer run, and 0.1's
    ``checkpoint.npz.tmp.npz``). Returns the files removed."""
    path = Path(path)
    removed = []
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(\d+)\.tmp$")
    try:
        names = os.listdir(path.parent if str(path.parent) else ".")
    except OSError:
        return removed
    for name in names:
        m = pattern.match(name)
        stale = (m is not None and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1)))) or \
            name == path.name + ".tmp.npz"
        if stale:
            p = path.with_name(name)
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


def _arrays(state) -> dict[str, np.ndarray]:
    arrays = {"param/" + k: v for k, v in state.params.items()}
    arrays.update({"optim/" + k: v for k, v in state.opt.state_dict().items()})
    arrays["step"] = np.array(state.step, dtype=np.int64)
    arrays["config"] = np.array(json.dumps(state.cfg.to_dict()))
    arrays["history"] = np.array(json.dumps(state.history))
    return arrays


def _write_npz(f, arrays: dict[str, np.ndarray]) -> None:
    """The one place bytes are written (tests replace it to simulate a full disk or a kill)."""
    np.savez(f, **arrays)


def save_checkpoint(path: str | Path, state) -> None:
    """Write ``state`` (params, optimiser state, step, config, history) to ``path`` atomically.

    The previous file at ``path`` is replaced only once the new one is complete and on disk.
    On failure (e.g. ``ENOSPC``) the temporary file is removed, the previous checkpoint is kept,
    and an ``OSError`` saying so is raised. A parameter or optimiser moment with NaN/inf is
    refused (:class:`~transformer_np.errors.NonFiniteError` naming the entry) before anything is
    written: a checkpoint holds finite numbers only. A Ctrl-C during the write is delivered once the
    checkpoint is complete (:func:`~transformer_np._files.interrupts_deferred`).
    """
    path = Path(path)
    arrays = _arrays(state)
    for key, a in arrays.items():
        if a.dtype.kind == "f" and not all_finite(a):
            raise NonFiniteError(f"not writing the checkpoint {path}: entry {key!r} contains NaN/inf values (the run "
                                 f"diverged); a checkpoint holds finite numbers only")
    remove_stale_temporaries(path)
    try:
        with interrupts_deferred():           # Ctrl-C while writing: the checkpoint is finished, then interrupted
            replace_atomically(path, lambda f: _write_npz(f, arrays))   # the temporary is removed on any failure
    except OSError as e:
        kept = "the previous checkpoint is kept" if path.is_file() else "no checkpoint was written"
        raise OSError(e.errno or errno.EIO, f"writing the checkpoint {path} failed "
                      f"({e.strerror or e}); {kept}") from None


# ----------------------------------------------------------------------------- reading: the archive
def _npy_header(f) -> tuple[tuple, bool, np.dtype]:
    """(shape, fortran_order, dtype) of the .npy stream ``f``, positioned at its start; leaves ``f`` at the data."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f, MAX_NPY_HEADER)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f, MAX_NPY_HEADER)
    raise ValueError(f"unsupported .npy version {version}")


def _check_stored(path: Path, key: str, info: zipfile.ZipInfo, archive_bytes: int) -> None:
    """A member as :func:`numpy.savez` writes it: stored (not compressed), not encrypted, its compressed and
    uncompressed sizes equal, and its bytes inside the archive — checked from the zip directory, before any
    member is opened."""
    if info.flag_bits & 0x1:
        raise CheckpointError(f"checkpoint {path}: entry {key!r} is encrypted; a checkpoint of this library never "
                              f"is: refused")
    if info.compress_type != zipfile.ZIP_STORED:
        raise CheckpointError(f"checkpoint {path}: entry {key!r} is compressed (zip method {info.compress_type}); "
                              f"this library writes stored members only (np.savez), so it is refused before "
                              f"anything is decompressed")
    if info.compress_size != info.file_size:
        raise CheckpointError(f"checkpoint {path}: entry {key!r} is stored but the zip directory declares "
                              f"{info.compress_size} bytes in the archive and {info.file_size} uncompressed: refused")
    if info.header_offset + info.compress_size > archive_bytes:
        raise CheckpointError(f"checkpoint {path}: entry {key!r} declares {info.compress_size} bytes at offset "
                              f"{info.header_offset}, past the end of the {archive_bytes}-byte file: truncated or "
                              f"corrupt")


class _Archive:
    """An open ``.npz`` with validated member headers: key -> (shape, dtype, ZipInfo)."""

    def __init__(self, path: Path):
        self.path = path
        if not os.path.lexists(path):
            raise CheckpointError(f"checkpoint not found: {path}")
        self._f = open_regular(path, error=CheckpointError, what="checkpoint")    # FIFOs, devices: refused
        try:
            self._open(path)
        except BaseException:
            self.close()
            raise

    def _open(self, path: Path) -> None:
        size = os.fstat(self._f.fileno()).st_size
        if size == 0:
            raise CheckpointError(f"checkpoint {path} is empty (0 bytes): not a checkpoint")
        head = self._f.read(4)
        if head not in _ZIP_MAGIC:
            raise CheckpointError(f"checkpoint {path} is not an .npz (zip) archive (it starts with {head!r}): "
                                  f"not a checkpoint of this library")
        self._f.seek(0)
        try:
            self.zf = zipfile.ZipFile(self._f)
            infos = self.zf.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {path} is a damaged or truncated zip archive ({e})") from None
        self.members: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise CheckpointError(f"checkpoint {path} holds {info.filename!r}, which is not an .npy array: "
                                      f"not a checkpoint of this library")
            key = info.filename[:-4]
            if key in self.members:
                raise CheckpointError(f"checkpoint {path} holds the entry {key!r} twice")
            _check_stored(path, key, info, size)
            self.members[key] = info
        self.headers: dict[str, tuple[tuple[int, ...], np.dtype]] = {}

    def close(self) -> None:
        if hasattr(self, "zf"):
            self.zf.close()
        if hasattr(self, "_f"):
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _damaged(self, key: str, e: Exception) -> CheckpointError:
        return CheckpointError(f"checkpoint {self.path}: entry {key!r} is damaged ({e}); the file is corrupt "
                               f"or truncated")

    def header(self, key: str) -> tuple[tuple[int, ...], np.dtype]:
        """(shape, dtype) from the member's .npy header, without reading its data."""
        if key not in self.headers:
            try:
                with self.zf.open(self.members[key]) as f:
                    shape, fortran, dtype = _npy_header(f)
            except (ValueError, NotImplementedError, zipfile.BadZipFile, EOFError, OSError) as e:
                raise self._damaged(key, e) from None
            if dtype.hasobject:
                raise CheckpointError(f"checkpoint {self.path}: entry {key!r} holds Python objects (dtype {dtype}), "
                                      f"which would need pickle: refused")
            self.headers[key] = (tuple(int(s) for s in shape), dtype)
        return self.headers[key]

    def read(self, key: str) -> np.ndarray:
        """The member's array (its header already checked against the schema); CRC verified."""
        shape, dtype = self.header(key)
        self.check_declared_size(key, math.prod(shape) * dtype.itemsize)
        try:
            with self.zf.open(self.members[key]) as f:
                a = np.lib.format.read_array(f, allow_pickle=False, max_header_size=MAX_NPY_HEADER)
                if f.read(1):
                    raise ValueError("trailing bytes after the array")
        except (ValueError, NotImplementedError, zipfile.BadZipFile, EOFError, OSError) as e:
            raise self._damaged(key, e) from None
        return a

    def read_text(self, key: str, max_chars: int) -> str:
        """A 0-d unicode member as a str, at most ``max_chars`` characters, read in bounded chunks.

        The ``.npy`` header's itemsize is checked against ``max_chars`` and the zip entry's declared size
        against the header before anything is decompressed; then the bytes are counted while they are
        decompressed (a member that inflates to more than its header says is damaged), so a small file
        whose entry unpacks to gigabytes is refused without allocating them."""
        shape, dtype = self.header(key)
        if shape != () or dtype.kind != "U":
            raise CheckpointError(f"checkpoint {self.path}: entry {key!r} must be a JSON string (a 0-d unicode "
                                  f"array), found shape {shape} dtype {dtype}")
        if dtype.itemsize // 4 > max_chars:
            raise CheckpointError(f"checkpoint {self.path}: entry {key!r} is {dtype.itemsize // 4} characters "
                                  f"long, more than the {max_chars} accepted here")
        self.check_declared_size(key, dtype.itemsize)
        codec = "utf-32-be" if dtype.byteorder == ">" else "utf-32-le"
        decoder = codecs.getincrementaldecoder(codec)()
        parts, left = [], dtype.itemsize
        try:
            with self.zf.open(self.members[key]) as f:
                _npy_header(f)
                while left:
                    chunk = f.read(min(_TEXT_CHUNK, left))
                    if not chunk:
                        raise EOFError(f"the data end after {dtype.itemsize - left} of {dtype.itemsize} bytes")
                    left -= len(chunk)
                    parts.append(decoder.decode(chunk))
                parts.append(decoder.decode(b"", final=True))
                if f.read(1):
                    raise ValueError("trailing bytes after the array (the entry inflates to more than its header "
                                     "says)")
        except (ValueError, NotImplementedError, zipfile.BadZipFile, EOFError, OSError, UnicodeDecodeError) as e:
            raise self._damaged(key, e) from None
        return "".join(parts).rstrip("\x00")

    def check_declared_size(self, key: str, data_bytes: int) -> None:
        """The zip entry's declared (uncompressed) size must be what its .npy header implies: the header plus
        ``data_bytes``. Checked before the data are read; the reading counts the bytes again."""
        declared = self.members[key].file_size
        if declared > data_bytes + MAX_NPY_HEADER + 16:
            raise CheckpointError(f"checkpoint {self.path}: entry {key!r} declares {declared} bytes uncompressed, but "
                                  f"its header describes {data_bytes} bytes of data: refused before decompressing")


# ----------------------------------------------------------------------------- reading: config and schema
def _config_from(archive: _Archive):
    if "config" not in archive.members:
        raise CheckpointError(f"checkpoint {archive.path} has no 'config' entry: not a checkpoint of this library")
    d = loads_strict(archive.read_text("config", MAX_CONFIG_CHARS), f"checkpoint {archive.path}: entry 'config'",
                     kind=dict, error=CheckpointError)
    try:
        return RunConfig.from_dict(d)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {archive.path}: entry 'config' is not a valid run config: {e}") from None


def read_checkpoint_config(path: str | Path):
    """The :class:`~transformer_np.training.state.RunConfig` stored in a checkpoint (only that
    entry is read and checked)."""
    try:
        with _Archive(Path(path)) as archive:
            return _config_from(archive)
    except MemoryError:
        raise ResourceLimitError(f"checkpoint {path}: reading its config ran out of memory (MemoryError)") from None


def _check_same_run(stored, expect, path: Path) -> None:
    if not isinstance(expect, RunConfig):
        raise InputTypeError(f"expect must be a RunConfig, got {describe(expect)}")
    a, b = stored.to_dict(), expect.to_dict()
    for name in a:
        if name not in RESUMABLE_FIELDS and a[name] != b.get(name):
            flag = "--" + name.replace("_", "-")
            raise CheckpointError(f"checkpoint {path} was written by a run with {name} = {a[name]!r}, but this run "
                                  f"asks for {name} = {b.get(name)!r} ({flag}); a resumed run keeps its settings "
                                  f"(only {', '.join(RESUMABLE_FIELDS)} may change) — use another --out for a new run")
    if stored.schedule != "constant" and expect.steps != stored.steps:
        raise CheckpointError(f"checkpoint {path} was written by a run whose {stored.schedule} schedule decays the "
                              f"learning rate to 0 at step {stored.steps}; --steps {expect.steps} would restart that "
                              f"decay from a higher learning rate, so a decaying schedule keeps its --steps on resume "
                              f"(a constant schedule can be extended) — train longer in a new run (another --out)")


def _schema(cfg, task, mc) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Required entries: name -> (shape, dtype). Optimiser slots are checked separately."""
    dt = np.dtype(cfg.dtype)
    shapes = {**param_shapes(mc), **head_param_shapes(task, mc)}
    out = {"param/" + k: (s, dt) for k, s in shapes.items()}
    i64 = np.dtype(np.int64)
    out["step"] = ((), i64)
    out["optim/t"] = ((), i64)
    return out


def _describe(shape, dtype) -> str:
    return f"shape {shape} dtype {dtype}"


def _check_headers(archive: _Archive, schema: dict, param_shapes_: dict, dtype: np.dtype) -> list[str]:
    """Compare every member's header with the schema; returns the optimiser keys (without 'optim/')."""
    path = archive.path
    i64 = np.dtype(np.int64)
    optim, unexpected = [], []
    for key in archive.members:
        if key in schema or key in ("config", "history"):
            continue
        if key.startswith("optim/"):
            okey = key[len("optim/"):]
            kind, dot, name = okey.partition(".")
            if dot and name in param_shapes_ and (kind == "step" or kind in _OPTIM_SLOTS):
                optim.append(okey)
                continue
        unexpected.append(key)
    missing = [k for k in (*schema, "history") if k not in archive.members]
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {path} does not match its config ({mismatch_detail(missing, unexpected)})")
    for key, (shape, dt) in schema.items():
        found = archive.header(key)
        if found != (shape, dt):
            raise CheckpointError(f"checkpoint {path}: entry {key!r}: expected {_describe(shape, dt)}, found "
                                  f"{_describe(*found)}")
    for okey in optim:
        kind, _, name = okey.partition(".")
        want = ((), i64) if kind == "step" else (param_shapes_[name], dtype)
        found = archive.header("optim/" + okey)
        if found != want:
            raise CheckpointError(f"checkpoint {path}: entry 'optim/{okey}': expected {_describe(*want)}, found "
                                  f"{_describe(*found)}")
    return optim


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_history(h, step: int, cfg, path: Path) -> dict:
    where = f"checkpoint {path}: entry 'history'"
    want = _new_history()
    if set(h) != set(want):
        raise CheckpointError(f"{where} does not have the history's keys "
                              f"({mismatch_detail(sorted(set(want) - set(h)), sorted(set(h) - set(want)))})")
    for k in (*_HISTORY_PER_STEP, "layer_grad_norms"):
        if not isinstance(h[k], list):
            raise CheckpointError(f"{where}: {k!r} must be a list, got {describe(h[k])}")
    for k in _HISTORY_PER_STEP:
        if len(h[k]) != step:
            raise CheckpointError(f"{where}: {k!r} has {len(h[k])} entries, but the checkpoint's step is {step} "
                                  f"(one entry per step done)")
    if h["step"] != list(range(step)):
        raise CheckpointError(f"{where}: 'step' must list the steps 0 … {step - 1} in order")
    for k in ("loss", "lr", "grad_norm"):
        if not all(_is_number(v) for v in h[k]):
            raise CheckpointError(f"{where}: {k!r} must hold numbers only")
    if len(h["layer_grad_norms"]) > step or not all(
            isinstance(r, list) and len(r) == cfg.layers and all(_is_number(v) for v in r)
            for r in h["layer_grad_norms"]):
        raise CheckpointError(f"{where}: 'layer_grad_norms' must hold at most {step} lists of {cfg.layers} numbers")
    ev = h["eval"]
    if not isinstance(ev, dict) or set(ev) != set(_HISTORY_EVAL) or not all(isinstance(ev[k], list) for k in ev) \
            or len({len(ev[k]) for k in _HISTORY_EVAL}) != 1:
        raise CheckpointError(f"{where}: 'eval' must be an object of three lists of equal length "
                              f"{list(_HISTORY_EVAL)}")
    if not all(isinstance(s, int) and not isinstance(s, bool) and 0 < s <= step for s in ev["step"]):
        raise CheckpointError(f"{where}: 'eval.step' must hold steps in 1 … {step}")
    for k in ("loss", "accuracy"):
        bad = [v for v in ev[k] if not _is_number(v)][:1]
        if bad:
            raise CheckpointError(f"{where}: 'eval.{k}' must hold numbers only, found {describe(bad[0])}")
    d = h["diverged_at"]
    if d is not None and not (isinstance(d, int) and not isinstance(d, bool) and 0 <= d < step):
        raise CheckpointError(f"{where}: 'diverged_at' must be null or a step in 0 … {step - 1}, got {d!r}")
    return h


def _history_limits(step: int, cfg) -> tuple[int, int]:
    """(characters, JSON tokens) the history of a run at ``step`` can need at most (see _CHARS_PER_STEP)."""
    rows = min(step, cfg.grad_norm_steps)
    chars = step * _CHARS_PER_STEP + rows * (cfg.layers + 1) * _CHARS_PER_NUMBER + _HISTORY_SLACK
    tokens = 7 * step + rows * (cfg.layers + 1) + 64
    return chars, tokens


def load_checkpoint(path: str | Path, expect=None):
    """Rebuild a :class:`~transformer_np.training.state.TrainState` from :func:`save_checkpoint`'s
    file, exactly — after checking all of it (see the module docstring).

    Args:
        path: the ``.npz`` file.
        expect: the :class:`~transformer_np.training.state.RunConfig` of the run that resumes, or
            None. When given, every field except ``steps`` and ``eval_every`` must equal the
            checkpoint's.

    Raises:
        CheckpointError: naming the file and the entry (expected and found) for a missing, empty,
            foreign, truncated or damaged file, a schema mismatch, invalid values, or a config that
            differs from ``expect``.
        ResourceLimitError: the run the checkpoint describes would not fit the memory limit.
    """
    path = Path(path)
    try:
        return _load(path, expect)
    except MemoryError:
        raise ResourceLimitError(f"checkpoint {path}: loading it ran out of the memory left to this process "
                                 f"(MemoryError) although the estimate fit the limit; nothing was assigned") from None


def _load(path: Path, expect):
    """load_checkpoint's work (a MemoryError in it becomes a one-line ResourceLimitError)."""
    with _Archive(path) as archive:
        cfg = _config_from(archive)
        if expect is not None:
            _check_same_run(cfg, expect, path)
        task, mc = _setup(cfg)                                  # budget checked here, before any table
        dtype = np.dtype(cfg.dtype)
        schema = _schema(cfg, task, mc)
        pshapes = {k[len("param/"):]: s for k, (s, _) in schema.items() if k.startswith("param/")}
        optim_keys = _check_headers(archive, schema, pshapes, dtype)
        step = int(archive.read("step"))
        if not 0 <= step <= cfg.steps:
            raise CheckpointError(f"checkpoint {path}: entry 'step': expected a step in 0 … {cfg.steps} (the "
                                  f"config's steps), found {step}")
        t = int(archive.read("optim/t"))
        if not 0 <= t <= step:
            raise CheckpointError(f"checkpoint {path}: entry 'optim/t': expected 0 … {step} (optimiser steps "
                                  f"cannot exceed training steps), found {t}")
        max_chars, max_tokens = _history_limits(step, cfg)   # from the config, before decompressing
        history = loads_strict(archive.read_text("history", max_chars),
                               f"checkpoint {path}: entry 'history'", kind=dict, error=CheckpointError,
                               allow_constants=True, max_tokens=max_tokens)
        _check_history(history, step, cfg, path)
        params = {}
        for name in pshapes:
            a = archive.read("param/" + name)
            if not all_finite(a):
                raise CheckpointError(f"checkpoint {path}: entry 'param/{name}' contains NaN/inf values")
            params[name] = np.array(a, dtype=dtype, order="C", copy=True)
        optim = {"t": np.array(t, dtype=np.int64)}
        optim.update({k: archive.read("optim/" + k) for k in optim_keys})
    state = _assemble(cfg, task, mc, params)
    try:
        state.opt.load_state_dict(optim)
    except (TypeError, ValueError) as e:
        if not isinstance(e, TransformerNPError):
            raise
        raise CheckpointError(f"checkpoint {path}: entry 'optim/…': {e}") from None
    state.step = step
    state.start_step = step
    state.history = history
    return state

