"""Issue 44, item 3: the gradebook against a roster (``check --key KEYS SUBMISSIONS --roster ROSTER.csv``), the
Canvas and Moodle import files read back by their documented column rules, the student × step matrix, the class
summary and its figure.

The class: 30 students of a roster with accented names and hyphenated ids, one problem each from ``worksheet
class``; files named as Canvas and Moodle bulk downloads name them. 20 honest sheets, 5 with one slip at the last
step, 2 with blank steps, a truncated file under a name that says nothing (its header names its problem), a
student who handed in another's completed sheet under their own name, a student who handed in nothing, a file
whose id has a Cyrillic look-alike letter, and a stray file that is no one's.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import os

import numpy as np
import pytest
import sheet_helpers

from transformer_np.cli import main
from transformer_np.worksheets.generate import to_toml
from transformer_np.worksheets.gradebook import Student, fold, match_file, name_key
from transformer_np.worksheets.lms import CANVAS_ID_COLUMNS
from transformer_np.worksheets.tomlio import read_toml

FIRST = ["Zoë", "José", "Łukasz", "Anaïs", "Søren", "Ngozi", "Chloé", "Mateo", "Aiko", "Björn"]
LAST = ["Núñez-Brown", "Álvarez", "Wójcik", "Lefèvre", "Ødegård", "Okafor", "Dubois", "García", "Satō", "Müller"]
HONEST, SLIPS, BLANKS = range(0, 20), range(20, 25), (25, 26)
TRUNCATED, COPIER, ABSENT = 27, 28, 29
CONFUSABLE = 5                 # an honest student whose file name writes the id with a Cyrillic а


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _students() -> list[dict]:
    out = []
    for i in range(30):
        first, last = FIRST[i % 10], LAST[(i * 3) % 10]
        out.append({"id": f"ka-{1000 + i}-b", "first": first, "last": last + ("" if i < 10 else f"-{i}"),
                    "email": f"s{i}@example.edu", "canvas_id": str(50000 + i)})
    return out


def _write(path, raw: dict) -> None:
    path.write_text(to_toml(raw, answers=raw.get("answers"), template=False), encoding="utf-8")


def _canvas_name(s: dict) -> str:
    return (s["last"] + s["first"]).lower().replace("-", "") + f"_{s['canvas_id']}_{777000 + int(s['canvas_id'])}_sheet"


@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    """The class folder: roster, keys, submissions; and what each student did."""
    tmp = tmp_path_factory.mktemp("roster")
    students = _students()
    roster = tmp / "roster.csv"
    with open(roster, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "First name", "Last name", "Email address", "canvas_id"])
        w.writerows([[s["id"], s["first"], s["last"], s["email"], s["canvas_id"]] for s in students])
    out = tmp / "class"
    assert main(["worksheet", "class", "--roster", str(roster), "--out", str(out), "--d-model", "4",
                 "--tokens", "3"]) == 0
    subs = tmp / "submissions"
    subs.mkdir()
    done = {}
    for i, s in enumerate(students):
        raw = read_toml(out / "students" / f"{s['id']}.toml")
        _, steps = sheet_helpers.steps_of(raw)
        if i in BLANKS:
            answered, _ = sheet_helpers.student(raw, written={st.key for st in steps[: len(steps) // 2]})
        else:
            answered, _ = sheet_helpers.student(raw)
        if i in SLIPS:                                  # one slip in the last step: only its marks are lost
            last = steps[-1]
            grid = answered["answers"][f"layer{last.layer}"][last.name]
            grid[0][0] = round(grid[0][0] + 0.5, 2)
        done[i] = {"raw": answered, "last": f"L{steps[-1].layer} {steps[-1].name}", "n_steps": len(steps)}
        if i == ABSENT:
            continue
        if i == TRUNCATED:
            text = to_toml(answered, answers=answered["answers"], template=False).encode("utf-8")
            (subs / "upload_3.toml").write_bytes(text[: int(len(text) * 0.6)])
        elif i == COPIER:                               # hands in student 0's completed sheet as their own
            _write(subs / f"{_canvas_name(s)}.toml", done[0]["raw"])
        elif i == CONFUSABLE:
            _write(subs / f"{s['id'].replace('a', 'а')}.toml", answered)        # Cyrillic а (U+0430)
        elif i % 2:
            _write(subs / f"{_canvas_name(s)}.toml", answered)                   # Canvas
        else:
            _write(subs / f"{s['first']} {s['last']}_{s['canvas_id']}_assignsubmission_file_sheet.toml",
                   answered)                                                     # Moodle
    stray = sheet_helpers.problem(seed=3)
    _write(subs / "stray.toml", {**stray, "setup": {**stray["setup"], "problem_id": "feedfeedfeedfeed"}})
    return {"tmp": tmp, "roster": roster, "keys": out / "keys", "subs": subs, "students": students, "done": done}


@pytest.fixture(scope="module")
def marked(klass, tmp_path_factory):
    """The gradebook and every file written from it (run once: marking 30 sheets takes a few seconds)."""
    import contextlib

    t = tmp_path_factory.mktemp("out")
    files = {k: t / f"{k}.{ext}" for k, ext in (("csv", "csv"), ("canvas", "csv"), ("moodle", "csv"),
                                                   ("matrix", "csv"), ("summary", "json"))}
    argv = ["check", "--key", klass["keys"], klass["subs"], "--roster", klass["roster"], "--csv", files["csv"],
            "--matrix", files["matrix"], "--summary", files["summary"],
            "--export", "canvas", files["canvas"], "--assignment", "Worksheet 1"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main([str(a) for a in argv])
    assert main(["check", "--key", str(klass["keys"]), str(klass["subs"]), "--roster", str(klass["roster"]),
                 "--export", "moodle", str(files["moodle"]), "--assignment", "Worksheet 1", "--json"]) == code
    rows = list(csv.DictReader(io.StringIO(files["csv"].read_text(encoding="utf-8"))))
    return {"code": code, "text": out.getvalue(), "files": files, "rows": rows}


def test_one_row_per_roster_student_in_roster_order(klass, marked):
    rows, students = marked["rows"], klass["students"]
    ids = [s["id"] for s in students]
    assert [r["id"] for r in rows[:30]] == ids
    assert all(r["id"] == "" for r in rows[30:]), "further rows are files that name no roster student"
    assert sorted(r["id"] for r in rows if r["id"]) == sorted(ids), "every roster student exactly one row"
    assert rows[0]["name"] == "Zoë Núñez-Brown"
    assert marked["code"] == 2                        # an unreadable file wins over wrong answers


def test_honest_slips_blanks(klass, marked):
    rows, done = marked["rows"], klass["done"]
    for i in HONEST:
        if i == CONFUSABLE:
            continue
        r = rows[i]
        assert float(r["total"]) == float(r["out_of"]) == done[i]["n_steps"], (i, r)
        assert float(r["percent"]) == 100.0, r          # exact: total / out_of is 1
    for i in SLIPS:
        r = rows[i]
        assert float(r["total"]) == float(r["out_of"]) - 1, (i, r)
        assert r["first_mistake"] and r["wrong"] == "1", r
    for i in BLANKS:
        assert int(rows[i]["missing"]) > 0 and rows[i]["error"] == "", rows[i]


def test_truncated_copied_absent_confusable_stray(klass, marked):
    rows, students = marked["rows"], klass["students"]
    t = rows[TRUNCATED]
    assert t["id"] == students[TRUNCATED]["id"] and t["file"].endswith("upload_3.toml")
    assert "unreadable" in t["flags"] and t["error"] and t["total"] == "", t
    for i in (0, COPIER):                              # both rows of the copied sheet
        assert "same_problem" in rows[i]["flags"] and "same_answers" in rows[i]["flags"], rows[i]
    assert f"not_own_problem: the problem of {students[0]['id']}" in rows[COPIER]["flags"]
    assert "not_own_problem" not in rows[0]["flags"]
    assert rows[ABSENT]["flags"] == "no_submission" and rows[ABSENT]["file"] == ""
    assert "confusable_id" in rows[CONFUSABLE]["flags"] and float(rows[CONFUSABLE]["percent"]) == 100.0
    honest_flags = [rows[i]["flags"] for i in HONEST if i not in (0, CONFUSABLE)]
    assert honest_flags == [""] * len(honest_flags), "no flag on a sheet nothing is wrong with"
    stray = [r for r in rows[30:] if r["file"].endswith("stray.toml")]
    assert len(stray) == 1 and "unmatched" in stray[0]["flags"] and "unreadable" in stray[0]["flags"]
    assert "Zoë Núñez-Brown" in marked["text"] and "no_submission" in marked["text"]


def test_canvas_file_by_its_column_rules(klass, marked):
    """Canvas's gradebook import: the header's first five columns Student, ID, SIS User ID, SIS Login ID,
    Section, then the assignment; a 'Points Possible' line; each student found by SIS User ID (or ID)."""
    text = marked["files"]["canvas"].read_text(encoding="utf-8")
    lines = list(csv.reader(io.StringIO(text)))
    assert tuple(lines[0][:5]) == CANVAS_ID_COLUMNS and lines[0][5] == "Worksheet 1"
    assert lines[1][0] == "Points Possible"
    points = float(lines[1][5])
    students = {s["id"]: s for s in klass["students"]}
    body = lines[2:]
    assert [b[2] for b in body] == [s["id"] for s in klass["students"]]
    for b in body:
        s = students[b[2]]
        assert b[1] == s["canvas_id"] and b[0] == f"{s['last']}, {s['first']}"
        assert b[5] == "" or 0 <= float(b[5]) <= points, b
    by_id = {b[2]: b[5] for b in body}
    assert by_id[klass["students"][ABSENT]["id"]] == "" and by_id[klass["students"][TRUNCATED]["id"]] == ""
    assert float(by_id[klass["students"][1]["id"]]) == points


def test_moodle_file_by_its_column_rules(klass, marked):
    """Moodle's CSV grade import: a header line, one line per user found by the column mapped to 'ID number',
    the grade column named as the grade item, a feedback column."""
    lines = list(csv.reader(io.StringIO(marked["files"]["moodle"].read_text(encoding="utf-8"))))
    header = lines[0]
    idc, gc, fc = header.index("ID number"), header.index("Worksheet 1"), header.index("Feedback")
    assert len({len(line) for line in lines}) == 1
    got = {line[idc]: line for line in lines[1:]}
    assert list(got) == [s["id"] for s in klass["students"]]
    for s in klass["students"]:
        line = got[s["id"]]
        assert line[header.index("First name")] == s["first"] and line[header.index("Last name")] == s["last"]
        assert line[header.index("Email address")] == s["email"]
    assert got[klass["students"][ABSENT]["id"]][gc] == ""
    slip = got[klass["students"][SLIPS[0]]["id"]]
    assert float(slip[gc]) == klass["done"][SLIPS[0]]["n_steps"] - 1 and "first mistake" in slip[fc]


def test_matrix_and_summary(klass, marked):
    lines = list(csv.reader(io.StringIO(marked["files"]["matrix"].read_text(encoding="utf-8"))))
    header = lines[0]
    last = klass["done"][0]["last"]
    assert header[:3] == ["name", "id", "file"] and header[-1] == last
    assert len(lines) == len(marked["rows"]) + 1
    assert set(lines[1][3:]) == {"correct"}
    assert lines[1 + SLIPS[0]][-1] == "wrong"
    assert set(lines[1 + ABSENT][3:]) == {""}
    s = json.loads(marked["files"]["summary"].read_text(encoding="utf-8"))
    assert s["students"] == 30 and s["no_submission"] == 1 and s["unreadable"] == 2     # truncated + stray
    assert s["steps_wrong"][0] == {"step": last, "students": len(SLIPS)}
    assert sum(d["students"] for d in s["first_mistakes_by_diagnosis"]) == len(SLIPS)
    assert s["steps_missing"] and s["steps_missing"][0]["students"] == len(BLANKS)


@pytest.mark.plot
def test_the_summary_figure(klass, tmp_path):
    """``--figure``: one PNG at 150 dpi (matplotlib, the ``plot`` extra: its own lane)."""
    from PIL import Image

    figure = tmp_path / "figure.png"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main([str(a) for a in ["check", "--key", klass["keys"], klass["subs"], "--roster", klass["roster"],
                               "--figure", figure]])
    with Image.open(figure) as im:
        assert im.format == "PNG" and im.info["dpi"][0] == pytest.approx(150, abs=1)
        assert im.size[0] >= 15 * 150 - 2


def test_fold_and_file_names():
    assert fold("KA-1000-В") == fold("ka-1000-b") and fold("ka-1000-b") != fold("ka-1000-d")
    assert fold("ΑΒΕ") == fold("abe")                 # Greek capitals alpha, beta, epsilon
    assert name_key("Zoë Núñez-Brown") == "zoenunezbrown"
    roster = [Student("ka-1-b", first="Zoë", last="Núñez-Brown", lms_id="51"), Student("x_2", name="Lee, Ann")]
    by_id = {fold(s.id): [k] for k, s in enumerate(roster)}
    assert match_file("nunezbrownzoe_51_9001_sheet", roster, by_id) == (0, False)              # Canvas
    assert match_file("nunezbrownzoe_late_99_9001_sheet", roster, by_id) == (0, False)
    assert match_file("Zoë Núñez-Brown_12_assignsubmission_file_s", roster, by_id) == (0, False)   # Moodle
    assert match_file("ka-1-b", roster, by_id) == (0, False)
    assert match_file("kа-1-b", roster, by_id) == (0, True)             # Cyrillic а: matched, and said so
    assert match_file("upload_x_2_final", roster, by_id) == (1, False)  # an id with "_" in it
    assert match_file("leeann_7_8_sheet", roster, by_id) == (1, False)
    assert match_file("someone_else", roster, by_id) == (None, False)
    assert match_file("KA-1-B", roster, by_id) == (0, False)            # case alone is no look-alike
    twins = roster + [Student("ka-9", first="Zoë", last="Núñez-Brown")]
    by_id = {fold(s.id): [k] for k, s in enumerate(twins)}
    assert match_file("nunezbrownzoe_77_9001_sheet", twins, by_id) == (None, False)   # two of that name: neither


def test_roster_options_refused_without_roster(capsys, tmp_path):
    code, _, err = _run(capsys, "check", "example", "--matrix", tmp_path / "m.csv")
    assert code == 2 and "--matrix needs --roster" in err
    code, _, err = _run(capsys, "check", "example", "--roster", tmp_path / "r.csv", "--export", "blackboard",
                        tmp_path / "x.csv")
    assert code == 2 and "expected canvas or moodle" in err


def test_copied_sheet_not_flagged_when_answers_differ(klass, tmp_path, capsys):
    """A student's own sheet and a different answer set to another problem: no same_answers, no same_problem."""
    subs = tmp_path / "subs"
    subs.mkdir()
    a, b = klass["students"][0], klass["students"][1]
    _write(subs / f"{a['id']}.toml", klass["done"][0]["raw"])
    other = copy.deepcopy(klass["done"][1]["raw"])
    _write(subs / f"{b['id']}.toml", other)
    code, out, _ = _run(capsys, "check", "--key", klass["keys"], subs, "--roster", klass["roster"], "--json")
    rows = json.loads(out)["rows"]
    assert rows[0]["flags"] == "" and rows[1]["flags"] == "" and np.all([r["flags"] == "no_submission"
                                                                         for r in rows[2:30]])


