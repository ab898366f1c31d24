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
