"""Issue 36, items 1 and 2: the instructor's key decides the problem and the mark scheme (``check --key``, the
problem id, ``problem_altered``); keys are never graded as submissions; ``worksheet class`` gives one problem per
student from a secret seed, so no sheet lets its key be remade."""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import re
import stat

import honest
import numpy as np
import pytest

from transformer_np.cli import main
from transformer_np.worksheets import check
from transformer_np.worksheets.generate import answer_key, new_worksheet, to_toml, write_worksheet
from transformer_np.worksheets.tomlio import read_toml


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def _write(path, raw: dict, marks: dict | None = None) -> str:
    text = to_toml(raw, answers=raw.get("answers"), template=False)
    if marks:
        text += "\n[marks]\n" + "".join(f"{k} = {v}\n" for k, v in marks.items())
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


def _worth(key_path: str, answers: dict) -> float:
    """What ``answers`` are worth against the handed-out problem: the key's problem and mark scheme with these
    answers, marked as a sheet of its own (no --key involved)."""
    key = read_toml(key_path)
    sheet = {k: v for k, v in key.items() if k not in ("answers", "key")}
    sheet["answers"] = answers
    return check(sheet).marks["awarded"]


# ----------------------------------------------------------------------------- item 1: the key is authoritative
def _cheats(tmp_path):
    """The handed-out problem (with a mark scheme in the key), its key, and six submissions: an honest one, one
    with a wrong step and an inflated [marks], one on an easier problem (H0 of zeros) with that problem's answers
    (as `check --answers` prints them), one with W_1 = 0 and that problem's answers, one with the key remade from
    the printed seed (`worksheet new --seed S`), and the key itself handed in."""
    raw = new_worksheet(seed=5)
    paths = write_worksheet(raw, str(tmp_path / "ws"), marks={"attention_weights": 2, "H": 3})  # the instructor's
    key_path = paths[3]
    right = answer_key(raw)
    subs = tmp_path / "subs"
    subs.mkdir()
    out = {}
    out["honest"] = _write(subs / "a_honest.toml", {**raw, "answers": right})
    wrong = copy.deepcopy(right)
    wrong["layer1"]["context"][0][0] += 0.5
    out["marks"] = _write(subs / "b_marks.toml", {**raw, "answers": wrong},
                          marks={"default": 1.3125, "attention_weights": 5, "context": 40})
    easy = copy.deepcopy(raw)
    easy["input"]["H0"] = np.zeros_like(np.array(raw["input"]["H0"])).tolist()
    out["easier"] = _write(subs / "c_easier.toml", {**easy, "answers": answer_key(easy)})
    flat = copy.deepcopy(raw)
    flat["layer1"]["W_1"] = np.zeros_like(np.array(raw["layer1"]["W_1"])).tolist()
    out["weights"] = _write(subs / "d_weights.toml", {**flat, "answers": answer_key(flat)})
    regen = new_worksheet(seed=raw["setup"]["seed"])          # the seed printed on the handout
    out["regenerated"] = _write(subs / "e_regenerated.toml", {**raw, "answers": answer_key(regen)})
    with open(key_path, encoding="utf-8") as f, open(subs / "f_key.toml", "w", encoding="utf-8") as g:
        g.write(f.read())
    return raw, key_path, subs, out


