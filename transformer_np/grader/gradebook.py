r"""The gradebook of ``transformer-np grade``: one row per submission, saying what it earned and why.

``--csv`` writes :func:`csv_rows`: the columns

    file, score, out_of, q1 … qN, q1_why … qN_why, flags, seed, sandbox, error

``<q>_why`` is the one-line cause of a question's lost marks (empty when the question earned its points): the
first problem of each failed check (``out: leaves out the residual around attention``), named by its check
when a question has several (exercise 6's Post-LN and Pre-LN), or why the function could not be called, or
``not graded: … (see error)`` for a file that could not be graded. ``seed`` is the seed the row's hidden
cases were drawn from (a regrade with ``--seed`` reproduces the row); ``sandbox`` is ``kernel`` when the
kernel boundary held and ``unsandboxed`` under ``--no-sandbox`` (formative grades); ``error`` says what was
wrong with a file that could not be graded at all (not JSON, not a notebook, too large, not a regular file).
The text output and ``--json`` carry the same (``--json``: ``questions[q]["why"]``, ``seed``, ``sandbox``,
``error`` of each submission).

Values here are plain text; the command escapes each cell for spreadsheets when it writes the file
(``transformer_np.textout.csv_cell``, through the one CSV writer ``cli._gradebook.CsvSink``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["WHY_CHARS", "csv_rows", "feedback_why", "one_line", "question_why"]

WHY_CHARS = 300          # a <q>_why cell is cut to this many characters (the full feedback is in --json)


def one_line(text: str, limit: int = WHY_CHARS) -> str:
    """``text`` on one line (every run of whitespace, newlines included, one space), cut to ``limit``
    characters with "…"."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def feedback_why(fb: Any) -> str:
    """The one-line cause of a failed check, from its :class:`~transformer_np.grader.feedback.Feedback`: the
    first problem as ``<output>: <message>`` (the header when there is no problem)."""
    problems = getattr(fb, "problems", None) or []
    if problems:
        p = problems[0]
        return one_line(f"{p.output}: {p.message}")
    return one_line(f"{fb.function}: {fb.header}")


def question_why(grade: Any) -> dict[str, str]:
    """{question: one-line cause of its lost marks, "" when it earned them all} of a
    :class:`~transformer_np.grader.grade.SubmissionGrade`, in question order."""
    per = grade.questions()
    if grade.error is not None:
        what = "the grader failed on it" if "grader_error" in grade.flags else "the file could not be read"
        return {q: f"not graded: {what} (see error)" for q in per}
    out: dict[str, str] = {}
    for q in per:
        checks = [c for c in grade.checks if c.question == q]
        failed = [c for c in checks if c.earned < c.points]
        if len(checks) > 1:
            parts = [f"{c.exercise}: {c.why or c.feedback or 'failed'}" for c in failed]
        else:
            parts = [c.why or c.feedback or "failed" for c in failed]
        out[q] = one_line("; ".join(parts)) if parts else ""
    return out


def csv_rows(grades: list, questions: list[str]) -> list[list]:
    """The header and one row per grade (plain values: escape each cell when writing)."""
    rows: list[list] = [["file", "score", "out_of"] + questions + [f"{q}_why" for q in questions]
                        + ["flags", "seed", "sandbox", "error"]]
    for g in grades:
        per, why = g.questions(), g.why()
        cells = [f"{per[q][0]:g}" if q in per else "" for q in questions]
        whys = [why.get(q, "") for q in questions]
        rows.append([g.file, f"{g.score:g}", f"{g.out_of:g}"] + cells + whys
                    + [";".join(g.flags), "" if g.seed is None else str(g.seed), g.sandbox,
                       "" if g.error is None else one_line(g.error, 1000)])
    return rows
