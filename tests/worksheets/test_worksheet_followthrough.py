"""Issue 36, item 3: follow-through as an examiner gives it. ``follows`` only where the student's own earlier
numbers do not trivialise the step (all zeros, a constant row, the identity where the truth is not, or a value
that is the same for any input); otherwise ``wrong``, diagnosed ``trivialised``. Honest follow-through (a real
mistake carried on) keeps its marks."""

from __future__ import annotations

import numpy as np
import sheet_helpers as sh

from transformer_np.worksheets import check, new_worksheet

CODES_TESTED = {"trivialised"}


def _zeros(v):
    return np.zeros((3, 4))


def _by_name(report) -> dict:
    return {s["name"]: s for s in report.steps if s["layer"] == 1}


def test_q_k_v_of_zeros_earn_no_follow_through():
    """Issue 36: Q = K = V = 0, carried on from those zeros, earned 15 of 18 marks. The scores (from Q, K of
    zeros), the attention weights (from scores of zeros), the context (uniform rows, V of zeros), the attention
    output and the residual (adding zeros) are `wrong`, trivialised; from the residual on (= H0, not trivial)
    the work is real and follows."""
    raw = new_worksheet(seed=4)
    report = check(sh.student(raw, plant={(1, n): _zeros for n in "QKV"})[0])
    steps = _by_name(report)
    trivial = ("scores", "attention_weights", "context", "attention_output", "residual")
    for name in trivial:
        assert steps[name]["verdict"] == "wrong", name
        assert steps[name]["diagnosis"] == "trivialised", name
    follows = [n for n, s in steps.items() if s["verdict"] == "follows"]
    assert follows and all(list(steps).index(n) > list(steps).index("residual") for n in follows)
    assert report.marks["awarded"] == len(follows) < 15
    assert report.first_mistake["name"] == "Q"
    assert "all zeros" in report.marking.trivial[(1, "scores")]


def test_attention_weights_of_the_identity_earn_no_follow_through():
    """A = I (each token attends only to itself) makes the context a copy of V: trivialised."""
    raw = sh.problem(seed=2)
    report = check(sh.student(raw, plant={(1, "attention_weights"): lambda v: np.eye(3)})[0])
    steps = _by_name(report)
    assert steps["attention_weights"]["verdict"] == "wrong"
    assert steps["context"]["verdict"] == "wrong" and steps["context"]["diagnosis"] == "trivialised"
    assert "identity" in report.marking.trivial[(1, "context")]


def test_a_step_that_is_the_same_for_any_input_earns_no_follow_through():
    """ffn_hidden written all negative: ReLU gives zeros whatever the numbers, so ffn_activation is trivialised
    (the true pre-activations are not all negative: there it is real work)."""
    raw = sh.problem(seed=3, activation="relu")
    def negative(v):
        z = v[(1, "layer_norm")] @ sh.steps_of(raw)[0].params[0]["W_1"] + sh.steps_of(raw)[0].params[0]["b_1"]
        return -np.abs(z) - 0.5
    report = check(sh.student(raw, plant={(1, "ffn_hidden"): negative})[0])
    steps = _by_name(report)
    assert steps["ffn_hidden"]["verdict"] == "wrong"
    assert steps["ffn_activation"]["verdict"] == "wrong" and steps["ffn_activation"]["diagnosis"] == "trivialised"
    assert "whatever ffn_hidden is" in report.marking.trivial[(1, "ffn_activation")]


def test_real_follow_through_keeps_its_marks():
    """A real mistake (the softmax down the columns) carried on honestly: every later step follows, none is
    trivialised."""
    raw = sh.problem(seed=1)
    plant = {(1, "attention_weights"): lambda v: sh.softmax_rows(v[(1, "scores")], axis=0)}
    report = check(sh.student(raw, plant=plant)[0])
    steps = _by_name(report)
    assert steps["attention_weights"]["verdict"] == "wrong"
    after = list(steps)[list(steps).index("attention_weights") + 1:]
    assert all(steps[n]["verdict"] in ("follows", "correct") for n in after)
    assert not report.marking.trivial


def test_the_table_shows_a_trivialised_step_against_the_truth():
    """Its error and tolerance (the decisive entry) are against the true value, where it is outside the band."""
    raw = new_worksheet(seed=4)
    report = check(sh.student(raw, plant={(1, n): _zeros for n in "QKV"})[0])
    m = report.marking
    for key in m.trivial:
        err, band = m.decisive(key)
        assert err > band, key
    assert "trivialised" in report.format()
