r"""Diagnosis of the first ``wrong`` step: which common mistake reproduces the student's numbers?

The step is recomputed from the student's own earlier answers (the follow-through chain) once per
candidate mistake, and a candidate *reproduces* the numbers when every given entry is within the
step's follow-through tolerance (:mod:`.marking`) of the recomputed value. Candidates:

* each mistake attached to the step itself (``missing_scale``, ``wrong_scale`` and
  ``transposed_scores`` at the scores, ``softmax_axis`` at the attention weights,
  ``sample_variance`` at a LayerNorm variance, ``ln_before_residual`` / ``ln_after_residual`` /
  ``no_residual`` at a residual sum or LayerNorm output, ``wrong_activation`` at the activation and
  its derivative; the scale and residual mistakes also in the backward);
* ``early_rounding``: the step's inputs rounded to k < ``decimals`` places first (k = D−1 … 0);
* the mistakes of an earlier step the student did *not* write down, carried through the unwritten
  steps in between (a student who skips ``scores`` and forgets the scale is still caught at
  ``attention_weights``).

The closest candidate (smallest error relative to the tolerance) wins; if none reproduces the
numbers the diagnosis is ``arithmetic``. Every diagnosis comes with an explanation in plain words
that quotes the student's numbers and the right ones.
"""

from __future__ import annotations

import numpy as np

from .marking import FLOAT_SLACK, Marking
from .names import DIAGNOSES, is_per_token
from .steps import DH_KEY, H0_KEY, Step

__all__ = ["diagnose", "round_half_away"]


def round_half_away(x: np.ndarray, k: int) -> np.ndarray:
    """Round to ``k`` places, halves away from zero (as by hand; NumPy rounds halves to even)."""
    f = 10.0 ** k
    return np.sign(x) * np.floor(np.abs(x) * f + 0.5) / f


def _score(m: Marking, step: Step, value: np.ndarray) -> float:
    """max |given − value| / tolerance over the given entries (≤ 1: the value reproduces the answer)."""
    a = m.given(step.key)
    tol = m.follow_tolerance(step) + FLOAT_SLACK
    with np.errstate(all="ignore"):
        r = (np.abs(a.value - value) / tol)[a.mask]
    return float(np.max(r)) if np.all(np.isfinite(r)) else np.inf


def _carry(m: Marking, steps: list[Step], target: Step, value: np.ndarray, last: Step) -> np.ndarray:
    """``target`` replaced by ``value``, the steps after it recomputed up to ``last`` (given entries kept)."""
    vals = dict(m.chain)
    vals[target.key] = value
    changed = {target.key}
    with np.errstate(all="ignore"):
        for s in steps[steps.index(target) + 1:]:
            if not changed.intersection(s.inputs):
                continue
            v = s.fn(*(vals[k] for k in s.inputs))
            if s is last:
                return v
            a = m.given(s.key)
            vals[s.key] = v if a is None else np.where(a.mask, a.value, v)
            changed.add(s.key)
    return m.own[last.key]


def _unwritten_ancestors(m: Marking, step: Step) -> list[Step]:
    """Earlier steps the student did not write that ``step`` depends on through unwritten steps only (a
    slip above a written answer cannot reach ``step``: the written answer is used as given), nearest first."""
    by_key = {s.key: s for s in m.steps}
    seen, order, todo = set(), [], list(step.inputs)
    while todo:
        k = todo.pop(0)
        if k in seen or k not in by_key or m.given(k) is not None:
            continue
        seen.add(k)
        order.append(by_key[k])
        todo += list(by_key[k].inputs)
    return sorted(order, key=m.steps.index, reverse=True)


def _candidates(m: Marking, step: Step):
    """(code, detail, at_step, recomputed value) for every candidate mistake."""
    steps, ws = m.steps, m.worksheet
    args = [m.chain[k] for k in step.inputs]
    with np.errstate(all="ignore"):
        for mis in step.mistakes:
            yield mis.code, mis.detail, step, mis.fn(*(m.chain[k] for k in mis.inputs))
        for k in range(ws.decimals - 1, -1, -1):
            rounded = [a if key in (H0_KEY, DH_KEY) else round_half_away(a, k) for key, a in zip(step.inputs, args)]
            if any(not np.array_equal(r, a) for r, a in zip(rounded, args)):
                what = f"what this step gives from its inputs rounded to {k} decimal{'s' if k != 1 else ''}"
                yield "early_rounding", what, step, step.fn(*rounded)
        for up in _unwritten_ancestors(m, step):
            for mis in up.mistakes:
                v = mis.fn(*(m.chain[k] for k in mis.inputs))
                yield mis.code, mis.detail, up, _carry(m, steps, up, v, step)


def diagnose(m: Marking, step: Step) -> dict:
    """``{"diagnosis", "explanation", "at"}`` for the wrong step ``step`` (``at``: the step the mistake
    was made in, which is ``step`` itself unless it was an unwritten earlier one)."""
    best = None
    for code, detail, at, value in _candidates(m, step):
        score = _score(m, step, value)
        if score <= 1.0 and (best is None or score < best[0]):
            best = (score, code, detail, at, value)
    if best is None:
        return {"diagnosis": "arithmetic", "explanation": _arithmetic(m, step), "at": step.key}
    _, code, detail, at, value = best
    return {"diagnosis": code, "explanation": _explain(m, step, code, detail, at, value), "at": at.key}


# ----------------------------------------------------------------------------- explanations
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


