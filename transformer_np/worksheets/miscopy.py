r"""``miscopied_input``: the student's numbers follow if one number of the sheet was copied wrongly.

For the first ``wrong`` step, when no common mistake reproduces its numbers, each entry of the
numbers the step reads — H0, dH and the weights, directly or through steps the student did not
write — is tried in turn: the value the student must have used is found by a linear fit (the
step's response to that one entry is computed by moving it by 1), rounded to the decimals the sheet
gives that array with, and the step recomputed with it. A value that reproduces every given entry
(within the step's band) is the diagnosis: the explanation names the entry, the sheet's value and
the value the student used. At most ``MAX_ENTRIES`` entries are tried, the arrays the step reads
directly first.
"""

from __future__ import annotations

import copy

import numpy as np

from .record import Marking, _recompute, _row, _score, _steps, _unwritten_ancestors, _vec, _worst
from .steps import DH_KEY, H0_KEY, Step, build_steps

__all__ = ["find_miscopy", "MAX_ENTRIES"]

MAX_ENTRIES = 400


def _decimals(a: np.ndarray) -> int:
    """The fewest decimals (≤ 6) that write every entry of ``a`` exactly."""
    for k in range(7):
        if np.allclose(a * 10.0 ** k, np.rint(a * 10.0 ** k), rtol=0, atol=1e-6):
            return k
    return 6


def _params_of(name: str, norm: str) -> tuple[str, ...]:
    """The parameters step ``name`` reads (directly, not through its inputs)."""
    post = norm == "post"
    table = {"Q": ("W_Q", "b_Q"), "K": ("W_K", "b_K"), "V": ("W_V", "b_V"), "attention_output": ("W_O", "b_O"),
             "ffn_hidden": ("W_1", "b_1"), "ffn_output": ("W_2", "b_2"), "layer_norm": ("gamma1", "beta1"),
             "layer_norm2": ("gamma2", "beta2"), "H": ("gamma2", "beta2") if post else (),
             "d_context": ("W_O",), "d_ffn_activation": ("W_2",), "d_layer_norm2": ("W_1",),
             "d_layer_norm": ("W_1",) if post else ("W_Q", "W_K", "W_V"),
             "d_residual2": ("gamma2",) if post else (), "d_residual": ("gamma1",) if post else ("gamma2",),
             "d_H0": ("W_Q", "W_K", "W_V") if post else ("gamma1",),
             "d_H": ("W_Q", "W_K", "W_V") if post else ("gamma1",)}
    return table.get(name, ())


def _order(arr: np.ndarray, key, D: np.ndarray, per_token: bool) -> list:
    """The entries of ``arr`` to try, the likeliest first: for H0 / dH (rows = tokens) the rows where the step's
    numbers are farthest off; for a weight the columns of the output farthest off."""
    idx = list(np.ndindex(arr.shape))
    if D.ndim >= 1 and arr.ndim == 2 and key in (H0_KEY, DH_KEY) and per_token and D.shape[0] == arr.shape[0]:
        w = np.abs(D).reshape(D.shape[0], -1).max(axis=1)
        return sorted(idx, key=lambda i: -w[i[0]])
    if D.ndim == 2 and arr.shape[-1] == D.shape[-1]:
        w = np.abs(D).max(axis=0)
        return sorted(idx, key=lambda i: -w[i[-1]])
    return idx


def _sources(m, step, chain_steps):
    """(involved steps, [(label, key, array)]): the numbers of the sheet the step reads, directly or through
    unwritten steps — H0 / dH and the parameters of those steps."""
    involved = [step] + _unwritten_ancestors(m, step)
    keys = {k for s in involved for k in s.inputs}
    ws = m.worksheet
    out = []
    if H0_KEY in keys:
        out.append(("H0", H0_KEY, ws.H0))
    if DH_KEY in keys and ws.backward:
        out.append(("dH", DH_KEY, ws.dH))
    for s in involved:
        if s.name == "d_H" and DH_KEY in s.inputs:          # the last layer's d_H is dH itself
            continue
        layer = s.layer + 1 if s.name == "d_H" else s.layer  # layer ℓ's d_H is computed in layer ℓ + 1
        for name in _params_of(s.name, ws.norm):
            src = (f"[layer{layer}].{name}", (layer, name), ws.params[layer - 1][name])
            if src[1] not in [o[1] for o in out]:
                out.append(src)
    return involved, out


