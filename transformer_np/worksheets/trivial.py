r"""Follow-through that cannot be gamed: ``trivialised``.

An examiner gives follow-through credit (``follows``) only where the earlier error does not make the later work
easier. A student who writes Q = K = V = 0 and carries on gets scores of zeros, uniform attention rows and a
context of zeros — each "right from their own numbers", and each no work at all. So a step that would be
``follows`` is ``wrong``, diagnosed ``trivialised``, when one of its inputs that rests on a mistake is, in the
student's chain, where the true value is not (beyond the band of honest rounding):

* **all zeros**;
* **constant rows** (every entry of each row equal, within the rounding of the last place — a uniform attention
  matrix, every row of a product alike);
* **the identity** (a square input equal to I);

or when the step's own-chain value is **the same for any input**: moving one of its inputs (in every entry, by
a small random amount) leaves the student's value unchanged where it moves the true one (e.g. a ReLU fed only
negative numbers, a gradient multiplied by zeros).

The limit: an earlier error that makes the later work easier in some other way — numbers that are merely
rounder, smaller or fewer — still earns follow-through; only these degenerate inputs are caught. One constant
row among others is not degenerate (issue 44): an honest slip often leaves one (a softmax down the columns, a
ReLU row of zeros), and the other rows are still real work.
"""

from __future__ import annotations

import numpy as np

from .record import FLOAT_SLACK, Marking
from .steps import Key, Step

__all__ = ["trivialised"]

_PERTURB = 1e-3       # relative size of the perturbation of the "same for any input" test


def _band(m: Marking, key: Key, shape) -> np.ndarray:
    return np.broadcast_to(np.asarray(m.tol.get(key, 0.0), dtype=float), shape)


def _degenerate(m: Marking, key: Key, x: np.ndarray, t: np.ndarray) -> str | None:
    """How the student's ``x`` of input ``key`` is degenerate where the true ``t`` is not, or None."""
    u = m.u + FLOAT_SLACK
    band = _band(m, key, np.shape(t)) + u
    name = key[1] if key[0] == 0 else f"{key[1]} (layer {key[0]})"
    if x.size and np.all(np.abs(x) <= u) and np.any(np.abs(t) > band):
        return f"your {name} is all zeros"
    if x.ndim == 2 and x.shape[1] > 1:
        flat_x = np.ptp(x, axis=1) <= 2 * u
        flat_t = np.ptp(t, axis=1) <= 2 * band.max(axis=1)
        if flat_x.all() and not flat_t.all():
            return f"every row of your {name} is constant"
    if x.ndim == 2 and x.shape[0] == x.shape[1] > 1:
        eye = np.eye(x.shape[0])
        if np.all(np.abs(x - eye) <= u) and np.any(np.abs(t - eye) > band):
            return f"your {name} is the identity"
    return None


def _insensitive(m: Marking, step: Step, own_step: Step) -> str | None:
    """The name of an input whose every small move leaves the student's value as it is but moves the true one."""
    args = [np.asarray(m.chain[k], dtype=float) for k in own_step.inputs]
    targs = [np.asarray(m.truth[k], dtype=float) for k in step.inputs]
    if [k for k in own_step.inputs] != [k for k in step.inputs]:
        return None                                    # a mistake carried in this step: its inputs differ
    rng = np.random.default_rng(7)
    with np.errstate(all="ignore"):
        own = own_step.fn(*args)
        truth = step.fn(*targs)
        for i, k in enumerate(step.inputs):
            scale = _PERTURB * (1.0 + float(np.max(np.abs(targs[i])) if targs[i].size else 0.0))
            d = rng.uniform(0.5, 1.0, size=np.shape(targs[i])) * rng.choice([-1.0, 1.0], size=np.shape(targs[i]))
            d *= scale
            moved_own = own_step.fn(*[a + d if j == i else a for j, a in enumerate(args)])
            moved_truth = step.fn(*[a + d if j == i else a for j, a in enumerate(targs)])
            tiny = 1e-9 * (1.0 + float(np.max(np.abs(own))) if np.size(own) else 1.0)
            still = np.all(np.abs(moved_own - own) <= tiny)
            moves = np.any(np.abs(moved_truth - truth) > 1e-6 * scale)
            if still and moves and np.all(np.isfinite(moved_own)):
                return k[1]
    return None


def trivialised(m: Marking, step: Step, unsound: set) -> str | None:
    """Why the student's own earlier numbers make ``step`` trivial (a sentence), or None. Only inputs that rest on
    a mistake (``unsound``) are examined for degenerate values; any input for the "same for any input" test."""
    own_step = next((s for s in (m.student_steps or m.steps) if s.key == step.key), step)
    for k in own_step.inputs:
        if k not in unsound or k not in m.truth:
            continue
        why = _degenerate(m, k, np.asarray(m.chain[k], dtype=float), np.asarray(m.truth[k], dtype=float))
        if why is not None:
            return why
    name = _insensitive(m, step, own_step)
    if name is not None:
        return f"from your numbers {step.name} comes out the same whatever {name} is"
    return None
