"""Issue 44, item 4 without a browser: ``[setup] reveal = false`` keeps correct values out of ``check`` and the
page; the page's formulas in the headings' Unicode notation with every symbol defined; wrong cells and what a
``follows`` step follows from; numbers that cannot be stored as written refused naming the cell; the browser
opened through a file only the user can read."""

from __future__ import annotations

import json
import os
import re
import stat

import numpy as np
import pytest
import serve_helpers as sh
import sheet_helpers

from transformer_np.cli import main
from transformer_np.errors import WorksheetError
from transformer_np.worksheets import check
from transformer_np.worksheets.generate import new_worksheet, to_toml
from transformer_np.worksheets.serve_page import formula_html, page_report, page_state
from transformer_np.worksheets.serve_save import problem_fingerprint, read_sheet_text, save_answers, toml_number


def _slipped(tmp_path, reveal: bool | None, plant: str = "ffn_hidden"):
    """A sheet with every step answered honestly but one cell of step ``plant`` off by 0.5 (a cell whose correct
    value, as the sheet rounds it, is written nowhere else on the honest sheet); the later steps worked from
    it. Returns (path, that correct value as written, the step's name)."""
    raw = new_worksheet(seed=7, tokens=3, d_model=4, activation="relu", decimals=3)
    if reveal is not None:
        raw["setup"]["reveal"] = reveal
    ws, steps = sheet_helpers.steps_of(raw)
    step = next(s for s in steps if s.name == plant)
    honest_raw, vals = sheet_helpers.student(raw)
    text = to_toml(honest_raw, answers=honest_raw["answers"], template=False)
    written = sheet_helpers.half_away(vals[step.key], 3)
    cell = next(ix for ix, x in np.ndenumerate(written) if text.count(f"{x:.3f}") == 1 and abs(x) > 0.2)

    def slip(v_in):
        v = step.fn(*(v_in[k] for k in step.inputs)).copy()
        v[cell] += 0.5
        return v

    answered, _ = sheet_helpers.student(raw, plant={step.key: slip})
    path = tmp_path / f"sheet_{reveal}.toml"
    path.write_text(to_toml(answered, answers=answered["answers"], template=False), encoding="utf-8")
    return str(path), f"{written[cell]:.3f}", step.name, cell


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_reveal_off_no_correct_value_in_check(tmp_path, capsys):
    path, correct, name, cell = _slipped(tmp_path, reveal=False)
    code, text, _ = _run(capsys, "check", path)
    assert code == 1 and f"FIRST MISTAKE: layer 1, {name}" in text
    assert correct not in text and "reveal = false" in text
    code, out, _ = _run(capsys, "check", path, "--json")
    d = json.loads(out)
    assert all(s["expected"] is None and s["max_abs_error"] is None for s in d["steps"])
    assert correct not in out and d["reveal"] is False
    # the same sheet revealing: the correct value is there (this test can fail)
    on, correct_on, _, _ = _slipped(tmp_path, reveal=None)
    assert correct_on == correct
    _, text_on, _ = _run(capsys, "check", on)
    assert correct in text_on
    _, text_key, _ = _run(capsys, "check", path, "--answers")          # the instructor's explicit request
    assert correct in text_key


def test_reveal_off_no_correct_value_on_the_page(tmp_path):
    path, correct, name, cell = _slipped(tmp_path, reveal=False)
    state = page_state(path)
    assert correct not in json.dumps(state["report"]) and correct not in json.dumps(state["steps"])
    fm = state["report"]["first_mistake"]
    assert fm["name"] == name and not re.search(r"\d\.\d\d\d", fm["explanation"])
    on, _, _, _ = _slipped(tmp_path, reveal=None)
    assert correct in json.dumps(page_state(on)["report"]), "revealing, the explanation quotes the correct value"


def test_the_keys_setting_decides(tmp_path, capsys):
    """A submission that says reveal = true, marked against a key that says false: nothing revealed, and the
    edit is not a change of the problem."""
    from transformer_np.worksheets.generate import answer_key

    sub, correct, name, _ = _slipped(tmp_path, reveal=True)
    raw = new_worksheet(seed=7, tokens=3, d_model=4, activation="relu", decimals=3)
    raw["setup"]["reveal"] = False
    key = tmp_path / "key.toml"
    key.write_text(to_toml(raw, answers=answer_key(raw), key=True), encoding="utf-8")
    code, text, _ = _run(capsys, "check", "--key", key, sub)
    assert code == 1 and f"FIRST MISTAKE: layer 1, {name}" in text and "PROBLEM ALTERED" not in text
    assert correct not in text
    _, text_own, _ = _run(capsys, "check", sub)                  # the student's own setting, without the key
    assert correct in text_own


