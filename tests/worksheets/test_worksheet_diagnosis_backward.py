"""The diagnoses of issue 23: backward mistakes, a forgotten bias, a transposed weight, a miscopied number,
LayerNorm before the residual with the statistics written, mistakes in unwritten steps (two heads too),
and no double penalty.

Each mistake is planted in plain NumPy (independently of the diagnosis' own mistake formulas) into two
students: ``plain`` (sheet_helpers: full precision in between, answers rounded) and ``rounded`` (honest:
every number and sub-step rounded to the sheet's decimals). The planted step must be the first mistake,
``wrong``, with the expected code; no step before it is anything but ``correct``, none after it ``wrong``.
"""

from __future__ import annotations

import copy
import math

import honest
import numpy as np
import pytest
import sheet_helpers as sh

from transformer_np.worksheets import check

NEW_CODES_TESTED = {"softmax_jacobian", "ln_stats_constant", "activation_derivative", "missing_bias",
                    "transposed_weight", "miscopied_input"}


def _p(raw, l=1):
    return sh.steps_of(raw)[0].params[l - 1]


def _sd(x):
    return np.sqrt(x.var(axis=1, keepdims=True) + 1e-12)


def _phi_cdf(z):
    return 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))


def _cases():
    """(id, problem kwargs, plant builder raw -> {key: f(values)}, written filter or None, (layer, name, code))."""
    return [
        ("softmax_jacobian A*dA", {"backward": True},
         lambda raw: {(1, "d_scores"): lambda v: v[(1, "attention_weights")] * v[(1, "d_attention_weights")]},
         None, (1, "d_scores", "softmax_jacobian")),
        ("softmax_jacobian dA, 2 heads pre", {"backward": True, "heads": 2, "norm": "pre"},
         lambda raw: {(1, "d_scores_head2"): lambda v: v[(1, "d_attention_weights_head2")] + 0.0},
         None, (1, "d_scores_head2", "softmax_jacobian")),
        ("ln_stats_constant post", {"backward": True},
         lambda raw: {(1, "d_residual2"): lambda v: _p(raw)["gamma2"] * v[(1, "d_H")] / _sd(v[(1, "residual2")])},
         None, (1, "d_residual2", "ln_stats_constant")),
        ("ln_stats_constant pre", {"backward": True, "norm": "pre"},
         lambda raw: {(1, "d_residual"): lambda v: v[(1, "d_residual2")]
                      + _p(raw)["gamma2"] * v[(1, "d_layer_norm2")] / _sd(v[(1, "residual")])},
         None, (1, "d_residual", "ln_stats_constant")),
        ("activation_derivative gelu", {"backward": True, "activation": "gelu"},
         lambda raw: {(1, "d_ffn_hidden"): lambda v: v[(1, "d_ffn_activation")] * _phi_cdf(v[(1, "ffn_hidden")])},
         None, (1, "d_ffn_hidden", "activation_derivative")),
        ("missing_bias Q", {},
         lambda raw: {(1, "Q"): lambda v: np.array(raw["input"]["H0"]) @ _p(raw)["W_Q"]},
         None, (1, "Q", "missing_bias")),
        ("missing_bias ffn_hidden pre", {"norm": "pre"},
         lambda raw: {(1, "ffn_hidden"): lambda v: v[(1, "layer_norm2")] @ _p(raw)["W_1"]},
         None, (1, "ffn_hidden", "missing_bias")),
        ("transposed_weight V", {},
         lambda raw: {(1, "V"): lambda v: np.array(raw["input"]["H0"]) @ _p(raw)["W_V"].T + _p(raw)["b_V"]},
         None, (1, "V", "transposed_weight")),
        ("transposed_weight d_context", {"backward": True},
         lambda raw: {(1, "d_context"): lambda v: v[(1, "d_attention_output")] @ _p(raw)["W_O"]},
         None, (1, "d_context", "transposed_weight")),
    ]


CASES = _cases()