def test_six_cheating_submissions_score_what_their_answers_are_worth(tmp_path, capsys):
    """Under --key every submission scores what its answers are worth against the handed-out problem and the
    key's mark scheme; the three whose problem or marks were altered are flagged problem_altered; the key
    handed in is not graded."""
    raw, key_path, subs, sheets = _cheats(tmp_path)
    code, out, err = _run(capsys, "check", "--key", key_path, subs, "--csv", "-")
    rows = {os.path.basename(r["file"]): r for r in _rows(out)}
    assert sorted(rows) == ["a_honest.toml", "b_marks.toml", "c_easier.toml", "d_weights.toml",
                            "e_regenerated.toml"]                               # the key: no row
    for kind, path in sheets.items():
        r = rows[os.path.basename(path)]
        assert float(r["total"]) == _worth(key_path, read_toml(path)["answers"]), kind
        altered = kind in ("marks", "easier", "weights")
        assert r["flags"].startswith("problem_altered") == altered, (kind, r["flags"])
        assert r["problem_id"] == raw["setup"]["problem_id"]
    assert "[marks]" in rows["b_marks.toml"]["flags"] and "[input].H0" in rows["c_easier.toml"]["flags"]
    assert "[layer1].W_1" in rows["d_weights.toml"]["flags"]
    full = _worth(key_path, answer_key(raw))
    assert float(rows["b_marks.toml"]["total"]) < full and rows["b_marks.toml"]["out_of"] == str(int(full))
    assert float(rows["c_easier.toml"]["total"]) < full and float(rows["d_weights.toml"]["total"]) < full
    assert code == 1                                                            # wrong answers, nothing unreadable


def test_without_the_key_the_altered_sheets_scored_full_marks(tmp_path):
    """What the key prevents (the finding): marked as they stand, the altered sheets earn full marks."""
    _, _, _, sheets = _cheats(tmp_path)
    for kind in ("easier", "weights"):
        r = check(sheets[kind])
        assert r.marks["awarded"] == r.marks["available"] > 0, kind


def test_the_report_and_json_carry_the_flag(tmp_path, capsys):
    _, key_path, _, sheets = _cheats(tmp_path)
    code, out, _ = _run(capsys, "check", "--key", key_path, sheets["easier"], "--json")
    d = json.loads(out)
    assert d["flags"] == ["problem_altered"] and d["altered"] == ["[input].H0"] and d["key"] == key_path
    code, out, _ = _run(capsys, "check", "--key", key_path, sheets["easier"])
    assert "PROBLEM ALTERED" in out and "[input].H0" in out
    code, out, _ = _run(capsys, "check", "--key", key_path, sheets["honest"], "--json")
    assert json.loads(out)["flags"] == [] and code == 0
    r = check(sheets["marks"], key=key_path)                    # the API: check(sheet, key=...)
    assert r.flags == ["problem_altered"] and r.altered == ["[marks]"]


def test_answers_that_do_not_fit_the_keys_problem_get_an_error_row(tmp_path, capsys):
    raw, key_path, subs, _ = _cheats(tmp_path)
    other = copy.deepcopy(raw)
    other["setup"]["tokens"] = ["x", "y", "z"]
    right = answer_key(raw)
    text = to_toml(other, template=False) + f"\n[answers.layer1]\nQ = {{ x = {right['layer1']['Q'][0]} }}\n"
    (subs / "g_tokens.toml").write_text(text, encoding="utf-8")
    code, out, err = _run(capsys, "check", "--key", key_path, subs, "--csv", "-")
    row = next(r for r in _rows(out) if r["file"].endswith("g_tokens.toml"))
    assert code == 2 and "do not fit the problem of the key" in row["error"] and "[setup].tokens" in row["error"]


