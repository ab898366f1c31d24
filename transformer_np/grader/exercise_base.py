r"""The building blocks of the exercises' specifications: a case, a known mistake, an exercise, and the
small NumPy helpers the mistakes are recomputed with (see :mod:`transformer_np.grader.specs`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ops.erf import erf

__all__ = ["Case", "Exercise", "Mistake", "copy_inputs"]


@dataclass(frozen=True)
class Case:
    """One input on which a student's function is checked."""

    label: str
    arrays: dict[str, np.ndarray]
    static: dict[str, Any] = field(default_factory=dict)
    dims: dict[str, int] = field(default_factory=dict)   # sizes that may explain a scale error
    gradcheck: bool = False                              # the case of the finite-difference check
    # values chosen to overflow a naive formula (softmax's large scores): a forward wrong on such a case, in any
    # way (NaN, inf, zeros, lost digits), costs the forward only — the backward is not graded on these cases
    extreme: bool = False


@dataclass(frozen=True)
class Mistake:
    """A common error, as a function that reproduces its result, and what to tell the student."""

    code: str
    message: str                       # the diagnosis in words: which term, axis or shape (what a student reads)
    compute: Callable[..., Any]
    fix: str = ""                      # the corrected formula or code: the instructor's report only


@dataclass(frozen=True)
class Exercise:
    """One assignment: a forward and a backward the student writes."""

    name: str
    forward: str
    backward: str
    signature: str
    backward_signature: str
    cases: Callable[[], list[Case]]
    call: Callable[[Callable, dict, dict], Any]
    reference: Callable[[dict, dict], tuple]
    reference_backward: Callable[[np.ndarray, Any], dict]
    returns: str                          # "array" (dx) | "tuple" (dx, dgamma, …) | "dx_grads" (dx, grads)
    grad_names: tuple[str, ...]           # "array"/"tuple": the inputs in return order; "dx_grads": backward order
    forward_hint: str
    backward_hint: str
    nonfinite_hint: str
    forward_mistakes: tuple[Mistake, ...] = ()
    backward_mistakes: tuple[Mistake, ...] = ()
    backward_hints: dict[str, str] = field(default_factory=dict)
    answers: tuple[str, ...] = ()         # the reference's expressions: never in a student's feedback
    allowed: tuple[str, ...] = ()         # library functions the notebook hands the student (dotted names)
    extra_shapes: Callable[[Case], dict] = lambda case: {}
    # 0: the finite-difference check samples up to 24 coordinates per tensor (check_op); n > 0: it checks each
    # tensor along n random unit directions instead (2n calls of the forward per tensor, whatever its size) —
    # for the encoder layers, whose 17 tensors cost ~460 calls per case coordinate by coordinate
    gradcheck_directions: int = 0

    def forward_mistakes_for(self, case: Case) -> list[tuple[Mistake, np.ndarray | None]]:
        return [(m, _attempt(m.compute, copy_inputs(case.arrays), dict(case.static)))
                for m in self.forward_mistakes]

    def backward_mistakes_for(self, case: Case, dout: np.ndarray) -> list[tuple[Mistake, dict | None]]:
        return [(m, _attempt(m.compute, copy_inputs(case.arrays), dict(case.static), dout.copy()))
                for m in self.backward_mistakes]

    def named_shapes(self, case: Case) -> dict[str, tuple]:
        return self.extra_shapes(case)

    def grad_order(self, case: Case) -> tuple[str, ...]:
        """The gradients in the order the backward computes them (so the first wrong one is the cause)."""
        return self.grad_names

    def grad_label(self, name: str) -> str:
        if self.returns == "dx_grads" and name != "x":
            return f"grads[{name!r}]"
        return "d" + name


def copy_inputs(value: Any) -> Any:
    """A deep copy of arrays (and dicts of arrays); other values as they are."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: copy_inputs(v) for k, v in value.items()}
    return value


def _attempt(fn: Callable, *args: Any) -> Any:
    """A mistake's output, or None where it cannot be formed (a shape that does not fit this case)."""
    try:
        with np.errstate(all="ignore"):
            return fn(*args)
    except (ValueError, IndexError):
        return None


def _softmax_along(x: np.ndarray, axis: int | None) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _global_sum(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))     # each row's max subtracted …
    return e / np.sum(e)                                  # … but divided by the sum of every entry


def _dx_grads(result: tuple) -> dict:
    """A library ``(dx, grads)`` as one dict {"x": dx, param: grad, …}."""
    dx, grads = result
    return {"x": dx, **grads}


def _lead(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(x.ndim - 1))


def _rows(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1, x.shape[-1])                     # (M, d)


def _phi(z: np.ndarray) -> np.ndarray:                    # φ(z), the standard normal density
    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def _Phi(z: np.ndarray) -> np.ndarray:                    # Φ(z), its CDF
    return 0.5 * (1.0 + erf(z / math.sqrt(2.0)))
