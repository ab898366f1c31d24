"""The course companion: the studies behind the lesson notebooks and figures.

Each study computes the numbers a lesson states — the worked example (:mod:`.trace`), gradient flow through
deep stacks (:mod:`.gradflow`), contextual embeddings of MiniLM (:mod:`.contextual`), warm-up and LayerNorm
placement (:mod:`.stability`), the encoder's anatomy (:mod:`.anatomy`), its cost (:mod:`.complexity`) — and
:mod:`.plots` draws them; :mod:`.figures` regenerates every figure, :mod:`.ledger` holds the verdict on every
claim, and :mod:`.progress` shows a long notebook cell's progress. Nothing is imported here until used.

The exercises' checks and their grade of record are a package of their own, :mod:`transformer_np.grader`; the
old paths (``transformer_np.course.exercises``, ``transformer_np.course.grade_notebook``, …) still import it.
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []
_GRADER = ("grade_notebook", "grade_submissions")


def __getattr__(name: str) -> Any:
    if name in _GRADER:          # the old home of the grade of record
        from ..grader import grade

        return getattr(grade, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
