"""Worksheets: check a hand calculation of a small encoder, step by step, forward and backward.

A worksheet is a small TOML file (see :mod:`.format`) describing one problem — tokens, H^(0), the
weights — and, optionally, a student's answers for any of the named steps (:mod:`.names`).
:func:`check` computes every step with the library's own ops (:mod:`.steps`), marks each answer
``correct`` / ``follows`` / ``wrong`` / ``missing`` with follow-through (:mod:`.marking`) and
diagnoses the first mistake (:mod:`~transformer_np.worksheets.diagnosis`). :func:`new_worksheet` writes a
fresh problem chosen for hand calculation (:mod:`.generate`).

    >>> import transformer_np as tnp
    >>> report = tnp.check(tnp.worksheets.example_path("the_cat_sat"))
    >>> report.first_mistake["diagnosis"]
    'arithmetic'

Marking, beyond the first step: the tolerance band of honest rounding (:mod:`.band`), the instructor's key
(:mod:`.keys`), common mistakes as formulas (:mod:`.mistakes`) and a miscopied number (:mod:`.miscopy`) for
the diagnosis, follow-through that cannot be gamed (:mod:`.trivial`), the marking record they share
(:mod:`.record`), a report that does not give the answers away (:mod:`.withheld`), the LayerNorm notation
sheets and page share (:mod:`.notation`) and TOML read and written (:mod:`.tomlio`). The class: the gradebook
against a roster (:mod:`.gradebook`, its figure :mod:`.gradebook_plot`, its LMS export :mod:`.lms`) and a
worksheet as a PrairieLearn question (:mod:`.prairielearn`). The page of ``worksheet serve``: :mod:`.serve`
(the server), :mod:`.serve_page` (what it shows) and :mod:`.serve_save` (saving into the sheet).

Command line: ``transformer-np check [--key KEY] DIR_OR_FILE... [--json] [--answers] [--csv GRADEBOOK]``,
``transformer-np worksheet new`` and ``transformer-np worksheet class`` (:mod:`.classroom`).
"""

from __future__ import annotations

import os
from importlib import resources

from .format import Answer, Worksheet, load_worksheet, quantity_shape
from .names import DIAGNOSES, VERDICTS
from .report import Report

__all__ = ["check", "load_worksheet", "Worksheet", "Answer", "Report", "quantity_shape", "example_path",
           "EXAMPLES", "VERDICTS", "DIAGNOSES", "new_worksheet", "write_worksheet"]

EXAMPLES = ("the_cat_sat",)


def example_path(name: str = "the_cat_sat") -> str:
    """The path of a worksheet shipped with the package (``EXAMPLES``)."""
    if name not in EXAMPLES:
        from ..errors import InputValueError
        raise InputValueError(f"name must be one of {list(EXAMPLES)}, got {name!r}")
    return os.fspath(resources.files(__name__).joinpath("examples", f"{name}.toml"))


def check(worksheet, key=None) -> Report:
    """Check a worksheet: compute every step, mark the student's answers, diagnose the first mistake.

    Args:
        worksheet: a path to a TOML worksheet, or a dict of the same structure (or a
            :class:`Worksheet`).
        key: the instructor's answer key (a path, a dict, or a :class:`.keys.Key`): the problem and the mark
            scheme are then taken from the key and only the answers from ``worksheet``; a sheet whose copy of
            the problem or of ``[marks]`` differs is flagged ``problem_altered`` (``report.flags``,
            ``report.altered``; see :mod:`.keys`). Without it the sheet is marked as it stands (self-study).

    Returns:
        a :class:`Report`: ``report.to_dict()`` is ``{"steps": [{"layer", "name", "verdict", "given",
        "expected", "max_abs_error", "marks", "out_of"}, …], "first_mistake": {"layer", "name", "diagnosis",
        "explanation"} or None, "marks": {"awarded", "available"}, "counts": {…}}``; ``print(report)``
        shows the text report.

    Raises:
        WorksheetError: (a ``ValueError``) the worksheet is malformed — the message names the file,
            section, key, what was expected and what was given.
    """
    import numpy as np

    from ..errors import InputValueError, WorksheetError
    from .marking import mark_worksheet

    if key is not None:
        from .keys import check_with_key

        if isinstance(worksheet, Worksheet):
            from ..errors import InputTypeError
            raise InputTypeError("check(worksheet, key=…): worksheet must be a path or a dict (its answers are "
                                 "put into the key's problem), got a parsed Worksheet")
        return check_with_key(worksheet, key)
    ws = load_worksheet(worksheet)
    try:
        m = mark_worksheet(ws)
    except WorksheetError:
        raise
    except InputValueError as e:          # an op refusing a value the sheet led to: name the file
        raise WorksheetError(f"{ws.source}: {e}") from None
    for s in m.steps:                     # the bounds on a sheet's numbers keep every value finite; say so if not
        if not np.all(np.isfinite(m.truth[s.key])):
            raise WorksheetError(f"{ws.source}: layer {s.layer}, {s.name}: the correct value is not finite; the "
                                 f"sheet's numbers are too large to check")
    return Report(m)


def new_worksheet(*args, **kwargs):
    """A fresh problem for hand calculation; see :func:`transformer_np.worksheets.generate.new_worksheet`."""
    from .generate import new_worksheet as _new

    return _new(*args, **kwargs)


def write_worksheet(*args, **kwargs):
    """Write a problem's TOML, student sheet and answer key; see :func:`.generate.write_worksheet`."""
    from .generate import write_worksheet as _write

    return _write(*args, **kwargs)
