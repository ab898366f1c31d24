r"""One problem per student: ``transformer-np worksheet class --roster ROSTER.csv --out DIR [--secret-file F]``.

For each student id of the roster (its ``id`` column) a problem is generated (:func:`.generate.new_worksheet`,
with the options of ``worksheet new``) from a seed that only the instructor can compute:

    seed = the first 63 bits of HMAC-SHA256(secret, "transformer_np worksheet class" | options | student id)

where ``secret`` is 32 random bytes kept in the secret file (made, readable by its owner only, when absent). The
student's sheet shows the problem, its problem id (a fingerprint of the problem, :func:`.keys.problem_id`) and
nothing else: no seed, so ``worksheet new --seed S`` cannot remake the key, and without the secret no seed can
be derived from the student id. The same secret, roster and options make the same problems again (a student
added later gets a problem and nobody else's changes); ``--seed`` picks another set of problems from the same
secret (a second assignment).

Files written — all of them or none (:func:`~transformer_np._files.write_all_or_none`):

* ``DIR/students/<id>.toml`` (the problem to fill in) and ``DIR/students/<id>.md`` (the student sheet): hand
  these out;
* ``DIR/keys/<id>_key.toml`` (the key: problem, answers, the full mark scheme ``[marks]`` — one mark per step,
  or the weights of ``--marks FILE`` — and a ``[key]`` table naming the student) and ``DIR/keys/<id>_key.md``:
  keep these. Marks are out of the whole sheet: a step left blank earns 0 of its marks. ``check --key DIR/keys
  SUBMISSIONS`` marks each submission against its own key and gives each row the student's id.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import os
import secrets

from ..errors import InputValueError

__all__ = ["read_roster", "read_secret", "seed_for", "class_worksheets", "MAX_STUDENTS", "SECRET_BYTES"]

MAX_STUDENTS = 10_000
MAX_ROSTER_BYTES = 1 << 22
MAX_ID_CHARS = 64
SECRET_BYTES = 32
_ID_COLUMNS = ("id", "student_id", "student")
_SALT = b"transformer_np worksheet class v1"


def _bad_id(sid: str) -> str | None:
    """Why ``sid`` cannot be a student id (it names files), or None."""
    if not sid:
        return "an empty id"
    if len(sid) > MAX_ID_CHARS:
        return f"an id of {len(sid)} characters (at most {MAX_ID_CHARS})"
    if sid in (".", "..") or sid.startswith(".") or any(c in sid for c in "/\\:") or \
            any(not c.isprintable() or (c.isspace() and c != " ") for c in sid):
        return f"{sid!r}, which cannot name a file (no '/', '\\', ':', leading '.', or control characters)"
    return None


def read_roster(path: str) -> list[str]:
    """The student ids of a roster CSV: the column headed ``id`` (or ``student_id``, ``student``; any case), one
    row per student, in order. Empty, duplicate and unusable ids are refused naming the line."""
    from .._files import read_bytes_bounded

    data = read_bytes_bounded(path, MAX_ROSTER_BYTES, error=InputValueError, what="roster")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise InputValueError(f"--roster: {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    rows = csv.reader(io.StringIO(text, newline=""))
    header = next(rows, None)
    if not header:
        raise InputValueError(f"--roster: {path} is empty; expected a header line with an 'id' column")
    names = [h.strip().lower() for h in header]
    col = next((names.index(c) for c in _ID_COLUMNS if c in names), None)
    if col is None:
        raise InputValueError(f"--roster: {path}: no id column; expected a header naming one of "
                              f"{list(_ID_COLUMNS)}, got {header!r}")
    ids: list[str] = []
    seen: dict[str, int] = {}
    for line, row in enumerate(rows, 2):
        if not any(c.strip() for c in row):
            continue                                           # a blank line
        sid = row[col].strip() if col < len(row) else ""
        why = _bad_id(sid)
        if why is not None:
            raise InputValueError(f"--roster: {path}, line {line}: {header[col]!r} is {why}")
        if sid in seen:
            raise InputValueError(f"--roster: {path}, line {line}: the id {sid!r} is also on line {seen[sid]}")
        seen[sid] = line
        ids.append(sid)
        if len(ids) > MAX_STUDENTS:
            raise InputValueError(f"--roster: {path}: more than {MAX_STUDENTS} students")
    if not ids:
        raise InputValueError(f"--roster: {path}: no students (only the header)")
    return ids


def read_secret(path: str) -> bytes | None:
    """The secret in ``path`` (hex, at least 32 digits), or None when the file does not exist."""
    from .._files import read_bytes_bounded

    if not os.path.lexists(path):
        return None
    data = read_bytes_bounded(path, 4096, error=InputValueError, what="secret file").strip()
    try:
        secret = bytes.fromhex(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise InputValueError(f"--secret-file: {path}: expected hexadecimal digits (as written by worksheet "
                              f"class), got something else") from None
    if len(secret) < 16:
        raise InputValueError(f"--secret-file: {path}: a secret of {len(secret)} bytes is too short (at least 16)")
    return secret


def _new_secret(path: str) -> bytes:
    """32 random bytes, written as hex to a new file that only its owner can read."""
    secret = secrets.token_bytes(SECRET_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.write(fd, (secret.hex() + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return secret


def seed_for(secret: bytes, student: str, options: dict, attempt: int = 0) -> int:
    """The seed of ``student``'s problem: 63 bits of HMAC-SHA256 of the options and the id under ``secret``."""
    msg = "\0".join([f"{k}={options[k]!r}" for k in sorted(options)] + [student, str(attempt)]).encode("utf-8")
    digest = hmac.new(secret, _SALT + b"\0" + msg, hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") & (2 ** 63 - 1)


def _problem(secret: bytes, student: str, options: dict, assignment: int, taken: set) -> dict:
    from .generate import new_worksheet

    salted = {**options, "assignment": assignment}
    for attempt in range(8):                    # two students never share a problem (a 64-bit match: never seen)
        raw = new_worksheet(seed=seed_for(secret, student, salted, attempt), **options)
        if raw["setup"]["problem_id"] not in taken:
            taken.add(raw["setup"]["problem_id"])
            del raw["setup"]["seed"]            # the seed is the instructor's: not on any sheet
            return raw
    raise InputValueError(f"no distinct problem found for student {student!r}; try other options")


def class_worksheets(roster: str, out: str, secret_file: str | None = None, force: bool = False,
                     assignment: int = 0, marks: dict | None = None, marks_source: str = "--marks",
                     reveal: bool = False, **options) -> dict:
    """Write one problem per student of ``roster`` into ``out/students`` and its key into ``out/keys`` (see the
    module docstring); ``secret_file`` defaults to ``out/class_secret.txt`` and is made when absent.
    ``assignment`` (``--seed``) picks another set of problems; ``options`` are :func:`.generate.new_worksheet`'s
    (tokens, d_model, heads, norm, backward, layers, d_ff, activation, decimals). Existing files are not
    replaced unless ``force``. ``marks``: a ``[marks]`` table of weights (``--marks FILE``,
    :func:`.generate.read_marks_file`; ``marks_source`` names it in errors), written in full into every key (and
    every student's TOML). Returns ``{"students": [ids], "secret": path, "secret_made": bool, "files":
    [paths]}``."""
    from .._files import confined_path, write_all_or_none
    from .generate import sheet_texts

    ids = read_roster(roster)
    if isinstance(assignment, bool) or not isinstance(assignment, int) or assignment < 0:
        raise InputValueError(f"--seed must be a non-negative integer, got {assignment!r}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputValueError(f"--out: {out} exists and is not a folder")
    secret_file = os.path.join(out, "class_secret.txt") if secret_file is None else secret_file
    students, keys = os.path.join(out, "students"), os.path.join(out, "keys")
    for sub in (students, keys):
        if os.path.islink(sub) or (os.path.exists(sub) and not os.path.isdir(sub)):
            raise InputValueError(f"--out: {sub} is not a folder (or is a symbolic link); not writing into it")
    secret = read_secret(secret_file)
    made = secret is None
    taken: set = set()
    plan = []
    for sid in ids:
        targets = [confined_path(students, f"{sid}.toml", argument="--roster id"),
                   confined_path(students, f"{sid}.md", argument="--roster id"),
                   confined_path(keys, f"{sid}_key.md", argument="--roster id"),
                   confined_path(keys, f"{sid}_key.toml", argument="--roster id")]
        if not force:
            existing = [t for t in targets if os.path.lexists(t)]
            if existing:
                raise InputValueError(f"{existing[0]} already exists (use --force to overwrite); nothing was written")
        plan.append((sid, targets))
    if made and os.path.lexists(secret_file):
        raise InputValueError(f"--secret-file: {secret_file} exists")
    created = [d for d in (out, students, keys) if not os.path.isdir(d)]
    try:
        for d in created:
            os.makedirs(d, exist_ok=True)
        if made:
            secret = _new_secret(secret_file)
        files = []
        for sid, targets in plan:
            raw = _problem(secret, sid, options, assignment, taken)
            raw["setup"]["reveal"] = bool(reveal)   # check and the page show correct values? (worksheets.withheld)
            files += list(zip(targets, sheet_texts(raw, student=sid, marks=marks, marks_source=marks_source,
                                                       toml_name=f"{sid}.toml")))
        written = write_all_or_none(files, error=InputValueError)
    except BaseException:
        if made and secret is not None:
            try:
                os.remove(secret_file)
            except OSError:
                pass
        for d in reversed(created):
            try:
                os.rmdir(d)
            except OSError:
                pass
        raise
    return {"students": ids, "secret": secret_file, "secret_made": made, "files": [os.fspath(p) for p in written]}
