"""Issue 36, item 5: a gradebook that cannot be turned against its reader. Special files get an error row without
blocking; a symbolic link is followed inside the class folder and refused (with a row) outside it; a non-UTF-8
name gets a row, escaped; CSV cells that a spreadsheet would evaluate are escaped; terminal control characters
are shown escaped; --csv refuses an existing file unless --force, and --csv - writes to standard output; the
reports are streamed, so memory does not grow with the class."""

from __future__ import annotations

import csv
import io
import os
import socket
import subprocess
import sys
import tracemalloc

import pytest

from transformer_np.cli import main
from transformer_np.textout import terminal
from transformer_np.worksheets.generate import answer_key, new_worksheet, to_toml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RAW = new_worksheet(seed=4)
SHEET = to_toml(RAW, answers={"layer1": {k: v for k, v in answer_key(RAW)["layer1"].items() if k in ("Q", "K")}})


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _cli(*argv, cwd=None, timeout=120):
    """The command in a fresh process (a hang fails the test instead of stopping the run)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "transformer_np", *map(str, argv)], capture_output=True,
                          cwd=cwd, env=env, timeout=timeout)


def _rows(text) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text if isinstance(text, str) else text.decode("utf-8"))))


def _class(tmp_path, names=("alice.toml", "bob.toml")):
    folder = tmp_path / "class"
    folder.mkdir()
    for n in names:
        (folder / n).write_text(SHEET, encoding="utf-8")
    return folder


def test_special_files_get_a_row_without_blocking(tmp_path):
    """A FIFO named *.toml (no writer: opening it for reading would wait forever), a socket and a folder named
    *.toml: each gets an error row saying what it is, the others are marked, and the run ends."""
    folder = _class(tmp_path)
    os.mkfifo(folder / "c_fifo.toml")
    (folder / "d_folder.toml").mkdir()
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(folder / "e_socket.toml"))
        r = _cli("check", folder, "--csv", "-", timeout=120)
    finally:
        s.close()
    rows = {os.path.basename(x["file"]): x for x in _rows(r.stdout)}
    assert sorted(rows) == ["alice.toml", "bob.toml", "c_fifo.toml", "d_folder.toml", "e_socket.toml"]
    assert rows["alice.toml"]["total"] == "2" and rows["bob.toml"]["error"] == ""
    assert "FIFO" in rows["c_fifo.toml"]["error"] and "folder" in rows["d_folder.toml"]["error"]
    assert "socket" in rows["e_socket.toml"]["error"]
    assert r.returncode == 2


def test_symlinks_inside_the_class_are_followed_and_outside_refused(tmp_path):
    folder = _class(tmp_path)
    os.symlink("alice.toml", folder / "carol.toml")                     # inside: a row of its own
    secret = tmp_path / "outside.toml"
    secret.write_text(SHEET, encoding="utf-8")
    os.symlink(secret, folder / "dave.toml")                            # outside the class folder
    os.symlink("/etc/passwd", folder / "eve.toml")
    r = _cli("check", folder, "--csv", "-")
    rows = {os.path.basename(x["file"]): x for x in _rows(r.stdout)}
    assert sorted(rows) == ["alice.toml", "bob.toml", "carol.toml", "dave.toml", "eve.toml"]
    assert rows["carol.toml"]["total"] == rows["alice.toml"]["total"] == "2"
    for name in ("dave.toml", "eve.toml"):
        assert "outside the class folder" in rows[name]["error"] and rows[name]["total"] == "", name


def test_a_non_utf8_name_gets_an_escaped_row(tmp_path):
    folder = _class(tmp_path)
    bad = os.fsencode(str(folder)) + b"/caf\xe9.toml"
    with open(bad, "wb") as f:
        f.write(SHEET.encode("utf-8"))
    book = tmp_path / "book.csv"
    r = _cli("check", folder, "--csv", book)
    assert r.returncode == 0, r.stderr
    rows = _rows(book.read_text(encoding="utf-8"))
    names = [os.path.basename(x["file"]) for x in rows]
    assert names == ["alice.toml", "bob.toml", "caf\\xe9.toml"] and rows[2]["total"] == "2"
    assert b"caf\\xe9.toml" in r.stdout


@pytest.mark.parametrize("lead", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_cells_a_spreadsheet_would_run_are_escaped(tmp_path, capsys, monkeypatch, lead):
    """A file name beginning with = + - @ TAB or CR (and so the error message that quotes it) reaches the CSV with
    a leading ' — a spreadsheet shows it as text instead of evaluating it."""
    folder = _class(tmp_path, ())
    name = f"{lead}HYPERLINK(\"x\").toml"
    broken = f"{lead}cmd.toml"
    (folder / name).write_text(SHEET, encoding="utf-8")
    (folder / broken).write_text("[setup\n", encoding="utf-8")
    monkeypatch.chdir(folder)
    code, out, _ = _run(capsys, "check", "--csv", "-", "--", name, broken)
    rows = list(csv.reader(io.StringIO(out)))
    cells = [c for row in rows[1:] for c in row if c]
    assert cells and all(not c.startswith(("=", "+", "-", "@", "\t", "\r")) for c in cells), cells
    # neutralised: a leading ' (the spreadsheets' escape), or TAB/CR written as an escape (a leading backslash)
    assert any(c.startswith(("'" + terminal(lead), "'\\", "\\")) for c in cells)
    assert code == 2


