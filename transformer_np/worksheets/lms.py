r"""The gradebook as an LMS imports it: ``check … --roster ROSTER.csv --export canvas|moodle FILE``.

Only the roster's students are written (one line each, in roster order); files that name no roster student
are in the gradebook CSV, not here. A student with no marked sheet (nothing handed in, or an unreadable file)
gets an empty grade: both systems leave an empty cell as it is, so the instructor decides.

**Canvas** (Grades → Import, a CSV laid out like Canvas's own gradebook export): the columns ``Student``,
``ID``, ``SIS User ID``, ``SIS Login ID``, ``Section`` — Canvas identifies each row by one of ``Student``
(``Last, First``), ``ID`` (Canvas's user id) or ``SIS User ID``, and expects the five columns before the
assignments — then one assignment column named by ``--assignment`` (a new name makes a new assignment). The
second line is Canvas's ``Points Possible`` line: the sheet's total. ``ID`` is the roster's ``canvas_id``
column when it has one, ``SIS User ID`` the roster's id; the others are empty.

**Moodle** (Grades → Import → CSV file): any header, then one line per user; on the preview page each column is
mapped — ``ID number`` to *useridnumber* (the roster's id is the user's ID number) and the grade column to the
grade item; ``Feedback`` may be mapped to that item's feedback (Moodle's docs: import the feedback together
with the grades). Columns: ``First name``, ``Last name``, ``ID number``, ``Email address``, the grade (named
by ``--assignment``), ``Feedback`` (the marks, the first mistake and the flags, as text).
"""

from __future__ import annotations

import csv
import io

from ..errors import InputValueError

__all__ = ["export_rows", "CANVAS_ID_COLUMNS", "EXPORTS"]

CANVAS_ID_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
EXPORTS = ("canvas", "moodle")


def _split_name(st) -> tuple[str, str]:
    if st.first or st.last:
        return st.first, st.last
    name = st.name.strip()
    if "," in name:
        last, first = (p.strip() for p in name.split(",", 1))
        return first, last
    parts = name.split()
    return (" ".join(parts[:-1]), parts[-1]) if len(parts) > 1 else ("", name)


def _grade(row) -> object:
    return row["total"] if isinstance(row["total"], (int, float)) and not row["error"] else ""


def _feedback(row) -> str:
    parts = []
    if isinstance(row["total"], (int, float)):
        parts.append(f"{row['total']:g} / {row['out_of']:g}")
    if row["first_mistake"]:
        parts.append(f"first mistake: {row['first_mistake']} ({row['diagnosis']})")
    if row["flags"]:
        parts.append(f"flags: {row['flags']}")
    return "; ".join(parts)


def export_rows(kind: str, rows: list[dict], students: list, assignment: str) -> list[list]:
    """The lines (header first) of the ``kind`` import file for the roster rows of ``rows`` (the first
    ``len(students)`` rows, in roster order, as :meth:`.gradebook.Gradebook.rows` gives them)."""
    roster = rows[:len(students)]
    if kind == "canvas":
        out_of = next((r["out_of"] for r in roster if isinstance(r["out_of"], (int, float))), "")
        lines = [list(CANVAS_ID_COLUMNS) + [assignment], ["Points Possible", "", "", "", "", out_of]]
        for st, r in zip(students, roster):
            first, last = _split_name(st)
            lines.append([f"{last}, {first}" if first else last, st.lms_id, st.id, "", "", _grade(r)])
        return lines
    if kind == "moodle":
        lines = [["First name", "Last name", "ID number", "Email address", assignment, "Feedback"]]
        for st, r in zip(students, roster):
            first, last = _split_name(st)
            lines.append([first, last, st.id, st.email, _grade(r), _feedback(r)])
        return lines
    raise InputValueError(f"--export: expected one of {', '.join(EXPORTS)}, got {kind!r}")


def export_text(kind: str, rows: list[dict], students: list, assignment: str) -> str:
    """:func:`export_rows` as CSV text (UTF-8 with ``\\n`` line ends; text cells made safe by the caller)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(export_rows(kind, rows, students, assignment))
    return buf.getvalue()
