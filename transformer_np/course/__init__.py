"""The course companion: the studies behind the lesson notebooks and figures, the exercises' checks and grading.

Each study computes the numbers a lesson states — the worked example (:mod:`.trace`), gradient flow through
deep stacks (:mod:`.gradflow`), contextual embeddings of MiniLM (:mod:`.contextual`), warm-up and LayerNorm
placement (:mod:`.stability`), the encoder's anatomy (:mod:`.anatomy`), its cost (:mod:`.complexity`) — and
:mod:`.plots` draws them; :mod:`.figures` regenerates every figure, :mod:`.ledger` holds the verdict on every
claim. :mod:`.exercises` holds the exercises' checks (the students' own loop), and :mod:`.grade` the grade of
record, :func:`grade_notebook` / :func:`grade_submissions`, which runs each submission in its own restricted
process (:mod:`.sandbox`). Nothing is imported here until used: import the module you need, or take
``grade_notebook`` from this package (loaded on first use).
"""

from __future__ import annotations

from typing import Any

__all__ = ["grade_notebook", "grade_submissions"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import grade

        return getattr(grade, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
