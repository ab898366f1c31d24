r"""Feedback for the course exercises: a student's forward and backward, checked against the library.

Each assignment in ``exercises/`` (otter-grader notebooks; ``scripts/build_exercises.sh`` makes the
student versions and autograders) asks for one op in the library's style, ``x_forward(...) ->
(out, cache)`` and ``x_backward(dout, cache)``. Its test cells call

    check_forward("softmax", softmax_forward)
    check_backward("softmax", softmax_forward, softmax_backward)

Both return ``None`` when every check passes — silence means correct, so an otter test cell has no
expected output — and otherwise a :class:`Feedback`, whose text (its ``repr``) says which output is
wrong and how, and whose ``codes`` name each problem for programs. Nothing the student's code does
escapes as an exception: a ``NotImplementedError``, an unfilled body (``...`` returns None), a
crash (a ``KeyboardInterrupt`` or ``SystemExit`` too), a wrong return type or shape all become
feedback. What the student's functions print is captured, not shown (a failed check says how much),
and the checks' own arithmetic ignores the notebook's ``np.seterr`` and warnings filters
(:mod:`.calling`).

These checks run in the student's own Python process (the notebook's kernel, or otter's): they are
the student's feedback loop and the formative score, and code in the notebook can change what they
see. They do not try to refuse calls into the library. The grade of record is ``transformer-np grade``,
which runs the student's cells in a separate process where this library (and any framework) cannot be
imported, and calls the student's functions from the grader through proxies; it reuses
:func:`run_forward` and :func:`run_backward` on those proxies, so both give the same verdicts on honest
work.

How a forward is checked, case by case (simplest first; the first failing case is reported):

1. call it on copies of the inputs; an exception becomes ``not_implemented`` or ``exception`` (its
   type, message and the line of the student's code that raised or called into the raise);
2. the result must be ``(out, cache)`` with ``out`` an array (``returned_none``, ``not_tuple``);
   the inputs must be unchanged (``mutated_input``);
3. ``out`` must have the library's shape (``shape``: transposed, an extra axis, the shape of an
   input or of an intermediate such as the attention weights) and be finite (``nonfinite``);
4. its values must agree with the library's op to a relative error of ``TOLERANCE``
   (``rel_error`` of :mod:`transformer_np.model.gradcheck`). Values computed in float32 (a float32 or
   float16 result, or float64 holding float32-rounded numbers, that agrees with the op to that
   precision) are ``float32``. Otherwise the diagnosis is found by
   recomputing the op with each *known mistake* of that exercise (missing 1/√d_k, softmax over the
   wrong axis, sample variance, tanh-GELU, Pre-LN wiring, …) and keeping the one that reproduces the
   student's numbers (to ``MATCH``); failing that, by generic relations — a constant factor (named
   when it is √d_k, 1/d_k, …), the opposite sign, the transpose, a near miss; failing that, where
   the largest error is.

Hints before answers: every diagnosis is in words (which term, axis or shape); the corrected formula
or code (a mistake's ``fix``, the op's equation) is shown only at the ``instructor`` level
(``TRANSFORMER_NP_FEEDBACK=instructor``) and is always in ``Feedback.instructor_text``.

A backward, when the forward passes: on each case it gets a random upstream gradient; the return
value must have the documented structure (``wrong_count``, ``missing_gradient``,
``unexpected_gradient``, …); every gradient is compared with the library's backward at
``BACKWARD_TOLERANCE`` — the backward must be analytic: one that is close but not that close (within
``TOLERANCE``), as a finite-difference backward is, gets ``not_analytic`` — and diagnosed as above
(known mistakes: the diagonal-only softmax Jacobian, LayerNorm's missing mean terms, a skipped
residual path, …; generic: scale, sign, transposition, another gradient's values
``swapped_gradients``). A backward that evaluates a function of the notebook at complex inputs (a
complex-step derivative, exact to rounding) is ``not_analytic`` too. When a gradient is wrong, the
finite-difference gradient check of :func:`transformer_np.model.gradcheck.check_op` runs the student's
backward against central differences of the student's *own* forward and says whether they agree
(``gradcheck``); a backward that agrees with the library on every case is not checked again (central
differences could only confirm it). When the forward is wrong but recognisably
the op (a named slip, or within ``FOLLOW_LIMIT`` of it), the backward is checked against central
differences of that forward on every case instead (at the gradient check's tolerance) — error carried
forward — and a forward that is not the op at all gives ``forward_first``. A forward that returns
NaN/inf on some cases only is followed on the others (the skipped cases are named); one that is wrong in any
way on a case of values chosen to overflow a naive formula (``Case.extreme``: softmax's large scores) is
followed without every such case, whatever form its overflow takes on a given draw: an overflow costs
the forward only, on every seed. The hidden, graded checks (:mod:`.grading`) run all this on
more cases drawn at grading time.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InputValueError
from ..model.gradcheck import FD_STEP, CheckResult, check_op, rel_error
from ..model.gradcheck import TOLERANCE as GRADCHECK_TOLERANCE
from .calling import (
    STUDENT_EXCEPTIONS,
    _as_array,
    _call,
    _call_backward,
    _out_and_cache,
    _student_call,
    _unpack,
    student_type,
)
from .calling import with_grader_state as _with_grader_state
from .diagnosis import (
    MATCH,
    TOLERANCE,
    _complex_step,
    _generic,
    _kind,
    _low_precision,
    _named_shapes,
    _not_analytic,
    _shape_message,
    _where,
    _where_wrong,
)
from .feedback import _MAX_LINES as _MAX_LINES  # re-exported: importable from here as before the split
from .feedback import FEEDBACK_ENV, Feedback, Problem, _Stop, feedback_level
from .feedback import _summarise as _summarise  # re-exported, as _MAX_LINES
from .specs import EXERCISES, Case, Exercise, Mistake
from .specs import copy_inputs as _copy

__all__ = ["BACKWARD_TOLERANCE", "EXERCISE_NAMES", "FEEDBACK_ENV", "FOLLOW_LIMIT", "MATCH", "TOLERANCE", "Feedback",
           "Problem", "check_backward", "check_forward", "feedback_level", "run_backward", "run_forward"]

FOLLOW_LIMIT = 0.5  # a wrong forward within this relative error of the op (or a named slip) is followed
# The backward must be analytic (issue 35, policy): where the student's forward is right, each gradient must
# agree with the library's to BACKWARD_TOLERANCE (tensor-level relative error, the floor being the op's largest
# gradient entry, as in _compare). Measured over 40 seeds of the public + hidden cases of every exercise
# (6 for the encoder layers): the solution notebooks' backwards, the library's, the honest ones of
# tests/grader/test_grading.py, softmax through its full Jacobian and LayerNorm as a staged chain rule agree to
# at most 7.1e-16; LayerNorm with var = E[x²] − E[x]² (cancellation on rows with a small spread) to 8.4e-14.
# A backward made of central differences of the student's own forward, at the step h (1e-3 … 1e-7) best for
# each check, misses by at least 8.4e-12 over a check's cases (gelu; 2.6e-11 … 4.0e-10 for the others).
# 1e-12 leaves a margin of 12x above the worst honest formulation and 8x below the best central differences.
# (A five-point stencil at its best h misses by 1.5e-13 … 2.9e-12 per check: caught for softmax, layernorm, mha
# and the layers, not for attention, gelu and ffn — a limit of any single tolerance that keeps honest work.)
BACKWARD_TOLERANCE = 1e-12
EXERCISE_NAMES = tuple(EXERCISES)


# ----------------------------------------------------------------------------- public API
def _exercise(name: str) -> Exercise:
    if not isinstance(name, str) or name not in EXERCISES:
        near = difflib.get_close_matches(str(name), EXERCISES, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise InputValueError(f"exercise must be one of {', '.join(EXERCISES)}; got {name!r}{hint}")
    return EXERCISES[name]


def check_forward(exercise: str, forward: Callable) -> Feedback | None:
    """Check a student's forward for ``exercise`` (one of :data:`EXERCISE_NAMES`) on the public cases.

    Returns None when it agrees with the library on every case, else a :class:`Feedback`.
    Raises :class:`~transformer_np.errors.InputValueError` only for an unknown exercise name.
    """
    ex = _exercise(exercise)
    return run_forward(ex, forward, ex.cases())


def check_backward(exercise: str, forward: Callable, backward: Callable) -> Feedback | None:
    """Check a student's backward for ``exercise`` on the public cases, the student's forward providing
    the cache.

    With a correct forward, every gradient is compared with the library's, then the finite-difference
    check runs the backward against the student's own forward. With a forward that is wrong but
    recognisably the op (a named slip, or within :data:`FOLLOW_LIMIT` of it), the backward is checked
    against the derivative of *that* forward instead (error carried forward): a forward slip costs
    the forward only. Returns None when all pass, else a :class:`Feedback`.
    """
    ex = _exercise(exercise)
    return run_backward(ex, forward, backward, ex.cases())


@_with_grader_state
def run_forward(ex: Exercise, forward: Callable, cases: list[Case], hidden: bool = False) -> Feedback | None:
    """:func:`check_forward` on given cases (``hidden``: the labels say so)."""
    if not callable(forward):
        return Feedback(ex.forward, f"expected your function {ex.signature}, got {_kind(forward)}",
                        [Problem(ex.forward, "not_callable", "define it with def, then run its cell")])
    for i, case in enumerate(cases):
        problems = _forward_case(ex, forward, case)
        if problems:
            return Feedback(ex.forward, _case_header(i, cases, hidden), problems, _passed_note(i, cases, hidden))
    return None


_STRUCTURAL = {"not_implemented", "exception", "returned_none", "not_tuple", "wrong_count", "missing_gradient",
               "unexpected_gradient", "not_array", "shape", "not_callable", "mutated_input",
               "nonfinite"}


@_with_grader_state
def run_backward(ex: Exercise, forward: Callable, backward: Callable, cases: list[Case],
                 hidden: bool = False) -> Feedback | None:
    """:func:`check_backward` on given cases."""
    if not callable(backward):
        return Feedback(ex.backward, f"expected your function {ex.backward_signature}, got {_kind(backward)}",
                        [Problem(ex.backward, "not_callable", "define it with def, then run its cell")])
    fwd = run_forward(ex, forward, cases, hidden)
    notes: list[str] = []
    if fwd is not None:
        skipped = _overflowed(ex, forward, cases)
        if skipped and len(skipped) < len(cases):    # a forward that overflows costs the forward only
            kept = [c for c in cases if not any(c is s for s in skipped)]
            notes.append(_skipped_note(ex, skipped, len(kept)))
            cases = kept
            fwd = run_forward(ex, forward, cases, hidden)
    low = fwd is not None and fwd.codes[:1] == ["float32"]
    if fwd is not None and not low:
        first = fwd.problems[0] if fwd.problems else Problem(ex.forward, "forward_first", fwd.header)
        if first.code in _STRUCTURAL or not _recognisable(ex, forward, cases, first):
            return Feedback(ex.backward, f"needs a {ex.forward} that computes the op (or close to it) first: its "
                            f"cache feeds the backward", [Problem(ex.forward, "forward_first", first.message)], notes)
        return _with_notes(_follow_own_forward(ex, forward, backward, cases, hidden), notes)
    gc_case = next((c for c in cases if c.gradcheck), cases[-1])
    for i, case in enumerate(cases):
        problems = _backward_case(ex, forward, backward, case, seed=i, low_forward=low)
        if problems:
            notes = _passed_note(i, cases, hidden) + notes
            if not (_STRUCTURAL | {"float32"}) & {p.code for p in problems}:
                gc = _gradcheck(ex, forward, backward, gc_case, seed=len(cases))
                if gc is not None:
                    problems.append(gc[0])
                    notes.append(gc[1])
            if low:
                notes.append(f"(your {ex.forward} computes in float32, and its cache feeds the backward: fix the "
                             f"forward first)")
            return Feedback(ex.backward, _case_header(i, cases, hidden), problems, notes)
    if low:                                # unreachable in practice: float32 gradients never pass TOLERANCE
        return Feedback(ex.backward, f"needs a {ex.forward} that computes in float64 first",
                        [Problem(ex.forward, "forward_first", fwd.problems[0].message)], notes)
    # Every gradient agrees with the op's on every case, from a forward that agrees with the op on every case:
    # central differences of that forward could only confirm it (or fail where their own stencil does, which
    # would cost honest work a mark), so they are not run (issue 43: they were ~17 of exercise 6's ~19 s).
    return None


def _with_notes(fb: Feedback | None, notes: list[str]) -> Feedback | None:
    if fb is not None:
        fb.notes.extend(notes)
    return fb


def _nonfinite_forward(ex: Exercise, forward: Callable, case: Case) -> bool:
    """Does the student's forward return NaN/inf on this case? (A forward that raises does not count: it is
    reported as such.)"""
    try:
        out, _ = _out_and_cache(ex, _call(ex, ex.forward, ex.call, forward, _copy(case.arrays), _copy(case.static)))
    except _Stop:
        return False
    return not bool(np.all(np.isfinite(out)))


def _overflowed(ex: Exercise, forward: Callable, cases: list[Case]) -> list[Case]:
    """The cases the backward is not graded on because the student's forward overflows there: every case where
    it returns NaN/inf, and — when it is wrong on any case of values chosen to overflow a naive formula
    (``Case.extreme``), whatever form the overflow takes (NaN, inf, a row of zeros, digits lost to subnormal
    numbers) — every such case. So the verdict on the backward does not depend on how a given draw of the
    hidden cases makes the forward overflow."""
    extreme = any(_forward_case(ex, forward, c) for c in cases if c.extreme)
    return [c for c in cases if (c.extreme and extreme) or _nonfinite_forward(ex, forward, c)]


def _skipped_note(ex: Exercise, skipped: list[Case], kept: int) -> str:
    labels = "; ".join(f'"{c.label}"' for c in skipped)
    extreme = " or is wrong on values chosen to overflow a naive formula" if any(c.extreme for c in skipped) else ""
    return (f"(the backward is checked on the {kept} case{'s' if kept != 1 else ''} where your {ex.forward} does "
            f"not overflow; skipped, because your {ex.forward} gives NaN/inf there{extreme} (that costs the forward "
            f"only): {labels})")


def _recognisable(ex: Exercise, forward: Callable, cases: list[Case], problem: Problem) -> bool:
    """Is a wrong forward still recognisably the op, so that its backward can be followed? A named slip
    (a known mistake, a constant factor, the sign, a transpose, a near miss) is; so is any forward within
    ``FOLLOW_LIMIT`` relative error of the op on every case. A forward unrelated to the op (zeros, the
    identity) is not: there would be nothing of the exercise left to differentiate."""
    if problem.code != "wrong_values":
        return True
    for case in cases:
        try:
            out, _ = _out_and_cache(ex, _call(ex, ex.forward, ex.call, forward, _copy(case.arrays), _copy(case.static)))
        except _Stop:
            return False
        want, _ = ex.reference(_copy(case.arrays), _copy(case.static))
        if out.shape != want.shape or not np.all(np.isfinite(out)) or rel_error(out, want) > FOLLOW_LIMIT:
            return False
    return True


def _follow_own_forward(ex: Exercise, forward: Callable, backward: Callable, cases: list[Case],
                        hidden: bool) -> Feedback | None:
    """The forward is wrong: the backward must be the derivative of the student's own forward (finite
    differences on every case), or the library's gradients on the same inputs."""
    for i, case in enumerate(cases):
        problems = _backward_case(ex, forward, backward, case, seed=i, compare=False)
        if problems:
            return Feedback(ex.backward, _case_header(i, cases, hidden), problems, _passed_note(i, cases, hidden))
        if _matches_library(ex, forward, backward, case, seed=i):
            continue
        gc = _gradcheck(ex, forward, backward, case, seed=len(cases) + i)
        if gc is not None:
            return Feedback(ex.backward, _case_header(i, cases, hidden) + f" (your {ex.forward} is not the op, so "
                            f"your backward is checked against the derivative of your own forward)", [gc[0]],
                            _passed_note(i, cases, hidden))
    return None


