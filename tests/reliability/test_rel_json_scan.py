"""Issue 26, the JSON pre-scan: one linear pass (depth, tokens, strings) that agrees with a byte-by-byte reference
on any input and with Python's json on valid input; hostile files of 1 MB refused in well under a second, naming
the file and key; big integers and overflowing numbers refused with their key path."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer_np.errors import FileFormatError, ModelFolderError
from transformer_np.io import jsonfile
from transformer_np.io.jsonfile import MAX_INT_DIGITS, loads_strict, read_json, scan_json

PROPS = settings(max_examples=400, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def reference_scan(raw: bytes) -> tuple[int, int, int, bool]:
    """The obvious state machine, one byte at a time: (depth, first offset of that depth, tokens, unterminated)."""
    inside = esc = False
    depth = best = tokens = 0
    best_at = -1
    for i, ch in enumerate(raw):
        escaped, esc = esc, ch == 0x5C and not esc     # a backslash escapes the next byte unless itself escaped
        if ch == 0x22 and not escaped:
            inside = not inside
            continue
        if inside:
            continue
        if ch in b"[{":
            depth += 1
            if depth > best:
                best, best_at = depth, i
        elif ch in b"]}":
            depth -= 1
        if ch in b"[{,:":
            tokens += 1
    return best, best_at, tokens, inside


# Inputs made of the bytes the scan cares about (plus filler), valid or not: runs of backslashes of every length
# right before quotes and brackets, in every order.
PIECES = [b"\\", b"\\" * 2, b"\\" * 3, b'"', b'\\"', b'\\\\"', b"[", b"]", b"{", b"}", b",", b":", b"a", b" ",
          "\u00e9".encode()]
NOISE = st.lists(st.sampled_from(PIECES), max_size=120).map(b"".join)


@PROPS
@given(NOISE)
def test_scan_agrees_with_the_byte_by_byte_reference_on_any_input(raw):
    assert tuple(scan_json(raw)) == reference_scan(raw)


@PROPS
@given(NOISE, st.integers(1, 7))
def test_scan_is_the_same_across_block_boundaries(raw, block):
    # The scan carries three numbers from block to block; tiny blocks put every boundary everywhere.
    old = jsonfile._SCAN_CHUNK
    jsonfile._SCAN_CHUNK = block
    try:
        small = scan_json(raw)
    finally:
        jsonfile._SCAN_CHUNK = old
    assert tuple(small) == reference_scan(raw)


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


TEXT = st.text(alphabet=st.sampled_from('ab"\\/[]{},:\n\t\u00e9\u4e2d\U0001F600'), max_size=12)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10 ** 30, 10 ** 30) | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(TEXT, kids, max_size=4),
    max_leaves=40)


@PROPS
@given(VALUES, st.booleans(), st.sampled_from([None, 1]))
def test_valid_json_parses_as_pythons_json_and_the_scan_finds_its_depth(value, ascii_only, indent):
    raw = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode("utf-8")
    scan = scan_json(raw)
    assert scan.depth == _depth(value)
    assert not scan.unterminated
    assert loads_strict(raw, "v.json") == json.loads(raw)


@PROPS
@given(st.integers(0, 20), st.integers(0, 40), st.integers(1, 30))
def test_escaped_quotes_and_backslashes_before_brackets(n_backslashes, n_open, seed):
    # '"a' + k backslashes + '"' + ... : the quote closes the string iff k is even.
    raw = b'["a' + b"\\" * n_backslashes + b'"' + b"[" * n_open + b'"]'
    depth = reference_scan(raw)[0]
    assert scan_json(raw).depth == depth
    assert depth == (1 + n_open if n_backslashes % 2 == 0 else 1)


@PROPS
@given(st.integers(MAX_INT_DIGITS + 1, 3 * MAX_INT_DIGITS), st.sampled_from(["", "-"]),
       st.sampled_from(["n", "a.b", "l[2]"]))
def test_huge_integers_are_refused_naming_the_key(digits, sign, where):
    number = sign + "7" * digits
    value = {"n": number, "a": {"b": number}, "l": [0, 1, number]}
    text = json.dumps({k: v for k, v in value.items() if where.startswith(k)}).replace(f'"{number}"', number)
    with pytest.raises(FileFormatError) as info:
        loads_strict(text, "big.json")
    msg = str(info.value)
    assert msg.startswith(f"big.json: {where} is an integer of {digits} digits")
    assert "set_int_max_str_digits" not in msg and "\n" not in msg


def test_an_integer_of_the_largest_accepted_length_parses():
    n = int("9" * MAX_INT_DIGITS)
    assert loads_strict(f'{{"n": {n}}}', "x.json") == {"n": n}


@pytest.mark.parametrize("text, path", [('{"a": [1, 1e400]}', "a[1]"), ('{"b": -2e308}', "b"),
                                        ('{"c": {"d": NaN}}', "c.d")])
def test_numbers_that_are_not_finite_are_refused_naming_the_key(text, path):
    with pytest.raises(FileFormatError) as info:
        loads_strict(text, "x.json")
    assert str(info.value).startswith(f"x.json: {path} is ")


def test_overflowing_numbers_are_accepted_where_constants_are():
    # A diverged run's history holds Infinity; 1e400 is the same number written differently.
    assert loads_strict('{"loss": [1e400, -Infinity]}', "h", allow_constants=True) == {
        "loss": [float("inf"), float("-inf")]}


# ----------------------------------------------------------------------------- hostile files: time and message
# Times are CPU seconds of this process (time.process_time): a bound on the work done, not on how busy the
# machine is.
MB = 2 ** 20


def _hostile():
    return {
        "unterminated escaped quotes": b'{"a": "' + b'\\"' * (MB // 2),
        "escaped backslashes then quotes": b'{"a": "' + b'\\\\\\"' * (MB // 4),
        "deep nesting": b"[" * MB,
        "deep nesting in an object": b'{"a": ' * (MB // 6),
        "a million empty objects": b"[" + b"{}," * (MB // 3) + b"{}]",
        "quotes and brackets": b'"[' * (MB // 2),
        "one huge integer": b'{"n": ' + b"1" * MB + b"}",
    }


@pytest.mark.parametrize("name", list(_hostile()))
def test_a_hostile_1mb_json_file_is_refused_fast_naming_the_file(tmp_path, name):
    path = tmp_path / "config.json"
    path.write_bytes(_hostile()[name])
    t0 = time.process_time()
    with pytest.raises(ModelFolderError) as info:
        read_json(path, error=ModelFolderError)                 # the default bounds
    seconds = time.process_time() - t0
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg, msg
    assert seconds < 1.0, f"{name}: {seconds:.2f} s"


def test_the_scan_time_per_megabyte_is_bounded_for_every_kind_of_input():
    # Generous: about 0.04 s per MB measured on a busy 2-core machine; the old regex took 2 hours on the first.
    for name, raw in _hostile().items():
        t0 = time.process_time()
        scan_json(raw)
        assert time.process_time() - t0 < 1.0 * len(raw) / MB, name


def test_the_token_bound_is_checked_before_parsing():
    raw = b"[" + b"0," * 1000 + b"0]"
    assert scan_json(raw).tokens == 1001
    assert loads_strict(raw, "t.json", max_tokens=1001) == [0] * 1001
    with pytest.raises(FileFormatError, match=r"^t\.json: JSON with 1001 values and keys .* at most 1000"):
        loads_strict(raw, "t.json", max_tokens=1000)


def test_a_device_is_refused_at_open_and_a_proc_file_at_the_bound(tmp_path):
    t0 = time.process_time()
    with pytest.raises(ModelFolderError, match=r"^/dev/zero: is a character device, not a regular file"):
        read_json("/dev/zero", error=ModelFolderError, max_bytes=1000)
    with pytest.raises(ModelFolderError, match=r"^/proc/self/maps: more than the 100 bytes"):
        read_json("/proc/self/maps", error=ModelFolderError, max_bytes=100)    # st_size 0: the bytes read count
    assert time.process_time() - t0 < 1.0


def test_a_1mb_hostile_config_json_is_refused_by_the_embed_command(tiny_folder, refused_cli):
    (tiny_folder / "config.json").write_bytes(b'{"a": "' + b'\\"' * (MB // 2))
    from transformer_np.cli import build_parser

    build_parser()                  # the command modules' imports: a fixed cost of every command, timed apart
    t0 = time.process_time()
    line = refused_cli("embed", "--model", tiny_folder, "a sentence")
    assert time.process_time() - t0 < 1.0
    assert str(tiny_folder / "config.json") in line


def test_a_huge_integer_in_config_json_is_refused_by_the_embed_command(tiny_folder, refused_cli):
    path = tiny_folder / "config.json"
    path.write_text(path.read_text().replace('"hidden_size": 16', '"hidden_size": ' + "1" * 5000))
    line = refused_cli("embed", "--model", tiny_folder, "a sentence")
    assert f"{path}: hidden_size is an integer of 5000 digits" in line


def test_a_huge_integer_in_a_safetensors_header_is_refused_naming_the_tensor_and_field():
    import numpy as np

    from transformer_np.io.safetensors import dumps_safetensors, loads_safetensors

    raw = dumps_safetensors({"a": np.zeros(3, np.float32)})
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["a"]["shape"] = ["BIG"]
    text = json.dumps(header).replace('"BIG"', "7" * 5000).encode()
    with pytest.raises(FileFormatError) as info:
        loads_safetensors(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    msg = str(info.value)
    # the header goes through the strict JSON reader (issue 37): the key path names the tensor and the field
    assert "the header: a.shape[0] is an integer of 5000 digits" in msg
    assert "set_int_max_str_digits" not in msg
