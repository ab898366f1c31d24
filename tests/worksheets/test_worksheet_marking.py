"""Marking: correct sheets are all correct, the tolerance rule, follow-through, the JSON and text contracts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import sheet_helpers as sh

import transformer_np as tnp
from transformer_np.worksheets import check
from transformer_np.worksheets.marking import FLOAT_SLACK, unit

CONFIGS = [(norm, heads, layers, backward) for norm in ("post", "pre") for heads in (1, 2) for layers in (1, 2)
           for backward in (False, True)]


@pytest.mark.parametrize("mode", ["pencil", "spreadsheet"])
@pytest.mark.parametrize("norm,heads,layers,backward", CONFIGS)
def test_correct_sheets_are_all_correct(norm, heads, layers, backward, mode):
    raw, _ = sh.student(sh.problem(norm, heads, layers, backward, seed=layers + 3 * heads), mode=mode)
    report = check(raw)
    v = sh.verdicts(report)
    n_steps = len(v)
    assert n_steps == sum(len(t) for t in raw["answers"].values())
    assert set(v.values()) == {"correct"}, {k: x for k, x in v.items() if x != "correct"}
    assert report.first_mistake is None
    assert {s["layer"] for s in report.steps} == set(range(1, layers + 1))


@pytest.mark.parametrize("decimals", [1, 2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_a_student_writing_some_steps_is_correct(seed, decimals):
    """A student who writes a random half of the steps (rounded) and keeps one more digit in between."""
    raw0 = sh.problem("pre" if seed % 2 else "post", heads=1 + seed % 2, layers=2, backward=True, seed=seed,
                      decimals=decimals)
    _, steps = sh.steps_of(raw0)
    rng = np.random.default_rng(seed)
    written = {s.key for s in steps if rng.random() < (0.1, 0.3, 0.6)[seed % 3]}
    raw, _ = sh.student(raw0, written=written)
    v = sh.verdicts(check(raw))
    assert {k for k, x in v.items() if x != "missing"} == written
    assert all(v[k] == "correct" for k in written), {k: v[k] for k in written if v[k] != "correct"}


def test_tolerance_of_a_step_from_exact_data_is_half_a_unit():
    """Q = H0 W_Q + b_Q reads exact data only: its tolerance is u = 0.005 at 2 decimals, exactly."""
    raw = sh.problem()
    report = check(raw)
    m = report.marking
    Q = np.array(report.steps[0]["expected"])
    assert report.steps[0]["name"] == "Q"
    # exact: exact data propagate no error: the tolerance is u itself
    np.testing.assert_array_equal(m.tol[(1, "Q")], np.full(Q.shape, unit(2)))
    for off, verdict in ((0.0049, "correct"), (-0.0049, "correct"), (0.0051, "wrong"), (-0.0051, "wrong")):
        given = Q.copy()
        given[1, 2] += off
        assert check({**raw, "answers": {"layer1": {"Q": given.tolist()}}}).verdict("Q") == verdict, off


@pytest.mark.parametrize("seed", range(3))
def test_tolerances_are_finite_and_at_least_half_a_unit(seed):
    """Every band is at least u (the answer's own rounding) and finite, on a two-layer forward + backward
    sheet; the band itself is tested in test_worksheet_band.py."""
    raw = sh.problem("post" if seed % 2 else "pre", layers=2, backward=True, seed=seed)
    marked, _ = sh.student(raw)
    m = check(marked).marking
    u = unit(2)
    for key, tol in m.tol.items():
        assert np.all(tol >= u) and np.all(np.isfinite(tol)), key


@pytest.mark.parametrize("norm,heads", [("post", 1), ("pre", 2), ("post", 2)])
def test_careful_students_are_never_marked_wrong(norm, heads):
    """Soundness of the tolerance: students whose unwritten work carries random errors of up to u/10 (one more
    digit than the answers) and who write a random few steps, rounded, are marked correct — 30 students per
    sheet, two layers, forward and backward."""
    from transformer_np.worksheets.steps import DH_KEY, H0_KEY
    raw0 = sh.problem(norm, heads, layers=2, backward=True, seed=heads)
    ws, steps = sh.steps_of(raw0)
    u = unit(ws.decimals)
    rng = np.random.default_rng(0)
    for _ in range(30):
        vals, answers = {H0_KEY: ws.H0, DH_KEY: ws.dH}, {}
        for s in steps:
            v = s.fn(*(vals[k] for k in s.inputs))
            if rng.random() < 0.15:
                v = sh.half_away(v, ws.decimals)
                answers.setdefault(f"layer{s.layer}", {})[s.name] = v.tolist()
            else:
                v = v + rng.uniform(-u / 10, u / 10, size=np.shape(v))
            vals[s.key] = v
        v = sh.verdicts(check({**raw0, "answers": answers}))
        assert all(x in ("correct", "missing") for x in v.values()), {k: x for k, x in v.items() if x == "wrong"}


def test_follow_through_marks_an_early_slip_once():
    """A slip in V (one entry), then everything done right from it: V wrong; every later step built on V
    follows where it differs from the truth beyond its tolerance and is correct where it does not; the
    steps not built on V are correct; the slip is marked once."""
    raw0 = sh.problem("post", layers=1, seed=2)
    raw, _ = sh.student(raw0, plant={(1, "V"): lambda vals: _slip(vals, (1, "V"), raw0, 0.5)})
    report = check(raw)
    m = report.marking
    v = sh.verdicts(report)
    assert v[(1, "V")] == "wrong"
    assert v[(1, "Q")] == v[(1, "K")] == v[(1, "scores")] == v[(1, "attention_weights")] == "correct"
    for s in m.steps[m.steps.index(next(s for s in m.steps if s.name == "context")):]:
        beyond = np.any(np.abs(m.given(s.key).value - m.truth[s.key]) > m.tol[s.key] + FLOAT_SLACK)
        assert v[s.key] == ("follows" if beyond else "correct"), s.name
    assert sum(x == "follows" for x in v.values()) >= 5
    assert list(v.values()).count("wrong") == 1
    fm = report.first_mistake
    assert (fm["layer"], fm["name"], fm["diagnosis"]) == (1, "V", "arithmetic")


def _slip(vals, key, raw, delta):
    ws, steps = sh.steps_of(raw)
    s = next(s for s in steps if s.key == key)
    out = s.fn(*(vals[k] for k in s.inputs)).copy()
    out[0, 1] += delta
    return out


def test_rows_keyed_by_token_are_marked_on_those_rows_only():
    raw0 = sh.problem(seed=6)
    m = check(raw0).marking
    A = m.truth[(1, "attention_weights")]
    good = {"cat": sh.half_away(A[1], 2).tolist()}
    assert check({**raw0, "answers": {"layer1": {"attention_weights": good}}}).verdict("attention_weights") == \
        "correct"
    bad = {"cat": sh.half_away(A[1], 2).tolist(), "sat": (sh.half_away(A[2], 2) + [0.1, -0.1, 0]).tolist()}
    r = check({**raw0, "answers": {"layer1": {"attention_weights": bad}}})
    step = next(s for s in r.steps if s["name"] == "attention_weights")
    assert step["verdict"] == "wrong" and step["given"] == bad
    assert step["max_abs_error"] == pytest.approx(np.max(np.abs(np.array(bad["sat"]) - A[2])))


def test_json_contract(capsys):
    raw, _ = sh.student(sh.problem("pre", backward=True, seed=1),
                        plant={(1, "residual"): lambda vals: vals[(1, "attention_output")]},
                        written={(1, "Q"), (1, "residual"), (1, "layer_norm2"), (1, "H"), (1, "d_H0")})
    d = check(raw).to_dict()
    # issue 36 added (at the end, so older readers are unaffected) the problem id, the flags and each step's
    # diagnosis; "key", "student" and "altered" appear only when marked against a key (test_worksheet_keyed)
    assert list(d) == ["steps", "first_mistake", "marks", "counts", "problem_id", "flags"]
    for s in d["steps"]:
        # issue 44 added "from_yours" at the end (the value from the student's own earlier answers)
        assert list(s) == ["layer", "name", "verdict", "given", "expected", "max_abs_error", "marks", "out_of",
                           "diagnosis", "from_yours"]
        assert (s["diagnosis"] is not None) <= (s["verdict"] == "wrong")
        assert s["verdict"] in ("correct", "follows", "wrong", "missing")
        assert (s["given"] is None) == (s["verdict"] == "missing") == (s["max_abs_error"] is None)
    assert list(d["first_mistake"]) == ["layer", "name", "diagnosis", "explanation"]
    assert list(d["marks"]) == ["awarded", "available", "blank"]
    assert d["first_mistake"]["name"] == "residual" and d["first_mistake"]["diagnosis"] == "no_residual"
    assert json.loads(json.dumps(d)) == d
    names = [(s["layer"], s["name"]) for s in d["steps"]]
    assert (1, "d_H0") in names and names.index((1, "d_H0")) == len(names) - 1


def test_text_report(tmp_path):
    raw, _ = sh.student(sh.problem("post", seed=3), plant={
        (1, "attention_weights"): lambda vals: sh.softmax_rows(vals[(1, "scores")], axis=0)},
        written={(1, n) for n in ("Q", "K", "scores", "attention_weights", "context", "residual", "layer_norm")})
    report = check(raw)
    text = str(report)
    assert "LAYER 1" in text and "FIRST MISTAKE: layer 1, attention_weights — softmax_axis" in text
    A = report.marking.truth[(1, "attention_weights")]
    assert f"{A[0, 0]:.2f}" in text                         # rounded as the worksheet rounds
    assert "follows" in text and "WRONG" in text
    assert "yours" in report.format(full=True)
    key = report.format(key=True)
    assert "(answer key)" in key and "(answer key)" not in text


def test_top_level_check_and_report_helpers():
    raw, _ = sh.student(sh.problem(seed=1))
    r = tnp.check(raw)
    assert r.counts()["correct"] == len(r.steps) and "0 wrong" in repr(r)
    assert r.verdict("H") == "correct"
    with pytest.raises(KeyError):
        r.verdict("H", layer=2)
    assert FLOAT_SLACK < 1e-6
