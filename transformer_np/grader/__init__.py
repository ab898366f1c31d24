"""The exercise grader: the exercises' checks, and their grade of record, ``transformer-np grade``.

What runs where, and what crosses the pipe:

* **In the grader's process** (this package, never reachable from a student's code): the exercises' specs
  (:mod:`.specs`, :mod:`.specs_ops`, :mod:`.specs_blocks`, :mod:`.exercise_base`) and their hidden cases
  (:mod:`.hidden_cases`); the checks and their feedback (:mod:`.exercises`, :mod:`.calling`,
  :mod:`~transformer_np.grader.diagnosis`, :mod:`.feedback`); the points by name (:mod:`.grading`); the class run
  (:mod:`.grade`: :func:`grade_notebook`, :func:`grade_submissions`) and the gradebook it writes; the similarity
  report (:mod:`.similarity`); the side of the sandbox that starts a child, talks to it under deadlines and serves the
  functions a notebook hands out (:mod:`.sandbox`), the kernel's boundary it sets up for the child (:mod:`.confine`:
  Landlock, seccomp-bpf, a user namespace), the child's clocks (:mod:`.timing`: CPU seconds, wall-clock caps) and
  the parse of a submission's source that cannot crash the grader (:mod:`.source`). The grader draws the cases,
  computes the reference and does every comparison.
* **In the child process** (:mod:`.child`, one per submission, run as a separate program that never imports this
  project): the student's cells and functions, behind the operating system's boundary set up before any student
  code runs.
* **Across the pipe** (:mod:`.wire`): framed messages of a JSON header and ``.npy`` arrays — cells and call
  arguments to the child; numbers, strings, type names and handle numbers back. Nothing the child sends is
  executed or unpickled; every frame is bounded before it is read.

Where a course grades (:mod:`.platforms`): Gradescope autograders and PrairieLearn external-grader questions
that run the same grade of record.

Nothing is imported here until used. The old paths under ``transformer_np.course`` (``course.exercises``,
``course.grade``, ``course.sandbox``, …) import these same modules.
"""

from __future__ import annotations

from typing import Any

__all__ = ["grade_notebook", "grade_submissions"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import grade

        return getattr(grade, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
