"""Hostile and oversized worksheets are refused before parsing, fast, in one line naming the file and the key.

Each refusal is bounded generously (< 1 s for something that takes milliseconds); the point is that nothing is
parsed, converted or computed at the size the file asks for. The largest legitimate sheet (every quantity of a
sheet at the hand-calculation limits, forward and backward) is accepted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from transformer_np.errors import WorksheetError
from transformer_np.worksheets import check
from transformer_np.worksheets.format import LIMITS, MAX_ABS
from transformer_np.worksheets.generate import answer_key, new_worksheet, to_toml
from transformer_np.worksheets.tomlio import (
    MAX_DEPTH,
    MAX_ENTRIES,
    MAX_FILE_BYTES,
    MAX_KEYS,
    MAX_LINE_CHARS,
    MAX_LINES,
    MAX_NUMBER_CHARS,
    MAX_STRING_CHARS,
    MAX_TABLES,
)

GOOD = """[setup]
tokens = ["the", "cat", "sat"]
d_model = 4

[input]
H0 = [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]
"""
REFUSAL_SECONDS = 1.0      # generous: each refusal below takes milliseconds


def _write(tmp_path, text, name="w.toml"):
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return str(p)


def _refused(source, *words):
    """check(source) raises a one-line WorksheetError containing every word, in under REFUSAL_SECONDS."""
    t = time.perf_counter()
    with pytest.raises(WorksheetError) as e:
        check(source)
    elapsed = time.perf_counter() - t
    msg = str(e.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, (w, msg)
    assert elapsed < REFUSAL_SECONDS, (elapsed, msg)
    return msg


# ----------------------------------------------------------------------------- files, before the parser
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1_000, 200_000])
def test_deep_nesting_is_refused_before_the_parser(tmp_path, depth):
    opening = "\n".join("[" * min(4_000, depth - i) for i in range(0, depth, 4_000))    # lines within bounds
    text = GOOD.replace("H0 = [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]", "H0 = " + opening + "]")
    path = _write(tmp_path, text)
    _refused(path, path, "[input].H0", f"nested more than {MAX_DEPTH} deep")     # not a RecursionError


def test_unclosed_nesting_in_a_header_table_is_refused(tmp_path):
    path = _write(tmp_path, "[setup]\ntokens = " + ("[" * 4_000 + "\n") * 50)
    _refused(path, path, "[setup].tokens", "nested")


@pytest.mark.parametrize("digits", [MAX_NUMBER_CHARS + 1, 401, 4_000])
def test_a_huge_integer_literal_is_refused_with_its_key(tmp_path, digits):
    path = _write(tmp_path, GOOD + "dH = [[" + "9" * digits + ", 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]\n")
    _refused(path, path, "[input].dH", f"an integer of {digits} characters")     # not OverflowError / int advice


def test_a_two_million_entry_file_is_refused_unread(tmp_path):
    path = _write(tmp_path, GOOD + "dH = [" + "0," * 2_000_000 + "0]\n")
    _refused(path, path, f"more than the {MAX_FILE_BYTES} bytes")


def test_too_many_entries_are_refused_while_scanning(tmp_path):
    rows = (MAX_ENTRIES + 100) // 100
    path = _write(tmp_path, GOOD + "dH = [\n" + ("0, " * 100 + "\n") * rows + "0]\n")
    assert os.path.getsize(path) < MAX_FILE_BYTES          # within the size bound: the entry bound refuses it
    _refused(path, path, "[input].dH", f"more than {MAX_ENTRIES} entries")


@pytest.mark.parametrize("name,text,words", [
    ("long line", GOOD + "dH = [" + " " * (MAX_LINE_CHARS + 10) + "]\n", ["[input].dH", "a line of"]),
    ("lines", GOOD + "dH = [" + "\n" * (MAX_LINES + 10) + "]\n", ["lines", f"at most {MAX_LINES}"]),
    ("keys", GOOD + "[layer1]\n" + "".join(f"k{i} = 1\n" for i in range(MAX_KEYS + 10)), ["[layer1]", "keys"]),
    ("tables", GOOD + "".join(f"[t{i}]\n" for i in range(MAX_TABLES + 10)), ["[tables]"]),
    ("string", GOOD.replace('"sat"', '"' + "s" * (MAX_STRING_CHARS + 10) + '"'), ["[setup].tokens", "a string of"]),
    ("escapes", '[setup]\ntokens = ["' + '\\"' * 100_000 + "\n", ["[setup].tokens"]),
])
def test_each_scan_bound(tmp_path, name, text, words):
    path = _write(tmp_path, text)
    assert len(text.encode()) <= MAX_FILE_BYTES, name
    _refused(path, path, *words)


@pytest.mark.parametrize("key,value", [("H0", "1e300"), ("dH", "1e308"), ("dH", "-1e308"),
                                       ("H0", str(int(MAX_ABS) + 1))])
def test_a_huge_number_is_refused_naming_file_and_key(tmp_path, key, value):
    rows = [["1", "0", "1", "0"], ["0", "1", "0", "1"], ["1", "1", "0", "0"]]
    rows[1][2] = value
    matrix = "[" + ", ".join("[" + ", ".join(r) + "]" for r in rows) + "]"
    text = GOOD.replace("H0 = [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]", "") + f"{key} = {matrix}\n"
    if key == "dH":
        text += "H0 = [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]\n"
    path = _write(tmp_path, text)
    _refused(path, path, f"[input].{key}", "[1][2]", "beyond")


def test_an_answer_of_1e300_is_refused_naming_the_quantity(tmp_path):
    path = _write(tmp_path, GOOD + "\n[answers.layer1]\nQ = { cat = [0, 1e300, 0, 0] }\n")
    _refused(path, path, "[answers.layer1].Q.cat", "beyond")


def test_devices_and_pipes_are_refused_without_reading_or_blocking(tmp_path):
    # issue 37: a worksheet is a regular file; a device or a FIFO is refused at open (non-blocking), naming it
    _refused("/dev/zero", "/dev/zero", "is a character device, not a regular file")
    fifo = str(tmp_path / "pipe.toml")
    os.mkfifo(fifo)                                    # no writer: a blocking open would wait forever
    t0 = time.process_time()
    _refused(fifo, fifo, "is a FIFO (named pipe), not a regular file")
    assert time.process_time() - t0 < 1.0


def test_an_unterminated_string_reaches_the_parser(tmp_path):
    path = _write(tmp_path, '[setup]\ntokens = ["' + '\\"' * 100 + "\n")       # short: reaches the parser
    _refused(path, path, "not valid TOML")


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = _write(tmp_path, b"\xef\xbb\xbf" + GOOD.encode())
    assert check(path).answered == 0


# ----------------------------------------------------------------------------- dicts: shapes before numbers
def test_a_two_million_entry_list_is_refused_from_its_length():
    raw = {"setup": {"tokens": ["the", "cat", "sat"], "d_model": 4}, "input": {"H0": [0.0] * 2_000_000}}
    _refused(raw, "[input].H0", "expected shape (3, 4)", "2000000 entries")
    raw = {"setup": {"tokens": ["a"] * 2_000_000}, "input": {"H0": [[0.0]]}}
    _refused(raw, "[setup].tokens", f"at most {LIMITS['tokens']} tokens")


def test_deeply_nested_dict_values_are_refused_without_recursion():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    raw = {"setup": {"tokens": ["the", "cat", "sat"], "d_model": 4}, "input": {"H0": [deep, deep, deep]}}
    _refused(raw, "[input].H0", "expected shape (3, 4)")


def test_huge_python_integers_are_refused_without_overflow():
    big = 10 ** 400
    raw = {"setup": {"tokens": ["the", "cat", "sat"], "d_model": 4},
           "input": {"H0": [[1, 0, 1, 0], [0, 1, big, 1], [1, 1, 0, 0]]}}
    _refused(raw, "[input].H0", "[1][2]", "an integer of 401 digits", "beyond")
    _refused({**raw, "input": {"H0": [[1, 0, 1, 0]] * 3}, "setup": {**raw["setup"], "eps": big}}, "[setup].eps")
    _refused({**raw, "input": {"H0": [[1, 0, 1, 0]] * 3}, "setup": {**raw["setup"], "seed": big}}, "[setup].seed")


def test_a_long_token_is_refused():
    raw = {"setup": {"tokens": ["the", "x" * 10_000, "sat"], "d_model": 4},
           "input": {"H0": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]}}
    _refused(raw, "[setup].tokens", "a token is a word")


def test_numpy_tokens_print_as_words():
    raw = {"setup": {"tokens": [np.str_("the"), np.str_("cat"), np.str_("sat")], "d_model": 4},
           "input": {"H0": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]},
           "answers": {"layer1": {"Q": {"the": [9, 9, 9, 9]}}}}
    r = check(raw)
    text = r.format(answers=True) + json.dumps(r.to_dict()) + repr(r.first_mistake)
    assert "np.str_" not in text and all(type(t) is str for t in r.worksheet.tokens)


# ----------------------------------------------------------------------------- the largest legitimate sheet
def test_the_largest_hand_sheet_fits_every_bound(tmp_path):
    """Every quantity, forward and backward, of a sheet at the limits: written as TOML it is within the size and
    entry bounds, and check reads it and marks the key all correct."""
    raw = new_worksheet(tokens=LIMITS["tokens"], d_model=LIMITS["d_model"], heads=LIMITS["d_model"],
                        layers=LIMITS["layers"], d_ff=LIMITS["d_ff"], backward=True, seed=3, decimals=4)
    text = to_toml(raw, answers=answer_key(raw))
    path = _write(tmp_path, text)
    assert len(text.encode()) < MAX_FILE_BYTES and text.count(",") < MAX_ENTRIES
    r = check(path)
    assert r.counts()["wrong"] == 0 and r.answered == len(r.steps)


# ----------------------------------------------------------------------------- JSON is strict
def test_json_never_carries_nan(tmp_path):
    r = check(_write(tmp_path, GOOD + "\n[answers.layer1]\nQ = { the = [1, 0, 1, 0] }\n"))
    json.loads(r.to_json())                               # strict JSON parses it
    r.steps[0]["max_abs_error"] = float("nan")            # what a non-finite value would do: refused, not printed
    with pytest.raises(WorksheetError, match="not finite"):
        r.to_json()


def test_cli_refusals_are_one_line_with_status_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    cases = {"deep.toml": GOOD + "dH = " + "[" * 200_000, "int.toml": GOOD + "dH = " + "9" * 401,
             "inf.toml": GOOD.replace("[1, 1, 0, 0]]", "[1, 1, 0, 1e308]]")}
    for name, text in cases.items():
        path = _write(tmp_path, text, name)
        r = subprocess.run([sys.executable, "-m", "transformer_np", "check", path, "--json"], capture_output=True,
                           text=True, env=env, timeout=300)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and path in lines[0] and "[input]" in lines[0], (name, r.stderr)
        assert r.stdout == "" and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- generated hostile files
_PIECES = ["[", "]", "{", "}", ",", "\n", " ", "\t", "=", '"', "'", '\\"', "\\", "#", ".", "0", "9" * 70, "1e308",
           "a", "tokens", "H0 = ", "[input]\n", "[[", '"""', "'''", "-", "_", "inf", "nan", "\ufeff", "é"]


