r"""Marking: the tolerance rule, follow-through, and the verdict of every step.

Rounding convention (the one the sheets state): every answer written down is rounded to
``decimals`` = D places, so it is off by at most u = ½·10^(−D), half a unit in its last place;
work that is *not* written down keeps at least one more digit, so it is off by at most u/10.

Propagated rounding. A step y = f(x_1, …, x_k) computed from inputs that carry errors e_j is off by

    P(y) = Σ_j max( |f(x + e_j) − f(x)|, |f(x) − f(x − e_j)| )

over every input entry j, each moved alone by its error, up and down (for a smooth step this is
Σ_j |∂y/∂x_j| e_j to first order; at a kink such as ReLU's it takes the larger one-sided change).
The data the sheet gives (H0, dH, the weights) is exact. A LayerNorm counts the error of its input
once, through LN as a whole, plus the rounding of the mean and variance (a shift of x moves μ with
it and cancels). The error an entry *carries* into later steps is u on the entries the student wrote
(they may have carried more digits than they wrote) and u/10 + P on unwritten work.

Verdicts, for each quantity the student gave (on the entries given — a table keyed by token gives
some rows):

1. ``correct`` if |given − true value| ≤ u + P, with P propagated from the true inputs as if none
   were written (the answer is the true value, rounded, up to the rounding of the work before it);
2. otherwise compare with the value recomputed from the student's *own* earlier answers (their
   given entries replace the true ones step by step; unwritten steps are recomputed from them):
   within u + P (P now propagated with the carried errors above) it is ``correct`` if every answer
   it depends on was correct — right work on right (if rounded) inputs — and ``follows`` if one was
   not: an early slip is marked once, as an examiner would, not again on every line built on it;
3. otherwise ``wrong`` (the first ``wrong`` step is diagnosed by :mod:`.diagnosis`);
4. ``missing`` when not given.

``FLOAT_SLACK`` (1e-9) is added to every comparison for binary floating point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .steps import DH_KEY, H0_KEY, Key, Step, build_steps, evaluate

__all__ = ["FLOAT_SLACK", "Marking", "mark_worksheet", "propagated", "step_propagated", "unit"]

FLOAT_SLACK = 1e-9
UNWRITTEN = 0.1     # unwritten work keeps one more digit: its own rounding is u / 10


def unit(decimals: int) -> float:
    """Half a unit in the last place of an answer rounded to ``decimals`` places."""
    return 0.5 * 10.0 ** (-decimals)


def _groups(x: np.ndarray, e: np.ndarray, local: str | None):
    """Masks of input entries that can be moved together without their effects overlapping."""
    live = e > 0
    if not live.any():
        return
    if local == "element":                 # output entry i reads input entry i only
        yield live
    elif local == "row":                   # output row i reads input row i only: one column at a time
        cols = live.reshape(x.shape[0], -1)
        for c in range(cols.shape[1]):
            m = np.zeros_like(cols)
            m[:, c] = cols[:, c]
            if m.any():
                yield m.reshape(x.shape)
    else:
        for j in np.flatnonzero(live):
            m = np.zeros(x.size, bool)
            m[j] = True
            yield m.reshape(x.shape)


def propagated(fn, args: list[np.ndarray], errs: list[np.ndarray | None], local: str | None = None) -> np.ndarray:
    """Σ_j max(|f(x + e_j) − f(x)|, |f(x) − f(x − e_j)|): the effect on every output entry of each
    input entry moved alone by its error ``errs`` (None = exact input)."""
    with np.errstate(all="ignore"):
        y0 = fn(*args)
        total = np.zeros(np.shape(y0))
        for i, e in enumerate(errs):
            if e is None:
                continue
            x = args[i]
            for m in _groups(x, e, local):
                worst = np.zeros_like(total)
                for sign in (1.0, -1.0):
                    xp = x.copy()
                    xp[m] += sign * e[m]
                    worst = np.maximum(worst, np.abs(fn(*args[:i], xp, *args[i + 1:]) - y0))
                total += worst
    return total


def step_propagated(step: Step, args: list, errs: list, rounding: list) -> np.ndarray:
    """P for ``step``: its own rule if it has one (LayerNorm), else :func:`propagated`. ``rounding`` is
    each input's own rounding (u written, u/10 unwritten; None exact)."""
    if step.propagate is not None:
        with np.errstate(all="ignore"):
            return step.propagate(args, errs, rounding)
    if step.multilinear:
        # f is linear in each input and every input entry meets an output entry in at most one product, so
        # moving it by e changes that output by e · |the product of the others|: with the others replaced by
        # their absolute values, f(…, e_i, …) − f(…, 0, …) sums those changes (the second call removes the
        # terms that do not contain input i).
        with np.errstate(all="ignore"):
            absd = [np.abs(a) for a in args]
            terms = [step.fn(*absd[:i], e, *absd[i + 1:]) - step.fn(*absd[:i], np.zeros_like(e), *absd[i + 1:])
                     for i, e in enumerate(errs) if e is not None]
        return sum(terms) if terms else np.zeros(np.shape(step.fn(*args)))
    if step.rowsum is not None:        # a sum over tokens: each input entry moves only its token's term
        return propagated(step.rowsum, args, errs, "row").sum(axis=0)
    return propagated(step.fn, args, errs, step.local)