def _explain(m: Marking, step: Step, code: str, detail: str, at: Step, value: np.ndarray) -> str:
    dec = m.worksheet.decimals
    a = m.given(step.key)
    label, i = _worst(m, step, m.own[step.key])
    yours, right = _row(step, a.value, i), _row(step, m.own[step.key], i)
    grad = at.backward
    head = {
        "missing_scale": ("The 1/sqrt(d_k) of the scores is missing from this gradient." if grad else
                          "The scores were not divided by sqrt(d_k)."),
        "wrong_scale": ("This gradient is scaled by the wrong number: the scores' scale is 1/sqrt(d_k)." if grad else
                        "The scores were divided by the wrong number: the scale is 1/sqrt(d_k), with d_k = "
                        "d_model / n_heads the width of one head."),
        "softmax_axis": "The softmax was taken over the wrong axis: each ROW (one query against every key) "
                        "must sum to 1, not each column.",
        "transposed_scores": "The score matrix is transposed: S[i, j] must be query i against key j "
                             "(Q K^T), not key i against query j.",
        "sample_variance": "The LayerNorm variance was divided by d - 1 (the sample variance); LayerNorm uses "
                           "the population variance, dividing by d.",
        "ln_before_residual": "The LayerNorm was applied before the residual was added. In Post-LN the "
                              "residual comes first and the LayerNorm normalises the sum: LN(x + Sublayer(x)).",
        "ln_after_residual": "The residual sum was normalised. In Pre-LN the LayerNorm is applied to the "
                             "sublayer's input only; the residual stream is left as x + Sublayer(LN(x)).",
        "no_residual": ("The gradient of the residual (skip) path is missing: an addition passes its gradient "
                        "to both of its inputs, so the skip path's gradient must be added." if grad else
                        "The residual (skip) connection was left out: the sublayer's input must be added back."),
        "wrong_activation": f"The feed-forward activation is not the sheet's {m.worksheet.activation!r}.",
        "early_rounding": "The numbers follow if the inputs of this step are rounded too early; keep at least "
                          f"{dec + 1} decimals in intermediate results and round only the answers you write "
                          f"down (to {dec}).",
    }[code]
    text = f"{head} At {label} of {step.name} you wrote {_vec(yours, dec)}, which is {detail}"
    if at is not step:
        text += f" (the slip is in {at.name}, which you did not write down, and carries on from there)"
    return text + f"; from your own earlier answers it should be {_vec(right, dec)}."


def _arithmetic(m: Marking, step: Step) -> str:
    dec, ws = m.worksheet.decimals, m.worksheet
    a = m.given(step.key)
    own, truth = m.own[step.key], m.truth[step.key]
    label, i = _worst(m, step, own)
    yours, right, true_row = _row(step, a.value, i), _row(step, own, i), _row(step, truth, i)
    base = step.name.split("_head")[0]
    text = "None of the common mistakes reproduces your numbers, so this is a slip in the arithmetic. "
    if base == "attention_weights" and a.mask[i[0]].all():
        s = m.chain[step.inputs[0]][i[0]]
        total = float(yours.sum())
        text += f"At {label}: softmax{_vec(s, dec)} = {_vec(right, dec)}; you wrote {_vec(yours, dec)}. "
        j, k = _worst_ratio(s, yours)
        if abs(total - 1.0) > float(m.follow_tolerance(step)[i[0]].sum()):
            text += f"Your row sums to {_fmt(total, dec)}, not 1: a softmax row always sums to 1."
        elif j != k and yours[k] > 0:
            text += (f"Your row sums to {_fmt(total, dec)}, so it is normalised, but its ratios are wrong: a softmax "
                     f"keeps a_j / a_k = e^(s_j - s_k), so {ws.tokens[j]!r} / {ws.tokens[k]!r} must be "
                     f"e^{_fmt(s[j] - s[k], dec)} = {_fmt(np.exp(s[j] - s[k]), dec)}, and yours is "
                     f"{_fmt(yours[j], dec)} / {_fmt(yours[k], dec)} = {_fmt(yours[j] / yours[k], dec)}.")
        else:
            text += f"Your row sums to {_fmt(total, dec)}, but its ratios are not those of e^(s_j - s_k)."
    elif base.endswith("_mean") and a.mask[i[0]].all():
        x = m.chain[step.inputs[0]][i[0]]
        text += (f"The mean of {label} of {step.inputs[0][1]} {_vec(x, dec)} is {_fmt(x.sum(), dec)} / {x.size} = "
                 f"{_fmt(x.mean(), dec)}; you wrote {_vec(yours, dec)}.")
    else:
        text += (f"At {label} you wrote {_vec(yours, dec)}; from your own earlier answers {step.name} = "
                 f"{step.formula} gives {_vec(right, dec)}")
        if not np.allclose(right, true_row):
            text += f" (the correct value is {_vec(true_row, dec)})"
        text += "."
    return text


def _worst_ratio(s: np.ndarray, a: np.ndarray) -> tuple[int, int]:
    """The pair (j, k) whose ratio a_j / a_k is farthest from e^(s_j − s_k) (in log terms)."""
    best, pair = -1.0, (int(np.argmax(s)), int(np.argmin(s)))
    for j in range(len(s)):
        for k in range(len(s)):
            if j != k and a[j] > 0 and a[k] > 0 and s[j] >= s[k]:
                err = abs(np.log(a[j] / a[k]) - (s[j] - s[k]))
                if err > best:
                    best, pair = err, (j, k)
    return pair


def describe_code(code: str) -> str:
    """The one-line meaning of a diagnosis code."""
    return DIAGNOSES[code]
