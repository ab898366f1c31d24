r"""Marking: the tolerance band, follow-through, and the verdict of every step.

The band (:mod:`.band`). An honest student works to the sheet's ``decimals`` = D and rounds every
number they produce — answers, quantities the sheet does not ask for, and the sub-steps of each
formula (a mean, a variance, a square root, each exponential and the row sum of a softmax, …) — to
D places. The band of an entry is u = ½·10^(−D) (the answer's own rounding) plus ``C_BAND`` times
the standard deviation that this rounding of everything before produces in the entry, measured by
working the chain with honest rounding (:func:`.band.sample_chain`). It is computed per entry; it
does not depend on which steps the student wrote (a student who keeps more digits stays inside
it); a step read off exact data (Q = H0 W_Q + b_Q from the sheet's numbers) has band u exactly.

Verdicts, for each quantity the student gave (on the entries given — a table keyed by token gives
some rows):

1. ``correct`` if every given entry is within the band of the true value (``tol``);
2. otherwise compare with the value recomputed from the student's *own* numbers — their given
   entries replace the true ones step by step, unwritten steps are recomputed from them, and a
   mistake diagnosed in an unwritten step (or a miscopied number of the sheet) is kept in the
   student's chain — within that chain's band (``own_tol``: only unwritten work and sub-steps are
   rounded there; the given entries are used as written) it is ``follows`` if anything it depends
   on was not correct, and ``correct`` otherwise (right work on right, if rounded, inputs);
3. otherwise ``wrong``. The first ``wrong`` step is diagnosed (:mod:`.diagnosis`); a mistake the
   diagnosis places in an unwritten step or in a copied number is then carried in the student's
   chain and the later steps are marked again, so a step computed correctly from the student's own
   numbers is ``follows`` — a mistake is penalised once;
4. ``missing`` when not given.

``FLOAT_SLACK`` (1e-9) is added to every comparison for binary floating point.

:class:`Marking` exposes, per step, the band used for the verdict (:meth:`Marking.band_used`) and
the entry that decided it (:meth:`Marking.decisive`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .band import C_BAND, sample_chain
from .steps import DH_KEY, H0_KEY, Key, Step, build_steps, evaluate

__all__ = ["C_BAND", "FLOAT_SLACK", "Marking", "mark_worksheet", "unit", "band_of"]

FLOAT_SLACK = 1e-9


def unit(decimals: int) -> float:
    """Half a unit in the last place of an answer rounded to ``decimals`` places."""
    return 0.5 * 10.0 ** (-decimals)


def band_of(steps: list[Step], inputs: dict, decimals: int, reference: dict, fixed: dict | None = None,
            upto: Key | None = None) -> dict:
    """u + C_BAND · σ per entry of every step (up to ``upto``): see the module docstring."""
    u = unit(decimals)
    return {k: u + C_BAND * s for k, s in sample_chain(steps, inputs, decimals, reference, fixed, upto=upto).items()}


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


def _within(given: np.ndarray, ref: np.ndarray, tol: np.ndarray, mask: np.ndarray) -> bool:
    with np.errstate(invalid="ignore"):
        ok = np.abs(given - ref) <= tol + FLOAT_SLACK
    return bool(np.all(ok[mask]))


def _student_chain(ws, steps, inputs):
    own: dict = {}

    def student(key, value):
        own[key] = value
        a = ws.answers.get(key)
        return value if a is None else np.where(a.mask, a.value, value)

    return evaluate(steps, inputs, student), own


def _inputs(ws) -> dict:
    inputs = {H0_KEY: ws.H0}
    if ws.backward:
        inputs[DH_KEY] = ws.dH
    return inputs


def _verdicts(m: Marking, forced: dict) -> None:
    """Rules 1–4 for every step; ``forced``: {key: verdict} kept as they are (a diagnosed first mistake)."""
    ws = m.worksheet
    unsound: set[Key] = set(m.hidden)   # steps built on an answer that was not correct, or on a carried mistake
    m.verdict.clear()
    m.reference.clear()
    for s in m.steps:
        a = ws.answers.get(s.key)
        if any(k in unsound for k in s.inputs):
            unsound.add(s.key)
        if a is None:
            m.verdict[s.key], m.error[s.key] = "missing", None
            continue
        m.error[s.key] = float(np.max(np.abs(a.value - m.truth[s.key])[a.mask]))
        if s.key in forced:
            m.verdict[s.key], m.reference[s.key] = forced[s.key], "own"
        elif _within(a.value, m.truth[s.key], m.tol[s.key], a.mask):
            m.verdict[s.key], m.reference[s.key] = "correct", "truth"
        elif _within(a.value, m.own[s.key], m.own_tol[s.key], a.mask):
            m.verdict[s.key] = "follows" if s.key in unsound else "correct"
            m.reference[s.key] = "own"
        else:
            m.verdict[s.key], m.reference[s.key] = "wrong", "own"
        if m.verdict[s.key] != "correct":
            unsound.add(s.key)


def _own_pass(m: Marking, steps: list[Step], inputs: dict) -> None:
    ws = m.worksheet
    m.chain, m.own = _student_chain(ws, steps, inputs)
    m.own_tol = band_of(steps, inputs, ws.decimals, m.own, fixed=ws.answers) if ws.answers else m.tol


MAX_ROUNDS = 4     # mistakes carried into the student's chain before the rest is marked as it stands


def mark_worksheet(ws) -> Marking:
    """Compute every step of ``ws`` (a :class:`~.format.Worksheet`) and mark its answers."""
    from .diagnosis import diagnose, student_version  # diagnosis imports this module

    steps = build_steps(ws)
    inputs = _inputs(ws)
    truth = evaluate(steps, inputs)
    tol = band_of(steps, inputs, ws.decimals, truth)
    m = Marking(ws, steps, truth, tol, {}, {}, tol, {}, {}, unit(ws.decimals))
    all_correct = True
    for a_key, a in ws.answers.items():
        if not _within(a.value, truth[a_key], tol[a_key], a.mask):
            all_correct = False
            break
    if all_correct:                    # nothing to follow through: the student's chain is the truth's
        m.chain, m.own, m.own_tol = dict(truth), dict(truth), tol
        _verdicts(m, {})
        return m
    _own_pass(m, steps, inputs)
    _verdicts(m, {})
    forced: dict = {}
    for _ in range(MAX_ROUNDS):
        first = next((s for s in steps if m.verdict[s.key] == "wrong" and s.key not in forced), None)
        if first is None:
            break
        d = diagnose(m, first)
        m.diagnoses[first.key] = d
        forced[first.key] = "wrong"
        m.saved[first.key] = (m.own[first.key], m.own_tol[first.key])
        version = student_version(m, d)
        if version is None:
            continue
        m.student_steps, m.student_inputs, hidden = version
        m.hidden |= hidden
        _own_pass(m, m.student_steps, m.student_inputs)
        _verdicts(m, forced)
    return m