def _matches_library(ex: Exercise, forward: Callable, backward: Callable, case: Case, seed: int) -> bool:
    """The student's backward (fed by the student's forward) gives the library's gradients."""
    try:
        out, cache = _out_and_cache(ex, _call(ex, ex.forward, ex.call, forward, _copy(case.arrays),
                                              _copy(case.static)))
        dout = np.random.default_rng(100 + seed).standard_normal(out.shape)
        grads = _unpack(ex, _call(ex, ex.backward, backward, dout.copy(), cache), ex.grad_order(case))
        _, ref_cache = ex.reference(_copy(case.arrays), _copy(case.static))
        want = ex.reference_backward(dout.copy(), ref_cache)
        return all(np.shape(grads[k]) == want[k].shape
                   and rel_error(_as_array(k, grads[k]), want[k], eps=_scale(want)) <= TOLERANCE for k in want)
    except _Stop:
        return False


def _scale(grads: dict) -> float:
    """The largest entry of any expected gradient: the error floor of the gradient comparisons."""
    return max([float(np.max(np.abs(g))) for g in grads.values() if np.size(g)] + [1e-12])


def _case_header(i: int, cases: list[Case], hidden: bool = False) -> str:
    kind = "hidden case" if hidden else "case"
    return f"fails on {kind} {i + 1} of {len(cases)} — {cases[i].label}"


