r"""Marking: the tolerance rule, follow-through, and the verdict of every step.

Rounding convention (the one the sheets state): every answer written down is rounded to
``decimals`` = D places, so it is off by at most u = ½·10^(−D), half a unit in its last place;
work that is *not* written down keeps at least one more digit, so its own rounding is at most u/10.

Propagated rounding. For a step y = f(x_1, …, x_k) whose input entries carry errors e_j, let

    Δ_j = max( |f(x + e_j) − f(x)|, |f(x) − f(x − e_j)| )

be the effect of moving entry j alone by its error, up and down (|∂y/∂x_j| e_j to first order; at a
kink such as ReLU's the larger one-sided change). Then

    tol(y) = u + P,   P = Σ_{written j} Δ_j  +  COVERAGE · √( Σ_{unwritten j} Δ_j² )

* an entry the student wrote carries e = u (they may have carried more digits than they wrote): these
  few errors of one step are summed, the worst case;
* unwritten work carries e = u/10 + P_w + P_u (its own rounding plus what it inherited), and those
  errors, which come from many independent roundings, are combined in quadrature — summing them
  would compound the worst case step after step until, two layers on, the tolerance is as large as
  the numbers — and that total is counted ``COVERAGE`` = 2 times;
* the data the sheet gives (H0, dH, the weights) is exact; a LayerNorm counts the error of its input
  once, through LN as a whole (a shift of x moves μ with it and cancels), plus the rounding of the
  mean and variance.

The tests check both sides: simulated careful students (random errors of up to u/10 on unwritten
work, a random few steps written and rounded) are never marked wrong, and a fully written sheet has
one-step tolerances only.

Verdicts, for each quantity the student gave (on the entries given — a table keyed by token gives
some rows):

1. ``correct`` if |given − true value| ≤ tol(y), P taken at the true inputs;
2. otherwise compare with the value recomputed from the student's *own* earlier answers (their
   given entries replace the true ones step by step; unwritten steps are recomputed from them):
   within tol(y) (P taken at the student's inputs) it is ``correct`` if every answer it depends on
   was correct — right work on right (if rounded) inputs — and ``follows`` if one was not: an early
   slip is marked once, as an examiner would, not again on every line built on it;
3. otherwise ``wrong`` (the first ``wrong`` step is diagnosed by :mod:`.diagnosis`);
4. ``missing`` when not given.

``FLOAT_SLACK`` (1e-9) is added to every comparison for binary floating point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .steps import DH_KEY, H0_KEY, Key, Step, build_steps, evaluate

__all__ = ["COVERAGE", "FLOAT_SLACK", "UNWRITTEN", "Marking", "mark_worksheet", "propagated", "step_propagated", "unit"]

FLOAT_SLACK = 1e-9
UNWRITTEN = 0.1     # unwritten work keeps one more digit: its own rounding is u / 10
COVERAGE = 2.0      # the quadrature sum of unwritten work's errors is counted twice in a tolerance


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


def propagated(fn, args: list[np.ndarray], errs: list[np.ndarray | None], local: str | None = None,
               rss: bool = False) -> np.ndarray:
    """Σ_j Δ_j, Δ_j = max(|f(x + e_j) − f(x)|, |f(x) − f(x − e_j)|): the effect on every output entry of each
    input entry moved alone by its error ``errs`` (None = exact input); ``rss``: √(Σ_j Δ_j²) instead."""
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
                total += worst * worst if rss else worst
    return np.sqrt(total) if rss else total


def _multilinear(step: Step, args: list, errs: list, rss: bool) -> np.ndarray:
    """The same sums for a step c · (sum of products) in which each input entry meets each output entry in at
    most one product: moving entry j by e changes that output by e · c · |the product of the others|, so with
    the others replaced by their absolute values (their squares for ``rss``), f(…, e_i, …) − f(…, 0, …) adds
    up those changes (the second call removes the terms without input i). For squares the constant c enters
    once where c² is needed, hence the extra factor c."""
    c = step.multilinear
    with np.errstate(all="ignore"):
        base = [a * a if rss else np.abs(a) for a in args]
        total = np.zeros(np.shape(step.fn(*args)))
        for i, e in enumerate(errs):
            if e is not None:
                ei = e * e if rss else e
                total += step.fn(*base[:i], ei, *base[i + 1:]) - step.fn(*base[:i], np.zeros_like(e), *base[i + 1:])
    return np.sqrt(c * np.maximum(total, 0.0)) if rss else total


def _one_rule(step: Step, args: list, errs: list, rounding: list, rss: bool) -> np.ndarray:
    if all(e is None for e in errs) and all(r is None for r in rounding):
        return np.zeros(np.shape(step.fn(*args)))
    if step.propagate is not None:
        with np.errstate(all="ignore"):
            return step.propagate(args, errs, rounding, rss)
    if step.multilinear:
        return _multilinear(step, args, errs, rss)
    if step.rowsum is not None:        # a sum over tokens: each input entry moves only its token's term
        per_token = propagated(step.rowsum, args, errs, "row", rss)
        return np.sqrt((per_token ** 2).sum(axis=0)) if rss else per_token.sum(axis=0)
    return propagated(step.fn, args, errs, step.local, rss)


def _parts(step: Step, args: list, written: list, unwritten: list, rounding_written: list,
           rounding_unwritten: list) -> tuple[np.ndarray, np.ndarray]:
    """(P_w, P_u): the written input entries' errors summed, the unwritten ones' in quadrature."""
    p_w = _one_rule(step, args, written, rounding_written, rss=False)
    if any(e is not None for e in unwritten) or any(r is not None for r in rounding_unwritten):
        return p_w, _one_rule(step, args, unwritten, rounding_unwritten, rss=True)
    return p_w, np.zeros_like(p_w)


def step_propagated(step: Step, args: list, written: list, unwritten: list | None = None,
                    rounding_written: list | None = None, rounding_unwritten: list | None = None) -> np.ndarray:
    """P = P_w + COVERAGE · P_u for ``step``: P_w sums the effects of the written input entries' errors (worst
    case: few entries, one step); P_u combines those of unwritten work in quadrature (see the module
    docstring). Each list holds one array (or None) per input; ``rounding_*`` are the inputs' own rounding
    (the LayerNorm's rule needs the statistics' rounding apart from the error they carry)."""
    k = len(args)
    p_w, p_u = _parts(step, args, written, unwritten or [None] * k, rounding_written or [None] * k,
                      rounding_unwritten or [None] * k)
    return p_w + COVERAGE * p_u


def _propagate_all(steps: list[Step], values: dict, u: float, answers: dict) -> dict[Key, np.ndarray]:
    """P of every step at ``values``: entries in ``answers`` carry u; unwritten work carries u/10 + P_w + P_u."""
    P: dict[Key, np.ndarray] = {}
    carried: dict[Key, np.ndarray] = {}
    for s in steps:
        ew, eu, rw, ru = [], [], [], []
        for k in s.inputs:
            if k in (H0_KEY, DH_KEY):
                ew.append(None), eu.append(None), rw.append(None), ru.append(None)
                continue
            a = answers.get(k)
            if a is None:
                ew.append(None), rw.append(None)
                eu.append(carried[k])
                ru.append(np.full(np.shape(values[k]), UNWRITTEN * u))
            else:
                ew.append(np.where(a.mask, u, 0.0))
                rw.append(np.where(a.mask, u, 0.0))
                eu.append(None if a.mask.all() else np.where(a.mask, 0.0, carried[k]))
                ru.append(None if a.mask.all() else np.where(a.mask, 0.0, UNWRITTEN * u))
        p_w, p_u = _parts(s, [values[k] for k in s.inputs], ew, eu, rw, ru)
        P[s.key] = p_w + COVERAGE * p_u
        carried[s.key] = UNWRITTEN * u + p_w + p_u
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
    tol = {k: u + p for k, p in _propagate_all(steps, truth, u, ws.answers).items()}
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