def test_worksheet_class_writes_reveal_false(tmp_path, capsys):
    roster = tmp_path / "r.csv"
    roster.write_text("id\nst-1\n", encoding="utf-8")
    assert _run(capsys, "worksheet", "class", "--roster", roster, "--out", tmp_path / "c")[0] == 0
    for f in (tmp_path / "c" / "students" / "st-1.toml", tmp_path / "c" / "keys" / "st-1_key.toml"):
        assert "reveal = false" in f.read_text(encoding="utf-8"), f
    assert _run(capsys, "worksheet", "class", "--roster", roster, "--out", tmp_path / "d", "--reveal")[0] == 0
    assert "reveal = true" in (tmp_path / "d" / "students" / "st-1.toml").read_text(encoding="utf-8")


def test_reveal_must_be_a_boolean(tmp_path, capsys):
    p = tmp_path / "s.toml"
    p.write_text(to_toml(new_worksheet(seed=1)).replace("[setup]\n", "[setup]\nreveal = \"no\"\n"),
                 encoding="utf-8")
    code, _, err = _run(capsys, "check", p)
    assert code == 2 and "[setup].reveal" in err and "true or false" in err


def test_wrong_cells_and_follows_from(tmp_path):
    path, _, name, cell = _slipped(tmp_path, reveal=False)
    rep = page_report(check(path))
    by = {s["name"]: s for s in rep["steps"]}
    cells = np.array(by[name]["wrong_cells"])
    assert by[name]["verdict"] == "wrong" and cells[cell] and cells.sum() == 1, cells
    after = [s for s in rep["steps"] if s["verdict"] == "follows"]
    assert after and all(s["follows_from"] for s in after)
    # residual2 = layer_norm + ffn_output: only ffn_output carries the slip (layer_norm is correct)
    assert by["layer_norm"]["verdict"] == "correct"
    assert by["residual2"]["verdict"] == "follows" and by["residual2"]["follows_from"] == "ffn_output"
    assert by["Q"]["wrong_cells"] is None and by["Q"]["follows_from"] is None


def test_formulas_in_unicode_notation_every_symbol_defined(tmp_path):
    assert formula_html("Q K^T / sqrt(d_k)   (d_k = 4)") == "Q Kᵀ / √dₖ   (dₖ = 4)"
    assert formula_html("H^(0) W_Q + b_Q") == "H⁽⁰⁾ W<sub>Q</sub> + b<sub>Q</sub>"
    assert formula_html("d_ffn_activation * relu'(ffn_hidden)") == "d_ffn_activation ⊙ relu′(ffn_hidden)"
    ln = formula_html("LayerNorm backward of d_H at residual2")
    assert "x̂" in ln and "σ = √(var + ε)" in ln and "γ<sub>2</sub>" in ln
    pre = formula_html("d_residual2 + LayerNorm backward of d_layer_norm2 at residual")     # Pre-LN's second LN
    assert "g = γ<sub>2</sub> ⊙ d_layer_norm2" in pre and "x̂ = (residual − μ) / σ" in pre
    first = formula_html("d_residual + LayerNorm backward of d_layer_norm at H^(1)")
    assert "g = γ<sub>1</sub> ⊙ d_layer_norm" in first and "x̂ = (H⁽¹⁾ − μ) / σ" in first
    assert formula_html("d_context V^T (head 1's columns)") == "d_context Vᵀ (head 1&#x27;s columns)"
    for k, (act, norm) in enumerate((("relu", "post"), ("gelu", "pre"), ("gelu_tanh", "post"))):
        p = sh.sheet(tmp_path, seed=2 + k, backward=True, activation=act, norm=norm, heads=2)
        state = page_state(p)
        defined = [x["symbol_html"] for x in state["symbols"]]
        for s in state["steps"]:
            f = s["formula_html"]
            assert not re.search(r"\^T|sqrt|d_k|[a-z]'|LayerNorm backward|LN-normalised", f), (s["name"], f)
        used = " ".join(s["formula_html"] for s in state["steps"])
        assert f"{act}′" in used and f"{act}′" in defined and act in defined
        for sym in ("x̂", "σ", "μ", "⊙", "dₖ"):
            assert sym in used and any(sym in d for d in defined), sym
        assert "Xᵀ" in defined and "ᵀ" in used
        assert not any(d in defined for a in ("relu", "gelu", "gelu_tanh") if a != act for d in (a, f"{a}′"))


