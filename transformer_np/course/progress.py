"""Progress of a long notebook cell, on one line of the cell's output.

The course functions that take seconds (:func:`transformer_np.course.gradflow.compute_all`,
:func:`~transformer_np.course.gradflow.probe_table`, …) accept ``progress(i, total, label)``, called as step
``i`` of ``total`` starts. In a notebook, pass :func:`progress_line`: it prints what runs and how many steps,
then a dot as each step starts and the step's number every ten steps::

    per-layer sweep, spectra and expansions, 52 steps: .........10.........20.........30.........40.........50..

The line is the same on every run (no times), so a notebook's stored output stays comparable (nbval), and in
Jupyter it grows while the cell runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["progress_line"]


def progress_line(what: str, stream=None) -> Callable[[int, int, str], None]:
    """A ``progress(i, total, label)`` callback writing ``what, N steps: ....`` to ``stream`` (default: the
    ``sys.stdout`` of the moment, a notebook cell's output); the line ends as the last step starts."""
    if not isinstance(what, str):
        from .._validate import describe
        from ..errors import InputTypeError
        raise InputTypeError(f"what must be a str (what the steps compute), got {describe(what)}")

    def step(i: int, total: int, label: str) -> None:
        out = stream if stream is not None else sys.stdout
        text = f"{what}, {total} steps: " if i == 1 else ""
        text += str(i) if i % 10 == 0 else "."
        out.write(text + ("\n" if i == total else ""))
        out.flush()

    return step