def _passed_note(i: int, cases: list[Case], hidden: bool = False) -> list[str]:
    if i == 0:
        return []
    return [f"(case{'s' if i > 1 else ''} 1{f'–{i}' if i > 1 else ''} passed: "
            + "; ".join(c.label for c in cases[:i]) + ")"]


# ----------------------------------------------------------------------------- the forward
def _forward_case(ex: Exercise, forward: Callable, case: Case) -> list[Problem]:
    arrays, static = _copy(case.arrays), _copy(case.static)
    try:
        out, _ = _out_and_cache(ex, _call(ex, ex.forward, ex.call, forward, arrays, static))
        changed = [k for k in case.arrays if not np.array_equal(arrays[k], case.arrays[k])]
        if changed:
            raise _Stop(Problem(ex.forward, "mutated_input",
                                f"changed its input {', '.join(changed)} in place (e.g. `x -= …`); "
                                f"work on new arrays — the caller (and the backward) still need the input"))
        want, _ = ex.reference(_copy(case.arrays), _copy(case.static))

        def rounded(dtype: np.dtype) -> np.ndarray:
            return ex.reference(_rounded_inputs(case.arrays, dtype), _copy(case.static))[0]

        problem = _compare("out", out, want, case, lambda: ex.forward_mistakes_for(case), ex.forward_hint, ex,
                           rounded=rounded)
    except _Stop as stop:
        return [stop.problem]
    return [] if problem is None else [problem]


