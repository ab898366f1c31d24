r"""Marking: the tolerance rule, follow-through, and the verdict of every step.

Tolerance. Answers are rounded to ``decimals`` = D places, so a correct answer may be off by half a
unit in the last place, u = ½·10^(−D) — and by whatever the rounding of its *inputs* did to it: a
student who works from rounded intermediate values carries their error forward. The tolerance of
a step y = f(x_1, …, x_k) is therefore

    tol(y) = u + Σ_j  max( |f(x + tol_j e_j) − f(x)|, |f(x) − f(x − tol_j e_j)| )

over every input entry j (each moved alone by its own tolerance, up and down), starting from
tol = 0 for the exact data (H0, dH and the weights, which the sheet gives exactly). For a smooth
step this is u + Σ_j |∂y/∂x_j| tol_j to first order — "half a unit in the last place plus the
propagated rounding"; at a kink (ReLU at 0) it takes the larger one-sided change, so a value next
to the kink is not refused for landing on the other side. (``1e-9`` is added for binary floating
point.)

Verdicts, for each quantity the student gave (only the entries given — a table keyed by token
gives some rows):

* ``correct`` — within the tolerance of the true value;
* ``follows`` — not correct, but within the tolerance of the value recomputed from the student's
  *own* earlier answers (their given entries replace the true ones, step by step, and unwritten
  steps are recomputed from them). Here a given input counts as exact up to u (the student may have
  carried more digits than written) and an unwritten one carries its tolerance. An early slip is
  thus marked once, as an examiner would, and not again on every later line built on it;
* ``wrong`` — neither; the first ``wrong`` step gets a diagnosis (:mod:`.diagnosis`);
* ``missing`` — not given.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .steps import DH_KEY, H0_KEY, Key, Step, build_steps, evaluate

__all__ = ["unit", "propagated", "tolerances", "Marking", "mark_worksheet", "FLOAT_SLACK"]

FLOAT_SLACK = 1e-9


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


def tolerances(steps: list[Step], values: dict, u: float) -> dict[Key, np.ndarray]:
    """tol of every step at ``values`` (the truth): the module docstring's rule."""
    tol: dict[Key, np.ndarray] = {}
    for s in steps:
        args = [values[k] for k in s.inputs]
        errs = [tol.get(k) for k in s.inputs]
        tol[s.key] = u + propagated(s.fn, args, errs, s.local)
    return tol


@dataclass
class Marking:
    """Everything the verdicts were computed from (arrays keyed by step key)."""

    worksheet: object
    steps: list[Step]
    truth: dict            # the correct value of every step
    tol: dict              # its tolerance
    chain: dict            # the student's chain: given entries, unwritten ones recomputed from them
    own: dict              # each step recomputed from the chain's inputs (what "follows" compares with)
    follow_tol: dict       # tolerance of that comparison (steps that needed it)
    verdict: dict          # key -> verdict
    error: dict            # key -> max |given − truth| over the given entries (None when missing)
    u: float

    def given(self, key):
        return self.worksheet.answers.get(key)

    def input_errors(self, step: Step, at_chain: bool = True) -> list:
        """The error each input of ``step`` may carry in the follow-through comparison."""
        out = []
        for k in step.inputs:
            if k in (H0_KEY, DH_KEY):
                out.append(None)
                continue
            a = self.given(k)
            out.append(np.where(a.mask, self.u, self.tol[k]) if (a is not None and at_chain) else self.tol[k])
        return out

    def follow_tolerance(self, step: Step) -> np.ndarray:
        if step.key not in self.follow_tol:
            args = [self.chain[k] for k in step.inputs]
            self.follow_tol[step.key] = self.u + propagated(step.fn, args, self.input_errors(step), step.local)
        return self.follow_tol[step.key]


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
    u = 0.5 * 10.0 ** (-ws.decimals)
    tol = tolerances(steps, truth, u)
    own: dict = {}

    def student(key, value):
        own[key] = value
        a = ws.answers.get(key)
        return value if a is None else np.where(a.mask, a.value, value)

    chain = evaluate(steps, inputs, student)
    m = Marking(ws, steps, truth, tol, chain, own, {}, {}, {}, u)
    for s in steps:
        a = ws.answers.get(s.key)
        if a is None:
            m.verdict[s.key], m.error[s.key] = "missing", None
            continue
        m.error[s.key] = float(np.max(np.abs(a.value - truth[s.key])[a.mask]))
        if _within(a.value, truth[s.key], tol[s.key], a.mask):
            m.verdict[s.key] = "correct"
        elif _within(a.value, own[s.key], m.follow_tolerance(s), a.mask):
            m.verdict[s.key] = "follows"
        else:
            m.verdict[s.key] = "wrong"
    return m
