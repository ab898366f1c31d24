"""`python -m transformer_np gradcheck` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "transformer_np", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def gradcheck_json():
    r = run_cli("gradcheck", "--json", "--max-coords", "6")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_json_lists_every_op_placement_stack_sharing_and_heads(gradcheck_json):
    names = [e["name"] for e in gradcheck_json]
    for e in gradcheck_json:
        assert set(e) == {"name", "max_rel_error", "checked"}
        assert e["checked"] > 0 and 0 <= e["max_rel_error"] <= 1e-7, e
    joined = " | ".join(names)
    for needle in ("linear", "softmax", "scaled dot-product", "multi-head attention", "layernorm", "relu",
                   "gelu", "gelu_tanh", "feed-forward", "residual", "dropout", "token embedding",
                   "sinusoidal", "encoder layer (post-LN", "encoder layer (pre-LN", "encoder stack (post-LN",
                   "encoder stack (pre-LN", "weight sharing", "mean pooling", "classifier", "tagger",
                   "cross-entropy"):
        assert needle in joined, needle


def test_table_output_and_exit_code():
    r = run_cli("gradcheck", "--max-coords", "2")
    assert r.returncode == 0
    assert "max rel error" in r.stdout and "worst" in r.stdout


def test_failing_tolerance_exits_nonzero():
    r = run_cli("gradcheck", "--max-coords", "2", "--tol", "1e-30")
    assert r.returncode == 1
    assert "FAILED" in r.stderr


def test_bad_arguments_are_one_line_errors():
    r = run_cli("gradcheck", "--max-coords", "0")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--max-coords" in r.stderr
    r = run_cli("gradcheck", "--no-such-flag")
    assert r.returncode == 2
    r = run_cli("no-such-command")
    assert r.returncode == 2


@pytest.mark.parametrize("view", ["columns", "transpose"])
def test_numerical_gradient_perturbs_a_strided_parameter(view):
    """A parameter that is a strided view (a loaded model's W_Q is a column block of one (d + 1, 3d)
    array) is perturbed in place, not through a copy: the central difference of Σ R ⊙ (x W) with
    respect to W is xᵀ R, the same as for a contiguous W."""
    import numpy as np

    from transformer_np.model.gradcheck import numerical_gradient

    r = np.random.default_rng(3)
    x, R = r.standard_normal((5, 4)), r.standard_normal((5, 3))
    base = r.standard_normal((4, 9)) if view == "columns" else r.standard_normal((3, 4))
    W = base[:, 3:6] if view == "columns" else base.T                 # (4, 3), not C-contiguous
    assert not W.flags.c_contiguous
    before = W.copy()
    num = numerical_gradient(lambda: x @ W, W, R, np.arange(W.size))
    # central differences with h = 1e-6 of a function linear in W: round-off only
    np.testing.assert_allclose(num.reshape(W.shape), x.T @ R, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(W, before)   # exact: each entry is restored to its saved value
