r"""The class gradebook against a roster: ``check --key KEYS SUBMISSIONS --roster ROSTER.csv``.

One row per roster student, in roster order, then a row for every file that names no roster student. Which
student a file belongs to is read, in this order, from

1. its file name: a roster id anywhere in it (``s-1001.toml``, ``s-1001_sheet.toml``), the LMS's own user id of a
   roster column ``canvas_id`` / ``lms_id``, or the name as an LMS bulk download writes it — Canvas
   ``lastnamefirstname_[late_]12345_67890_sheet.toml``, Moodle ``First Last_12345_assignsubmission_file_…``
   (accents, case, spaces and hyphens of a name are ignored);
2. its problem: the key of a ``worksheet class`` folder names the student the problem was made for, and the
   problem id is read from the file's header even when the rest of the file cannot be read (a truncated file).

Ids are compared after :func:`fold` (NFKC, case folding, and a small table of Cyrillic and Greek letters that
look like Latin ones), so ``s-1001а`` with a Cyrillic ``а`` is the roster's ``s-1001a`` — and flagged.

Flags (the ``flags`` column, ``;``-separated, each ``code`` or ``code: detail``), on every row involved:

* ``no_submission`` — a roster student with no file; ``unreadable`` — the file cannot be marked (``error``
  says why); ``unmatched`` — a file that names no roster student;
* ``same_problem`` — two or more files pose the same problem (the same problem id, or the same problem
  fingerprint); ``same_answers`` — two or more files give identical answers; ``not_own_problem`` — the file
  name names one student and the problem is another's;
* ``confusable_id`` — an id equal to another only after :func:`fold`; ``several_submissions`` — more than one
  file for one student (the first by file name is the student's row, the others follow the roster's rows);
* ``problem_altered`` — as without a roster (:mod:`.keys`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field

from ..errors import InputValueError

__all__ = ["Student", "read_students", "fold", "name_key", "match_file", "header_problem_id", "answers_digest",
           "Submission", "Gradebook", "ROSTER_COLUMNS", "FLAGS"]

ROSTER_COLUMNS = ("name", "id", "total", "out_of", "percent", "first_mistake", "diagnosis", "flags", "file",
                  "problem_id", "correct", "follows", "wrong", "missing", "error")
FLAGS = ("no_submission", "unreadable", "unmatched", "same_problem", "same_answers", "not_own_problem",
         "confusable_id", "several_submissions", "problem_altered")

# Cyrillic and Greek letters that look like Latin ones, after case folding (so the capitals are covered too:
# Cyrillic А folds to а, Greek Η to η). Where a capital and its small letter look like different Latin letters
# (Cyrillic В / в, Н / н, Greek Η / η), the capital's look-alike is taken: ids are mostly written in capitals.
_CONFUSABLE = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "з": "3", "і": "i", "ї": "i", "ј": "j", "к": "k", "м": "m", "н": "h",
    "о": "o", "р": "p", "с": "c", "т": "t", "у": "y", "х": "x", "ѕ": "s", "ԁ": "d", "һ": "h", "ԛ": "q", "ԝ": "w",
    "ӏ": "l", "ү": "y", "ө": "o",
    # Greek
    "α": "a", "β": "b", "ε": "e", "ζ": "z", "η": "h", "ι": "i", "κ": "k", "μ": "m", "ν": "v", "ο": "o", "ρ": "p",
    "τ": "t", "υ": "u", "χ": "x", "ϲ": "c", "ϳ": "j", "ѵ": "v",
}
_FOLD = str.maketrans(_CONFUSABLE)
_ID_COLUMNS = ("id", "student_id", "student")            # as worksheet class reads them (.classroom)
_NAME_COLUMNS = ("name", "full name", "student name")
_FIRST_COLUMNS = ("first name", "first_name", "firstname", "given name", "given_name")
_LAST_COLUMNS = ("last name", "last_name", "lastname", "surname", "family name", "family_name")
_EMAIL_COLUMNS = ("email", "email address", "e-mail")
_LMS_COLUMNS = ("canvas_id", "canvas id", "lms_id", "lms id", "moodle_id")
_PID = re.compile(rb'^\s*problem_id\s*=\s*"([A-Za-z0-9_-]{1,64})"', re.M)


def fold(text: str) -> str:
    """``text`` as ids are compared: NFKC, case folded, the common Cyrillic/Greek look-alikes of Latin letters
    mapped to them (the table above), NFKC again. ``fold("S-1001А") == fold("s-1001a")``."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold().translate(_FOLD))