def test_explanations_in_the_pages_notation():
    from transformer_np.worksheets.serve_page import unicode_text

    assert unicode_text("S[i, j] must be query i against key j (Q K^T), not 1/sqrt(d_k)") == \
        "S[i, j] must be query i against key j (Q Kᵀ), not 1/√dₖ"
    assert unicode_text("dx = (g - mean(g) - xhat * mean(g * xhat)) / sqrt(var + eps)") == \
        "dx = (g - mean(g) - x̂ ⊙ mean(g ⊙ x̂)) / √(var + ε)"
    assert unicode_text("GELU'(z) = Phi(z) + z phi(z)") == "GELU′(z) = Φ(z) + z φ(z)"


@pytest.mark.parametrize("cell, words", [("1e-400", "would be read as 0.0"),
                                         ("123456789012345678901234", "beyond"),
                                         ("-0.0000e-500", None)])
def test_unstorable_numbers_refused_naming_the_cell(tmp_path, cell, words):
    if words is None:                                  # a zero written as zero is a zero
        assert toml_number(cell) == "-0.0000e-500"      # the digits as typed
        return
    with pytest.raises(ValueError, match=words):
        toml_number(cell)
    p = sh.sheet(tmp_path, seed=3)
    _, _, raw = read_sheet_text(p)
    before = open(p, encoding="utf-8").read()
    with pytest.raises(WorksheetError, match=r"answers\.layer1\.Q\[0\]\[1\]") as e:
        save_answers(p, {"layer1": {"Q": [["0.1", cell, "0.3", "0.4"], ["", "", "", ""], ["", "", "", ""]]}},
                     problem_fingerprint(raw))
    assert words in str(e.value)
    assert open(p, encoding="utf-8").read() == before


def test_browser_opened_through_a_private_file(tmp_path, monkeypatch):
    import webbrowser

    from transformer_np.worksheets import serve as serve_mod

    opened = []
    monkeypatch.setattr(webbrowser, "open", lambda url, *a, **k: opened.append(url))
    p = sh.sheet(tmp_path, seed=4)
    seen = {}

    def fake_run(self, idle_timeout, log=None):
        import time
        for _ in range(100):
            if opened:
                break
            time.sleep(0.02)
        path = opened[0].removeprefix("file://")
        seen["mode"] = stat.S_IMODE(os.stat(path).st_mode)
        seen["dir"] = stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)
        seen["text"] = open(path, encoding="utf-8").read()
        seen["token"] = self.token
        seen["path"] = path
        self.server_close()
        return "idle"

    monkeypatch.setattr(serve_mod.SheetServer, "run", fake_run)
    serve_mod.serve(p, open_browser=True, out=open(os.devnull, "w"))
    assert opened[0].startswith("file://") and seen["token"] not in opened[0]
    assert seen["mode"] == 0o600 and seen["dir"] == 0o700
    assert seen["token"] in seen["text"]
    assert not os.path.exists(seen["path"]), "the redirect file is removed when the server stops"


@pytest.mark.parametrize("literal, words", [("1e-400", "line {line}: the number 1e-400 cannot be stored as written"),
                                            ("123456789012345678901234", "an integer of 24 digits")])
def test_a_sheet_that_cannot_be_read_as_written_is_refused(tmp_path, capsys, literal, words):
    """Typed into the TOML by hand: 1e-400 is not read as 0.0 without a word, and a 24-digit integer's message
    says how long it is."""
    text = to_toml(new_worksheet(seed=1), template=False) + f"\n[answers.layer1]\nQ = [[{literal}, 0, 0, 0], " \
        "[0, 0, 0, 0], [0, 0, 0, 0]]\n"
    line = text.splitlines().index(next(t for t in text.splitlines() if t.startswith("Q = "))) + 1
    p = tmp_path / "s.toml"
    p.write_text(text, encoding="utf-8")
    code, _, err = _run(capsys, "check", p)
    assert code == 2 and words.format(line=line) in err, err
