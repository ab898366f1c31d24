"""``worksheet new``: fresh problems for hand calculation, a student sheet, an answer key."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from transformer_np.errors import InputValueError
from transformer_np.worksheets import check, load_worksheet
from transformer_np.worksheets import generate as gen
from transformer_np.worksheets.generate import (
    MIN_VARIANCE,
    answer_key,
    key_markdown,
    new_worksheet,
    student_markdown,
    to_toml,
    write_worksheet,
)
from transformer_np.worksheets.tomlio import parse_toml

VARIANTS = [dict(), dict(heads=2), dict(norm="pre"), dict(backward=True), dict(norm="pre", backward=True, heads=2),
            dict(layers=2, backward=True), dict(tokens=4, d_model=8, heads=2), dict(activation="gelu", d_ff=6)]


@pytest.mark.parametrize("kwargs", VARIANTS, ids=[str(v) for v in VARIANTS])
def test_each_new_sheet_checked_with_its_own_key_is_all_correct(kwargs):
    for seed in range(6):
        raw = new_worksheet(seed=seed, **kwargs)
        report = check({**raw, "answers": answer_key(raw)})
        verdicts = {s["verdict"] for s in report.steps}
        assert verdicts == {"correct"}, (seed, report.counts())
        assert report.first_mistake is None


def test_the_written_key_checks_all_correct_and_the_problem_all_missing(tmp_path):
    for seed in range(10):
        raw = new_worksheet(seed=seed, backward=seed % 2 == 1, norm=("post", "pre")[seed % 3 == 0])
        paths = write_worksheet(raw, str(tmp_path), f"s{seed}")
        assert [os.path.basename(p) for p in paths] == [f"s{seed}.toml", f"s{seed}_student.md", f"s{seed}_key.md",
                                                        f"s{seed}_key.toml"]
        assert {s["verdict"] for s in check(paths[3]).steps} == {"correct"}
        assert {s["verdict"] for s in check(paths[0]).steps} == {"missing"}


def test_different_seeds_give_different_problems_and_a_seed_gives_the_same_one():
    texts = [to_toml(new_worksheet(seed=s)) for s in range(12)]
    assert len(set(texts)) == 12
    assert to_toml(new_worksheet(seed=5)) == texts[5]


@pytest.mark.parametrize("kwargs", [dict(), dict(norm="pre", heads=2, layers=2)])
def test_numbers_are_chosen_for_hand_calculation(kwargs):
    for seed in range(8):
        raw = new_worksheet(seed=seed, **kwargs)
        H0 = np.array(raw["input"]["H0"])
        assert set(np.unique(H0)) <= {0.0, 1.0} and len({tuple(r) for r in H0}) == len(H0)
        for l in range(1, raw["setup"]["layers"] + 1):
            p = {k: np.array(v) for k, v in raw[f"layer{l}"].items()}
            for w in ("W_1", "W_2"):
                assert set(np.unique(p[w])) <= {-1.0, -0.5, 0.0, 0.5, 1.0}
            # b_1 on the half-grid, or (after ten failed draws of the layer) off it, so no pre-activation is 0
            b1 = set(np.unique(p["b_1"]))
            assert b1 <= {-0.5, 0.0, 0.5} or b1 <= {-0.75, -0.25, 0.25, 0.75}
            for w in ("W_Q", "W_K", "W_V"):
                assert set(np.unique(p[w])) <= {0.0, 1.0} and np.all(p[w].sum(axis=0) == 1)
            np.testing.assert_array_equal(p["W_O"], np.eye(len(p["W_O"])))   # exact: generated small numbers, parsed
        m = check(raw).marking
        dk = m.worksheet.d_k
        for s in m.steps:
            x = m.truth[s.key]
            if s.name.startswith("scores"):
                widen = (gen._LAYER_DRAWS - 1) // gen._WIDEN_EVERY     # the most the search may widen the bound
                assert np.abs(x).max() <= max(2.0 if s.layer == 1 else 3.0, np.sqrt(dk)) + widen + 1e-9
            if s.name.endswith("_var"):
                assert x.min() >= MIN_VARIANCE
            if s.name == "ffn_hidden":
                assert np.abs(x).min() >= 0.05                       # ReLU (the default) clear of its kink


def test_post_ln_layer_one_scores_are_multiples_of_one_over_sqrt_dk():
    for seed in range(5):
        m = check(new_worksheet(seed=seed)).marking
        S = m.truth[(1, "scores")] * 2                                # d_k = 4
        np.testing.assert_allclose(S, np.round(S), atol=1e-12)


def test_markdown_sheets():
    raw = new_worksheet(seed=3, backward=True)
    ws = load_worksheet(raw)
    student, key = student_markdown(raw), key_markdown(raw)
    n_steps = len(check(raw).steps)
    assert student.count("### ") == key.count("### ") == n_steps
    steps_part = student.split("## Steps")[1]
    assert not re.search(r"\d\.\d\d", steps_part)                     # blanks: no numbers in the step tables
    answers = answer_key(raw)
    A = np.array(answers["layer1"]["attention_weights"])
    row = "| **" + ws.tokens[0] + "** | " + " | ".join(f"{x:.2f}" for x in A[0]) + " |"
    assert row in key
    for name in ("H0", "dH", "W_Q", "W_1"):
        assert name in student


def test_toml_round_trip():
    raw = new_worksheet(seed=2, heads=2, norm="pre", backward=True)
    text = to_toml(raw)
    back = parse_toml(text, "<text>")
    a, b = load_worksheet(raw), load_worksheet(back)
    np.testing.assert_array_equal(a.H0, b.H0)   # exact: a TOML round trip
    np.testing.assert_array_equal(a.dH, b.dH)   # exact: a TOML round trip
    for pa, pb in zip(a.params, b.params):
        assert pa.keys() == pb.keys()
        for k in pa:
            np.testing.assert_array_equal(pa[k], pb[k])   # exact: a TOML round trip
    assert '"identity"' in text                                      # W_O written as the identity
    for name in ("scores_head1", "scores_head2", "layer_norm2", "d_H0"):
        assert f"# {name} = ..." in text


def test_write_refuses_to_overwrite(tmp_path):
    raw = new_worksheet(seed=1)
    write_worksheet(raw, str(tmp_path))
    with pytest.raises(InputValueError, match="already exists"):
        write_worksheet(raw, str(tmp_path))
    assert len(write_worksheet(raw, str(tmp_path), force=True)) == 4


@pytest.mark.parametrize("kwargs,word", [(dict(heads=3), "divisible"), (dict(tokens=1), "tokens"),
                                         (dict(tokens=17), "tokens"), (dict(d_model=65), "d_model"),
                                         (dict(layers=0), "layers"), (dict(norm="mid"), "norm"),
                                         (dict(activation="tanh"), "activation"), (dict(seed=-2), "seed"),
                                         (dict(d_ff=1000), "d_ff"), (dict(decimals=0), "decimals")])
def test_bad_arguments(kwargs, word):
    with pytest.raises(InputValueError, match=word):
        new_worksheet(**kwargs)


def _cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return subprocess.run([sys.executable, "-m", "transformer_np", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=cwd)


def test_cli_worksheet_new(tmp_path):
    r = _cli("worksheet", "new", "--tokens", "4", "--d-model", "4", "--heads", "2", "--norm", "pre", "--backward",
             "--seed", "7", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    paths = r.stdout.split()
    assert len(paths) == 4 and all(os.path.isfile(p) for p in paths)
    ws = load_worksheet(paths[0])
    assert (ws.n, ws.d_model, ws.n_heads, ws.norm, ws.backward, ws.seed) == (4, 4, 2, "pre", True, 7)
    r = _cli("check", paths[3], "--json")
    d = json.loads(r.stdout)        # the key marks all correct: exit 0, no step wrong, no first mistake
    assert r.returncode == 0 and d["counts"]["wrong"] == 0 and d["first_mistake"] is None
    r = _cli("worksheet", "new", "--seed", "7", "--out", str(tmp_path), "--tokens", "4", "--heads", "2")
    assert r.returncode == 2 and "already exists" in r.stderr
    for bad in (["--heads", "3"], ["--tokens", "0"], ["--d-model", "100"], ["--norm", "mid"]):
        r = _cli("worksheet", "new", "--out", str(tmp_path), *bad)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (bad, r.stderr)
    r = _cli("worksheet")
    assert r.returncode == 2 and "ACTION" in r.stderr


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_the_sheet_writes_out_the_layernorm_backward(norm):
    """The two LayerNorm backward steps — the hardest by hand — carry their formula on the student sheet, with x̂ and
    σ defined there (the sheet said only "LayerNorm backward of d_H at residual2"), as the page shows it."""
    from transformer_np.worksheets.generate import new_worksheet, student_markdown

    sheet = student_markdown(new_worksheet(seed=3, backward=True, norm=norm))
    heads = [line for line in sheet.splitlines() if line.startswith("### ") and "x̂" in line]
    assert len([h for h in heads if "mean(g ⊙ x̂)) / σ" in h]) == 2, heads         # both LayerNorms of the layer
    assert all("σ = √(var + ε)" in h for h in heads if "mean(g ⊙ x̂)" in h)
    assert "LayerNorm backward of" not in sheet and "LN-normalised" not in sheet
