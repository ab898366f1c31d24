"""Issue 37, item 5: terminal output shows text, not control sequences. File names, JSON keys, sentences and
paths printed by a command — in its result or in its one error line — have their control characters escaped
(``\\x1b``, ``\\n``, ``\\u202e``), so a hostile name can neither drive the terminal nor forge a second line."""

from __future__ import annotations

import json
import shutil

from transformer_np.errors import ModelFolderError

ESC = "\x1b]0;pwned\x07\x1b[2J"


def test_printable_escapes_controls_and_keeps_text():
    from transformer_np._text import printable  # new in issue 37

    assert printable("bank\u00e9 \u4e2d x") == "bank\u00e9 \u4e2d x"                 # exact: nothing to escape
    assert printable("a\x1b[2Jb\nc\r\td\x7f\x9b\u202e") == "a\\x1b[2Jb\\nc\\r\\td\\x7f\\x9b\\u202e"


def test_library_errors_are_one_printable_line():
    e = ModelFolderError(f"dir{ESC}\nforged line: config.json: bad")
    assert "\x1b" not in str(e) and "\n" not in str(e) and "\\x1b]0;pwned" in str(e)


def test_embed_escapes_the_sentences_it_prints(tiny_folder, cli):
    code, out, err = cli("embed", "--model", tiny_folder, f"the river{ESC}bank", "the bank")
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and "the river\\x1b]0;pwned\\x07\\x1b[2Jbank" in out


def test_an_error_naming_a_hostile_folder_is_one_escaped_line(tiny_folder, refused_cli):
    bad = tiny_folder.parent / f"model{ESC}\nforged"
    shutil.move(tiny_folder, bad)
    (bad / "config.json").write_text('{"hidden_size": NaN}')
    line = refused_cli("embed", "--model", bad, "a sentence")
    assert "\x1b" not in line and "config.json" in line and "\\nforged" in line


def test_a_hostile_json_key_is_escaped_in_the_error(tiny_folder, refused_cli):
    cfg = json.loads((tiny_folder / "config.json").read_text())
    cfg[f"x{ESC}"] = 1e400                                          # refused naming the key path
    (tiny_folder / "config.json").write_text(json.dumps(cfg).replace("Infinity", "1e400"))
    line = refused_cli("embed", "--model", tiny_folder, "a sentence")
    assert "\x1b" not in line and "x\\x1b]0;pwned" in line


def test_train_escapes_the_paths_it_prints(tmp_path, cli):
    out = tmp_path / f"run{ESC}"
    code, msg, err = cli("train", "--task", "sort", "--layers", "1", "--d-model", "16", "--heads", "2",
                         "--batch-size", "4", "--eval-every", "2", "--steps", "2", "--quiet", "--out", out)
    assert code == 0, err
    assert "\x1b" not in msg and "run\\x1b]0;pwned" in msg
