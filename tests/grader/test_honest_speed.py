"""Exercise 6 at most 3 CPU-seconds per notebook (issue 43, item 4), counted in calls of the student's forward (not
timed: each call through the grade of record's child costs ~6 ms of CPU, handed-out sublayers included).

Before, a right encoder layer cost ~820–930 calls of its forward per backward check — a finite-difference check,
coordinate by coordinate over 17 tensors, after the backward had already agreed with the op on every case — and a
followed one (a forward slip) ~2,200. Now the right one is not checked again by central differences (they could
only confirm it), and the layers' check goes along 2 random directions per tensor.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_grading import HONEST, SEED, SLIPS

from transformer_np.grader.grading import grade_backward
from transformer_np.grader.hidden_cases import hidden_cases
from transformer_np.grader.specs import EXERCISES

LAYERS = ["encoder_layer_post", "encoder_layer_pre"]


def _counted(fn):
    calls = [0]

    def forward(*args, **kwargs):
        calls[0] += 1
        return fn(*args, **kwargs)

    return forward, calls


def _cases(name: str) -> int:
    return len(EXERCISES[name].cases()) + len(hidden_cases(name, SEED))


@pytest.mark.parametrize("name", LAYERS)
def test_a_right_layer_costs_a_few_calls_per_case(name):
    fwd, bwd = HONEST[name]
    forward, calls = _counted(fwd)
    assert grade_backward(name, forward, bwd, seed=SEED) is None
    assert calls[0] <= 3 * _cases(name), calls        # run_forward, then forward + backward per case


@pytest.mark.parametrize("name", LAYERS)
def test_a_followed_layer_costs_two_directions_per_tensor(name):
    fwd, bwd = SLIPS[name]                             # a forward slip with the derivative of that forward
    forward, calls = _counted(fwd)
    assert grade_backward(name, forward, bwd, seed=SEED) is None
    tensors = 17                                       # x, 8 attention, 4 FFN, 4 LayerNorm parameters
    assert calls[0] <= _cases(name) * (2 * 2 * tensors + 8), calls


@pytest.mark.parametrize("key", ["x", "attn.b_V", "ln1.beta", "ffn.W_2"])
def test_the_directional_check_catches_one_wrong_tensor(key):
    """A followed backward wrong in one tensor only — by 1 % — is still not the derivative of its forward."""
    fwd, bwd = SLIPS["encoder_layer_post"]

    def one_wrong(dout, cache):
        dx, grads = bwd(dout, cache)
        if key == "x":
            return dx * 1.01, grads
        return dx, {**grads, key: np.asarray(grads[key]) * 1.01}

    fb = grade_backward("encoder_layer_post", fwd, one_wrong, seed=SEED)
    assert fb is not None and fb.codes == ["gradcheck"], fb
    assert "random directions" in fb.text
