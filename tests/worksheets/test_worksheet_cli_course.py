"""The worksheet tools in a course: marks with error carried forward, a class gradebook, exit status 0/1/2, a sheet
without answers, the instructor's key (``--answers``) and ``worksheet new`` writing only where it is told to."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import sheet_helpers as sh

from transformer_np.cli import main
from transformer_np.errors import WorksheetError
from transformer_np.worksheets import check, example_path
from transformer_np.worksheets.format import LIMITS
from transformer_np.worksheets.generate import answer_key, new_worksheet, to_toml, write_worksheet

GOOD = """[setup]
tokens = ["the", "cat", "sat"]
d_model = 4

[input]
H0 = [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]
"""


def _write(folder, name, text):
    p = os.path.join(folder, name)
    with open(p, "w", encoding="utf-8") as f:
        f.write(text)
    return p


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _example_with(extra: str) -> str:
    with open(example_path(), encoding="utf-8") as f:
        return f.read() + extra


# ----------------------------------------------------------------------------- marks
def test_marks_are_awarded_with_error_carried_forward(tmp_path):
    """The article's sheet: scores correct, attention_weights wrong, attention_output and residual follow,
    layer_norm_mean wrong. Follows earns its marks, wrong earns none; the total is out of the whole sheet (issue
    44): every step of both layers counts, named ones at their marks, the others at the default."""
    path = _write(tmp_path, "marked.toml", _example_with(
        "\n[marks]\nattention_weights = 2\nresidual = 3\ndefault = 1\n[marks.layer1]\nlayer_norm_mean = 4\n"))
    r = check(path)
    mark = {"scores": 1, "attention_weights": 2, "attention_output": 1, "residual": 3, "layer_norm_mean": 4}
    by_name = {s["name"]: s for s in r.steps if s["layer"] == 1 and s["verdict"] != "missing"}
    assert set(by_name) == set(mark)
    for name, s in by_name.items():
        earns = s["verdict"] in ("correct", "follows")
        assert s["out_of"] == mark[name] and s["marks"] == (mark[name] if earns else 0), s
    assert by_name["attention_output"]["verdict"] == "follows" and by_name["attention_output"]["marks"] == 1
    assert by_name["attention_weights"]["verdict"] == "wrong" and by_name["attention_weights"]["marks"] == 0
    awarded = sum(s["marks"] for s in by_name.values())
    # [marks].name applies in every layer (layer 2's attention_weights 2, residual 3), [marks.layer1] only in
    # layer 1 (layer 2's layer_norm_mean is at the default), and every step left blank earns 0 of its marks
    blank = [s for s in r.steps if s["verdict"] == "missing"]
    assert all(s["marks"] == 0 for s in blank)
    layer2 = {s["name"]: s["out_of"] for s in r.steps if s["layer"] == 2}
    assert layer2["attention_weights"] == 2 and layer2["residual"] == 3 and layer2["layer_norm_mean"] == 1
    available = sum(mark.values()) + sum(s["out_of"] for s in blank)
    assert available == sum(mark.values()) + len(blank) + (2 - 1) + (3 - 1)
    assert r.marks == {"awarded": awarded, "available": available, "blank": len(blank)}
    text = str(r)
    assert f"MARKS: {awarded} / {available}" in text and "error carried forward" in text
    assert f"{len(blank)} steps still blank" in text
    assert "0/2" in text and "3/3" in text


def test_a_question_left_unanswered_counts_in_the_total(tmp_path):
    """[marks] weights a step: one the student skipped earns 0 of its marks and shows as missing; every other
    step counts at the default (1), answered or not."""
    path = _write(tmp_path, "skip.toml", _example_with("\n[marks.layer2]\nH = 5\n"))
    r = check(path)
    h2 = next(s for s in r.steps if (s["layer"], s["name"]) == (2, "H"))
    assert h2["verdict"] == "missing" and (h2["marks"], h2["out_of"]) == (0, 5)
    assert r.marks["available"] == len(r.steps) - 1 + 5
    answered = [s for s in r.steps if s["verdict"] != "missing"]
    assert r.marks["awarded"] == sum(s["verdict"] in ("correct", "follows") for s in answered)


def test_default_zero_marks_only_the_named_steps(tmp_path):
    """[marks] default = 0 with two named steps: only those two are marked (out of 2 + 3), the rest carry no
    marks (out_of None)."""
    path = _write(tmp_path, "two.toml", _example_with("\n[marks]\ndefault = 0\nscores = 2\n[marks.layer2]\nH = 3\n"))
    r = check(path)
    marked = {(s["layer"], s["name"]): s["out_of"] for s in r.steps if s["out_of"] is not None}
    assert marked == {(1, "scores"): 2, (2, "scores"): 2, (2, "H"): 3}
    assert r.marks["available"] == 7


def test_without_a_mark_scheme_each_step_is_worth_one():
    """No [marks] table: 1 mark per step of the whole sheet; the blank ones earn 0 and are counted."""
    raw, _ = sh.student(sh.problem(seed=2), written={(1, "Q"), (1, "scores"), (1, "H")})
    r = check(raw)
    n = len(r.steps)
    assert r.marks == {"awarded": 3, "available": n, "blank": n - 3}
    assert [s["out_of"] for s in r.steps] == [1] * n
    assert f"MARKS: 3 / {n} (no [marks] table: 1 mark per step); {n - 3} steps still blank" in str(r)


def test_a_blank_sheet_is_out_of_the_whole_sheet():
    """A blank sheet checked on its own: 0 out of every step, every step still blank (never "0 / 0")."""
    r = check(sh.problem(seed=2))
    n = len(r.steps)
    assert n > 0 and r.marks == {"awarded": 0, "available": n, "blank": n}
    assert f"MARKS: 0 / {n}" in str(r) and f"{n} steps still blank" in str(r)


@pytest.mark.parametrize("marks,words", [
    ({"attention_wieghts": 2}, ["[marks]", "did you mean 'attention_weights'"]),
    ({"scores": -1}, ["[marks].scores", "[0, 1000]"]),
    ({"scores": True}, ["[marks].scores", "marks must be a number"]),
    ({"layer1": {"Hx": 1}}, ["[marks.layer1]", "did you mean 'H'"]),
    ({"layer3": {"H": 1}}, ["[marks.layer3]", "setup.layers = 1"]),
])
def test_a_bad_mark_scheme_is_refused(marks, words):
    raw = {"setup": {"tokens": ["the", "cat", "sat"], "d_model": 4},
           "input": {"H0": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]}, "marks": marks}
    with pytest.raises(WorksheetError) as e:
        check(raw)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


# ----------------------------------------------------------------------------- exit status, no answers, --answers
def test_exit_status_0_1_2(tmp_path, capsys):
    raw = new_worksheet(seed=4)
    key = _write(tmp_path, "key.toml", to_toml(raw, answers=answer_key(raw)))
    assert _run(capsys, "check", key)[0] == 0                                  # all correct
    assert _run(capsys, "check", example_path())[0] == 1                       # two wrong steps
    code, out, err = _run(capsys, "check", str(tmp_path / "nope.toml"))
    assert code == 2 and out == "" and "no such worksheet file" in err and len(err.splitlines()) == 1


def test_a_sheet_with_no_answers_says_so(tmp_path, capsys):
    path = _write(tmp_path, "blank.toml", GOOD)
    code, out, _ = _run(capsys, "check", path)
    assert code == 0 and "No answers given" in out and "No mistake" not in out
    for name in ("Q", "attention_weights", "layer_norm_var", "H"):
        assert name in out
    assert "0.000" not in out                                      # no table, no values
    code, out, _ = _run(capsys, "check", path, "--json")
    d = json.loads(out)
    assert code == 0 and d["counts"]["missing"] == len(d["steps"]) and d["first_mistake"] is None
    assert all(s["expected"] is None for s in d["steps"])


def test_expected_values_only_for_answered_steps_unless_answers(tmp_path, capsys):
    code, out, _ = _run(capsys, "check", example_path(), "--json")
    d = json.loads(out)
    for s in d["steps"]:
        assert (s["expected"] is None) == (s["verdict"] == "missing"), s["name"]
    code, out, _ = _run(capsys, "check", example_path(), "--json", "--answers")
    assert all(s["expected"] is not None for s in json.loads(out)["steps"])
    r = check(example_path())
    Q = r.marking.truth[(1, "Q")]
    plain, key = r.format(), r.format(answers=True)
    assert "(answer key)" not in plain and "(answer key)" in key
    assert f"Q = {r.marking.steps[0].formula}" in key and f"Q = {r.marking.steps[0].formula}" not in plain
    assert f"{Q[0, 0]:.2f}" in key


def test_cosmetics(tmp_path):
    """The table header keeps its words apart however short the names; layer 2's input is H^(1)."""
    raw, _ = sh.student(sh.problem(seed=1, layers=2), written={(1, "Q"), (2, "K")})
    r = check(raw)
    text = r.format(answers=True)
    assert "quantityverdict" not in text and "quantity" in text
    layer2 = text[text.index("LAYER 2"):]
    assert "H^(0)" not in layer2 and "H^(1)" in layer2


