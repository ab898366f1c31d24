"""Policy: the backward must be analytic (issue 35, item 5).

Where the student's forward is right, each gradient is compared with the library's at
``exercises.BACKWARD_TOLERANCE``, which a backward made of finite differences of the student's own forward
cannot meet (its measured ranges are in the constant's comment). A finite-difference backward fails with
``not_analytic`` and a message saying why, for every exercise; honest backwards written in several ways —
the solution notebooks', the library's, the ones of test_grading.py, and three more formulations below —
pass on the hidden cases of many seeds. Error carried forward (a slipped forward) keeps the
finite-difference check's tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_exercises import ARGS, LIBRARY, _pack
from test_grading import HONEST, SEED, softmax_global_fwd

from transformer_np.course.exercises import BACKWARD_TOLERANCE, EXERCISE_NAMES, TOLERANCE, check_backward
from transformer_np.grader.grading import grade_backward
from transformer_np.grader.specs import EXERCISES, copy_inputs
from transformer_np.model.gradcheck import TOLERANCE as GRADCHECK_TOLERANCE

REPO = Path(__file__).resolve().parents[2]
_NOTEBOOK = {"softmax": "01_softmax", "layernorm": "02_layernorm", "attention": "03_attention",
             "mha": "04_multihead_attention", "gelu": "05_gelu_ffn", "ffn": "05_gelu_ffn",
             "encoder_layer_post": "06_encoder_layer", "encoder_layer_pre": "06_encoder_layer"}


def _solution(name: str) -> tuple:
    """The solution notebook's forward and backward: its code cells run, its check cells left out."""
    nb = json.loads((REPO / "exercises" / f"{_NOTEBOOK[name]}.ipynb").read_text())
    ns: dict = {}
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and not any(s in src for s in ("check_forward(", "check_backward(", "grade_")):
            exec(compile(src, f"{_NOTEBOOK[name]}.ipynb", "exec"), ns)
    ex = EXERCISES[name]
    return ns[ex.forward], ns[ex.backward]


def finite_difference_backward(name: str, forward, h: float = 1e-5):
    """A student who did not derive the backward: the forward caches its arguments, the backward takes
    central differences of Σ dout ⊙ forward(…) in every input entry, with the returns the exercise documents."""
    ex = EXERCISES[name]

    def fwd(*args):
        out, _ = forward(*args)
        return out, args

    def bwd(dout, args):
        arrays, static = ARGS[name](*args)
        arrays = copy_inputs(arrays)
        grads = {}
        for key, x in arrays.items():
            g = np.zeros_like(x)
            for i in np.ndindex(x.shape):
                old = x[i]
                x[i] = old + h
                plus = ex.call(forward, arrays, static)[0]
                x[i] = old - h
                minus = ex.call(forward, arrays, static)[0]
                x[i] = old
                g[i] = np.sum(dout * (plus - minus)) / (2 * h)
            grads[key] = g
        return _pack(ex, grads)

    return fwd, bwd


@pytest.mark.parametrize("name", EXERCISE_NAMES)
def test_a_finite_difference_backward_is_not_analytic(name):
    fwd, bwd = finite_difference_backward(name, _solution(name)[0])
    for fb in (check_backward(name, fwd, bwd), grade_backward(name, fwd, bwd, seed=SEED)):
        assert fb is not None, f"{name}: a finite-difference backward passed"
        assert set(fb.codes) == {"not_analytic"}, fb
        assert "must be derived" in fb.text and "finite differences" in fb.text
        assert "times 1" not in fb.text


@pytest.mark.parametrize("h", [1e-4, 1e-6])
def test_other_steps_are_not_analytic_either(h):
    fwd, bwd = finite_difference_backward("softmax", _solution("softmax")[0], h)
    assert set(grade_backward("softmax", fwd, bwd, seed=SEED).codes) == {"not_analytic"}


# ----------------------------------------------------------------------------- honest formulations
def softmax_full_jacobian_bwd(dout, cache):
    (s,) = cache
    J = s[..., :, None] * (np.eye(s.shape[-1]) - s[..., None, :])       # (..., n, n): J_ij = s_i (δ_ij − s_j)
    return np.einsum("...ij,...i->...j", J, dout)


def layernorm_staged_fwd(x, gamma, beta, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta, (x, mu, var, gamma, eps)


def layernorm_staged_bwd(dout, cache):
    """The chain rule node by node (x → x − μ → σ² → 1/σ → x̂), as CS231n's staged graph."""
    x, mu, var, gamma, eps = cache
    d = x.shape[-1]
    xc, std = x - mu, np.sqrt(var + eps)
    lead = tuple(range(x.ndim - 1))
    dxhat = dout * gamma
    dvar = np.sum(dxhat * xc, -1, keepdims=True) * -0.5 * (var + eps) ** -1.5
    dmu = np.sum(-dxhat / std, -1, keepdims=True) + dvar * np.mean(-2 * xc, -1, keepdims=True)
    return dxhat / std + dvar * 2 * xc / d + dmu / d, np.sum(dout * xc / std, lead), np.sum(dout, lead)


def layernorm_moments_fwd(x, gamma, beta, eps=1e-5):
    """var = E[x²] − E[x]²: loses digits to cancellation on rows with a small spread (still honest work)."""
    mu = x.mean(-1, keepdims=True)
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) - mu * mu + eps)
    xhat = (x - mu) * r
    return gamma * xhat + beta, (xhat, r, gamma)


def layernorm_moments_bwd(dout, cache):
    xhat, r, gamma = cache
    g = dout * gamma
    lead = tuple(range(dout.ndim - 1))
    dx = r * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, (dout * xhat).sum(lead), dout.sum(lead)


def _honest(name: str) -> list:
    found = [("solution notebook", *_solution(name)), ("test_grading", *HONEST[name]), ("library", *LIBRARY[name])]
    if name == "softmax":
        found.append(("full Jacobian", HONEST["softmax"][0], softmax_full_jacobian_bwd))
    if name == "layernorm":
        found += [("staged chain rule", layernorm_staged_fwd, layernorm_staged_bwd),
                  ("E[x²] − E[x]²", layernorm_moments_fwd, layernorm_moments_bwd)]
    return found


@pytest.mark.parametrize("name", EXERCISE_NAMES)
def test_honest_backwards_pass_on_the_hidden_cases_of_many_seeds(name):
    seeds = range(3) if name.startswith("encoder_layer") else range(20)
    for label, fwd, bwd in _honest(name):
        for seed in seeds:
            assert grade_backward(name, fwd, bwd, seed=seed) is None, (label, seed, grade_backward(name, fwd, bwd,
                                                                                                    seed=seed))


def test_the_tolerance_is_tighter_than_the_old_one():
    assert BACKWARD_TOLERANCE < TOLERANCE


def test_error_carried_forward_keeps_the_finite_difference_tolerance():
    """The analytic rule applies where the forward is right. A slipped forward's backward is checked against
    central differences of that forward at the gradient check's tolerance (1e-7), so a backward that is the
    slipped forward's numerical derivative passes there (the forward's check fails, as it should)."""
    assert GRADCHECK_TOLERANCE > TOLERANCE
    fwd, bwd = finite_difference_backward("softmax", softmax_global_fwd)
    assert grade_backward("softmax", fwd, bwd, seed=SEED) is None