def _plain(kwargs, plant_of, written, seed):
    raw0 = sh.problem(**{"seed": seed, **kwargs})
    raw, _ = sh.student(raw0, plant=plant_of(raw0), written=written)
    return check(raw)


def _rounded(kwargs, plant_of, written, seed, half_even=False):
    raw0 = sh.problem(**{"seed": seed, **kwargs})
    st = honest.Student(raw0, half_even=half_even, plant=plant_of(raw0)).run()
    return check({**raw0, "answers": st.answers(written)})


def assert_first_mistake(report, want):
    fm = report.first_mistake
    assert fm is not None and (fm["layer"], fm["name"], fm["diagnosis"]) == want, fm
    assert report.verdict(want[1], want[0]) == "wrong"
    m = report.marking
    keys = [s.key for s in m.steps]
    i = keys.index(want[:2])
    assert all(m.verdict[k] in ("correct", "missing") for k in keys[:i]), [(k, m.verdict[k]) for k in keys[:i]
                                                                          if m.verdict[k] not in ("correct",
                                                                                                  "missing")]
    assert all(m.verdict[k] != "wrong" for k in keys[i + 1:]), [k for k in keys[i + 1:] if m.verdict[k] == "wrong"]
    assert len(fm["explanation"]) > 60


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("style", ["plain", "rounded"])
@pytest.mark.parametrize("name,kwargs,plant_of,written,want", CASES, ids=[c[0] for c in CASES])
def test_planted_mistake(name, kwargs, plant_of, written, want, style, seed):
    run = _plain if style == "plain" else _rounded
    assert_first_mistake(run(kwargs, plant_of, written, seed), want)


# ----------------------------------------------------------------------------- miscopied input
def _miscopied(raw0, where, idx, value):
    raw = copy.deepcopy(raw0)
    table = raw["input"] if where in ("H0", "dH") else raw["layer1"]
    if where not in table:                         # a seeded weight: write it out first
        table[where] = _p(raw0)[where].tolist()
    arr = np.array(table[where], dtype=float)
    given = float(arr[idx])
    arr[idx] = value
    table[where] = arr.tolist()
    return raw, given


@pytest.mark.parametrize("style", ["plain", "rounded"])
@pytest.mark.parametrize("where,idx,value,kwargs,first", [
    ("H0", (1, 2), 2.5, {}, "Q"),
    ("W_V", (0, 1), 0.9, {}, "V"),
    ("dH", (2, 0), -1.5, {"backward": True, "norm": "pre"}, "d_H"),
    ("b_1", (3,), 2.0, {"norm": "pre"}, "ffn_hidden"),
])
def test_miscopied_input(where, idx, value, kwargs, first, style):
    """The student copies one number wrongly and works everything else right from it: the first step that
    reads it is `wrong`, diagnosed miscopied_input naming the entry, the sheet's value and the value used;
    nothing after it is wrong (a later step that reads the same number again follows)."""
    raw0 = sh.problem(**{"seed": 4, **kwargs})
    bad, given = _miscopied(raw0, where, idx, value)
    if style == "plain":
        answers = sh.student(bad)[0]["answers"]
    else:
        answers = honest.Student(bad).run().answers()
    report = check({**raw0, "answers": answers})
    assert_first_mistake(report, (1, first, "miscopied_input"))
    if where == "H0":                  # the residual adds the student's H0 again: it follows, it is not wrong
        assert report.verdict("residual") == "follows"
    text = report.first_mistake["explanation"]
    assert where in text and f"{given:g}" in text and f"{value:g}" in text, text


