r"""The marking record and the helpers that read it, shared by the marker, the diagnosis and the miscopy search.

:class:`Marking` holds everything the verdicts were computed from (the truth, the bands, the student's chain,
the verdicts); ``FLOAT_SLACK`` is added to every comparison with a band. Below them, the readings of a record
that both :mod:`~transformer_np.worksheets.diagnosis` and :mod:`.miscopy`
need: the steps of the student's chain, one step recomputed
with some values or steps put into that chain, the unwritten steps a step depends on, how closely a value
reproduces the student's answer, and the student's numbers quoted in an explanation.

This is the lowest of the four: :mod:`.marking` imports :mod:`~transformer_np.worksheets.diagnosis`, which
imports :mod:`.miscopy`, and all three import from here, so every import goes one way. ``FLOAT_SLACK`` and
``Marking`` keep resolving from :mod:`.marking`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .names import is_per_token
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
    trivial: dict = field(default_factory=dict)     # key -> why the student's numbers make it trivial (wrong)
    local: dict = field(default_factory=dict)       # key -> the step recomputed from the student's written inputs
    local_tol: dict = field(default_factory=dict)   # key -> its band: this step's rounding and its inputs' alone
    local_step: dict = field(default_factory=dict)  # key -> the step (the student's version) they were made with

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
        return None if r is None else {"truth": self.tol, "own": self.own_tol, "local": self.local_tol}[r][key]

    def decisive(self, key: Key) -> tuple[float, float] | None:
        """(|given − reference|, band) at the given entry that decided the verdict — the one with the largest
        error relative to its band — so that a table shows an error and a tolerance that agree with the
        verdict: error ≤ band for ``correct``/``follows``, error > band for ``wrong``."""
        a = self.given(key)
        r = self.reference.get(key)
        if a is None or r is None:
            return None
        ref = self.saved[key][0] if key in self.saved else {"truth": self.truth, "own": self.own,
                                                            "local": self.local}[r][key]
        band = self.band_used(key)
        with np.errstate(all="ignore"):
            err = np.abs(a.value - ref)
            ratio = np.where(a.mask, np.nan_to_num(err / (band + FLOAT_SLACK), nan=np.inf), -1.0)
        i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        return float(err[i]), float(band[i])


# ----------------------------------------------------------------------------- the student's chain
def _steps(m: Marking) -> list[Step]:
    """The steps of the student's chain (with mistakes carried, when a diagnosis put one in)."""
    return m.student_steps or m.steps


def _recompute(m: Marking, steps: list[Step], changed: dict, last: Step, replaced: dict | None = None):
    """The value of ``last`` with ``changed`` ({key: value}) and ``replaced`` ({key: Step}) put into the student's
    chain, every step in between recomputed (given entries kept as written)."""
    vals = dict(m.chain)
    vals.update(changed)
    dirty = set(changed) | set(replaced or ())
    replaced = replaced or {}
    with np.errstate(all="ignore"):
        for s in steps:
            s = replaced.get(s.key, s)
            if s.key not in dirty and not dirty.intersection(s.inputs):
                if s.key == last.key:
                    return m.own[last.key]
                continue
            v = s.fn(*(vals[k] for k in s.inputs))
            if s.key == last.key:
                return v
            a = m.given(s.key)
            vals[s.key] = v if a is None else np.where(a.mask, a.value, v)
            dirty.add(s.key)
    return m.own[last.key]


def _unwritten_ancestors(m: Marking, step: Step) -> list[Step]:
    """Earlier steps the student did not write that ``step`` depends on through unwritten steps only (a
    slip above a written answer cannot reach ``step``: the written answer is used as given), nearest first."""
    steps = _steps(m)
    by_key = {s.key: s for s in steps}
    seen, order, todo = set(), [], list(step.inputs)
    while todo:
        k = todo.pop(0)
        if k in seen or k not in by_key or m.given(k) is not None or k in m.hidden:
            continue
        seen.add(k)
        order.append(by_key[k])
        todo += list(by_key[k].inputs)
    pos = {s.key: i for i, s in enumerate(steps)}
    return sorted(order, key=lambda s: pos[s.key], reverse=True)


def _score(m: Marking, step: Step, value: np.ndarray) -> float:
    """max |given − value| / tolerance over the given entries (≤ 1: the value reproduces the answer)."""
    a = m.given(step.key)
    tol = m.follow_tolerance(step) + FLOAT_SLACK
    with np.errstate(all="ignore"):
        r = (np.abs(a.value - value) / tol)[a.mask]
    return float(np.max(r)) if np.all(np.isfinite(r)) else np.inf


# ----------------------------------------------------------------------------- quoting the student's numbers
def _fmt(x, dec: int) -> str:
    s = f"{x:.{dec}f}"
    return s.replace("-", "") if float(s) == 0 else s


def _vec(v, dec: int) -> str:
    v = np.atleast_1d(v)
    return "(" + ", ".join(_fmt(x, dec) for x in v) + ")" if v.size > 1 else _fmt(v[0], dec)


def _worst(m: Marking, step: Step, ref: np.ndarray):
    """(label, index) of the given row (or entry) farthest from ``ref``."""
    a = m.given(step.key)
    with np.errstate(invalid="ignore"):
        diff = np.where(a.mask, np.nan_to_num(np.abs(a.value - ref), nan=np.inf), -1.0)
    i = np.unravel_index(int(np.argmax(diff)), diff.shape)
    if is_per_token(step.name):
        return f"row {m.worksheet.tokens[i[0]]!r}", i
    return (f"row {i[0] + 1}" if diff.ndim > 1 else "the vector"), i


def _row(step: Step, a: np.ndarray, i) -> np.ndarray:
    """The row ``i`` is in (for a per-token vector, its entry; for a parameter vector, all of it)."""
    if a.ndim > 1 or is_per_token(step.name):
        return a[i[0]]
    return a
