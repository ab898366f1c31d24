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
   — but not ``follows`` where the student's own earlier numbers make the step trivial (all zeros, a
   constant row, the identity, or a value that is the same for any input: :mod:`.trivial`); that is
   ``wrong``, diagnosed ``trivialised``;
3. otherwise ``wrong``. The first ``wrong`` step is diagnosed (:mod:`~transformer_np.worksheets.diagnosis`); a mistake
   the diagnosis places in an unwritten step or in a copied number is then carried in the student's chain and the
   later steps are marked again, so a step computed correctly from the student's own numbers is ``follows`` — a
   mistake is penalised once;
4. ``missing`` when not given.

``FLOAT_SLACK`` (1e-9) is added to every comparison for binary floating point.

:class:`~.record.Marking` (defined in :mod:`.record`, with ``FLOAT_SLACK``, below the diagnosis; both keep
resolving from here) exposes, per step, the band used for the verdict (:meth:`~.record.Marking.band_used`) and
the entry that decided it (:meth:`~.record.Marking.decisive`).
"""

from __future__ import annotations

import numpy as np

from .band import C_BAND, local_band, sample_chain
from .diagnosis import diagnose, student_version
from .record import FLOAT_SLACK, Marking
from .steps import DH_KEY, H0_KEY, Key, Step, build_steps, evaluate
from .trivial import trivialised

__all__ = ["C_BAND", "FLOAT_SLACK", "Marking", "mark_worksheet", "unit", "band_of"]

def unit(decimals: int) -> float:
    """Half a unit in the last place of an answer rounded to ``decimals`` places."""
    return 0.5 * 10.0 ** (-decimals)


def band_of(steps: list[Step], inputs: dict, decimals: int, reference: dict, fixed: dict | None = None,
            upto: Key | None = None) -> dict:
    """u + C_BAND · σ per entry of every step (up to ``upto``): see the module docstring."""
    u = unit(decimals)
    return {k: u + C_BAND * s for k, s in sample_chain(steps, inputs, decimals, reference, fixed, upto=upto).items()}


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
    m.trivial.clear()
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
            why = trivialised(m, s, unsound) if s.key in unsound else None
            if why is not None:                 # no follow-through where the earlier error made this step trivial
                m.verdict[s.key], m.reference[s.key], m.trivial[s.key] = "wrong", "truth", why
        else:
            m.verdict[s.key], m.reference[s.key] = "wrong", "own"
        # a slip the written inputs show (inputs that are themselves right: a step right against the truth but not
        # from a wrong written input was worked from the right value, and that mistake is penalised once)
        if m.verdict[s.key] == "correct" and s.key not in unsound and not _local_ok(m, s, a):
            m.verdict[s.key], m.reference[s.key] = "wrong", "local"
        if m.verdict[s.key] != "correct":
            unsound.add(s.key)


def _local_inputs(m: Marking, s: Step):
    """(the step as the student's chain has it, its input values, which are written) when every input of ``s`` is
    written in full or is the sheet's own data; None otherwise."""
    ws = m.worksheet
    own_step = next((t for t in (m.student_steps or m.steps) if t.key == s.key), s)
    if own_step.key in m.hidden:
        return None
    data = m.student_inputs if m.student_inputs is not None else _inputs(ws)
    values, noisy = [], []
    for k in own_step.inputs:
        a = ws.answers.get(k)
        if k in data:
            values.append(data[k])
            noisy.append(False)
        elif a is not None and a.mask.all():
            values.append(a.value)
            noisy.append(True)
        else:
            return None
    return own_step, values, noisy


def _local(m: Marking, s: Step):
    """(value, band) of step ``s`` recomputed from the inputs the student wrote — every input written in full or
    the sheet's own data — with the band of this step's rounding and its inputs' rounding alone
    (:func:`.band.local_band`); None when an input is not written in full. The step as the student's chain has
    it (a carried miscopy of a weight included)."""
    found = _local_inputs(m, s)
    if found is None:
        return None
    own_step, values, noisy = found
    if m.local_step.get(s.key) is not own_step:
        with np.errstate(all="ignore"):
            value = own_step.fn(*values)
        band = local_band(own_step, values, noisy, m.worksheet.decimals)
        m.local[s.key], m.local_tol[s.key], m.local_step[s.key] = value, band, own_step
    return m.local[s.key], m.local_tol[s.key]


def _local_ok(m: Marking, s: Step, a) -> bool:
    """Is the answer within the band of the step recomputed from the student's own written inputs (True when
    those are not all written)? An answer inside the band around the truth can still show a slip there. Within
    u of that value it is (the band is never narrower): the band is then not computed."""
    found = _local_inputs(m, s)
    if found is None:
        return True
    own_step, values, _ = found
    with np.errstate(all="ignore"):
        if _within(a.value, own_step.fn(*values), np.asarray(m.u), a.mask):
            return True
    value, band = _local(m, s)
    return _within(a.value, value, band, a.mask)


def _own_pass(m: Marking, steps: list[Step], inputs: dict) -> None:
    ws = m.worksheet
    m.chain, m.own = _student_chain(ws, steps, inputs)
    m.own_tol = band_of(steps, inputs, ws.decimals, m.own, fixed=ws.answers) if ws.answers else m.tol


MAX_ROUNDS = 4     # mistakes carried into the student's chain before the rest is marked as it stands


def mark_worksheet(ws) -> Marking:
    """Compute every step of ``ws`` (a :class:`~.format.Worksheet`) and mark its answers."""
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
        if "wrong" not in m.verdict.values():          # no slip shown by the written inputs either
            return m
    _own_pass(m, steps, inputs)
    _verdicts(m, {})
    forced: dict = {}
    for _ in range(MAX_ROUNDS):
        first = next((s for s in steps if m.verdict[s.key] == "wrong" and s.key not in forced
                      and s.key not in m.trivial), None)
        if first is None:
            break
        d = diagnose(m, first)
        m.diagnoses[first.key] = d
        forced[first.key] = "wrong"
        local = m.reference.get(first.key) == "local"
        m.saved[first.key] = (m.local[first.key], m.local_tol[first.key]) if local else \
            (m.own[first.key], m.own_tol[first.key])
        version = student_version(m, d)
        if version is None:
            continue
        m.student_steps, m.student_inputs, hidden = version
        m.hidden |= hidden
        _own_pass(m, m.student_steps, m.student_inputs)
        _verdicts(m, forced)
    return m