def _rounded_inputs(arrays: dict[str, np.ndarray], dtype: np.dtype) -> dict[str, np.ndarray]:
    """The inputs rounded to ``dtype`` (and back to float64): the float32 reference is the op on these."""
    return {k: np.asarray(v).astype(dtype).astype(np.float64) for k, v in arrays.items()}


def _compare(label: str, got: np.ndarray, want: np.ndarray, case: Case,
             mistakes: Callable[[], list[tuple[Mistake, Any]]], hint: str, ex: Exercise,
             others: dict[str, np.ndarray] | None = None, floor: float = 1e-12,
             rounded: Callable[[np.dtype], np.ndarray] | None = None, tolerance: float = TOLERANCE,
             low_forward: bool = False) -> Problem | None:
    """None when ``got`` matches ``want``; else the best explanation of the difference.

    ``mistakes()``: (mistake, wrong_output) pairs for this case, tried in order (computed only when
    ``got`` is wrong). ``hint``: the op's equation — a fix, shown to instructors only.
    ``others``: other expected gradients, to recognise swapped outputs.
    ``floor``: the error floor of the relative error (for gradients: the op's largest expected gradient
    entry, as in :mod:`transformer_np.model.gradcheck` — a gradient that is 0 in exact arithmetic, such as
    dL/db_K, is then judged against the op's scale rather than its own round-off).
    ``rounded(dtype)``: the expected values computed from inputs rounded to ``dtype`` (the float32 reference).
    ``tolerance``: :data:`TOLERANCE`, or :data:`BACKWARD_TOLERANCE` for a backward whose forward is right —
    then a gradient that misses it by little is ``not_analytic``.
    ``low_forward``: the student's forward computes in float32, so these values may too.
    """
    if got.shape != want.shape:
        return Problem(label, "shape", _shape_message(got.shape, want.shape, _named_shapes(ex, case, label)))
    if not np.all(np.isfinite(got)):
        bad = int(np.size(got) - np.count_nonzero(np.isfinite(got)))
        return Problem(label, "nonfinite", f"has {bad} NaN/inf entr{'y' if bad == 1 else 'ies'} "
                       f"(of {got.size}); {ex.nonfinite_hint}")
    err_floor = rel_error(got, want, eps=floor)
    if err_floor <= tolerance:
        return None
    low = _low_precision(got, want, floor, rounded, low_forward)
    if low is not None:
        return Problem(label, "float32", low)
    if tolerance < TOLERANCE and err_floor <= TOLERANCE:
        return Problem(label, "not_analytic", _not_analytic(tolerance))
    err = rel_error(got, want)
    for mistake, wrong in mistakes():
        if wrong is not None and wrong.shape == got.shape and np.all(np.isfinite(wrong)) \
                and rel_error(wrong, want) > MATCH and rel_error(got, wrong) <= MATCH:
            return Problem(label, mistake.code, mistake.message, mistake.fix or hint)
    for other, value in (others or {}).items():
        if value.shape == got.shape and rel_error(value, want) > MATCH and rel_error(got, value) <= MATCH:
            return Problem(label, "swapped_gradients", f"holds the values expected for {other} — "
                           f"the gradients are returned in the wrong order or mixed up")
    generic = _generic(got, want, case)
    if generic is not None:
        return Problem(label, generic[0], generic[1], hint)
    return Problem(label, "wrong_values", _where_wrong(got, want, err), hint)