@pytest.mark.parametrize("seed", range(12))
def test_generated_hostile_files_are_answered_fast(tmp_path, seed):
    """Files made of random runs of TOML's special characters (nesting, quotes, escapes, long runs of spaces,
    keys, headers, huge numbers), up to the size bound: each is refused with a one-line WorksheetError (or, if
    it happens to be a valid sheet, checked), in under a second — no regex backtracking, no recursion, no
    quadratic scan."""
    rng = np.random.default_rng(seed)
    parts, size = [GOOD] if seed % 2 else [], 0
    while size < MAX_FILE_BYTES - 5_000:
        piece = _PIECES[rng.integers(len(_PIECES))] * int(rng.choice([1, 3, 50, 2_000]))
        parts.append(piece)
        size += len(piece.encode())
    path = _write(tmp_path, "".join(parts)[: MAX_FILE_BYTES // 2 if seed % 3 == 0 else None])
    t = time.perf_counter()
    try:
        check(path)
    except WorksheetError as e:
        assert "\n" not in str(e) and path in str(e), str(e)[:300]
    assert time.perf_counter() - t < REFUSAL_SECONDS


def test_a_backslash_at_the_end_of_a_string_line(tmp_path):
    """Found by the generated files: a basic string whose line ends in a backslash is refused by the parser,
    not by an error in the scan."""
    path = _write(tmp_path, GOOD + 'x = "abc\\\n"\n')
    _refused(path, path, "not valid TOML")
