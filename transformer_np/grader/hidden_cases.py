"""The hidden cases of each exercise: inputs drawn at grading time from a seed, with varied shapes.

The public cases (``Exercise.cases``) are fixed so a student can loop on them; these are new on every
grading run (or reproducible from a seed the instructor sets): non-square score matrices (n_q ≠ n_k),
n ≠ d, several heads, a batch larger than one, masks that hide a random number of keys, ε other than
1e-5. Each generator returns three cases; the last is the one the finite-difference check runs on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from ..model.gradcheck import random_params
from ..model.params import sub_params
from ..ops.attention import MHA_PARAM_NAMES
from ..ops.masks import mask_value
from .exercise_base import Case
from .specs_blocks import _layer_config

__all__ = ["hidden_cases"]


def _shape(shape: tuple) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _padding_mask(rng: np.random.Generator, B: int, n_k: int) -> np.ndarray:
    """(B, 1, 1, n_k): each batch item hides a random number of its last keys (never all of them)."""
    mask = np.zeros((B, 1, 1, n_k))
    for b in range(B):
        hidden = int(rng.integers(0 if b else 1, n_k))         # 0 … n_k − 1 keys; batch item 1 hides at least one
        if hidden:
            mask[b, ..., n_k - hidden:] = mask_value(np.float64)
    return mask


def _softmax(rng: np.random.Generator) -> list[Case]:
    r, n = (int(v) for v in rng.choice(np.arange(2, 9), size=2, replace=False))
    B, h, n2 = int(rng.integers(2, 4)), int(rng.integers(2, 4)), int(rng.integers(3, 8))
    big = rng.standard_normal((3, n)) + rng.choice([-1, 1], size=(3, 1)) * rng.uniform(500, 1000, (3, 1))
    return [Case(f"x of shape {_shape((r, n))}", {"x": 2 * rng.standard_normal((r, n))}, dims={"n": n}),
            Case(f"large scores, x of shape {_shape((3, n))}", {"x": big}, dims={"n": n},
                 extreme=True),
            Case(f"x of shape {_shape((B, h, r, n2))}", {"x": 2 * rng.standard_normal((B, h, r, n2))},
                 dims={"n": n2}, gradcheck=True)]


def _layernorm(rng: np.random.Generator) -> list[Case]:
    def arrays(x: np.ndarray) -> dict:
        d = x.shape[-1]
        return {"x": x, "gamma": 1 + 0.3 * rng.standard_normal(d), "beta": 0.3 * rng.standard_normal(d)}

    r, d = int(rng.integers(2, 6)), int(rng.integers(3, 10))
    B, n, d2 = int(rng.integers(2, 4)), int(rng.integers(2, 6)), int(rng.integers(3, 10))
    eps = float(rng.choice([1e-5, 1e-3]))
    return [Case(f"x of shape {_shape((r, d))}, ε = {eps:g}", arrays(rng.normal(1, 2, (r, d))), {"eps": eps},
                 dims={"d": d}),
            Case(f"rows with a small spread, x of shape {_shape((r, d2))}, ε = 0.01",
                 arrays(3 + 0.05 * rng.standard_normal((r, d2))), {"eps": 1e-2}, dims={"d": d2}),
            Case(f"x of shape {_shape((B, n, d2))}, ε = {eps:g}", arrays(rng.standard_normal((B, n, d2))),
                 {"eps": eps}, dims={"d": d2}, gradcheck=True)]


def _attention(rng: np.random.Generator) -> list[Case]:
    n = rng.standard_normal
    nq, nk = (int(v) for v in rng.choice(np.arange(2, 8), size=2, replace=False))
    dk, dv = (int(v) for v in rng.choice(np.arange(2, 7), size=2, replace=False))
    B, h = int(rng.integers(2, 4)), int(rng.integers(2, 4))
    mask = _padding_mask(rng, B, nk)
    return [Case(f"Q {_shape((nq, dk))}, K {_shape((nk, dk))}, V {_shape((nk, dv))}, no mask",
                 {"Q": n((nq, dk)), "K": n((nk, dk)), "V": n((nk, dv))}, {"mask": None}, dims={"d_k": dk}),
            Case(f"Q {_shape((B, h, nq, dk))}, K {_shape((B, h, nk, dk))}, V {_shape((B, h, nk, dv))}, a padding "
                 f"mask {_shape(mask.shape)}", {"Q": n((B, h, nq, dk)), "K": n((B, h, nk, dk)), "V": n((B, h, nk, dv))},
                 {"mask": mask}, dims={"d_k": dk}),
            Case(f"Q {_shape((B, h, nk, dk))}, K and V {_shape((B, h, nk, dk))}, a padding mask",
                 {"Q": n((B, h, nk, dk)), "K": n((B, h, nk, dk)), "V": n((B, h, nk, dk))}, {"mask": mask},
                 dims={"d_k": dk}, gradcheck=True)]


def _mha_arrays(rng: np.random.Generator, B: int, n: int, d: int) -> dict:
    a = {"x": rng.standard_normal((B, n, d))}
    for name in MHA_PARAM_NAMES:
        a[name] = rng.standard_normal((d, d)) / math.sqrt(d) if name.startswith("W") else 0.3 * rng.standard_normal(d)
    return a


def _mha(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i in range(3):
        B, n = int(rng.integers(2, 4)), int(rng.integers(3, 7))
        h = int(rng.choice([2, 3, 4]))
        dk = int(rng.choice([d for d in (2, 3) if d * h != n] or [2]))
        mask = _padding_mask(rng, B, n) if i else None
        cases.append(Case(f"x of shape {_shape((B, n, h * dk))}, {h} heads (d_k = {dk})"
                          + (f", a padding mask {_shape(mask.shape)}" if mask is not None else ", no mask"),
                          _mha_arrays(rng, B, n, h * dk), {"n_heads": h, "mask": mask},
                          dims={"d_k": dk, "d_model": h * dk}, gradcheck=i == 2))
    return cases


def _gelu(rng: np.random.Generator) -> list[Case]:
    shapes = [(int(rng.integers(3, 9)),), (int(rng.integers(2, 5)), int(rng.integers(2, 7))),
              (int(rng.integers(2, 4)), int(rng.integers(2, 5)), int(rng.integers(3, 7)))]
    return [Case(f"z of shape {_shape(s)}", {"z": 2.5 * rng.standard_normal(s)}, gradcheck=i == 2)
            for i, s in enumerate(shapes)]


def _ffn(rng: np.random.Generator) -> list[Case]:
    cases = []
    for i, lead in enumerate([(int(rng.integers(2, 6)),), (2, int(rng.integers(2, 5))), (3, int(rng.integers(2, 5)))]):
        d = int(rng.integers(3, 8))
        d_ff = int(rng.integers(d + 1, 2 * d + 4))
        x = rng.standard_normal(lead + (d,))
        a = {"x": x, "W_1": rng.standard_normal((d, d_ff)) / math.sqrt(d), "b_1": 0.3 * rng.standard_normal(d_ff),
             "W_2": rng.standard_normal((d_ff, d)) / math.sqrt(d_ff), "b_2": 0.3 * rng.standard_normal(d)}
        cases.append(Case(f"x of shape {_shape(x.shape)}, d_ff = {d_ff}", a, dims={"d_model": d, "d_ff": d_ff},
                          gradcheck=i == 2))
    return cases


def _layer(norm: str) -> Callable[[np.random.Generator], list[Case]]:
    def cases(rng: np.random.Generator) -> list[Case]:
        out = []
        for i in range(3):
            B, n = (1, int(rng.integers(2, 5))) if i == 0 else (int(rng.integers(2, 4)), int(rng.integers(3, 6)))
            h, dk = int(rng.choice([2, 3])), int(rng.choice([2, 3]))
            d, d_ff = h * dk, int(rng.integers(h * dk + 1, 2 * h * dk + 3))
            eps = float(rng.choice([1e-5, 1e-6]))
            params = sub_params(random_params(_layer_config(norm, d, h, d_ff, eps), seed=int(rng.integers(1 << 30))),
                                "layers.0.")
            mask = _padding_mask(rng, B, n) if i else None
            title = "Post-LN" if norm == "post" else "Pre-LN"
            out.append(Case(f"{title}, x of shape {_shape((B, n, d))}, {h} heads, d_ff = {d_ff}"
                            + (", a padding mask" if mask is not None else ", no mask"),
                            {"x": rng.standard_normal((B, n, d)), **params},
                            {"norm": norm, "n_heads": h, "eps": eps, "mask": mask}, gradcheck=i == 2))
        return out
    return cases


_GENERATORS: dict[str, Callable[[np.random.Generator], list[Case]]] = {
    "softmax": _softmax, "layernorm": _layernorm, "attention": _attention, "mha": _mha, "gelu": _gelu,
    "ffn": _ffn, "encoder_layer_post": _layer("post"), "encoder_layer_pre": _layer("pre")}


def hidden_cases(exercise: str, seed: int) -> list[Case]:
    """The hidden cases of ``exercise`` for ``seed`` (labels start with "hidden")."""
    rng = np.random.default_rng([seed, sorted(_GENERATORS).index(exercise)])
    return [dataclasses.replace(c, label=f"hidden: {c.label}") for c in _GENERATORS[exercise](rng)]