def _plain(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def name_key(text: str) -> str:
    """A name as file names write it: folded, accents dropped, letters and digits only
    (``"Zoë Núñez-Brown"`` → ``"zoenunezbrown"``)."""
    decomposed = unicodedata.normalize("NFKD", fold(text))
    return "".join(c for c in decomposed if c.isalnum() and not unicodedata.combining(c))


@dataclass
class Student:
    """One roster row: the id (the roster's ``id`` column), the name as the roster writes it (``name``, or
    ``first name`` and ``last name``), an email and the LMS's own user id when the roster has them."""

    id: str
    name: str = ""
    first: str = ""
    last: str = ""
    email: str = ""
    lms_id: str = ""
    line: int = 0

    def keys(self) -> set[str]:
        """The spellings of this student's name a file name may carry (see :func:`name_key`)."""
        out = {name_key(self.name)} if self.name else set()
        if self.first or self.last:
            out |= {name_key(self.last + self.first), name_key(self.first + self.last)}
        if self.name and "," in self.name:                         # "Last, First"
            last, first = self.name.split(",", 1)
            out |= {name_key(last + first), name_key(first + last)}
        elif self.name and " " in self.name.strip():               # "First Last" -> Canvas writes lastfirst
            parts = self.name.split()
            out.add(name_key(parts[-1] + "".join(parts[:-1])))
        return {k for k in out if k}

    @property
    def display(self) -> str:
        if self.name:
            return self.name
        return " ".join(p for p in (self.first, self.last) if p)


def _column(names: list[str], choices) -> int | None:
    return next((names.index(c) for c in choices if c in names), None)


def read_students(path: str) -> list[Student]:
    """The students of a roster CSV, in order: the ids as :func:`.classroom.read_roster` reads (and checks)
    them, with the names, emails and LMS ids of the columns this module knows (any case)."""
    from .._files import read_bytes_bounded
    from .classroom import MAX_ROSTER_BYTES, read_roster

    ids = read_roster(path)
    text = read_bytes_bounded(path, MAX_ROSTER_BYTES, error=InputValueError, what="roster").decode("utf-8")
    rows = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""))
    header = [h.strip().lower() for h in next(rows)]
    col = {k: _column(header, c) for k, c in (("id", _ID_COLUMNS), ("name", _NAME_COLUMNS),
                                               ("first", _FIRST_COLUMNS), ("last", _LAST_COLUMNS),
                                               ("email", _EMAIL_COLUMNS), ("lms_id", _LMS_COLUMNS))}
    out: list[Student] = []
    for line, row in enumerate(rows, 2):
        if not any(c.strip() for c in row):
            continue
        get = {k: (row[i].strip() if i is not None and i < len(row) else "") for k, i in col.items()}
        out.append(Student(line=line, **get))
    if [s.id for s in out] != ids:                       # read_roster and this reader disagree: never expected
        raise InputValueError(f"--roster: {path}: the id column could not be read consistently")
    return out


def header_problem_id(data: bytes) -> str | None:
    """The ``problem_id = "…"`` of a sheet's text, read line by line (a truncated or otherwise unreadable file
    still names its problem in its header)."""
    m = _PID.search(data[:65536])
    return None if m is None else m.group(1).decode("ascii")


def answers_digest(raw: dict) -> str | None:
    """A SHA-256 of the ``[answers]`` of a sheet as read from TOML (None when it gives none): two files hand in
    identical answers exactly when their digests are equal."""
    answers = raw.get("answers") if isinstance(raw, dict) else None
    if not answers:
        return None
    try:
        text = json.dumps(answers, sort_keys=True, allow_nan=True, default=str)
    except (TypeError, ValueError, RecursionError):
        return None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def match_file(stem: str, students: list[Student], by_id: dict[str, list[int]]) -> tuple[int | None, bool]:
    """The roster index of the student the file name ``stem`` (without ``.toml``) names, or None; and whether
    the id matched only because :func:`fold` mapped a look-alike letter (a ``confusable_id``; a difference of
    case alone is not one). A name two roster students share names neither."""
    parts = stem.split("_")
    for i in range(len(parts)):                                  # a roster id: any run of "_"-separated parts
        for j in range(len(parts), i, -1):
            cand = "_".join(parts[i:j])
            hit = by_id.get(fold(cand))
            if hit:
                same = [k for k in hit if _plain(students[k].id) == _plain(cand)]
                return (same[0], False) if same else (hit[0], True)
    digits = [p for p in parts if p.isdigit()]
    found = [k for k, s in enumerate(students) if s.lms_id and s.lms_id in digits]      # the LMS's user id
    if len(found) == 1:
        return found[0], False
    head = name_key(parts[0])                                    # Canvas: lastfirst_…; Moodle: "First Last_…"
    found = [k for k, s in enumerate(students) if head and head in s.keys()]
    return (found[0], False) if len(found) == 1 else (None, False)