# ----------------------------------------------------------------------------- the backward
def _backward_case(ex: Exercise, forward: Callable, backward: Callable, case: Case, seed: int,
                   compare: bool = True, low_forward: bool = False) -> list[Problem]:
    """The student's backward on one case: its structure, then (``compare``) each gradient against the
    library's at :data:`BACKWARD_TOLERANCE` (the forward is right; ``low_forward``: right to float32
    precision). Without ``compare`` only the structure, shapes and finiteness are checked."""
    arrays, static = _copy(case.arrays), _copy(case.static)
    try:
        out, cache = _out_and_cache(ex, _call(ex, ex.forward, ex.call, forward, arrays, static))
        dout = np.random.default_rng(100 + seed).standard_normal(out.shape)
        result, complex_step = _call_backward(ex, ex.backward, backward, dout.copy(), cache)
        grads = _unpack(ex, result, ex.grad_order(case))
    except _Stop as stop:
        return [stop.problem]
    if compare and complex_step:          # numerical, however exact: refused where finite differences are
        return [Problem(ex.backward, "not_analytic", _complex_step(complex_step))]
    if not compare:
        def structure(name: str, label: str, got: np.ndarray) -> Problem | None:
            if got.shape != case.arrays[name].shape:
                return Problem(label, "shape", _shape_message(got.shape, case.arrays[name].shape,
                                                              _named_shapes(ex, case, label)))
            if not np.all(np.isfinite(got)):
                return Problem(label, "nonfinite", "has NaN/inf entries")
            return None

        return _each_gradient(ex, case, grads, structure)
    _, ref_cache = ex.reference(_copy(case.arrays), _copy(case.static))
    want = ex.reference_backward(dout.copy(), ref_cache)
    computed: list = []

    def mistakes() -> list:                     # the known mistakes' gradients, computed once, if needed
        if not computed:
            computed.append(ex.backward_mistakes_for(case, dout))
        return computed[0]

    def against_reference(name: str, label: str, got: np.ndarray) -> Problem | None:
        others = {ex.grad_label(k): v for k, v in want.items() if k != name}

        def per() -> list:
            return [(m, None if wrong is None else wrong.get(name)) for m, wrong in mistakes()]

        def rounded(dtype: np.dtype) -> np.ndarray:
            _, cache = ex.reference(_rounded_inputs(case.arrays, dtype), _copy(case.static))
            return ex.reference_backward(dout.copy(), cache)[name]

        return _compare(label, got, want[name], case, per, ex.backward_hints.get(name, ex.backward_hint), ex,
                        others, floor=_scale(want), rounded=rounded, tolerance=BACKWARD_TOLERANCE,
                        low_forward=low_forward)

    return _each_gradient(ex, case, grads, against_reference)


