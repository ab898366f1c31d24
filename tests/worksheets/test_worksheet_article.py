"""The article's worked example as a worksheet: the article's printed numbers as the answers, checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from transformer_np.course import trace as tr
from transformer_np.worksheets import check, example_path, load_worksheet

# the trace's printed figures -> the worksheet quantity (layer 1) and the token row that holds it
FIGURE_TO_STEP = {"attention_weights[the]": "attention_weights", "attention_output[the]": "attention_output",
                  "residual[the]": "residual", "mean(residual[the])": "layer_norm_mean", "scores": "scores"}


@pytest.fixture(scope="module")
def report():
    return check(example_path("the_cat_sat"))


@pytest.fixture(scope="module")
def trace():
    return tr.run_trace()


def test_the_sheet_is_the_traces_problem(trace):
    ws = load_worksheet(example_path())
    assert list(ws.tokens) == trace["tokens"]
    np.testing.assert_array_equal(ws.H0, trace["H0"])   # exact: parsed input, copied
    P = ws.library_params()
    assert set(P) == set(trace["params"])
    for k, v in trace["params"].items():
        np.testing.assert_array_equal(P[k], v, err_msg=k)   # exact: the same seeded draws or parsed values
    cfg, tcfg = ws.config(), trace["config"]
    for f in ("n_layers", "d_model", "n_heads", "d_ff", "activation", "norm_position", "layer_norm_eps"):
        assert getattr(cfg, f) == getattr(tcfg, f), f


def test_the_answers_are_the_articles_printed_numbers():
    ws = load_worksheet(example_path())
    figs = {k: np.asarray(v, float) for k, _, v, _ in tr.ARTICLE_FIGURES}
    for fig, name in FIGURE_TO_STEP.items():
        a = ws.answers[(1, name)]
        given = a.value if fig == "scores" else a.value[0]
        np.testing.assert_array_equal(given, figs[fig], err_msg=fig)   # exact: parsed numbers
        assert a.mask.all() if fig == "scores" else (a.mask[0].all() and not a.mask[1:].any())


def test_the_computed_values_are_the_traces(report, trace):
    m = report.marking
    for l, layer in enumerate(trace["layers"], 1):
        for name in ("scores", "attention_weights", "attention_output", "residual", "layer_norm", "ffn_output", "H"):
            np.testing.assert_allclose(m.truth[(l, name)], layer[name], rtol=0, atol=1e-12)


def test_check_gives_exactly_the_four_errata(report, trace):
    answered = {s["name"]: s["verdict"] for s in report.steps if s["verdict"] != "missing"}
    assert answered == {"scores": "correct", "attention_weights": "wrong", "attention_output": "follows",
                        "residual": "follows", "layer_norm_mean": "wrong"}
    errata = {FIGURE_TO_STEP[e["quantity"]]: e for e in trace["errata"]}
    assert set(errata) == {n for n, v in answered.items() if v != "correct"}
    for name, e in errata.items():            # follows <=> the article's figure follows from its own premise
        assert (answered[name] == "follows") == bool(e["consistent_with_article_premise"]), name
    assert all(s["layer"] == 1 for s in report.steps if s["verdict"] != "missing")


def test_the_softmax_row_is_an_arithmetic_slip(report):
    fm = report.first_mistake
    assert (fm["layer"], fm["name"], fm["diagnosis"]) == (1, "attention_weights", "arithmetic")
    assert "sums to 1.00" in fm["explanation"] and "e^0.50 = 1.65" in fm["explanation"]


def test_cli_check_on_the_example():
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(tr.__file__))))
    p = subprocess.run([sys.executable, "-m", "transformer_np", "check", example_path(), "--json"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 1, p.stderr          # the article's numbers have two wrong steps: exit status 1
    d = json.loads(p.stdout)
    assert d["first_mistake"]["diagnosis"] == "arithmetic"
    assert sum(s["verdict"] in ("wrong", "follows") for s in d["steps"]) == 4
    p = subprocess.run([sys.executable, "-m", "transformer_np", "check", "example"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 1 and "FIRST MISTAKE: layer 1, attention_weights — arithmetic" in p.stdout


def test_the_example_ships_as_package_data():
    path = example_path()
    assert os.path.isfile(path) and path.endswith(os.path.join("worksheets", "examples", "the_cat_sat.toml"))
    with pytest.raises(ValueError, match="name"):
        example_path("nope")
