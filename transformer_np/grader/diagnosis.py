"""How a wrong output is described to a student, whatever the op: its shape against the expected one, a
constant factor named by the sizes, the sign, a transpose, a near miss, where the values go wrong; and the
line of the student's code an exception came from. Used by :mod:`transformer_np.grader.exercises`."""

from __future__ import annotations

import linecache
import os
import traceback
from typing import Any

import numpy as np

from ..model.gradcheck import rel_error
from .exercise_base import Case, Exercise

TOLERANCE = 1e-8   # agreement with the library (tensor-level relative error; float64 round-off is ~1e-15)
MATCH = 1e-6       # a diagnosis must reproduce the student's numbers to this relative error
# float32 (or float16) arithmetic: values within this many machine epsilons of the dtype (relative error) of the
# op, or of the op on inputs rounded to that dtype. Measured: the solution notebooks' forwards fed float32
# (float16) inputs miss the op on inputs so rounded by at most 23 (17) eps (LayerNorm's rows with a small spread;
# ≤ 1.1 eps for the other ops; the large-scores softmax misses the float64 op itself by 91 eps, its rounded
# inputs by 0.7); the closest known mistake, tanh-GELU, is ≥ 149 float32 eps from the op.
LOW_PRECISION_EPS = 64
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NUMPY_DIR = os.path.dirname(os.path.abspath(np.__file__))


def _kind(x: Any) -> str:
    if x is None:
        return "None"
    if isinstance(x, np.ndarray):
        return f"an array of shape {x.shape}"
    if isinstance(x, tuple):
        return f"a tuple of {len(x)}"
    return f"a {type(x).__name__}"


def _where(exc: BaseException) -> str:
    """The line of the student's code that raised, or that called into the raise — never a
    traceback into numpy or transformer_np. An exception from a grade-of-record proxy (the student's code
    ran in another process) carries that line already, formatted as here, in ``student_where``."""
    remote = getattr(exc, "student_where", None)
    if isinstance(remote, str):
        return remote
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not (os.path.abspath(f.filename).startswith(_PACKAGE_DIR)
                                     or os.path.abspath(f.filename).startswith(_NUMPY_DIR))]
    if not own:
        return ""
    f = own[-1]
    text = (f.line or linecache.getline(f.filename, f.lineno)).strip()
    inside = frames[-1] is not f
    where = f"line {f.lineno} of {f.name}" if f.name != "<module>" else f"line {f.lineno}"
    return f" — {'in a call made at' if inside else 'at'} {where}: `{text}`" if text else f" — at {where}"


def _low_precision(got: np.ndarray, want: np.ndarray, floor: float, rounded: Any = None,
                   low_forward: bool = False) -> str | None:
    """Why ``got`` misses ``want`` when it was computed in float32 (or float16), else None.

    The evidence: its dtype is float32/float16, or it is float64 holding float32-rounded values only (every
    entry exactly a float32 number), or (``low_forward``) the forward whose cache it came from computes in
    float32; and it matches the op to that precision (:data:`LOW_PRECISION_EPS`) — directly, or as the op on
    inputs rounded to that dtype (``rounded(dtype)``, the float32 reference)."""
    if got.dtype in (np.float32, np.float16):
        dtype, what = got.dtype, f"returns {got.dtype.name} values"
    elif got.dtype == np.float64 and got.size and np.array_equal(got.astype(np.float32), got):
        dtype, what = np.dtype(np.float32), "returns float64 values that are all float32 numbers (rounded to float32)"
    elif low_forward:
        dtype, what = np.dtype(np.float32), "is computed from the cache of a forward that computes in float32"
    else:
        return None
    limit = LOW_PRECISION_EPS * float(np.finfo(dtype).eps)
    err = rel_error(got, want, eps=floor)
    if err > limit and rounded is not None:
        ref = rounded(dtype)
        if ref.shape == got.shape and np.all(np.isfinite(ref)):
            err = min(err, rel_error(got, ref, eps=floor))
    if err > limit:
        return None
    return (f"computes in {dtype.name}: it {what}; they agree with the op to {dtype.name} precision (within "
            f"{LOW_PRECISION_EPS} {dtype.name} epsilons), not to float64's (≤ {TOLERANCE:.0e}). NumPy keeps "
            f"np.float64 inputs in float64 unless something converts them: look for a {dtype.name} dtype or "
            f"conversion in your code.")


def _not_analytic(tolerance: float) -> str:
    """A gradient close to the library's, but not to the precision of an analytic backward (one message for
    every such gradient, so that they are listed together)."""
    return (f"agrees with the library's gradient closely but not to {tolerance:.0e} (relative error): an analytic "
            f"backward agrees to ~1e-14 or better, a numerical one (finite differences of the forward) cannot "
            f"get that close. The backward must be derived — the chain rule through your forward's steps — not "
            f"estimated from the forward.")