@dataclass
class Submission:
    """What the gradebook keeps of one marked file (never the report): its row, the verdict of every step
    (for ``--matrix``), and what identifies it."""

    file: str
    row: dict
    verdicts: dict[str, str] | None = None  # step label ("L1 scores") -> verdict
    by_file: int | None = None              # roster index named by the file name
    owner: int | None = None                # roster index the problem was made for
    problem: str | None = None              # problem id (or fingerprint)
    answers: str | None = None              # answers digest
    confusable: bool = False
    flags: list[str] = field(default_factory=list)

    @property
    def student(self) -> int | None:
        return self.by_file if self.by_file is not None else self.owner


def _flag(sub: Submission, code: str, detail: str = "") -> None:
    text = f"{code}: {detail}" if detail else code
    if text not in sub.flags:
        sub.flags.append(text)


class Gradebook:
    """The roster's gradebook, built file by file (:meth:`add`) and finished by :meth:`rows`: one row per
    roster student in roster order, then the files that name no roster student (and further files of a
    student). ``steps`` are the step labels of the matrix (from the first sheet marked)."""

    def __init__(self, students: list[Student], owners: dict[str, str] | None = None):
        self.students = students
        self.by_id: dict[str, list[int]] = {}
        for k, s in enumerate(students):
            self.by_id.setdefault(fold(s.id), []).append(k)
        self.owner_of = {}                        # problem id -> roster index (from the keys' [key].student)
        for pid, sid in (owners or {}).items():
            hit = self.by_id.get(fold(sid))
            if hit:
                self.owner_of[pid] = hit[0]
        self.subs: list[Submission] = []
        self.steps: list[str] = []

    def add(self, file: str, stem: str, row: dict, report=None, raw_bytes: bytes | None = None,
            raw: dict | None = None, fingerprint: str | None = None) -> Submission:
        """Record one file: ``row`` as ``check`` makes it, the ``report`` (None when unreadable), the file's
        bytes (for the header of an unreadable file) and its TOML (for the answers' digest)."""
        by_file, confusable = match_file(stem, self.students, self.by_id)
        pid = row.get("problem_id") or (header_problem_id(raw_bytes) if raw_bytes is not None else None)
        owner = self.owner_of.get(pid) if pid else None
        if owner is None and report is not None and report.student:
            hit = self.by_id.get(fold(report.student))
            owner = hit[0] if hit else None
        verdicts = None
        if report is not None:
            verdicts = {f"L{s['layer']} {s['name']}": s["verdict"] for s in report.steps}
            known = set(self.steps)
            self.steps += [k for k in verdicts if k not in known]    # sheets of other sizes: their steps appended
        sub = Submission(file=file, row=row, verdicts=verdicts, by_file=by_file, owner=owner,
                         problem=pid or fingerprint, answers=None if raw is None else answers_digest(raw),
                         confusable=confusable)
        if row.get("error"):
            _flag(sub, "unreadable")
        if row.get("flags"):                     # "problem_altered: [input].H0, …" (keys.py)
            _flag(sub, row["flags"])
        self.subs.append(sub)
        return sub

    def _cross_flags(self) -> None:
        def who(s: Submission) -> str:
            return self.students[s.student].id if s.student is not None else s.file

        for attr, code in (("problem", "same_problem"), ("answers", "same_answers")):
            groups: dict[str, list[Submission]] = {}
            for s in self.subs:
                if getattr(s, attr):
                    groups.setdefault(getattr(s, attr), []).append(s)
            for group in groups.values():
                if len(group) > 1:
                    for s in group:
                        _flag(s, code, "also " + ", ".join(who(o) for o in group if o is not s))
        for s in self.subs:
            if s.by_file is not None and s.owner is not None and s.by_file != s.owner:
                _flag(s, "not_own_problem", f"the problem of {self.students[s.owner].id}")
            if s.confusable:
                _flag(s, "confusable_id", f"the file name's id equals {self.students[s.by_file].id} only "
                                          f"after folding look-alike letters")

    def rows(self) -> list[dict]:
        """The finished gradebook (see the class docstring); each row has the :data:`ROSTER_COLUMNS` and
        ``verdicts`` (step label -> verdict, or None)."""
        self._cross_flags()
        mine: dict[int, list[Submission]] = {}
        for s in sorted(self.subs, key=lambda s: s.file):
            if s.student is not None:
                mine.setdefault(s.student, []).append(s)
        folded = Counter(fold(s.id) for s in self.students)
        out, extra = [], []
        for k, st in enumerate(self.students):
            subs = mine.get(k, [])
            if len(subs) > 1:
                for s in subs:
                    _flag(s, "several_submissions", ", ".join(o.file for o in subs if o is not s))
            if subs:
                row = self._row(st, subs[0])
                extra += [self._row(st, s) for s in subs[1:]]
            else:
                row = self._empty(st)
            if folded[fold(st.id)] > 1:
                others = [o.id for o in self.students if o is not st and fold(o.id) == fold(st.id)]
                row["flags"] = "; ".join(filter(None, [row["flags"], f"confusable_id: the roster's "
                                                                      f"{', '.join(others)}"]))
            out.append(row)
        for s in sorted(self.subs, key=lambda s: s.file):
            if s.student is None:
                _flag(s, "unmatched")
                extra.append(self._row(None, s))
        return out + extra

    def _row(self, st: Student | None, s: Submission) -> dict:
        r = s.row
        total, out_of = r.get("total", ""), r.get("out_of", "")
        pct = round(100 * total / out_of, 2) if isinstance(total, (int, float)) and out_of else ""
        return {"name": st.display if st else "", "id": st.id if st else "", "total": total, "out_of": out_of,
                "percent": pct, "first_mistake": r.get("first_mistake", ""), "diagnosis": r.get("diagnosis", ""),
                "flags": "; ".join(s.flags), "file": s.file, "problem_id": r.get("problem_id", "") or s.problem or "",
                **{k: r.get(k, "") for k in ("correct", "follows", "wrong", "missing")},
                "error": r.get("error", "") or "", "verdicts": s.verdicts}

    @staticmethod
    def _empty(st: Student) -> dict:
        return {**{k: "" for k in ROSTER_COLUMNS}, "name": st.display, "id": st.id, "flags": "no_submission",
                "verdicts": None}


