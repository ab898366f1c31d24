r"""The marking record, below the marker and the diagnosis that both read it.

:class:`Marking` holds everything the verdicts were computed from (the truth, the bands, the student's chain,
the verdicts); ``FLOAT_SLACK`` is added to every comparison with a band. :mod:`.marking` builds the record and
calls :mod:`.diagnosis`, which reads it: both import from here, so every import goes one way. ``FLOAT_SLACK``
and ``Marking`` keep resolving from :mod:`.marking`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .steps import Key, Step

__all__ = ["FLOAT_SLACK", "Marking"]

FLOAT_SLACK = 1e-9


@dataclass
class Marking:
    """Everything the verdicts were computed from (arrays keyed by step key)."""

    worksheet: object
    steps: list[Step]
    truth: dict            # the correct value of every step
    tol: dict              # the band around the truth (verdict rule 1), per entry
    chain: dict            # the student's chain: given entries, unwritten ones recomputed from them
    own: dict              # each step recomputed from the chain's inputs (rule 2 compares with it)
    own_tol: dict          # the band along the student's chain (rule 2), per entry
    verdict: dict          # key -> verdict
    error: dict            # key -> max |given − truth| over the given entries (None when missing)
    u: float
    reference: dict = field(default_factory=dict)   # key -> "truth" | "own": what the verdict compared with
    diagnoses: dict = field(default_factory=dict)   # key -> the diagnosis of that wrong step (cached)
    student_steps: list | None = None               # the steps of the student's chain, if they differ
    student_inputs: dict | None = None              # H0 / dH as the student used them
    hidden: set = field(default_factory=set)        # keys where a diagnosed mistake is carried in the chain
    saved: dict = field(default_factory=dict)       # key -> (reference, band) a forced verdict was decided with

    def given(self, key):
        return self.worksheet.answers.get(key)

    def follow_tolerance(self, step: Step) -> np.ndarray:
        """The band of a comparison with a value recomputed from the student's own answers."""
        return self.own_tol[step.key]

    def band_used(self, key: Key) -> np.ndarray | None:
        """The band (per entry, the step's shape) the verdict of ``key`` was decided with: around the truth
        for ``correct`` at the truth, around the value from the student's own numbers otherwise (None when
        missing)."""
        if key in self.saved:
            return self.saved[key][1]
        r = self.reference.get(key)
        return None if r is None else (self.tol if r == "truth" else self.own_tol)[key]

    def decisive(self, key: Key) -> tuple[float, float] | None:
        """(|given − reference|, band) at the given entry that decided the verdict — the one with the largest
        error relative to its band — so that a table shows an error and a tolerance that agree with the
        verdict: error ≤ band for ``correct``/``follows``, error > band for ``wrong``."""
        a = self.given(key)
        r = self.reference.get(key)
        if a is None or r is None:
            return None
        ref = self.saved[key][0] if key in self.saved else self.truth[key] if r == "truth" else self.own[key]
        band = self.band_used(key)
        with np.errstate(all="ignore"):
            err = np.abs(a.value - ref)
            ratio = np.where(a.mask, np.nan_to_num(err / (band + FLOAT_SLACK), nan=np.inf), -1.0)
        i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        return float(err[i]), float(band[i])
