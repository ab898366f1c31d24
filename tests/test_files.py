"""transformer_np._files: bounded reads (pipes and devices included), confined names, atomic writes."""

from __future__ import annotations

import os
import time

import pytest

from transformer_np._files import confined_path, read_bytes_bounded, replace_atomically, temporary_name, write_atomic
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
def test_read_bytes_bounded_refuses_an_endless_device_at_open():
    t0 = time.perf_counter()
    with pytest.raises(FileFormatError, match="^/dev/zero: is a character device, not a regular file"):
        read_bytes_bounded("/dev/zero", 1 << 20)
    assert time.perf_counter() - t0 < 1.0     # refused at open, nothing read


def test_read_bytes_bounded_counts_the_bytes_of_a_file_that_says_it_is_empty():
    # /proc files are regular files of size 0 that hold far more: the bound is on the bytes read
    assert os.path.getsize("/proc/self/maps") == 0
    with pytest.raises(FileFormatError, match="^/proc/self/maps: more than the 10 bytes"):
        read_bytes_bounded("/proc/self/maps", 10)


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


def test_replace_atomically_writes_what_the_writer_writes(tmp_path):
    p = tmp_path / "out.bin"
    p.write_bytes(b"old")
    assert replace_atomically(p, lambda f: (f.write(b"ne"), f.write(b"w"))) == p
    assert p.read_bytes() == b"new"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.bin"]


class _Midway(Exception):
    pass


def _fails_midway(f):
    f.write(b"half of the new ")
    f.flush()
    raise _Midway("the writer gave up")


@pytest.mark.parametrize("existed", [True, False])
def test_replace_atomically_a_writer_raising_midway_leaves_no_temporary(tmp_path, existed):
    p = tmp_path / "out.bin"
    if existed:
        p.write_bytes(b"old")
    with pytest.raises(_Midway, match="the writer gave up"):     # the writer's own exception, unchanged
        replace_atomically(p, _fails_midway)
    assert sorted(x.name for x in tmp_path.iterdir()) == (["out.bin"] if existed else [])
    if existed:
        assert p.read_bytes() == b"old"


def test_replace_atomically_an_oserror_midway_propagates_and_cleans_up(tmp_path):
    p = tmp_path / "out.bin"
    p.write_bytes(b"old")

    def full_disk(f):
        f.write(b"PK half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left on device"):
        replace_atomically(p, full_disk)
    assert p.read_bytes() == b"old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.bin"]


def test_replace_atomically_removes_a_leftover_at_its_temporary_name(tmp_path):
    p = tmp_path / "out.bin"
    tmp = temporary_name(p)
    assert tmp.parent == tmp_path and tmp.name == f".out.bin.{os.getpid()}.tmp"
    tmp.write_bytes(b"this pid's leftover from an earlier failed write")
    replace_atomically(p, lambda f: f.write(b"new"))
    assert p.read_bytes() == b"new"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.bin"]


def test_write_atomic_turns_an_oserror_into_the_callers_error(tmp_path, monkeypatch):
    p = tmp_path / "out.txt"
    p.write_text("old")

    def no_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", no_fsync)
    with pytest.raises(InputValueError, match=r"out\.txt: cannot be written \(Input/output error\)"):
        write_atomic(p, "new", error=InputValueError)
    monkeypatch.undo()
    assert p.read_text() == "old"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.txt"]