# ----------------------------------------------------------------------------- the gradebook
def _class_folder(tmp_path):
    folder = tmp_path / "class"
    folder.mkdir()
    raw = new_worksheet(seed=4)
    _write(folder, "b_key.toml", to_toml(raw, answers=answer_key(raw)))
    shutil.copy(example_path(), folder / "a_article.toml")
    shutil.copy(example_path(), folder / "c, with comma.toml")
    _write(folder, "d_blank.toml", GOOD)
    _write(folder, "e_broken.toml", GOOD.replace("d_model = 4", "d_model = = 4"))
    _write(folder, "notes.txt", "not a sheet")
    return folder


def test_gradebook_of_a_class(tmp_path, capsys):
    folder = _class_folder(tmp_path)
    book = tmp_path / "gradebook.csv"
    code, out, err = _run(capsys, "check", str(folder), "--csv", str(book))
    assert code == 2                                                # one sheet unreadable
    assert "e_broken.toml" in err and len(err.splitlines()) == 1
    with open(book, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    names = [os.path.basename(r["file"]) for r in rows]
    assert names == ["a_article.toml", "b_key.toml", "c, with comma.toml", "d_blank.toml", "e_broken.toml"]
    by = dict(zip(names, rows))
    article = check(example_path())
    assert by["a_article.toml"]["total"] == str(article.marks["awarded"])
    assert by["a_article.toml"]["first_mistake"] == "layer 1 attention_weights"
    assert by["a_article.toml"]["diagnosis"] == article.first_mistake["diagnosis"]
    assert by["c, with comma.toml"]["diagnosis"] == by["a_article.toml"]["diagnosis"]     # quoted, not split
    assert by["b_key.toml"]["wrong"] == "0" and by["b_key.toml"]["first_mistake"] == ""
    blank = check(str(folder / "d_blank.toml"))                   # a blank sheet is out of its whole sheet
    assert by["d_blank.toml"]["total"] == "0" and by["d_blank.toml"]["out_of"] == str(len(blank.steps)) != "0"
    assert by["e_broken.toml"]["total"] == "" and "not valid TOML" in by["e_broken.toml"]["error"]
    assert "Most common first mistakes:" in out
    assert f"2 × layer 1 attention_weights — {article.first_mistake['diagnosis']}" in out
    assert "UNREADABLE" in out and "4 of 5 sheets marked, 1 unreadable" in out


def test_gradebook_exit_1_when_all_read_and_json(tmp_path, capsys):
    folder = _class_folder(tmp_path)
    os.remove(folder / "e_broken.toml")
    code, out, _ = _run(capsys, "check", str(folder), "--json")
    assert code == 1
    d = json.loads(out)
    assert [os.path.basename(s["file"]) for s in d["sheets"]][:2] == ["a_article.toml", "b_key.toml"]
    assert d["summary"]["first_mistakes"][0]["sheets"] == 2 and d["summary"]["unreadable"] == 0
    first = d["sheets"][0]["report"]
    assert all((s["expected"] is None) == (s["verdict"] == "missing") for s in first["steps"])


def test_gradebook_refuses_a_sheet_as_its_target(tmp_path, capsys):
    folder = _class_folder(tmp_path)
    before = (folder / "b_key.toml").read_text()
    code, _, err = _run(capsys, "check", str(folder), "--csv", str(folder / "b_key.toml"))
    assert code == 2 and "--csv" in err and (folder / "b_key.toml").read_text() == before


def test_an_empty_folder_is_an_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = _run(capsys, "check", str(tmp_path / "empty"))
    assert code == 2 and "no worksheets" in err


def test_check_example_prefers_a_local_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = _run(capsys, "check", "example")
    assert code == 1 and "the_cat_sat.toml" in out                        # no local file: the shipped sheet
    _write(tmp_path, "example", GOOD)
    code, out, _ = _run(capsys, "check", "example")
    assert code == 0 and "Worksheet example:" in out and "No answers given" in out


def test_help_documents_exit_status_in_plain_text():
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    for cmd in (["check", "--help"], ["worksheet", "new", "--help"], ["worksheet", "--help"]):
        r = subprocess.run([sys.executable, "-m", "transformer_np", *cmd], capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 0 and "``" not in r.stdout and ":mod:" not in r.stdout, cmd
    r = subprocess.run([sys.executable, "-m", "transformer_np", "check", "--help"], capture_output=True, text=True,
                       env=env, timeout=300)
    for words in ("exit status", "0  every given answer is correct", "1  at least one answer is wrong",
                  "2  a sheet cannot be read", "--answers", "--csv", "DIR_OR_FILE"):
        assert words in r.stdout, words


# ----------------------------------------------------------------------------- worksheet new writes where told
@pytest.mark.parametrize("name", ["../x", "/tmp/abs_ws2_name", "a/b", "..", ""])
def test_worksheet_new_name_is_a_name(tmp_path, capsys, name):
    out = tmp_path / "out"
    code, _, err = _run(capsys, "worksheet", "new", "--out", str(out), "--name", name)
    assert code == 2 and "--name" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.toml").exists() and not os.path.exists("/tmp/abs_ws2_name.toml")
    assert not out.exists() or not any(out.iterdir())


def test_worksheet_new_refuses_a_dangling_symlink(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    os.symlink(victim, out / "w_key.md")
    for extra in ([], ["--force"]):
        code, _, err = _run(capsys, "worksheet", "new", "--out", str(out), "--name", "w", *extra)
        assert code == 2 and "symbolic link" in err
        assert not victim.exists() and sorted(os.listdir(out)) == ["w_key.md"]      # nothing written at all


def test_worksheet_new_is_atomic_and_keeps_existing_files(tmp_path):
    raw = new_worksheet(seed=2)
    paths = write_worksheet(raw, str(tmp_path), "s")
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in paths)     # no temporary left
    before = {p: open(p).read() for p in paths}
    with pytest.raises(ValueError, match="already exists"):
        write_worksheet(new_worksheet(seed=3), str(tmp_path), "s")
    assert {p: open(p).read() for p in paths} == before
    write_worksheet(new_worksheet(seed=3), str(tmp_path), "s", force=True)
    assert open(paths[0]).read() != before[paths[0]] and len(os.listdir(tmp_path)) == 4


@pytest.mark.parametrize("kwargs", [
    dict(tokens=LIMITS["tokens"], d_model=LIMITS["d_model"], heads=LIMITS["d_model"], layers=LIMITS["layers"]),
    dict(tokens=LIMITS["tokens"], d_model=LIMITS["d_model"], heads=LIMITS["d_model"], layers=LIMITS["layers"],
         norm="pre", activation="gelu", d_ff=LIMITS["d_ff"]),
    dict(tokens=2, d_model=2, heads=1, layers=LIMITS["layers"], d_ff=LIMITS["d_ff"]),
    dict(tokens=2, d_model=2, heads=2, layers=LIMITS["layers"], norm="pre", d_ff=LIMITS["d_ff"]),
])
def test_worksheet_new_generates_the_corners_of_the_limits(kwargs):
    """Every documented size is generated (the search widens its bounds instead of giving up); the key it
    writes is marked all correct."""
    raw = new_worksheet(seed=0, backward=True, **kwargs)
    raw["answers"] = answer_key(raw)
    r = check(raw)
    assert r.counts()["wrong"] == 0 and r.answered == len(r.steps)
    H0 = np.array(raw["input"]["H0"])
    assert len({tuple(row) for row in H0}) == kwargs["tokens"]


def test_worksheet_new_refuses_more_tokens_than_distinct_rows():
    with pytest.raises(ValueError, match="needs d_model >= 4"):
        new_worksheet(tokens=8, d_model=2)


def test_the_table_never_shows_wrong_within_its_tolerance():
    """The table's error and tolerance are taken at one entry, against the reference the verdict used (the true
    value, or the student's own chain for ``follows``), so they agree with the verdict: a ``wrong`` step is never
    printed with an error below its tolerance, a ``correct`` or ``follows`` one never above."""
    from transformer_np.worksheets.report import _shown_error

    plants = [{}, {(1, "attention_weights"): lambda v: sh.softmax_rows(v[(1, "scores")], axis=0)},
              {(1, "scores"): lambda v: v[(1, "Q")] @ v[(1, "K")].T}]
    checked = 0
    for seed in range(4):
        for plant in plants:
            raw, _ = sh.student(sh.problem(norm=("post", "pre")[seed % 2], seed=seed, backward=seed % 2 == 0),
                                plant=plant, written=None if seed % 3 else {(1, "Q"), (1, "scores"), (1, "H")})
            r = check(raw)
            for key, v in r.marking.verdict.items():
                if v == "missing":
                    continue
                err, tol = _shown_error(r.marking, key)
                assert (err <= tol + 1e-9) == (v != "wrong"), (seed, key, v, err, tol)
                checked += 1
    assert checked > 100
