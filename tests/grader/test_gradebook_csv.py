"""A gradebook that says why (issue 43, item 6): ``transformer-np grade --csv`` has, per question, the one-line
cause of a lost mark (``<q>_why``), and per row the seed and the sandbox state; a file that could not be graded
says what was wrong with it. The text output and ``--json`` carry the same."""

from __future__ import annotations

import csv
import json

from test_grade import SOL, notebook

from transformer_np.grader.grade import CheckGrade, SubmissionGrade
from transformer_np.grader.gradebook import WHY_CHARS, csv_rows, one_line

DIAGONAL = "def softmax_backward(dout, cache):\n    s = cache['s']\n    return dout * s * (1 - s)\n"
HEADER = ["file", "score", "out_of", "q1", "q2", "q1_why", "q2_why", "flags", "seed", "sandbox", "error"]


def _cli(*argv):
    from transformer_np.cli import main

    return main(list(argv))


def _class(tmp_path):
    notebook(tmp_path / "good.ipynb", SOL)
    notebook(tmp_path / "slip.ipynb", SOL + [DIAGONAL])
    (tmp_path / "broken.ipynb").write_text('{"cells": [', encoding="utf-8")          # cut short: not JSON
    (tmp_path / "list.ipynb").write_text("[1, 2]", encoding="utf-8")                  # JSON, not a notebook
    return ["good.ipynb", "slip.ipynb", "broken.ipynb", "list.ipynb"]


def test_the_csv_says_why_each_mark_was_lost_and_with_which_seed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files = _class(tmp_path)
    out = tmp_path / "grades.csv"
    assert _cli("grade", "01_softmax", *files, "--csv", str(out), "--seed", "11", "--timeout", "5") == 0
    rows = list(csv.reader(out.read_text(encoding="utf-8").splitlines()))
    assert rows[0] == HEADER
    by = {r[0]: dict(zip(HEADER, r)) for r in rows[1:]}
    assert by["good.ipynb"]["score"] == "3" and by["good.ipynb"]["q1_why"] == by["good.ipynb"]["q2_why"] == ""
    slip = by["slip.ipynb"]
    assert (slip["q1"], slip["q2"], slip["q1_why"]) == ("1", "0", "")
    assert slip["q2_why"].startswith("dx: ") and "\n" not in slip["q2_why"], slip
    assert "diagonal" in slip["q2_why"].lower(), slip["q2_why"]
    assert all(r["seed"] == "11" and r["sandbox"] == "kernel" for r in by.values()), by
    assert slip["error"] == by["good.ipynb"]["error"] == ""
    # a file that could not be graded says what was wrong with it, in the error column and in each why
    broken, listed = by["broken.ipynb"], by["list.ipynb"]
    assert broken["flags"] == "unreadable" and "JSON" in broken["error"], broken
    assert "not a notebook" in listed["error"], listed
    assert broken["q1_why"] == broken["q2_why"] == "not graded: the file could not be read (see error)", broken


def test_text_and_json_carry_the_same(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files = _class(tmp_path)
    assert _cli("grade", "01_softmax", *files, "--seed", "11", "--timeout", "5") == 0
    text = capsys.readouterr().out
    assert "q2 why: dx: " in text and "sandbox: kernel" in text, text
    assert _cli("grade", "01_softmax", *files, "--json", "--seed", "11", "--timeout", "5") == 0
    doc = json.loads(capsys.readouterr().out)
    subs = {s["file"]: s for s in doc["submissions"]}
    assert subs["slip.ipynb"]["questions"]["q2"]["why"].startswith("dx: ")
    assert subs["slip.ipynb"]["questions"]["q1"]["why"] == ""
    assert all(s["seed"] == 11 and s["sandbox"] == "kernel" for s in subs.values())
    assert "JSON" in subs["broken.ipynb"]["error"] and subs["broken.ipynb"]["questions"]["q1"]["why"]


def test_a_question_with_two_checks_names_the_check_that_failed():
    g = SubmissionGrade("a.ipynb", "06_encoder_layer", 2.0, 4.0, seed=5, sandbox="unsandboxed", checks=[
        CheckGrade("q1", "forward", "encoder_layer_post", 1.0, 0.0, "long\nfeedback", ["x"], "out: leaves out a"),
        CheckGrade("q1", "forward", "encoder_layer_pre", 1.0, 1.0),
        CheckGrade("q2", "backward", "encoder_layer_post", 1.0, 1.0),
        CheckGrade("q2", "backward", "encoder_layer_pre", 1.0, 0.0, "x", ["y"], "dx: wrong")])
    rows = csv_rows([g], ["q1", "q2"])
    row = dict(zip(rows[0], rows[1]))
    assert row["q1_why"] == "encoder_layer_post: out: leaves out a"
    assert row["q2_why"] == "encoder_layer_pre: dx: wrong"
    assert (row["seed"], row["sandbox"], row["q1"], row["q2"]) == ("5", "unsandboxed", "1", "1")


def test_a_why_is_one_line_and_bounded():
    assert one_line("a\n  b\r\n\tc") == "a b c"
    long = one_line("word " * 1000)
    assert len(long) == WHY_CHARS and long.endswith("…")


def test_a_why_that_begins_like_a_formula_is_escaped_like_every_cell(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    raising = "def softmax_backward(dout, cache):\n    raise ValueError('=HYPERLINK(\"x\")')\n"
    notebook(tmp_path / "a.ipynb", SOL + [raising])
    assert _cli("grade", "01_softmax", "a.ipynb", "--csv", "-", "--seed", "3", "--timeout", "5") == 0
    rows = list(csv.reader(capsys.readouterr().out.splitlines()))
    row = dict(zip(rows[0], rows[1]))
    assert "=HYPERLINK" in row["q2_why"] and not row["q2_why"].startswith(("=", "+", "-", "@")), row
