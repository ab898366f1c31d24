"""transformer_np._files: bounded reads (pipes and devices included), confined names, atomic writes."""

from __future__ import annotations

import os
import time

import pytest

from transformer_np._files import confined_path, read_bytes_bounded, write_atomic
from transformer_np.errors import FileFormatError, InputValueError


def test_read_bytes_bounded_reads_a_small_file(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"hello")
    assert read_bytes_bounded(p, 5) == b"hello"


def test_read_bytes_bounded_refuses_one_byte_over(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"hello!")
    with pytest.raises(FileFormatError, match=r"a\.txt: more than the 5 bytes a worksheet may have"):
        read_bytes_bounded(p, 5, what="worksheet")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_read_bytes_bounded_stops_on_an_endless_device():
    t0 = time.perf_counter()
    with pytest.raises(FileFormatError, match="/dev/zero: more than the 1048576 bytes"):
        read_bytes_bounded("/dev/zero", 1 << 20)
    assert time.perf_counter() - t0 < 1.0     # refused at the bound, not read to a MemoryError


def test_read_bytes_bounded_names_a_missing_file_and_a_folder(tmp_path):
    with pytest.raises(FileFormatError, match="no such JSON file"):
        read_bytes_bounded(tmp_path / "nope.json", 10, what="JSON file")
    with pytest.raises(FileFormatError, match="is a folder"):
        read_bytes_bounded(tmp_path, 10)


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/b", "..", ".", "", "a\0b"])
def test_confined_path_refuses_paths(tmp_path, name):
    with pytest.raises(InputValueError, match="--name: expected a plain file name"):
        confined_path(tmp_path, name, argument="--name")


def test_confined_path_refuses_a_dangling_symlink(tmp_path):
    (tmp_path / "sheet.toml").symlink_to(tmp_path / "elsewhere.toml")
    with pytest.raises(InputValueError, match="symbolic link"):
        confined_path(tmp_path, "sheet.toml")
    assert not (tmp_path / "elsewhere.toml").exists()


def test_write_atomic_replaces_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "out.txt"
    p.write_text("old")
    write_atomic(p, "new")
    assert p.read_text() == "new"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.txt"]


def test_write_atomic_refuses_a_symlink(tmp_path):
    (tmp_path / "out.txt").symlink_to(tmp_path / "target.txt")
    with pytest.raises(FileFormatError, match="symbolic link"):
        write_atomic(tmp_path / "out.txt", b"x")
    assert not (tmp_path / "target.txt").exists()