# ----------------------------------------------------------------------------- LayerNorm before the residual
@pytest.mark.parametrize("style", ["plain", "rounded"])
@pytest.mark.parametrize("stats", [True, False])
def test_ln_before_residual_with_or_without_statistics(stats, style):
    """Post-LN worked as x + LN(attention_output): with the statistics written (they are those of
    attention_output alone) the first mistake is the mean; without, the LayerNorm output. Either way the
    diagnosis is ln_before_residual (not no_residual), and nothing after is wrong."""
    raw0 = sh.problem(seed=5)
    p = _p(raw0)
    H0 = np.array(raw0["input"]["H0"])

    def mean(v):
        return v[(1, "attention_output")].mean(axis=1)

    def var(v):
        return ((v[(1, "attention_output")] - v[(1, "layer_norm_mean")][:, None]) ** 2).mean(axis=1)

    def ln(v):
        if stats:
            mu, s2 = v[(1, "layer_norm_mean")][:, None], v[(1, "layer_norm_var")][:, None]
        else:
            ao = v[(1, "attention_output")]
            mu, s2 = ao.mean(axis=1, keepdims=True), ao.var(axis=1, keepdims=True)
        return H0 + p["gamma1"] * (v[(1, "attention_output")] - mu) / np.sqrt(s2 + 1e-12) + p["beta1"]

    plant = {(1, "layer_norm_mean"): mean, (1, "layer_norm_var"): var, (1, "layer_norm"): ln}
    _, steps = sh.steps_of(raw0)
    skip = {(1, "residual")} | (set() if stats else {(1, "layer_norm_mean"), (1, "layer_norm_var")})
    written = {s.key for s in steps} - skip
    if style == "plain":
        raw, _ = sh.student(raw0, plant=plant, written=written)
    else:
        raw = {**raw0, "answers": honest.Student(raw0, plant=plant).run().answers(written)}
    report = check(raw)
    assert_first_mistake(report, (1, "layer_norm_mean" if stats else "layer_norm", "ln_before_residual"))


# ----------------------------------------------------------------------------- unwritten steps, two heads
@pytest.mark.parametrize("style", ["plain", "rounded"])
@pytest.mark.parametrize("code", ["missing_scale", "transposed_scores", "wrong_scale"])
def test_two_heads_mistake_in_unwritten_scores(code, style):
    """Two heads, the scores not written, the weights written: the mistake in head 2's scores is found at
    head 2's attention weights, and the explanation names the unwritten scores_head2."""
    kwargs = {"heads": 2, "d": 8, "seed": 3}
    raw0 = sh.problem(**kwargs)

    def s2(v):
        Q, K = v[(1, "Q")][:, 4:], v[(1, "K")][:, 4:]
        return {"missing_scale": Q @ K.T, "transposed_scores": (K @ Q.T) / 2.0, "wrong_scale": Q @ K.T / 4}[code]

    plant = {(1, "scores_head2"): s2}
    _, steps = sh.steps_of(raw0)
    written = {s.key for s in steps} - {(1, "scores_head1"), (1, "scores_head2")}
    if style == "plain":
        raw, _ = sh.student(raw0, plant=plant, written=written)
    else:
        raw = {**raw0, "answers": honest.Student(raw0, plant=plant).run().answers(written)}
    report = check(raw)
    assert_first_mistake(report, (1, "attention_weights_head2", code))
    text = report.first_mistake["explanation"]
    assert "scores_head2" in text and "did not write" in text, text


@pytest.mark.parametrize("style", ["plain", "rounded"])
def test_no_double_penalty_for_a_mistake_in_an_unwritten_step(style):
    """Pre-LN, the residual not written and computed without the skip (attention_output alone); the
    LayerNorm-2 mean is the first wrong answer (no_residual, in the unwritten residual). residual2 =
    residual + ffn_output reads the student's own residual again: it must be `follows`, not `wrong`."""
    raw0 = sh.problem(norm="pre", seed=2)
    plant = {(1, "residual"): lambda v: v[(1, "attention_output")] + 0.0}
    _, steps = sh.steps_of(raw0)
    written = {s.key for s in steps} - {(1, "residual")}
    if style == "plain":
        raw, _ = sh.student(raw0, plant=plant, written=written)
    else:
        raw = {**raw0, "answers": honest.Student(raw0, plant=plant).run().answers(written)}
    report = check(raw)
    assert_first_mistake(report, (1, "layer_norm2_mean", "no_residual"))
    assert report.verdict("residual2") == "follows"
    assert "residual" in report.first_mistake["explanation"]
