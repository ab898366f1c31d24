r"""The instructor's key is authoritative: ``check --key KEY SUBMISSION...``.

A sheet handed out carries the problem (``[setup]``, ``[input]``, the weights) and perhaps a mark scheme
(``[marks]``); a student can edit any of it. Marked against a key, a submission's *answers* are taken from the
submission and everything else — the problem and the mark scheme — from the key. Each submission is matched to
its key by the problem id that ``worksheet new`` and ``worksheet class`` write on every sheet
(``[setup].problem_id``: :func:`problem_id`, a fingerprint of the problem); a submission whose id is missing or
unknown is matched by its problem's own fingerprint when that equals a key's. A submission whose copy of the
problem, its id or its ``[marks]`` differs from the key's is marked against the key's and flagged
``problem_altered``, with the parts that differ (``report.altered``).

An answer key carries a ``[key]`` table (``student = "id"`` under ``worksheet class``): it is never graded as
a submission.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from ..errors import InputValueError, WorksheetError
from .format import Worksheet, parse_worksheet
from .names import PARAM_NAMES

__all__ = ["problem_id", "fingerprint", "Key", "KeyRing", "check_with_key", "mark", "differences", "FLAG_ALTERED"]

FLAG_ALTERED = "problem_altered"
_SETUP_FIELDS = ("tokens", "d_model", "n_heads", "d_ff", "norm", "activation", "eps", "layers", "decimals")
_ID_CHARS = 16


def fingerprint(ws: Worksheet) -> str:
    """A SHA-256 of the problem of ``ws`` as parsed (set-up, H0, dH, every weight; not the seed, the id, the
    answers or the mark scheme): two sheets get the same fingerprint exactly when they pose the same problem."""
    h = hashlib.sha256()
    h.update(repr(tuple(getattr(ws, f) for f in _SETUP_FIELDS)).encode("utf-8"))
    for a in [ws.H0, ws.dH] + [p[k] for p in ws.params for k in PARAM_NAMES]:
        if a is None:
            h.update(b"none")
            continue
        a = np.ascontiguousarray(a, dtype=np.float64) + 0.0          # + 0.0: -0.0 and 0.0 are the same number
        h.update(repr(a.shape).encode("ascii") + a.tobytes())
    return h.hexdigest()


def problem_id(raw: dict) -> str:
    """The problem id written on a generated sheet: the first 16 hex digits of :func:`fingerprint` of its
    problem. It says which problem a sheet poses, and nothing from which another could be made."""
    problem = {k: v for k, v in raw.items() if k not in ("answers", "marks", "key")}
    problem["setup"] = {k: v for k, v in raw["setup"].items() if k != "problem_id"}
    return fingerprint(parse_worksheet(problem))[:_ID_CHARS]


def _problem_part(raw: dict) -> dict:
    return {k: v for k, v in raw.items() if k not in ("answers", "key")}


class Key:
    """One answer key: its problem and mark scheme (the key's own answers are not used)."""

    def __init__(self, raw: dict, source: str):
        self.source = source
        self.raw = _problem_part(raw)
        self.worksheet = parse_worksheet(self.raw, source)
        self.problem_id = self.worksheet.problem_id
        self.student = None
        if isinstance(raw.get("key"), dict) and isinstance(raw["key"].get("student"), str):
            from .format import _key_table
            try:
                self.student = _key_table(raw["key"])
            except WorksheetError as e:
                raise WorksheetError(f"{source}: {e}") from None
        self.fingerprint = fingerprint(self.worksheet)

    @classmethod
    def read(cls, path: str) -> Key:
        from .tomlio import read_toml

        return cls(read_toml(path), path)


class KeyRing:
    """The keys of ``check --key``: one key TOML (every submission is marked against it), or a folder of them
    (every ``*.toml`` in it with a ``[key]`` table; each needs a problem id, and no two may share one). Only the
    ids, fingerprints, students and paths are kept; a key is read again when a submission needs it (the last one
    read is cached)."""

    def __init__(self, path: str):
        self.path = path
        self.single: Key | None = None
        self.by_id: dict[str, str] = {}
        self.by_fingerprint: dict[str, str] = {}
        self._cache: Key | None = None
        self.students: dict[str, str] = {}               # problem id -> the student it was made for
        if os.path.isdir(path):
            from .tomlio import read_toml

            names = sorted(f for f in os.listdir(path) if f.endswith(".toml") and not f.startswith("."))
            for name in names:
                raw = read_toml(os.path.join(path, name))
                if "key" not in raw:                      # a problem or a submission beside the keys: not a key
                    continue
                key = Key(raw, os.path.join(path, name))
                if key.problem_id is None:
                    raise WorksheetError(f"{key.source}: a key in a folder of keys needs [setup].problem_id (the "
                                         f"id written on the student's sheet), and this one has none")
                if key.problem_id in self.by_id:
                    raise WorksheetError(f"{key.source}: problem id {key.problem_id!r} is also the id of "
                                         f"{self.by_id[key.problem_id]}; each key needs its own")
                self.by_id[key.problem_id] = key.source
                self.by_fingerprint.setdefault(key.fingerprint, key.source)
                if key.student is not None:
                    self.students[key.problem_id] = key.student
            if not self.by_id:
                raise InputValueError(f"--key: {path} has no answer keys in it (TOML files with a [key] table, as "
                                      f"worksheet new and worksheet class write them)")
        elif os.path.exists(path):
            self.single = Key.read(path)
        else:
            raise InputValueError(f"--key: {path}: no such key file or folder")

    def real_paths(self) -> set[str]:
        """The keys' real paths (a key given among the submissions is never graded)."""
        if self.single is not None:
            return {os.path.realpath(self.single.source)}
        return {os.path.realpath(p) for p in self.by_id.values()}

    def _load(self, path: str) -> Key:
        if self._cache is None or self._cache.source != path:
            self._cache = Key.read(path)
        return self._cache

    def find(self, sub: Worksheet | None) -> Key | None:
        """The key of submission ``sub`` (its problem, parsed; None when it cannot be read): by problem id, else
        by the problem's fingerprint; None when no key matches."""
        if self.single is not None:
            return self.single
        if sub is None:
            return None
        if sub.problem_id in self.by_id:
            return self._load(self.by_id[sub.problem_id])
        path = self.by_fingerprint.get(fingerprint(sub))
        return None if path is None else self._load(path)


def mark(ring: KeyRing, raw: dict, source: str):
    """Mark submission ``raw`` (as read from its TOML; ``source`` names it) against its key in ``ring``.
    Raises :class:`WorksheetError` when no key matches it, or as :func:`check_with_key`."""
    if "key" in raw:
        raise WorksheetError(f"{source}: is an answer key (it has a [key] table), not a submission")
    sub, why = read_problem(raw, source)
    key = ring.find(sub)
    if key is None:
        pid = None if sub is None else sub.problem_id
        what = f"its problem id {pid!r} is no key's, nor is its problem" if pid else \
            "it has no problem id, and its problem is no key's"
        if sub is None:
            what = f"its problem cannot be read: {why}"
        raise WorksheetError(f"{source}: no key in {ring.path} matches it ({what}); not marked")
    return check_with_key(raw, key, source)


def differences(sub: Worksheet | None, key: Key, sub_error: str | None = None) -> list[str]:
    """The parts of the problem (and mark scheme) where submission ``sub`` differs from ``key`` (exact
    comparisons: both are parsed from the same decimal text unless someone changed it)."""
    if sub is None:
        return [f"the problem cannot be read ({sub_error})" if sub_error else "the problem cannot be read"]
    k = key.worksheet
    out = []
    if sub.problem_id != k.problem_id:
        out.append("[setup].problem_id")
    out += [f"[setup].{f}" for f in _SETUP_FIELDS if getattr(sub, f) != getattr(k, f)]
    for name, a, b in (("H0", sub.H0, k.H0), ("dH", sub.dH, k.dH)):
        if (a is None) != (b is None) or (a is not None and not np.array_equal(a, b)):
            out.append(f"[input].{name}")
    if sub.layers == k.layers and sub.d_model == k.d_model and sub.d_ff == k.d_ff:
        for l, (p, q) in enumerate(zip(sub.params, k.params), 1):
            out += [f"[layer{l}].{n}" for n in PARAM_NAMES if not np.array_equal(p[n], q[n])]
    if sub.has_marks and (sub.marks, sub.mark_names, sub.mark_default) != (k.marks, k.mark_names, k.mark_default):
        out.append("[marks]")
    return out


def read_problem(raw: dict, source: str) -> tuple[Worksheet | None, str | None]:
    """The problem of a submission (its answers left out), or (None, why) when it cannot be read."""
    try:
        return parse_worksheet({k: v for k, v in raw.items() if k != "answers"}, source), None
    except WorksheetError as e:
        return None, str(e).removeprefix(f"{source}: ")


def check_with_key(submission, key, source: str | None = None):
    """Mark the answers of ``submission`` (a dict as read from TOML, or a path) against the problem and mark
    scheme of ``key`` (a :class:`Key`, a path or a dict). Returns the :class:`~.report.Report`, whose ``flags``
    hold ``"problem_altered"`` and ``altered`` the parts that differ when the submission's copy of the problem,
    its problem id or its ``[marks]`` is not the key's.

    Raises :class:`WorksheetError` when the submission is itself an answer key, or when its answers do not fit
    the key's problem (the message says so, and that the problem was altered where it was)."""
    from . import check
    from .tomlio import read_toml

    if isinstance(submission, (str, os.PathLike)):
        source = os.fspath(submission) if source is None else source
        submission = read_toml(submission)
    source = source or "<dict>"
    if not isinstance(key, Key):
        key = Key.read(os.fspath(key)) if isinstance(key, (str, os.PathLike)) else Key(key, "<key>")
    if not isinstance(submission, dict):
        raise WorksheetError(f"{source}: a worksheet must be a table (dict), got {type(submission).__name__}")
    if "key" in submission:
        raise WorksheetError(f"{source}: is an answer key (it has a [key] table), not a submission")
    sub, why = read_problem(submission, source)
    altered = differences(sub, key, why)
    combined = dict(key.raw)
    combined.pop("answers", None)
    if "answers" in submission:
        combined["answers"] = submission["answers"]
    try:
        ws = parse_worksheet(combined, source)
    except WorksheetError as e:
        note = f" (the problem was altered: {', '.join(altered)})" if altered else ""
        raise WorksheetError(f"{source}: the answers do not fit the problem of the key {key.source}: "
                             f"{str(e).removeprefix(source + ': ')}{note}") from None
    ws.source = source
    report = check(ws)
    report.key_source, report.student, report.problem_id = key.source, key.student, key.problem_id
    report.altered = altered
    report.flags = [FLAG_ALTERED] if altered else []
    return report