def test_without_roster_an_unreadable_file_still_names_its_student(klass, tmp_path, capsys):
    """The plain class gradebook (no --roster): the truncated file's row gets its student from the key its
    header's problem id names, and the summary does not call that student 'no submission'."""
    code, out, _ = _run(capsys, "check", "--key", klass["keys"], klass["subs"], "--csv", "-")
    rows = {r["file"].rsplit("/", 1)[-1]: r for r in csv.DictReader(io.StringIO(out))}
    t = rows["upload_3.toml"]
    assert t["student"] == klass["students"][TRUNCATED]["id"] and t["error"] and code == 2
    code, out, _ = _run(capsys, "check", "--key", klass["keys"], klass["subs"], "--json")
    missing = json.loads(out)["summary"]["no_submission"]
    ids = [s["id"] for s in klass["students"]]
    assert ids[TRUNCATED] not in missing
    assert missing == [ids[COPIER], ids[ABSENT]]      # without a roster, by problem: the copier's own is not in


def test_figure_without_matplotlib_says_how_to_install_it_before_marking(klass, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)          # import matplotlib raises ImportError
    book = tmp_path / "book.csv"
    code, out, err = _run(capsys, "check", "--key", klass["keys"], klass["subs"], "--roster", klass["roster"],
                          "--csv", book, "--figure", tmp_path / "f.png")
    assert code == 2 and "pip install" in err and "matplotlib" in err
    assert out == "" and not book.exists(), "nothing marked or written"


def test_output_files_refused_before_marking(klass, tmp_path, capsys):
    """An existing file (without --force), a symbolic link, a sheet or the roster itself, or one path for two
    outputs: refused naming the option, and nothing is written."""
    base = ["check", "--key", klass["keys"], klass["subs"], "--roster", klass["roster"]]
    (tmp_path / "there.json").write_text("{}", encoding="utf-8")
    os.symlink(tmp_path / "elsewhere.json", tmp_path / "link.json")
    for extra, words in ((["--summary", tmp_path / "there.json"], "--summary: "),
                         (["--summary", tmp_path / "link.json"], "symbolic link"),
                         (["--matrix", klass["roster"]], "is a worksheet or the roster"),
                         (["--matrix", tmp_path / "a.csv", "--csv", tmp_path / "a.csv"], "is also the file of")):
        code, out, err = _run(capsys, *base, *extra)
        assert code == 2 and words in err and out == "", (extra, err)
    assert (tmp_path / "there.json").read_text(encoding="utf-8") == "{}"
    assert not (tmp_path / "elsewhere.json").exists() and not (tmp_path / "a.csv").exists()