def _propagate_all(steps: list[Step], values: dict, u: float, answers: dict) -> dict[Key, np.ndarray]:
    """P of every step at ``values``; entries in ``answers`` carry u, unwritten work u/10 + P."""
    P: dict[Key, np.ndarray] = {}
    carried: dict[Key, np.ndarray] = {}
    for s in steps:
        errs, rounding = [], []
        for k in s.inputs:
            if k in (H0_KEY, DH_KEY):
                errs.append(None)
                rounding.append(None)
                continue
            a = answers.get(k)
            own = np.full(np.shape(values[k]), UNWRITTEN * u)
            if a is not None:
                own = np.where(a.mask, u, own)
                errs.append(np.where(a.mask, u, carried[k]))
            else:
                errs.append(carried[k])
            rounding.append(own)
        P[s.key] = step_propagated(s, [values[k] for k in s.inputs], errs, rounding)
        carried[s.key] = UNWRITTEN * u + P[s.key]
    return P


@dataclass
class Marking:
    """Everything the verdicts were computed from (arrays keyed by step key)."""

    worksheet: object
    steps: list[Step]
    truth: dict            # the correct value of every step
    tol: dict              # u + P at the truth (verdict rule 1)
    chain: dict            # the student's chain: given entries, unwritten ones recomputed from them
    own: dict              # each step recomputed from the chain's inputs (rule 2 compares with it)
    own_tol: dict          # u + P along the chain (rule 2's tolerance)
    verdict: dict          # key -> verdict
    error: dict            # key -> max |given − truth| over the given entries (None when missing)
    u: float

    def given(self, key):
        return self.worksheet.answers.get(key)

    def follow_tolerance(self, step: Step) -> np.ndarray:
        """The tolerance of a comparison with a value recomputed from the student's own answers."""
        return self.own_tol[step.key]


def _within(given: np.ndarray, ref: np.ndarray, tol: np.ndarray, mask: np.ndarray) -> bool:
    with np.errstate(invalid="ignore"):
        ok = np.abs(given - ref) <= tol + FLOAT_SLACK
    return bool(np.all(ok[mask]))


def mark_worksheet(ws) -> Marking:
    """Compute every step of ``ws`` (a :class:`~.format.Worksheet`) and mark its answers."""
    steps = build_steps(ws)
    inputs = {H0_KEY: ws.H0}
    if ws.backward:
        inputs[DH_KEY] = ws.dH
    truth = evaluate(steps, inputs)
    u = unit(ws.decimals)
    tol = {k: u + p for k, p in _propagate_all(steps, truth, u, {}).items()}
    own: dict = {}

    def student(key, value):
        own[key] = value
        a = ws.answers.get(key)
        return value if a is None else np.where(a.mask, a.value, value)

    chain = evaluate(steps, inputs, student)
    own_tol = {k: u + p for k, p in _propagate_all(steps, chain, u, ws.answers).items()} if ws.answers else tol
    m = Marking(ws, steps, truth, tol, chain, own, own_tol, {}, {}, u)
    unsound: set[Key] = set()        # steps built on an answer that was not correct
    for s in steps:
        a = ws.answers.get(s.key)
        if any(k in unsound for k in s.inputs):
            unsound.add(s.key)
        if a is None:
            m.verdict[s.key], m.error[s.key] = "missing", None
            continue
        m.error[s.key] = float(np.max(np.abs(a.value - truth[s.key])[a.mask]))
        if _within(a.value, truth[s.key], tol[s.key], a.mask):
            m.verdict[s.key] = "correct"
        elif _within(a.value, own[s.key], own_tol[s.key], a.mask):
            m.verdict[s.key] = "follows" if s.key in unsound else "correct"
        else:
            m.verdict[s.key] = "wrong"
        if m.verdict[s.key] != "correct":
            unsound.add(s.key)
    return m
