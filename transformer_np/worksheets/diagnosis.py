r"""Diagnosis of the first ``wrong`` step: which common mistake reproduces the student's numbers?

The step is recomputed from the student's own earlier answers (the follow-through chain) once per
candidate mistake, and a candidate *reproduces* the numbers when every given entry is within the
step's follow-through tolerance (:mod:`.marking`) of the recomputed value. Candidates:

* each mistake attached to the step itself (``missing_scale``, ``wrong_scale`` and
  ``transposed_scores`` at the scores, ``softmax_axis`` at the attention weights,
  ``sample_variance`` at a LayerNorm variance, ``ln_before_residual`` / ``ln_after_residual`` /
  ``no_residual`` at a residual sum, a LayerNorm output or — Post-LN, the statistics of the sublayer
  output alone — its mean and variance, ``wrong_activation`` and ``activation_derivative`` at the
  activation's derivative, ``softmax_jacobian`` at ``d_scores``, ``ln_stats_constant`` at a LayerNorm
  backward, ``missing_bias`` and ``transposed_weight`` at a linear layer and its input gradient; the
  scale and residual mistakes also in the backward; see :mod:`.mistakes`);
* ``early_rounding``: the step's inputs rounded to k < ``decimals`` places first (k = D−1 … 0);
* the mistakes of an earlier step the student did *not* write down, carried through the unwritten
  steps in between (a student who skips ``scores`` and forgets the scale is still caught at
  ``attention_weights``, and the explanation names ``scores``).

The closest candidate (smallest error relative to the band) wins. Where two readings give the same
numbers (the statistics of the sublayer output alone: ``no_residual`` or ``ln_before_residual``), the
LayerNorm output the student wrote decides. If none reproduces the numbers, a number of the sheet
copied wrongly is tried (``miscopied_input``, :mod:`.miscopy`); otherwise the diagnosis is
``arithmetic``. Every diagnosis comes with an explanation in plain words that quotes the student's
numbers and the right ones.

A diagnosis may carry a ``_version`` (private): how the mistake runs on in the student's chain — an
unwritten step computed the mistaken way, a miscopied H0 / dH / weight. :func:`student_version` turns
it into the steps and inputs the marker then follows through (:mod:`.marking`), so that later steps
built on the mistake are ``follows``, not ``wrong`` again.
"""

from __future__ import annotations

import numpy as np

from .miscopy import find_miscopy, param_version
from .names import DIAGNOSES
from .record import Marking, _fmt, _recompute, _row, _score, _steps, _unwritten_ancestors, _vec, _worst
from .steps import DH_KEY, H0_KEY, Step

__all__ = ["diagnose", "round_half_away"]


def round_half_away(x: np.ndarray, k: int) -> np.ndarray:
    """Round to ``k`` places, halves away from zero (as by hand; NumPy rounds halves to even)."""
    f = 10.0 ** k
    return np.sign(x) * np.floor(np.abs(x) * f + 0.5) / f


def _inputs(m: Marking) -> dict:
    if m.student_inputs is not None:
        return m.student_inputs
    out = {H0_KEY: m.worksheet.H0}
    if m.worksheet.backward:
        out[DH_KEY] = m.worksheet.dH
    return out


def _carry(m: Marking, steps: list[Step], target: Step, value: np.ndarray, last: Step) -> np.ndarray:
    """``target`` replaced by ``value``, the steps after it recomputed up to ``last`` (given entries kept)."""
    i = next(j for j, s in enumerate(steps) if s.key == target.key)
    return _recompute(m, steps[i + 1:], {target.key: value}, last)


def _candidates(m: Marking, step: Step):
    """(code, detail, at_step, recomputed value, version) for every candidate mistake; ``version`` says how
    to carry the mistake in the student's chain ({"replace": {key: Step}}), None when nothing needs carrying
    (the mistake is in the step the student wrote)."""
    steps, ws = _steps(m), m.worksheet
    args = [m.chain[k] for k in step.inputs]
    with np.errstate(all="ignore"):
        by_key = {s.key: s for s in steps}
        for mis in step.mistakes:
            version = None
            if mis.carry:
                version = {"replace": {k: _replaced(by_key[k], mm) for k, mm in mis.carry},
                           "confirm": by_key.get(mis.confirm)}
            yield mis.code, mis.detail, step, mis.fn(*(m.chain[k] for k in mis.inputs)), version
        for k in range(ws.decimals - 1, -1, -1):
            rounded = [a if key in (H0_KEY, DH_KEY) else round_half_away(a, k) for key, a in zip(step.inputs, args)]
            if any(not np.array_equal(r, a) for r, a in zip(rounded, args)):
                what = f"what this step gives from its inputs rounded to {k} decimal{'s' if k != 1 else ''}"
                yield "early_rounding", what, step, step.fn(*rounded), None
        for up in _unwritten_ancestors(m, step):
            for mis in up.mistakes:
                v = mis.fn(*(m.chain[k] for k in mis.inputs))
                yield (mis.code, mis.detail, up, _carry(m, steps, up, v, step),
                       {"replace": {up.key: _replaced(up, mis)}})


