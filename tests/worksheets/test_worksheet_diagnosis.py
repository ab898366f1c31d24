"""Each diagnosis code: a sheet with that mistake planted (written here in plain NumPy, independently of the
diagnosis' own mistake functions), every later step done right from the student's own numbers. The planted
step must be the first mistake, with that diagnosis; the steps before it correct; none after it wrong, and
the ones built on it ``follows``."""

from __future__ import annotations

import numpy as np
import pytest
import sheet_helpers as sh

from transformer_np.worksheets import check
from transformer_np.worksheets.names import DIAGNOSES


def _params(raw, layer=1):
    return sh.steps_of(raw)[0].params[layer - 1]


def _relu_grad(vals, L=1):
    return vals[(L, "d_ffn_activation")] * (vals[(L, "ffn_hidden")] > 0)


def _post_d_H0_no_skip(raw):
    p = _params(raw)
    return lambda v: v[(1, "d_Q")] @ p["W_Q"].T + v[(1, "d_K")] @ p["W_K"].T + v[(1, "d_V")] @ p["W_V"].T


def _early_rounded_softmax(v):
    return sh.softmax_rows(np.round(v[(1, "scores")], 0))


# (name, problem kwargs, {step: plain-NumPy mistake}, expected first mistake (layer, name, code))
CASES = [
    ("missing_scale", {}, {(1, "scores"): lambda v: v[(1, "Q")] @ v[(1, "K")].T},
     (1, "scores", "missing_scale")),
    ("wrong_scale d_k", {}, {(1, "scores"): lambda v: v[(1, "Q")] @ v[(1, "K")].T / 4},
     (1, "scores", "wrong_scale")),
    ("wrong_scale sqrt(d_model)", {"heads": 2, "d": 8},
     {(1, "scores_head1"): lambda v: v[(1, "Q")][:, :4] @ v[(1, "K")][:, :4].T / np.sqrt(8)},
     (1, "scores_head1", "wrong_scale")),
    ("transposed_scores", {}, {(1, "scores"): lambda v: (v[(1, "Q")] @ v[(1, "K")].T / 2).T},
     (1, "scores", "transposed_scores")),
    ("softmax_axis", {}, {(1, "attention_weights"): lambda v: sh.softmax_rows(v[(1, "scores")], axis=0)},
     (1, "attention_weights", "softmax_axis")),
    ("softmax_axis head 2", {"heads": 2, "norm": "pre"},
     {(1, "attention_weights_head2"): lambda v: sh.softmax_rows(v[(1, "scores_head2")], axis=0)},
     (1, "attention_weights_head2", "softmax_axis")),
    ("sample_variance", {}, {(1, "layer_norm_var"): lambda v: v[(1, "residual")].var(axis=1, ddof=1)},
     (1, "layer_norm_var", "sample_variance")),
    ("sample_variance layer 2", {"layers": 2, "norm": "pre"},
     {(2, "layer_norm2_var"): lambda v: v[(2, "residual")].var(axis=1, ddof=1)},
     (2, "layer_norm2_var", "sample_variance")),
    ("no_residual", {}, {(1, "residual"): lambda v: v[(1, "attention_output")]}, (1, "residual", "no_residual")),
    ("no_residual ffn, pre", {"norm": "pre"}, {(1, "residual2"): lambda v: v[(1, "ffn_output")]},
     (1, "residual2", "no_residual")),
    ("wrong_activation", {}, {(1, "ffn_activation"): lambda v: np.maximum(v[(1, "ffn_hidden")], 0.0)},
     (1, "ffn_activation", "wrong_activation")),
    ("wrong_activation backward", {"backward": True, "activation": "gelu"},
     {(1, "d_ffn_hidden"): _relu_grad}, (1, "d_ffn_hidden", "wrong_activation")),
    ("missing_scale backward", {"backward": True, "norm": "pre"},
     {(1, "d_Q"): lambda v: v[(1, "d_scores")] @ v[(1, "K")]}, (1, "d_Q", "missing_scale")),
    ("early_rounding", {}, {(1, "attention_weights"): _early_rounded_softmax},
     (1, "attention_weights", "early_rounding")),
    ("arithmetic", {}, {(1, "context"): lambda v: v[(1, "attention_weights")] @ v[(1, "V")] + [[0, 0.2, 0, 0],
                                                                                           [0, 0, 0, 0],
                                                                                           [0, 0, 0, 0]]},
     (1, "context", "arithmetic")),
]


def _run(kwargs, plant, written=None, seed=1):
    raw0 = sh.problem(**{"seed": seed, **kwargs})
    raw, _ = sh.student(raw0, plant=plant, written=written)
    return raw0, check(raw)


