"""The worksheet format: defaults only for absent keys, and every bad input a WorksheetError naming the key."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import sheet_helpers as sh

from transformer_np.errors import FileFormatError, InputTypeError, WorksheetError
from transformer_np.worksheets import check, load_worksheet
from transformer_np.worksheets.format import LIMITS

GOOD = """[setup]
tokens = ["the", "cat", "sat"]
d_model = 4

[input]
H0 = [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]
"""


def _raw(**changes):
    raw = {"setup": {"tokens": ["the", "cat", "sat"], "d_model": 4},
           "input": {"H0": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]}}
    raw = copy.deepcopy(raw)
    for path, value in changes.items():
        *head, last = path.split("__")
        t = raw
        for h in head:
            t = t.setdefault(h, {})
        if value is _DELETE:
            del t[last]
        else:
            t[last] = value
    return raw


_DELETE = object()


def test_defaults_for_absent_keys_only(tmp_path):
    ws = load_worksheet(_raw())
    assert (ws.n_heads, ws.d_ff, ws.norm, ws.activation, ws.eps, ws.layers, ws.decimals, ws.seed) == \
        (1, 16, "post", "gelu", 1e-12, 1, 2, 0)
    ws = load_worksheet(_raw(setup__d_model=_DELETE))               # d_model from H0's width
    assert ws.d_model == 4
    ws = load_worksheet(_raw(setup__d_ff=8, setup__norm="pre", setup__eps=1e-5, setup__seed=3))
    assert (ws.d_ff, ws.norm, ws.eps, ws.seed) == (8, "pre", 1e-5, 3)
    p = tmp_path / "s.toml"
    p.write_text(GOOD)
    assert load_worksheet(str(p)).source == str(p) and load_worksheet(p).d_model == 4


def test_identity_and_seeded_weights():
    from transformer_np.model.params import init_params
    ws = load_worksheet(_raw(layer1={"W_Q": "identity", "b_1": [0.5] * 16}))
    np.testing.assert_array_equal(ws.params[0]["W_Q"], np.eye(4))   # exact: parsed input
    np.testing.assert_array_equal(ws.params[0]["b_1"], np.full(16, 0.5))   # exact: parsed input
    seeded = init_params(ws.config(), seed=0, init="xavier")
    # exact: the same init_params draws
    np.testing.assert_array_equal(ws.params[0]["W_K"], seeded["layers.0.attn.W_K"])
    assert ws.given_params == [{"W_Q", "b_1"}]


def test_rows_keyed_by_token_for_the_input():
    ws = load_worksheet(_raw(input__H0={"the": [1, 0, 1, 0], "cat": [0, 1, 0, 1], "sat": [1, 1, 0, 0]}))
    np.testing.assert_array_equal(ws.H0, [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]])   # exact: parsed input


BAD = [
    # (changes, words the one-line message must contain)
    ({"setup__d_modle": 4}, ["[setup]", "d_modle", "did you mean 'd_model'"]),
    ({"setpu": {}}, ["setpu", "did you mean 'setup'"]),
    ({"layer1": {"W_q": "identity"}}, ["[layer1]", "W_q", "did you mean 'W_Q'"]),
    ({"answers": {"layer1": {"socres": [[0] * 3] * 3}}}, ["[answers.layer1]", "socres", "did you mean 'scores'"]),
    ({"input__H1": [[0]]}, ["[input]", "H1", "did you mean 'H0'"]),
    ({"input__H0": [[1, 0, 1], [0, 1, 0], [1, 1, 0]]}, ["[input].H0", "expected shape (3, 4)", "got shape (3, 3)"]),
    ({"answers": {"layer1": {"scores": [[1, 0], [0, 1], [1, 1]]}}},
     ["[answers.layer1].scores", "expected shape (3, 3)", "got shape (3, 2)"]),
    ({"layer1": {"W_1": [[0.0] * 4] * 4}}, ["[layer1].W_1", "expected shape (4, 16)", "got shape (4, 4)"]),
    ({"answers": {"layer1": {"attention_weights": {"dog": [0.3, 0.3, 0.4]}}}},
     ["attention_weights.dog", "unknown token 'dog'", "the', 'cat', 'sat"]),
    ({"answers": {"layer1": {"attention_weights": {"teh": [0.3, 0.3, 0.4]}}}}, ["did you mean 'the'"]),
    ({"setup__tokens": ["the", "cat", "the"], "answers": {"layer1": {"Q": {"the": [1, 0, 1, 0]}}}},
     ["Q.the", "appears 2 times", "whole array"]),
    ({"input__H0": [[1, 0, 1, float("nan")], [0, 1, 0, 1], [1, 1, 0, 0]]}, ["[input].H0", "non-finite", "nan"]),
    ({"answers": {"layer1": {"Q": [[float("inf")] * 4] * 3}}}, ["[answers.layer1].Q", "non-finite"]),
    ({"setup__eps": float("inf")}, ["[setup].eps", "positive finite"]),
    ({"setup__eps": 0}, ["[setup].eps", "positive finite"]),
    ({"setup__d_model": LIMITS["d_model"] + 1},
     ["[setup].d_model", f"[1, {LIMITS['d_model']}]", "hand calculation", f"{LIMITS['d_model'] + 1}"]),
    ({"setup__tokens": [f"t{i}" for i in range(LIMITS["tokens"] + 1)]},
     ["[setup].tokens", f"at most {LIMITS['tokens']}", f"{LIMITS['tokens'] + 1}"]),
    ({"setup__layers": LIMITS["layers"] + 1}, ["[setup].layers", f"[1, {LIMITS['layers']}]"]),
    ({"setup__d_ff": LIMITS["d_ff"] + 1}, ["[setup].d_ff", f"[1, {LIMITS['d_ff']}]"]),
    ({"setup__decimals": 9}, ["[setup].decimals", "[0, 8]"]),
    ({"setup__seed": -1}, ["[setup].seed", ">= 0"]),
    ({"setup__d_model": 4.0}, ["[setup].d_model", "must be an integer", "4.0"]),
    ({"setup__layers": True}, ["[setup].layers", "must be an integer"]),
    ({"setup__norm": "postln"}, ["[setup].norm", "did you mean 'post'"]),
    ({"setup__activation": "gleu"}, ["[setup].activation", "did you mean 'gelu'"]),
    ({"setup__tokens": "the cat sat"}, ["[setup].tokens", "array of non-empty strings"]),
    ({"setup__tokens": _DELETE}, ["[setup]", "tokens is required"]),
    ({"setup__n_heads": 3}, ["n_heads", "divisible"]),
    ({"input__H0": _DELETE}, ["[input]", "H0 is required"]),
    ({"input__H0": [[1, 0, 1, 0], [0, 1], [1, 1, 0, 0]]}, ["[input].H0", "expected shape (3, 4)", "[4, 2, 4]"]),
    ({"answers": {"layer1": {"layer_norm_mean": [1, [2, 3], 4]}}}, ["layer_norm_mean", "ragged"]),
    ({"input__H0": [[1, 0, 1, "0"], [0, 1, 0, 1], [1, 1, 0, 0]]}, ["[input].H0", "expected numbers", "'0'"]),
    ({"input__H0": {"the": [1, 0, 1, 0], "cat": [0, 1, 0, 1]}}, ["[input].H0", "every token needs a row", "sat"]),
    ({"layer1": {"W_1": "identity"}}, ["[layer1].W_1", "square", "(4, 16)"]),
    ({"layer1": {"W_Q": "eye"}}, ["[layer1].W_Q", "identity", "'eye'"]),
    ({"layer2": {}}, ["[layer2]", "setup.layers = 1"]),
    ({"answers": {"layer2": {}}}, ["[answers.layer2]", "setup.layers = 1"]),
    ({"answers": {"layer1": {"d_Q": [[0] * 4] * 3}}}, ["d_Q", "upstream gradient", "dH"]),
    ({"setup__n_heads": 2, "answers": {"layer1": {"scores": [[0] * 3] * 3}}},
     ["scores", "n_heads = 2", "scores_head1, scores_head2"]),
    ({"answers": {"layer1": {"scores_head1": [[0] * 3] * 3}}}, ["scores_head1", "one head", "'scores'"]),
    ({"answers": {"layer1": {"layer_norm2": [[0] * 4] * 3}}}, ["layer_norm2", "Post-LN", "H"]),
    ({"answers": {"layer1": {"d_W_Q": {"the": [0, 0, 0, 0]}}}, "input__dH": [[0] * 4] * 3},
     ["d_W_Q", "not one row per token"]),
    ({"answers": {"layer1": {"Q": {}}}}, ["[answers.layer1].Q", "empty table"]),
    ({"answers": {"layer1": 3}}, ["[answers.layer1]", "must be a table"]),
    ({"setup": 3}, ["[setup]", "must be a table"]),
]


@pytest.mark.parametrize("changes,words", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_worksheets_are_refused_with_a_clear_error(changes, words):
    with pytest.raises(WorksheetError) as e:
        check(_raw(**changes))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("<dict>: ")
    for w in words:
        assert w in msg, (w, msg)
    assert isinstance(e.value, FileFormatError) and isinstance(e.value, ValueError)


def test_missing_sections():
    with pytest.raises(WorksheetError, match=r"\[setup\] section is required"):
        check({"input": {"H0": [[1]]}})
    with pytest.raises(WorksheetError, match=r"\[input\] section"):
        check({"setup": {"tokens": ["a"]}})
    with pytest.raises(InputTypeError, match="path to a TOML file or a dict"):
        check(3)


def _write(tmp_path, text, name="w.toml", mode="w"):
    p = tmp_path / name
    if mode == "w":
        p.write_text(text)
    else:
        p.write_bytes(text)
    return str(p)


def test_toml_syntax_error_names_the_line(tmp_path):
    path = _write(tmp_path, GOOD.replace("d_model = 4", "d_model = = 4"))
    with pytest.raises(WorksheetError) as e:
        check(path)
    assert path in str(e.value) and "line 3" in str(e.value) and "not valid TOML" in str(e.value)


def test_toml_nan_and_inf_literals_are_refused(tmp_path):
    path = _write(tmp_path, GOOD.replace("[1, 1, 0, 0]]", "[1, 1, 0, nan]]"))
    with pytest.raises(WorksheetError, match=r"\[input\]\.H0: non-finite number nan\[2\]\[3\]"):
        check(path)
    path = _write(tmp_path, GOOD + "\n[answers.layer1]\nQ = { the = [inf, 0, 0, 0] }\n", "b.toml")
    with pytest.raises(WorksheetError, match=r"Q\.the: non-finite number inf"):
        check(path)


def test_file_problems(tmp_path):
    with pytest.raises(WorksheetError, match="no such worksheet file"):
        check(str(tmp_path / "nope.toml"))
    with pytest.raises(WorksheetError, match="not UTF-8"):
        check(_write(tmp_path, b"\xff\xfe[setup]", mode="b"))
    big = _write(tmp_path, "# " + "x" * (1 << 20) + "\n" + GOOD, "big.toml")
    with pytest.raises(WorksheetError, match="bytes a worksheet file may have"):
        check(big)


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return subprocess.run([sys.executable, "-m", "transformer_np", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_cli_bad_input_is_one_line_with_status_2(tmp_path):
    cases = {
        "syntax": (GOOD.replace("d_model = 4", "d_model = = 4"), "line 3"),
        "unknown key": (GOOD.replace("d_model", "d_modle"), "did you mean 'd_model'"),
        "shape": (GOOD.replace("[1, 1, 0, 0]]", "[1, 1, 0]]"), "expected shape (3, 4), got rows of lengths [4, 4, 3]"),
        "token": (GOOD + "\n[answers.layer1]\nQ = { dog = [1, 0, 1, 0] }\n", "unknown token 'dog'"),
        "size": (GOOD.replace("d_model = 4", "d_model = 400"), "hand calculation"),
    }
    for name, (text, words) in cases.items():
        r = _cli("check", _write(tmp_path, text, f"{name.replace(' ', '_')}.toml"))
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (name, r.stderr)
        assert lines[0].startswith("transformer-np check: error: ") and words in lines[0], (name, lines[0])
    r = _cli("check", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and "no such worksheet file" in r.stderr


def test_a_shape_error_in_a_row_names_the_row():
    with pytest.raises(WorksheetError, match=r"\[input\]\.H0\.cat: expected shape \(4,\), got shape \(3,\)"):
        check(_raw(input__H0={"the": [1, 0, 1, 0], "cat": [0, 1, 0], "sat": [1, 1, 0, 0]}))


def test_d_H0_at_the_top_of_answers():
    raw, _ = sh.student(sh.problem(backward=True), written={(1, "d_H0")})
    d_H0 = raw["answers"].pop("layer1")["d_H0"]
    r = check({**raw, "answers": {"d_H0": d_H0}})
    assert r.verdict("d_H0") == "correct"
    with pytest.raises(WorksheetError, match="given twice"):
        check({**raw, "answers": {"d_H0": d_H0, "layer1": {"d_H0": d_H0}}})


def test_tomli_fallback_and_its_message(monkeypatch, tmp_path):
    """Python 3.10 has no tomllib: the same parser comes from tomli, and without it the error names the fix."""
    import sys as _sys

    from transformer_np.worksheets import tomlio
    path = _write(tmp_path, GOOD)
    monkeypatch.setitem(_sys.modules, "tomllib", None)              # import tomllib now fails
    pytest.importorskip("tomli", reason="pip install tomli")
    assert tomlio._toml_module().__name__ == "tomli"
    assert load_worksheet(path).d_model == 4
    monkeypatch.setitem(_sys.modules, "tomli", None)
    with pytest.raises(ImportError, match="pip install tomli"):
        load_worksheet(path)
