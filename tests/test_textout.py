"""One way out for untrusted text (issue 46, item 5): ``transformer_np.textout`` gives every character a
terminal would act on, or would not show, one escape — in a terminal line, in a CSV cell and in every error."""

from __future__ import annotations

import os

import pytest

from transformer_np.errors import InputValueError
from transformer_np.textout import csv_cell, terminal

# the character, and what a terminal and a CSV cell show instead (typed out, not computed: the contract)
TABLE = [
    ("\x1b", "\\x1b"),                    # ESC: starts every terminal control sequence
    ("\u202e", "\\u202e"),                # right-to-left override (Cf): reorders what is shown
    ("\u2028", "\\u2028"),                # line separator (Zl)
    ("\u2029", "\\u2029"),                # paragraph separator (Zp)
    ("\u200b", "\\u200b"),                # zero width space (Cf): hides a difference
    (os.fsdecode(b"\xff"), "\\xff"),      # a byte that is not UTF-8, as os.fsdecode gives it
    ("\n", "\\n"),
    ("\t", "\\t"),
    ("\r", "\\r"),
    ("\x85", "\\x85"),                    # C1 next line
    ("\x7f", "\\x7f"),                    # DEL
    ("\U000e0001", "\\U000e0001"),        # language tag (Cf, above U+FFFF)
]


@pytest.mark.parametrize("char,shown", TABLE, ids=[repr(c) for c, _ in TABLE])
def test_terminal_escapes_each_character(char, shown):
    assert terminal(f"a{char}b") == f"a{shown}b"


@pytest.mark.parametrize("char,shown", TABLE, ids=[repr(c) for c, _ in TABLE])
def test_a_csv_cell_shows_the_same(char, shown):
    assert csv_cell(f"a{char}b") == f"a{shown}b"


@pytest.mark.parametrize("char,shown", TABLE, ids=[repr(c) for c, _ in TABLE])
def test_an_error_message_shows_the_same(char, shown):
    assert str(InputValueError(f"file 'a{char}b' not found")) == f"file 'a{shown}b' not found"


def test_newlines_kept_only_when_asked():
    text = "line 1\nline\t2\x1b[2J"
    assert terminal(text) == "line 1\\nline\\t2\\x1b[2J"
    assert terminal(text, newlines=True) == "line 1\nline\\t2\\x1b[2J"


def test_ordinary_text_is_unchanged():
    for text in ("", "plain ascii", "café 日本語 ∂L/∂W ×", "path/to/a file.toml", "non\u00a0breaking"):
        assert terminal(text) == text and csv_cell(text) == text


@pytest.mark.parametrize("lead", ["=", "+", "-", "@", "\t", "\r"])
def test_a_formula_cell_gets_a_leading_quote(lead):
    cell = csv_cell(f"{lead}1+1")
    assert cell.startswith("'") and "\t" not in cell and "\r" not in cell
    assert cell == "'" + terminal(f"{lead}1+1")


def test_csv_cell_keeps_numbers_and_empties_none():
    assert csv_cell(3) == 3 and csv_cell(0.5) == 0.5 and csv_cell(-2) == -2   # numbers are not formulas
    assert csv_cell(None) == ""
    assert csv_cell(True) == "True"
    assert csv_cell("a=b") == "a=b"


# ----------------------------------------------------------------------------- through every command's gradebook
# One file name holding every character of the table (but the undecodable byte, which a str name cannot hold:
# it is given as bytes): what each command prints and writes in its CSV is that name as terminal() shows it.
_NASTY = "".join(c for c, _ in TABLE if c != os.fsdecode(b"\xff"))
_NASTY_BYTES = os.fsencode(_NASTY) + b"\xff"


def _nasty_file(folder, suffix: str, content: bytes) -> str:
    """A file whose name is ``_NASTY`` + the byte 0xff + ``suffix``; returns the name as Python sees it."""
    raw = os.path.join(os.fsencode(str(folder)), _NASTY_BYTES + suffix.encode())
    with open(raw, "wb") as f:
        f.write(content)
    return os.fsdecode(raw)


def _cli(*argv, cwd):
    import subprocess
    import sys

    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "transformer_np", *argv], capture_output=True, cwd=cwd, env=env,
                          timeout=600)


def _csv_first_column(path) -> list[str]:
    import csv

    with open(path, encoding="utf-8", newline="") as f:
        return [row[0] for row in csv.reader(f)][1:]


def test_grade_prints_and_writes_a_nasty_file_name_as_terminal_shows_it(tmp_path):
    """``grade``: its text output and its CSV (the one gradebook writer) show the name as :func:`terminal` does."""
    path = _nasty_file(tmp_path, ".ipynb", b"not a notebook")
    book = tmp_path / "book.csv"
    r = _cli("grade", "01_softmax", path, "--csv", str(book), cwd=tmp_path)
    shown = terminal(path)
    assert shown.encode() in r.stdout, r.stdout
    assert not any(b in r.stdout for b in (b"\x1b", "\u202e".encode(), "\u2028".encode(), b"\xff"))
    assert _csv_first_column(book) == [shown]                       # the same escape, in the CSV
    assert not any(ch in book.read_text(encoding="utf-8") for ch in ("\x1b", "\u202e", "\u2028", "\u200b"))


def test_check_prints_and_writes_a_nasty_file_name_as_terminal_shows_it(tmp_path):
    """``check``: its table and its CSV show the name as :func:`terminal` does."""
    path = _nasty_file(tmp_path, ".toml", b"[setup\n")               # unreadable: its row names the file
    (tmp_path / "ok.toml").write_text("[setup]\n", encoding="utf-8")
    book = tmp_path / "book.csv"
    r = _cli("check", "--csv", str(book), "--", path, str(tmp_path / "ok.toml"), cwd=tmp_path)
    shown = terminal(path)
    assert shown.encode() in r.stdout + r.stderr
    assert not any(b in r.stdout + r.stderr for b in (b"\x1b", "\u202e".encode(), "\u2028".encode(), b"\xff"))
    assert shown in _csv_first_column(book)