def _each_gradient(ex: Exercise, case: Case, grads: dict, check: Callable[[str, str, np.ndarray], Problem | None]
                   ) -> list[Problem]:
    """The problems of the student's gradients, in ``ex.grad_order(case)``: one that is not an array is
    reported as such (and not checked further); an array ``got`` for the input ``name`` (shown as ``label``)
    is passed to ``check(name, label, got)``, which returns its problem or None."""
    problems = []
    for name in ex.grad_order(case):
        label = ex.grad_label(name)
        try:
            got = _as_array(label, grads[name])
        except _Stop as stop:
            problems.append(stop.problem)
            continue
        problem = check(name, label, got)
        if problem is not None:
            problems.append(problem)
    return problems


def _gradcheck(ex: Exercise, forward: Callable, backward: Callable, case: Case,
               seed: int) -> tuple[Problem, str] | None:
    """Central differences of the student's forward against the student's backward.
    None when every tensor passes; else (problem, note)."""
    arrays, static = _copy(case.arrays), _copy(case.static)

    def run(a: dict) -> tuple:
        out, cache = _student_call(ex.call, forward, a, static)
        return np.asarray(out, dtype=np.float64), cache

    def back(R: np.ndarray, cache: Any) -> dict:
        grads = _unpack(ex, _student_call(backward, R.copy(), cache), ex.grad_order(case))
        for name, g in grads.items():
            if np.shape(g) != arrays[name].shape:
                label = ex.grad_label(name)
                raise _Stop(Problem(label, "shape", _shape_message(np.shape(g), arrays[name].shape,
                                                                   _named_shapes(ex, case, label))
                                    + f" (on case \"{case.label}\")"))
        return grads

    try:
        if ex.gradcheck_directions:
            result = _directional_check(ex.name, run, back, arrays, seed, ex.gradcheck_directions)
        else:
            result = check_op(ex.name, run, back, arrays, seed=seed)
    except _Stop as stop:
        return stop.problem, ""
    except STUDENT_EXCEPTIONS as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        return Problem("gradient check", "exception",
                       f"your functions raised {student_type(e)}{': ' + msg if msg else ''}{_where(e)} "
                       f"during the finite-difference check"), ""
    bad = {k: v for k, v in result.per_tensor.items() if not v <= GRADCHECK_TOLERANCE}
    if not bad:
        return None
    worst = ", ".join(f"{ex.grad_label(k)} {v:.1e}" for k, v in sorted(bad.items(), key=lambda kv: -kv[1])[:5])
    return (Problem("gradient check", "gradcheck",
                    f"your backward is not the derivative of your forward: relative error {worst} "
                    f"(needs ≤ {GRADCHECK_TOLERANCE:.0e}; central differences, {result.checked} "
                    f"{'random directions' if ex.gradcheck_directions else 'coordinates'})"),
            f"(finite-difference check on case \"{case.label}\")")