def _replaced(step: Step, mis) -> Step:
    """``step`` computed with mistake ``mis`` instead (its hand formula: the mistake per sample)."""
    def hand(rd, *a, fn=mis.fn):
        return np.stack([fn(*x) for x in zip(*a)])
    return Step(step.key, mis.inputs, mis.fn, f"{step.formula} [{mis.code}]", [], step.local, hand)


def diagnose(m: Marking, step: Step) -> dict:
    """``{"diagnosis", "explanation", "at"}`` for the wrong step ``step`` (``at``: the step the mistake
    was made in, which is ``step`` itself unless it was an unwritten earlier one, or the input key of a
    miscopied number)."""
    if step.key in m.diagnoses:
        return m.diagnoses[step.key]
    if step.key in m.trivial:
        return {"diagnosis": "trivialised", "at": step.key,
                "explanation": f"Your {step.name} follows from your own earlier numbers, but they leave nothing to "
                               f"work out here: {m.trivial[step.key]}, and with the correct numbers it is not so. "
                               f"Follow-through earns marks only where the earlier error does not make the later "
                               f"work easier."}
    found = []
    for code, detail, at, value, version in _candidates(m, step):
        score = _score(m, step, value)
        if score <= 1.0:
            found.append((score, code, detail, at, value, version))
    found = _prefer(m, step, found)
    if not found:
        copy = find_miscopy(m, step)
        if copy is not None:
            return copy
        return {"diagnosis": "arithmetic", "explanation": _arithmetic(m, step), "at": step.key}
    _, code, detail, at, value, version = min(found, key=lambda f: f[0])
    return {"diagnosis": code, "explanation": _explain(m, step, code, detail, at, value), "at": at.key,
            "_version": version}


def _prefer(m: Marking, step: Step, found: list) -> list:
    """Where two readings give the same numbers at this step, the later written work decides: LayerNorm
    statistics of the sublayer output alone are ``no_residual`` (LN(f)) or ``ln_before_residual``
    (x + LN(f)) — the LayerNorm output the student wrote tells which."""
    codes = {f[1] for f in found}
    if not {"no_residual", "ln_before_residual"} <= codes:
        return found
    choice = _ln_lookahead(m, step, [f for f in found if f[1] == "ln_before_residual"])
    return [f for f in found if f[1] != ("no_residual" if choice == "ln_before_residual" else "ln_before_residual")]


def _ln_lookahead(m: Marking, step: Step, ln_found: list) -> str:
    """``ln_before_residual`` if the student's LayerNorm output (when written) follows that reading, else
    ``no_residual``."""
    for f in ln_found:
        version = f[5]
        out = (version or {}).get("confirm")
        if out is None:
            continue
        a = m.given(out.key)
        if a is None:
            continue
        steps = _steps(m)
        v = _recompute(m, steps, {}, out, version["replace"])
        if _score(m, out, v) <= 1.0:
            return "ln_before_residual"
    return "no_residual"


def student_version(m: Marking, d: dict):
    """(steps, inputs, keys) of the student's chain with the diagnosed mistake carried in it, or None when the
    mistake is in the written step itself (nothing to carry)."""
    version = d.get("_version")
    if not version:
        return None
    base, hidden = _steps(m), set()
    if "param" in version:
        base, hidden = param_version(m, base, *version["param"])
    steps = [version.get("replace", {}).get(s.key, s) for s in base]
    inputs = dict(_inputs(m))
    inputs.update(version.get("inputs", {}))
    hidden |= set(version.get("replace", {})) | set(version.get("hidden", ()))
    return steps, inputs, hidden


# ----------------------------------------------------------------------------- explanations
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
        "early_rounding": "The numbers follow if the inputs of this step are rounded to fewer decimals than the "
                          f"sheet's {dec}; round intermediate results to {dec} decimals (or keep more), not fewer.",
        "softmax_jacobian": "The softmax's Jacobian is incomplete: dS = A * (dA - rowsum(dA * A)); every score of "
                            "a row moves every weight of that row, so the row sum must be subtracted.",
        "ln_stats_constant": "The LayerNorm backward treats the mean and the variance as constants, but both "
                             "depend on the input: dx = (g - mean(g) - xhat * mean(g * xhat)) / sqrt(var + eps) "
                             "with g = gamma * dy.",
        "activation_derivative": f"The derivative of the activation {m.worksheet.activation!r} is wrong"
                                 + (": GELU'(z) = Phi(z) + z phi(z)." if m.worksheet.activation == "gelu" else "."),
        "missing_bias": "The bias was not added: a linear layer is x W + b.",
        "transposed_weight": ("The weight matrix is used the wrong way round: the backward of x W is dy W^T."
                              if grad else "The weight matrix is transposed: the layer computes x W (row-vector "
                              "weights, W of shape (d_in, d_out)), not x W^T."),
    }[code]
    text = f"{head} At {label} of {step.name} you wrote {_vec(yours, dec)}, which is {detail}"
    if at is not step:
        text += (f" (the slip is in {at.name} of layer {at.layer}, which you did not write down, and carries on "
                 f"from there)")
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
