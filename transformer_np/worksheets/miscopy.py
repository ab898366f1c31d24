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

from .steps import DH_KEY, H0_KEY, build_steps

__all__ = ["find_miscopy", "MAX_ENTRIES"]

MAX_ENTRIES = 400


def _decimals(a: np.ndarray) -> int:
    """The fewest decimals (≤ 6) that write every entry of ``a`` exactly."""
    for k in range(7):
        if np.allclose(a * 10.0 ** k, np.rint(a * 10.0 ** k), rtol=0, atol=1e-6):
            return k
    return 6


def _sources(m, step, chain_steps):
    """[(label, key_or_param, array)] the step reads: inputs and the parameters of the steps involved."""
    from .diagnosis import _unwritten_ancestors
    involved = [step] + _unwritten_ancestors(m, step)
    keys = {k for s in involved for k in s.inputs}
    ws = m.worksheet
    out = []
    if H0_KEY in keys:
        out.append(("H0", H0_KEY, ws.H0))
    if DH_KEY in keys and ws.backward:
        out.append(("dH", DH_KEY, ws.dH))
    layers = sorted({s.layer for s in involved if s.layer >= 1})
    for l in layers:
        for name, P in ws.params[l - 1].items():
            out.append((f"[layer{l}].{name}", (l, name), P))
    return involved, out


def _param_user(m, involved, l: int, name: str) -> bool:
    """Does a step in ``involved`` read parameter ``name`` of layer ``l``? (Moved, does its value change?)"""
    ws2 = _with_param(m.worksheet, l, name, None)
    steps2 = {s.key: s for s in build_steps(ws2)}
    with np.errstate(all="ignore"):
        for s in involved:
            args = [m.chain[k] for k in s.inputs]
            if not np.allclose(steps2[s.key].fn(*args), s.fn(*args), rtol=0, atol=1e-12, equal_nan=True):
                return True
    return False


def _with_param(ws, l: int, name: str, change):
    """A copy of worksheet ``ws`` with parameter ``name`` of layer ``l`` changed (``change``: (index, value);
    None: every entry moved by a small amount, to see who reads it)."""
    ws2 = copy.copy(ws)
    ws2.params = [dict(p) for p in ws.params]
    P = ws.params[l - 1][name].copy()
    if change is None:
        P = P + 0.37 + 0.01 * np.arange(P.size).reshape(P.shape)
    else:
        P[change[0]] = change[1]
    ws2.params[l - 1][name] = P
    return ws2


def find_miscopy(m, step) -> dict | None:
    """The ``miscopied_input`` diagnosis of ``step``, or None."""
    from .diagnosis import _explain_copy, _score, _steps
    a = m.given(step.key)
    chain_steps = _steps(m)
    involved, sources = _sources(m, step, chain_steps)
    base = m.own[step.key]
    D = np.where(a.mask, a.value - base, 0.0)
    budget = MAX_ENTRIES
    best = None
    for label, key, arr in sources:
        if isinstance(key, tuple) and key not in (H0_KEY, DH_KEY) and not _param_user(m, involved, *key):
            continue
        dec = _decimals(arr)
        for idx in np.ndindex(arr.shape):
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


def _evaluate_with(m, step, chain_steps, key, arr, idx, value):
    """The step's value with entry ``idx`` of the source ``key`` set to ``value`` (and the version to carry)."""
    from .diagnosis import _recompute
    if key in (H0_KEY, DH_KEY):
        new = arr.copy()
        new[idx] = value
        return _recompute(m, chain_steps, {key: new}, step), {"inputs": {key: new}, "hidden": {key}}
    l, name = key
    by2 = {s.key: s for s in build_steps(_with_param(m.worksheet, l, name, (idx, value)))}
    replace = {s.key: by2[s.key] for s in chain_steps if s.layer == l}
    return _recompute(m, chain_steps, {}, step, replace), {"param": (l, name, idx, value)}


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
    if key in (H0_KEY, DH_KEY):
        from .diagnosis import _recompute
        new = arr.copy()
        new[idx] = x0 + 1.0
        r = _recompute(m, chain_steps, {key: new}, step) - base
    else:
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