def _complex_step(function: str) -> str:
    """A backward that evaluated a function of the notebook at complex inputs: a complex-step derivative."""
    return (f"evaluates {function} at complex inputs — a complex-step derivative: numerical, even though it is "
            f"exact to rounding, so it counts as finite differences do. The backward must be derived — the "
            f"chain rule through your forward's steps — not estimated from the forward.")


def _named_shapes(ex: Exercise, case: Case, label: str) -> dict[str, tuple]:
    names = {f"the input {k}": np.shape(v) for k, v in case.arrays.items()}
    names.update(ex.named_shapes(case))
    return names


def _shape_message(got: tuple, want: tuple, named: dict[str, tuple]) -> str:
    base = f"has shape {got}, expected {want}"
    if len(got) == len(want) >= 2 and got[:-2] == want[:-2] and got[-2:] == want[-1:-3:-1]:
        return f"{base}: the last two axes are swapped — a transpose too many or too few (of K, or of a weight)"
    if len(got) > len(want) and got[len(got) - len(want):] == want:
        return (f"{base}: it keeps the leading axes {got[:len(got) - len(want)]} — a parameter is shared by "
                f"every batch item and position, so sum its gradient over those axes")
    if tuple(s for s in got if s != 1) == tuple(s for s in want if s != 1):
        return f"{base}: an axis of length 1 too many or too few (a reduction that kept or dropped its axis)"
    same = [name for name, s in named.items() if tuple(s) == got]
    if same:
        return f"{base}, which is the shape of {same[0]} — did you return that instead?"
    if np.prod(got) == np.prod(want):
        return f"{base} (the same number of entries: a reshape or transpose goes wrong)"
    return base


def _factor_name(c: float, dims: dict[str, int]) -> str | None:
    for name, v in dims.items():
        for value, text in ((v, name), (np.sqrt(v), f"√{name}"), (1 / v, f"1/{name}"), (1 / np.sqrt(v), f"1/√{name}")):
            if abs(c - value) <= 1e-6 * abs(value):
                return text
    return None


def _generic(got: np.ndarray, want: np.ndarray, case: Case) -> tuple[str, str] | None:
    """Relations that explain ``got`` from ``want`` whatever the op: scale, sign, transpose, near miss."""
    ww = float(np.sum(want * want))
    if ww > 0:
        c = float(np.sum(got * want)) / ww
        if c != 0 and abs(c - 1) > MATCH and rel_error(got, c * want) <= MATCH:   # (c ≈ 1 is a near miss)
            if abs(c + 1) <= 1e-6:
                return "sign", ("has the opposite sign everywhere (yours is minus the expected values): a minus "
                                "sign too many or too few.")
            named = _factor_name(c, case.dims)
            what = f"{named} (= {c:.6g})" if named else f"{c:.6g}"
            return "scale_factor", f"is off by a constant factor: yours is the expected values times {what}."
    if got.ndim >= 2 and got.shape[-1] == got.shape[-2] and rel_error(got, np.swapaxes(want, -1, -2)) <= MATCH:
        return "transposed", "holds the transpose of the expected values (the last two axes swapped)."
    err = rel_error(got, want)
    if err < 1e-3:
        return "near_miss", (f"is close but not exact (relative error {err:.1e}, needs ≤ {TOLERANCE:.0e}): "
                             f"a small term is off — an approximation (tanh-GELU, ε in the wrong place), "
                             f"float32 arithmetic, or rounding.")
    return None


def _where_wrong(got: np.ndarray, want: np.ndarray, err: float) -> str:
    scale = float(np.max(np.abs(got) + np.abs(want)))
    wrong = np.abs(got - want) > MATCH * scale
    idx = np.unravel_index(int(np.argmax(np.abs(got - want))), got.shape)
    at = tuple(int(i) for i in idx)
    text = (f"has wrong values in {int(wrong.sum())} of {got.size} entries (relative error {err:.2g}); the "
            f"largest difference is at index {at}: yours {got[idx]:.6g}, expected {want[idx]:.6g}.")
    if got.ndim >= 2:
        rows_wrong = np.any(wrong, axis=-1)
        if 0 < rows_wrong.sum() < rows_wrong.size:
            first = tuple(int(i) for i in np.argwhere(rows_wrong)[0])
            text += f" Only {int(rows_wrong.sum())} of {rows_wrong.size} rows are wrong (the first: {first})."
    return text
