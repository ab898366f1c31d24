"""The course: lessons' computations, exercise checks, and the grade of record (:func:`grade_notebook`).

Importing this package is cheap: :func:`grade_notebook` and :func:`grade_submissions` load
:mod:`transformer_np.course.grade` on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["grade_notebook", "grade_submissions"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import grade

        return getattr(grade, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