def _assert_follow_through(report, key):
    m = report.marking
    keys = [s.key for s in m.steps]
    i = keys.index(key)
    before = [m.verdict[k] for k in keys[:i] if m.verdict[k] != "missing"]
    after = [m.verdict[k] for k in keys[i + 1:] if m.verdict[k] != "missing"]
    assert set(before) <= {"correct"}, before
    assert "wrong" not in after, [(k, m.verdict[k]) for k in keys[i + 1:] if m.verdict[k] == "wrong"]
    # a later answer outside the band around the truth is `follows`; if the slip is small enough that every
    # later answer is inside the honest-rounding band (test_worksheet_band.py), they are all `correct`
    outside = [k for k in keys[i + 1:] if m.verdict[k] != "missing"
               and np.any((np.abs(m.given(k).value - m.truth[k]) > m.tol[k] + 1e-9)[m.given(k).mask])]
    assert all(m.verdict[k] == "follows" for k in outside), [(k, m.verdict[k]) for k in outside]
    assert outside or after.count("correct") == len(after)


@pytest.mark.parametrize("name,kwargs,plant,want", CASES, ids=[c[0] for c in CASES])
def test_planted_mistake_is_diagnosed(name, kwargs, plant, want):
    _, report = _run(kwargs, plant)
    fm = report.first_mistake
    assert (fm["layer"], fm["name"], fm["diagnosis"]) == want, fm
    assert report.verdict(want[1], want[0]) == "wrong"
    assert isinstance(fm["explanation"], str) and len(fm["explanation"]) > 60
    _assert_follow_through(report, (want[0], want[1]))


def test_ln_before_residual_post():
    p = _params(sh.problem(seed=1))
    plant = {(1, "residual"): lambda v: v[(0, "H0")] + sh.layer_norm(v[(1, "attention_output")], p["gamma1"],
                                                                        p["beta1"])}
    _, report = _run({}, plant)
    fm = report.first_mistake
    assert (fm["name"], fm["diagnosis"]) == ("residual", "ln_before_residual")
    assert "Post-LN" in fm["explanation"]
    _assert_follow_through(report, (1, "residual"))


def test_ln_after_residual_pre():
    raw = sh.problem(norm="pre", seed=1)
    p = _params(raw)
    plant = {(1, "residual"): lambda v: sh.layer_norm(v[(0, "H0")] + v[(1, "attention_output")], p["gamma1"],
                                                      p["beta1"])}
    _, report = _run({"norm": "pre"}, plant)
    fm = report.first_mistake
    assert (fm["name"], fm["diagnosis"]) == ("residual", "ln_after_residual")
    _assert_follow_through(report, (1, "residual"))


def test_no_residual_in_the_backward():
    raw = sh.problem(backward=True, seed=1)
    _, report = _run({"backward": True}, {(1, "d_H0"): _post_d_H0_no_skip(raw)})
    fm = report.first_mistake
    assert (fm["name"], fm["diagnosis"]) == ("d_H0", "no_residual")
    assert "skip" in fm["explanation"]


def test_a_mistake_in_an_unwritten_step_is_found_at_the_next_written_one():
    """The student skips the scores and forgets the scale: the attention weights are the first wrong answer,
    and the diagnosis says the slip is in the scores they did not write."""
    written = {(1, n) for n in ("Q", "K", "attention_weights", "context", "residual")}
    _, report = _run({}, {(1, "scores"): lambda v: v[(1, "Q")] @ v[(1, "K")].T}, written=written)
    fm = report.first_mistake
    assert (fm["name"], fm["diagnosis"]) == ("attention_weights", "missing_scale")
    assert "scores" in fm["explanation"] and "did not write" in fm["explanation"]
    assert report.verdict("context") == "follows"


def test_softmax_arithmetic_explanation_names_the_row_sum():
    """A row that does not sum to 1 is an arithmetic slip, and the explanation says so."""
    def bad(v):
        A = sh.softmax_rows(v[(1, "scores")])
        A[0] = A[0] * 1.2
        return A
    _, report = _run({}, {(1, "attention_weights"): bad})
    fm = report.first_mistake
    assert fm["diagnosis"] == "arithmetic" and "sums to" in fm["explanation"] and "not 1" in fm["explanation"]


def test_every_code_is_covered():
    from test_worksheet_diagnosis_backward import NEW_CODES_TESTED
    from test_worksheet_followthrough import CODES_TESTED
    covered = {c[3][2] for c in CASES} | {"ln_before_residual", "ln_after_residual", "no_residual"} | NEW_CODES_TESTED
    covered |= CODES_TESTED
    assert covered == set(DIAGNOSES)


@pytest.mark.parametrize("seed", range(3))
def test_no_diagnosis_without_a_mistake(seed):
    raw, _ = sh.student(sh.problem(layers=2, heads=2, backward=True, seed=seed))
    assert check(raw).first_mistake is None