def summary(rows: list[dict], steps: list[str], students: int | None = None) -> dict:
    """The class summary of a roster gradebook (what ``--summary`` writes as JSON): how many students, sheets
    marked, unreadable, without a submission; the mean percentage; the steps most often wrong and most often
    missing (students per step); the first mistakes by diagnosis; the percentages of every marked sheet.
    ``students``: the roster's size (default: the rows with an id)."""
    marked = [r for r in rows if isinstance(r["percent"], (int, float))]
    wrong, missing = Counter(), Counter()
    for r in rows:
        for name, v in (r["verdicts"] or {}).items():
            if v == "wrong":
                wrong[name] += 1
            elif v == "missing":
                missing[name] += 1
    first = Counter(r["diagnosis"] for r in rows if r["diagnosis"])
    at = Counter(r["first_mistake"] for r in rows if r["first_mistake"])
    flagged = Counter(f.split(":")[0] for r in rows for f in r["flags"].split("; ") if f)
    n = students if students is not None else sum(1 for r in rows if r["id"])
    return {"students": n, "rows": len(rows), "sheets_marked": len(marked),
            "unreadable": flagged["unreadable"], "no_submission": flagged["no_submission"],
            "flags": dict(flagged.most_common()),
            "mean_percent": round(sum(r["percent"] for r in marked) / len(marked), 2) if marked else None,
            "percents": [r["percent"] for r in marked],
            "steps": steps,
            "steps_wrong": [{"step": k, "students": n} for k, n in wrong.most_common()],
            "steps_missing": [{"step": k, "students": n} for k, n in missing.most_common()],
            "first_mistakes_by_diagnosis": [{"diagnosis": k, "students": n} for k, n in first.most_common()],
            "first_mistakes_by_step": [{"step": k, "students": n} for k, n in at.most_common()]}


def matrix_rows(rows: list[dict], steps: list[str]) -> tuple[list[str], list[list]]:
    """The student × step table of ``--matrix``: a header (name, id, file, then one column per step) and one
    line per gradebook row, each step's verdict (``correct``, ``follows``, ``wrong``, ``missing``; empty when
    the student has no marked sheet, or the step is not on the student's sheet)."""
    header = ["name", "id", "file"] + steps
    return header, [[r["name"], r["id"], r["file"]] + [(r["verdicts"] or {}).get(k, "") for k in steps]
                    for r in rows]
