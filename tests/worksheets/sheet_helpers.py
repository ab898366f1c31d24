"""Worksheets and simulated students for the worksheet tests (imported as ``import sheet_helpers``).

A simulated student works through the steps in order. ``mode="pencil"`` carries the values they
wrote (rounded to the sheet's decimals, halves away from zero) and keeps one more decimal for work
they do not write down — the convention the sheets state; ``mode="spreadsheet"`` carries full
precision and only rounds what it writes. ``plant`` replaces a step by the test's own plain-NumPy
version of a mistake; every later step is then done correctly from the student's own values.
"""

from __future__ import annotations

import numpy as np

from transformer_np.worksheets.format import load_worksheet
from transformer_np.worksheets.steps import DH_KEY, H0_KEY, build_steps

TOKENS = ["the", "cat", "sat", "on", "mat", "today"]


def problem(norm="post", heads=1, layers=1, backward=False, seed=0, d=4, n=3, d_ff=6, activation="gelu",
            decimals=2) -> dict:
    """A worksheet dict with generic numbers: H0, dH, biases, gamma, beta with one decimal; the weight
    matrices Glorot-uniform from the seed (so no quantity is accidentally symmetric or round)."""
    rng = np.random.default_rng(seed + 100)
    raw = {"setup": {"tokens": TOKENS[:n], "d_model": d, "n_heads": heads, "d_ff": d_ff, "norm": norm,
                     "activation": activation, "eps": 1e-12, "layers": layers, "decimals": decimals, "seed": seed},
           "input": {"H0": rng.normal(size=(n, d)).round(1).tolist()}}
    if backward:
        raw["input"]["dH"] = rng.normal(size=(n, d)).round(1).tolist()
    for l in range(layers):
        raw[f"layer{l + 1}"] = {"b_Q": rng.normal(size=d).round(1).tolist(),
                                "b_V": rng.normal(size=d).round(1).tolist(),
                                "gamma1": (1 + 0.3 * rng.normal(size=d)).round(1).tolist(),
                                "beta1": rng.normal(size=d).round(1).tolist(),
                                "b_1": rng.normal(size=d_ff).round(1).tolist(),
                                "gamma2": (1 + 0.3 * rng.normal(size=d)).round(1).tolist(),
                                "beta2": rng.normal(size=d).round(1).tolist()}
    return raw


def half_away(x, k: int):
    f = 10.0 ** k
    return np.sign(x) * np.floor(np.abs(x) * f + 0.5) / f + 0.0


def steps_of(raw: dict):
    ws = load_worksheet({k: v for k, v in raw.items() if k != "answers"})
    return ws, build_steps(ws)


def student(raw: dict, plant: dict | None = None, written=None, mode: str = "pencil") -> tuple[dict, dict]:
    """(worksheet dict with [answers], the values the student carried, keyed like the steps).

    ``written``: the step keys (layer, name) the student writes down (default: all).
    """
    ws, steps = steps_of(raw)
    D = ws.decimals
    vals = {H0_KEY: ws.H0}
    if ws.backward:
        vals[DH_KEY] = ws.dH
    answers: dict = {}
    for s in steps:
        v = plant[s.key](vals) if plant and s.key in plant else s.fn(*(vals[k] for k in s.inputs))
        v = np.asarray(v, dtype=float)
        write = written is None or s.key in written
        if write:
            answers.setdefault(f"layer{s.layer}", {})[s.name] = half_away(v, D).tolist()
        if mode == "pencil":
            vals[s.key] = half_away(v, D) if write else half_away(v, D + 1)
        else:
            vals[s.key] = v
    return {**raw, "answers": answers}, vals


def verdicts(report) -> dict:
    return {(s["layer"], s["name"]): s["verdict"] for s in report.steps}


def layer_norm(x, gamma=None, beta=None, eps=1e-12, ddof=0):
    """Plain LayerNorm over the last axis (ddof=1: the sample-variance mistake)."""
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).sum(axis=-1, keepdims=True) / (x.shape[-1] - ddof)
    y = (x - mu) / np.sqrt(var + eps)
    return y if gamma is None else y * gamma + beta


def softmax_rows(S, axis=-1):
    E = np.exp(S - S.max(axis=axis, keepdims=True))
    return E / E.sum(axis=axis, keepdims=True)