def test_terminal_control_characters_are_shown_escaped(tmp_path):
    """A token and a file name holding escape sequences (clear the screen, set the window title, an 8-bit CSI,
    a right-to-left override) are printed escaped: no control byte reaches the terminal."""
    folder = _class(tmp_path, ())
    evil = RAW | {"setup": {**RAW["setup"], "tokens": ["\x1b[2J", "cat\u202e", "\x9b31m"]}}
    (folder / "a\x1b]0;owned\x07.toml").write_text(to_toml(evil), encoding="utf-8")
    (folder / "b.toml").write_text(SHEET, encoding="utf-8")
    for argv in (("check", folder), ("check", folder / "a\x1b]0;owned\x07.toml"), ("check", folder, "--csv", "-")):
        r = _cli(*argv)
        text = (r.stdout + r.stderr).decode("utf-8")
        assert not any((ord(c) < 32 and c not in "\n") or 0x7f <= ord(c) <= 0x9f or c == "\u202e" for c in text), \
            (argv, text)
        assert "\\x1b" in text, argv


def test_csv_refuses_an_existing_file_unless_force(tmp_path, capsys):
    folder = _class(tmp_path)
    roster = tmp_path / "roster.xlsx"
    roster.write_bytes(b"PK\x03\x04 the class list")
    code, _, err = _run(capsys, "check", folder, "--csv", roster)
    assert code == 2 and "already exists" in err and "--force" in err
    assert roster.read_bytes() == b"PK\x03\x04 the class list"
    code, _, _ = _run(capsys, "check", folder, "--csv", roster, "--force")
    assert code == 0 and roster.read_text(encoding="utf-8").startswith("file,")


def test_csv_dash_is_standard_output(tmp_path, capsys, monkeypatch):
    folder = _class(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, out, _ = _run(capsys, "check", folder, "--csv", "-")
    assert code == 0 and not os.path.exists(tmp_path / "-")
    assert [os.path.basename(r["file"]) for r in _rows(out)] == ["alice.toml", "bob.toml"]
    assert "marks" not in out.splitlines()[0]                       # only the CSV: no text table


def _peak(folder, n, capsys) -> int:
    tracemalloc.start()
    try:
        code = main(["check", str(folder)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    out, _ = capsys.readouterr()
    assert code == 0 and sum(line.startswith(str(folder)) for line in out.splitlines()) == n
    return peak


def test_memory_does_not_grow_with_the_class(tmp_path, capsys):
    """Reports are streamed (a row is written and the report dropped): marking 60 sheets peaks no higher than
    marking 15, give or take 1 MB (each report kept would cost about 0.1 MB, 4.5 MB for the 45 more)."""
    small, large = tmp_path / "small", tmp_path / "large"
    for folder, n in ((small, 15), (large, 60)):
        folder.mkdir()
        for i in range(n):
            (folder / f"s{i:03d}.toml").write_text(SHEET, encoding="utf-8")
    _peak(small, 15, capsys)                                       # warm-up: imports, caches
    a = _peak(small, 15, capsys)
    b = _peak(large, 60, capsys)
    assert b - a < 1_000_000, (a, b)