def find_miscopy(m, step) -> dict | None:
    """The ``miscopied_input`` diagnosis of ``step``, or None."""
    from .names import is_per_token
    a = m.given(step.key)
    chain_steps = _steps(m)
    involved, sources = _sources(m, step, chain_steps)
    base = m.own[step.key]
    D = np.where(a.mask, a.value - base, 0.0)
    budget = MAX_ENTRIES
    best = None
    for label, key, arr in sources:
        dec = _decimals(arr)
        for idx in _order(arr, key, D, is_per_token(step.name)):
            if budget <= 0:
                break
            budget -= 1
            value = _try(m, step, chain_steps, key, arr, idx, D, base, dec, a.mask)
            if value is None:
                continue
            v, new_value, version = value
            score = _score(m, step, v)
            if score <= 1.0 and (best is None or score < best[0]):
                best = (score, label, key, idx, float(arr[idx]), new_value, version)
    if best is None:
        return None
    _, label, key, idx, given, used, version = best
    return {"diagnosis": "miscopied_input", "explanation": _explain_copy(m, step, label, key, idx, given, used),
            "at": key if key in (H0_KEY, DH_KEY) else step.key, "_version": version}


def _explain_copy(m: Marking, step: Step, label: str, key, idx, given: float, used: float) -> str:
    """The explanation of ``miscopied_input``: the entry, the sheet's value, the value used."""
    dec = m.worksheet.decimals
    ws = m.worksheet
    if key in (H0_KEY, DH_KEY):
        where = f"{label} row {ws.tokens[idx[0]]!r}, column {idx[1] + 1}"
    elif len(idx) == 2:
        where = f"{label}[{idx[0] + 1}, {idx[1] + 1}]"
    else:
        where = f"{label}[{idx[0] + 1}]"
    a = m.given(step.key)
    wl, i = _worst(m, step, m.own[step.key])
    yours, right = _vec(_row(step, a.value, i), dec), _vec(_row(step, m.own[step.key], i), dec)
    return (f"Your numbers follow if one number of the sheet was copied wrongly: {where} is {given:g} on the "
            f"sheet, and your {step.name} is what it gives with {used:g} instead. At {wl} you wrote {yours}; "
            f"with the sheet's {given:g} it is {right}.")



def _evaluate_with(m, step, chain_steps, key, arr, idx, value):
    """The step's value with entry ``idx`` of the source ``key`` set to ``value`` (and the version to carry).
    A parameter is changed in place for the one evaluation (the steps' functions hold the arrays) and put
    back."""
    if key in (H0_KEY, DH_KEY):
        new = arr.copy()
        new[idx] = value
        return _recompute(m, chain_steps, {key: new}, step), {"inputs": {key: new}, "hidden": {key}}
    old = arr[idx]
    try:
        arr[idx] = value
        v = _recompute(m, chain_steps, {}, step, {s.key: s for s in chain_steps if s.layer == key[0]})
    finally:
        arr[idx] = old
    return v, {"param": (key[0], key[1], idx, value)}


def _with_param(ws, l: int, name: str, change):
    """A copy of worksheet ``ws`` with entry ``change[0]`` of parameter ``name`` of layer ``l`` set to
    ``change[1]``."""
    ws2 = copy.copy(ws)
    ws2.params = [dict(p) for p in ws.params]
    P = ws.params[l - 1][name].copy()
    P[change[0]] = change[1]
    ws2.params[l - 1][name] = P
    return ws2


def param_version(m, chain_steps, l: int, name: str, idx, value):
    """The student's steps with parameter ``name`` of layer ``l`` copied as ``value`` at ``idx``, and the keys of
    the steps that read it."""
    by2 = {s.key: s for s in build_steps(_with_param(m.worksheet, l, name, (idx, value)))}
    users = set()
    with np.errstate(all="ignore"):
        for s in chain_steps:
            if s.layer == l:
                args = [m.chain[k] for k in s.inputs]
                if not np.allclose(by2[s.key].fn(*args), s.fn(*args), rtol=0, atol=1e-12, equal_nan=True):
                    users.add(s.key)
    return [by2[s.key] if s.layer == l else s for s in chain_steps], users


def _try(m, step, chain_steps, key, arr, idx, D, base, dec, mask):
    """(value, the number the student used, version) for one entry, or None when it cannot explain D."""
    x0 = float(arr[idx])
    r = _evaluate_with(m, step, chain_steps, key, arr, idx, x0 + 1.0)[0] - base
    r = np.where(mask, np.nan_to_num(r), 0.0)
    rr = float((r * r).sum())
    if rr < 1e-12:
        return None
    delta = float((r * D).sum()) / rr
    used = round(x0 + delta, dec)
    if used == x0:
        return None
    v, version = _evaluate_with(m, step, chain_steps, key, arr, idx, used)
    return v, used, version