def test_a_folder_of_keys_matches_by_problem_id_then_by_problem(tmp_path, capsys):
    keys = tmp_path / "keys"
    subs = tmp_path / "subs"
    subs.mkdir()
    raws = [new_worksheet(seed=s) for s in (1, 2)]
    for i, raw in enumerate(raws):
        write_worksheet(raw, str(keys), f"p{i}")
        for p in keys.glob(f"p{i}.toml"):
            p.unlink()
    for p in list(keys.glob("*.md")):
        p.unlink()
    _write(subs / "one.toml", {**raws[0], "answers": answer_key(raws[0])})
    no_id = copy.deepcopy(raws[1])
    del no_id["setup"]["problem_id"]                                # id removed: found by its problem
    _write(subs / "two.toml", {**no_id, "answers": answer_key(raws[1])})
    stray = new_worksheet(seed=3)
    _write(subs / "three.toml", {**stray, "answers": answer_key(stray)})
    code, out, _ = _run(capsys, "check", "--key", keys, subs, "--csv", "-")
    rows = {os.path.basename(r["file"]): r for r in _rows(out)}
    assert rows["one.toml"]["problem_id"] == raws[0]["setup"]["problem_id"] and rows["one.toml"]["flags"] == ""
    assert rows["two.toml"]["problem_id"] == raws[1]["setup"]["problem_id"]
    assert rows["two.toml"]["flags"] == "problem_altered: [setup].problem_id"
    assert rows["two.toml"]["total"] == rows["two.toml"]["out_of"]
    assert "no key" in rows["three.toml"]["error"] and code == 2


