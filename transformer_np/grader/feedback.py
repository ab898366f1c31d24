"""The feedback objects of the course exercises: what a check reports, and how it reads.

A :class:`Problem` is one thing wrong with a student's function (an output, a machine-readable code,
the diagnosis in words, the fix); a :class:`Feedback` gathers a failed case's problems and renders
them as the text a student reads, at the level :func:`feedback_level` reads from the environment
(``TRANSFORMER_NP_FEEDBACK``). ``_Stop`` carries a problem that ends the check of a case. The checks
that produce them are in :mod:`transformer_np.grader.exercises`, which re-exports these names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import InputValueError

__all__ = ["FEEDBACK_ENV", "Feedback", "Problem", "feedback_level"]

FEEDBACK_ENV = "TRANSFORMER_NP_FEEDBACK"   # "hint" (default: diagnoses in words) or "instructor" (+ the fix)
_MAX_LINES = 4     # gradient problems shown in full before the rest are summarised


def feedback_level() -> str:
    """``"hint"`` (the default: what is wrong, in words — which term, axis or shape) or ``"instructor"``
    (also the corrected formula or code), from the environment variable ``TRANSFORMER_NP_FEEDBACK``."""
    level = os.environ.get(FEEDBACK_ENV, "hint").strip().lower() or "hint"
    if level not in ("hint", "instructor"):
        raise InputValueError(f"{FEEDBACK_ENV} must be 'hint' or 'instructor'; got {level!r}")
    return level


@dataclass(frozen=True)
class Problem:
    """One thing wrong: ``output`` (e.g. "out", "dgamma"), a machine-readable ``code``, the diagnosis in
    words (``message``) and the fix (``fix``: the corrected formula or code, shown to instructors only)."""

    output: str
    code: str
    message: str
    fix: str = ""


@dataclass
class Feedback:
    """What is wrong with a student's function; its ``repr`` is the text a student reads.

    Attributes:
        function: the student's function the feedback is about ("softmax_backward").
        header: one line saying which case failed.
        problems: the problems found, in order.
        notes: further lines (the finite-difference check, cases that passed).
    """

    function: str
    header: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def codes(self) -> list[str]:
        """The problem codes, in order (``gradcheck`` included when it failed)."""
        return [p.code for p in self.problems]

    @property
    def text(self) -> str:
        """The feedback as plain text at :func:`feedback_level`: a header line, one line per distinct
        problem, then the notes. At the default level no line contains the corrected formula or code."""
        return self.render(feedback_level() == "instructor")

    @property
    def instructor_text(self) -> str:
        """The text with each problem's fix (the corrected formula or code): for the instructor's report."""
        return self.render(True)

    def render(self, with_fix: bool) -> str:
        lines = [f"✗ {self.function}: {self.header}"]
        lines += _summarise(self.problems, with_fix)
        lines += [f"  {n}" for n in self.notes]
        return "\n".join(line.rstrip() for line in lines if line.strip())   # no blank line: doctest-safe

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


def _summarise(problems: list[Problem], with_fix: bool = False) -> list[str]:
    """One line per distinct message (gradients sharing a diagnosis are listed together), at most
    ``_MAX_LINES`` of them, then a count of the rest."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for p in problems:
        groups.setdefault((p.code, p.message, p.fix if with_fix else ""), []).append(p.output)
    lines = []
    for (_code, message, fix), outputs in list(groups.items())[:_MAX_LINES]:
        who = outputs[0] if len(outputs) == 1 else ", ".join(outputs[:3]) + (
            f" and {len(outputs) - 3} more" if len(outputs) > 3 else "")
        lines.append(f"  - {who}: {message}" + (f" [fix: {fix}]" if fix else ""))
    rest = list(groups.values())[_MAX_LINES:]
    if rest:
        names = [o for outs in rest for o in outs]
        lines.append(f"  - also wrong: {', '.join(names[:6])}{' …' if len(names) > 6 else ''} "
                     f"(fix the ones above first: later gradients depend on them)")
    return lines


class _Stop(Exception):
    """Internal: a problem that ends the check of the current case."""

    def __init__(self, problem: Problem):
        super().__init__(problem.message)
        self.problem = problem