def _directional_check(name: str, run: Callable[[dict], tuple], back: Callable[[np.ndarray, Any], dict],
                       arrays: dict, seed: int, directions: int) -> CheckResult:
    """:func:`~transformer_np.model.gradcheck.check_op` along random directions: for each tensor x and each of
    ``directions`` random unit vectors v (x's shape, ‖v‖₂ = 1), the student's gradient g must give
    Σ g ⊙ v = d/dt Σ R ⊙ f(x + t v) at t = 0, the right side by central differences at check_op's step — the
    same error measure (relative, floored at the op's largest gradient entry) and tolerance. A unit step along
    v moves the forward as far as a coordinate step does, so the round-off and truncation errors are those of
    the coordinate check; a wrong gradient is caught whichever entries it gets wrong (v touches all of them),
    with 2 calls of the forward per direction instead of 2 per coordinate."""
    rng = np.random.default_rng(seed)
    out, cache = run(arrays)
    out = np.asarray(out, dtype=np.float64)
    R = rng.standard_normal(out.shape)
    analytic = back(R, cache)
    scale = max([float(np.max(np.abs(g))) for g in analytic.values() if np.size(g)] + [1e-12])
    per, total = {}, 0
    for key, grad in analytic.items():
        x = arrays[key]
        grad = np.asarray(grad, dtype=np.float64)
        worst = 0.0
        for _ in range(directions):
            v = rng.standard_normal(x.shape)
            v /= max(float(np.linalg.norm(v)), 1e-300)
            old = x.copy()
            x += FD_STEP * v
            plus = np.asarray(run(arrays)[0], dtype=np.float64)
            x[...] = old - FD_STEP * v
            minus = np.asarray(run(arrays)[0], dtype=np.float64)
            x[...] = old
            num = float(np.sum(R * (plus - minus))) / (2.0 * FD_STEP)
            worst = max(worst, rel_error(np.array([float(np.sum(grad * v))]), np.array([num]), eps=scale))
        per[key], total = worst, total + directions
    return CheckResult(name, max(per.values()) if per else 0.0, total, per)