def test_a_key_is_never_graded(tmp_path, capsys):
    """`worksheet new --out ws` then `check ws/ --csv`: the problem (no answers) gets a row, the key none, and the
    summary is not "mean mark 9.00 (100 %)"."""
    code, _, _ = _run(capsys, "worksheet", "new", "--out", tmp_path / "ws", "--seed", 3)
    assert code == 0
    code, out, _ = _run(capsys, "check", tmp_path / "ws", "--csv", tmp_path / "book.csv")
    with open(tmp_path / "book.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [os.path.basename(r["file"]) for r in rows] == ["worksheet_seed3.toml"]
    assert rows[0]["total"] == "0" and "100%" not in out and "1 answer key skipped" in out
    assert read_toml(tmp_path / "ws" / "worksheet_seed3_key.toml")["key"] == {}
    assert check(str(tmp_path / "ws" / "worksheet_seed3_key.toml")).counts()["wrong"] == 0   # self-check still
    code, out, err = _run(capsys, "check", "--key", tmp_path / "ws" / "worksheet_seed3_key.toml",
                          tmp_path / "ws" / "worksheet_seed3_key.toml")
    assert code == 2 and "answer key" in err


def test_every_generated_sheet_names_its_problem(tmp_path):
    raw = new_worksheet(seed=8, backward=True)
    pid = raw["setup"]["problem_id"]
    assert re.fullmatch(r"[0-9a-f]{16}", pid)
    for path in write_worksheet(raw, str(tmp_path)):
        with open(path, encoding="utf-8") as f:
            assert pid in f.read(), path
    assert new_worksheet(seed=8, backward=True)["setup"]["problem_id"] == pid           # the same problem
    assert new_worksheet(seed=9, backward=True)["setup"]["problem_id"] != pid


# ----------------------------------------------------------------------------- item 2: worksheet class
def _roster(path, n):
    with open(path, "w", encoding="utf-8") as f:
        f.write("name,id,email\n" + "".join(f"Student {i},s{i:03d},s{i}@example.org\n" for i in range(n)))
    return path


def _answered(folder, sid, answers) -> dict:
    raw = read_toml(os.path.join(folder, "students", f"{sid}.toml"))
    return {**raw, "answers": answers}


def test_a_class_of_30_honest_students(tmp_path, capsys):
    """30 problems, 30 honest rounded answered sheets (and a key slipped in among them): 30 rows keyed by student
    id, the key not graded, no answer wrong; no sheet shows a seed."""
    roster = _roster(tmp_path / "roster.csv", 30)
    out = tmp_path / "class"
    code, text, _ = _run(capsys, "worksheet", "class", "--roster", roster, "--out", out)
    assert code == 0
    ids = [f"s{i:03d}" for i in range(30)]
    assert sorted(os.listdir(out / "students")) == sorted([f"{s}.toml" for s in ids] + [f"{s}.md" for s in ids])
    assert sorted(os.listdir(out / "keys")) == sorted([f"{s}_key.toml" for s in ids] + [f"{s}_key.md" for s in ids])
    pids = set()
    for sid in ids:
        for name in (f"{sid}.toml", f"{sid}.md"):
            body = (out / "students" / name).read_text(encoding="utf-8")
            assert "seed" not in body.lower(), name
        pids.add(read_toml(out / "students" / f"{sid}.toml")["setup"]["problem_id"])
    assert len(pids) == 30
    subs = tmp_path / "submissions"
    subs.mkdir()
    for i, sid in enumerate(ids):
        raw = read_toml(out / "students" / f"{sid}.toml")
        st = honest.Student(raw, half_even=i % 2 == 1).run()
        _write(subs / f"upload_{i:02d}.toml", {**raw, "answers": st.answers()})
    (subs / "zz.toml").write_text((out / "keys" / "s007_key.toml").read_text(encoding="utf-8"), encoding="utf-8")
    code, text, err = _run(capsys, "check", "--key", out / "keys", subs, "--csv", "-")
    rows = _rows(text)
    # stderr: nothing but progress lines (shown once marking takes over 2 s, as on a loaded machine)
    assert code == 0 and all(line.startswith("check [") for line in err.splitlines()), err
    assert [r["student"] for r in rows] == ids                     # upload_00 … upload_29 are s000 … s029
    for r in rows:
        assert r["wrong"] == "0" and r["follows"] == "0" and r["flags"] == "" and r["total"] == r["out_of"]


def test_the_seed_regeneration_attack_gets_no_full_marks(tmp_path, capsys):
    """A student who tries to remake their key with `worksheet new --seed S`, for every number the sheet shows
    (the digits of the student id, the problem id read as a number, 0), with the sheet's own options, and hands
    in that key's answers (on the handed-out problem, or on the remade one): no full marks, and the remade
    problem is flagged."""
    roster = _roster(tmp_path / "roster.csv", 4)
    out = tmp_path / "class"
    assert _run(capsys, "worksheet", "class", "--roster", roster, "--out", out, "--backward")[0] == 0
    subs = tmp_path / "subs"
    subs.mkdir()
    for i in range(4):
        sid = f"s{i:03d}"
        raw = read_toml(out / "students" / f"{sid}.toml")
        s = raw["setup"]
        opts = dict(tokens=len(s["tokens"]), d_model=s["d_model"], heads=s["n_heads"], norm=s["norm"],
                    backward=True, layers=s["layers"], d_ff=s["d_ff"], activation=s["activation"],
                    decimals=s["decimals"])
        for j, seed in enumerate({0, i, int(sid[1:]), int(s["problem_id"], 16) % 2 ** 63}):
            fake = new_worksheet(seed=seed, **opts)
            _write(subs / f"{sid}_{j}_answers.toml", {**raw, "answers": answer_key(fake)})
            _write(subs / f"{sid}_{j}_problem.toml", {**fake, "answers": answer_key(fake)})
    code, text, _ = _run(capsys, "check", "--key", out / "keys", subs, "--csv", "-")
    rows = _rows(text)
    assert len(rows) >= 8
    for r in rows:
        if r["error"]:                                 # the remade problem's id is no key's: not marked at all
            assert "no key" in r["error"] and r["file"].endswith("_problem.toml")
            continue
        assert float(r["total"]) < float(r["out_of"]), r
        assert r["file"].endswith("_answers.toml")


def test_the_secret_decides_the_problems(tmp_path, capsys):
    roster = _roster(tmp_path / "roster.csv", 3)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert _run(capsys, "worksheet", "class", "--roster", roster, "--out", a)[0] == 0
    secret = a / "class_secret.txt"
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert re.fullmatch(r"[0-9a-f]{64}\n", secret.read_text())
    assert _run(capsys, "worksheet", "class", "--roster", roster, "--out", b, "--secret-file", secret)[0] == 0
    assert _run(capsys, "worksheet", "class", "--roster", roster, "--out", c)[0] == 0          # a new secret
    for sid in ("s000", "s001", "s002"):
        same = [(d / "keys" / f"{sid}_key.toml").read_text() for d in (a, b)]
        assert same[0] == same[1]                                   # the same secret: the same problem
        assert (c / "keys" / f"{sid}_key.toml").read_text() != same[0]
    assert not (b / "class_secret.txt").exists()


@pytest.mark.parametrize("roster,words", [
    ("name,email\nAnn,a@x\n", "no id column"),
    ("id\ns1\ns1\n", "also on line 2"),
    ("id\n../evil\n", "cannot name a file"),
    ("id\n\x1b[2J\n", "cannot name a file"),
])
def test_a_bad_roster_is_refused(tmp_path, capsys, roster, words):
    (tmp_path / "r.csv").write_text(roster, encoding="utf-8")
    code, _, err = _run(capsys, "worksheet", "class", "--roster", tmp_path / "r.csv", "--out", tmp_path / "o")
    assert code == 2 and words in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_worksheet_class_writes_all_files_or_none(tmp_path, capsys):
    roster = _roster(tmp_path / "roster.csv", 3)
    out = tmp_path / "class"
    (out / "keys" / "s002_key.toml").mkdir(parents=True)           # the last target cannot be written
    code, _, err = _run(capsys, "worksheet", "class", "--roster", roster, "--out", out, "--force")
    assert code == 2 and "s002_key.toml" in err
    assert sorted(p.name for p in out.rglob("*")) == ["keys", "s002_key.toml"]      # nothing else, no secret


def test_worksheet_new_writes_all_four_files_or_none(tmp_path, monkeypatch):
    """A rename that fails for the third file (as a full disk or a vanished folder would make it): before,
    the first two files were left written; now none of the four is, and nothing is left behind."""
    import transformer_np._files as files

    real = os.replace

    def failing(src, dst):
        if str(dst).endswith("_key.md"):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", failing)
    with pytest.raises(ValueError, match="No space left"):
        write_worksheet(new_worksheet(seed=2), str(tmp_path), "s")
    assert os.listdir(tmp_path) == []
    (tmp_path / "s.toml").write_text("the student's own file")           # with --force: put back as it was
    with pytest.raises(ValueError, match="No space left"):
        write_worksheet(new_worksheet(seed=2), str(tmp_path), "s", force=True)
    assert os.listdir(tmp_path) == ["s.toml"] and (tmp_path / "s.toml").read_text() == "the student's own file"


def test_the_summary_names_students_with_no_submission(tmp_path, capsys):
    roster = _roster(tmp_path / "roster.csv", 3)
    out = tmp_path / "class"
    assert _run(capsys, "worksheet", "class", "--roster", roster, "--out", out)[0] == 0
    subs = tmp_path / "subs"
    subs.mkdir()
    for sid in ("s000", "s002"):
        raw = read_toml(out / "students" / f"{sid}.toml")
        _write(subs / f"{sid}.toml", {**raw, "answers": answer_key(raw)})
    code, text, _ = _run(capsys, "check", "--key", out / "keys", subs)
    assert code == 0 and "No submission from 1 student of the keys: s001." in text
    code, text, _ = _run(capsys, "check", "--key", out / "keys", subs, "--json")
    assert json.loads(text)["summary"]["no_submission"] == ["s001"]


def test_a_folder_with_problems_beside_its_keys(tmp_path, capsys):
    """`worksheet new --out ws` puts the problem beside its key: --key ws uses the key and ignores the problem."""
    raw = new_worksheet(seed=6)
    write_worksheet(raw, str(tmp_path / "ws"))
    _write(tmp_path / "sub.toml", {**raw, "answers": answer_key(raw)})
    code, out, err = _run(capsys, "check", "--key", tmp_path / "ws", tmp_path / "sub.toml", "--json")
    assert code == 0 and json.loads(out)["key"].endswith("_key.toml"), err
