"""The NumPy safetensors reader: round trips, agreement with the reference ``safetensors``
package, and a clear ValueError (naming the tensor) for every kind of corrupt file."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer_np.io.safetensors import (
    MAX_HEADER_SIZE,
    dumps_safetensors,
    load_safetensors,
    loads_safetensors,
    read_safetensors_header,
    save_safetensors,
)


def _tensors():
    rng = np.random.default_rng(0)
    return {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=(4,)),
            "h": rng.normal(size=(2, 2)).astype(np.float16), "i": np.arange(6, dtype=np.int64).reshape(2, 3),
            "flag": np.array([True, False, True]), "scalar": np.array(2.5, dtype=np.float32),
            "empty": np.zeros((0, 5), dtype=np.float32)}


def _file(header: dict, data: bytes, pad: bytes = b"") -> bytes:
    h = json.dumps(header).encode() + pad
    return struct.pack("<Q", len(h)) + h + data


def test_round_trip_bytes_and_file(tmp_path):
    t = _tensors()
    out = loads_safetensors(dumps_safetensors(t, {"format": "np"}))
    assert set(out) == set(t)
    for k in t:
        assert out[k].dtype == t[k].dtype and out[k].shape == t[k].shape
        np.testing.assert_array_equal(out[k], t[k])   # exact: a file round trip
    p = tmp_path / "x.safetensors"
    save_safetensors(p, t, {"format": "np"})
    header, meta = read_safetensors_header(p)
    assert meta == {"format": "np"}
    assert header["w"] == ("F32", (3, 4)) and header["h"] == ("F16", (2, 2))
    sub = load_safetensors(p, names=["w"])
    assert list(sub) == ["w"]
    np.testing.assert_array_equal(sub["w"], t["w"])   # exact: a file round trip
    assert sub["w"].flags.writeable


def test_big_endian_input_is_written_little_endian():
    a = np.arange(5, dtype=">f8")
    out = loads_safetensors(dumps_safetensors({"a": a}))["a"]
    assert out.dtype == np.float64 and out.dtype.isnative
    np.testing.assert_array_equal(out, np.arange(5.0))   # exact: byte order only


def test_agrees_with_reference_package(tmp_path):
    sn = pytest.importorskip("safetensors.numpy", reason="pip install safetensors")
    t = _tensors()
    # the reference writes, we read
    p = tmp_path / "ref.safetensors"
    sn.save_file(t, str(p))
    ours = load_safetensors(p)
    for k in t:
        np.testing.assert_array_equal(ours[k], t[k])   # exact: a file round trip
        assert ours[k].dtype == t[k].dtype
    # we write, the reference reads
    q = tmp_path / "ours.safetensors"
    save_safetensors(q, t)
    ref = sn.load_file(str(q))
    for k in t:
        np.testing.assert_array_equal(ref[k], t[k])   # exact: a file round trip


def test_bf16_is_widened_exactly():
    torch = pytest.importorskip("torch", reason="pip install torch==2.13.0")
    from safetensors.torch import save as st_save

    x = torch.tensor([[1.0, -2.5, 3.140625], [1e-3, 65280.0, -0.0]]).to(torch.bfloat16)
    out = loads_safetensors(st_save({"x": x}))["x"]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x.float().numpy())   # exact: bfloat16 → float32 is exact


def test_model_file_matches_reference():
    sn = pytest.importorskip("safetensors.numpy", reason="pip install safetensors")
    from transformer_np.io.pretrained import model_folder

    try:
        path = model_folder("all-MiniLM-L6-v2") / "model.safetensors"
    except ImportError as e:
        pytest.skip(str(e))
    ours, ref = load_safetensors(path), sn.load_file(str(path))
    assert set(ours) == set(ref)
    for k in ref:
        assert ours[k].dtype == ref[k].dtype
        np.testing.assert_array_equal(ours[k], ref[k])   # exact: the same bytes read


# ----------------------------------------------------------------------------- corrupt files
GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]}}
DATA = np.array([1, 2], dtype="<f4").tobytes() + np.array([7], dtype="<i8").tobytes()


def test_good_handmade_file_with_space_padding():
    out = loads_safetensors(_file(GOOD, DATA, pad=b"   "))
    np.testing.assert_array_equal(out["a"], [1.0, 2.0])   # exact: parsed input
    assert out["b"].tolist() == [7]


def _with(name, **changes):
    h = json.loads(json.dumps(GOOD))
    h[name].update(changes)
    return h


@pytest.mark.parametrize("header, data, match", [
    (_with("a", dtype="F99"), DATA, r"tensor 'a'.*unknown dtype"),
    (_with("a", dtype="F8_E4M3"), DATA, r"tensor 'a'.*no NumPy"),
    (_with("a", shape=[3]), DATA, r"tensor 'a'.*needs 12 bytes"),
    (_with("a", shape=[-2]), DATA, r"tensor 'a'.*non-negative"),
    (_with("a", shape=[True, 2]), DATA, r"tensor 'a'.*non-negative integers"),
    (_with("a", shape="2"), DATA, r"tensor 'a'.*shape"),
    (_with("a", data_offsets=[0]), DATA, r"tensor 'a'.*data_offsets"),
    (_with("a", data_offsets=[8, 0]), DATA, r"tensor 'a'.*end 0 < begin 8"),
    (_with("b", data_offsets=[4, 12]), DATA, r"tensor 'b'.*overlaps"),
    (_with("b", data_offsets=[12, 20]), DATA + b"\0" * 4, r"tensor 'b'.*gap"),
    (_with("b", data_offsets=[8, 16]), DATA[:12], r"tensor 'b'.*past the end"),
    (GOOD, DATA + b"xx", r"trailing bytes"),
    (_with("a", extra=1), DATA, r"tensor 'a'.*unexpected \['extra'\]"),
    ({**GOOD, "__metadata__": {"k": 1}}, DATA, r"__metadata__"),
    ({**GOOD, "c": [1, 2]}, DATA, r"tensor 'c'.*must be an object"),
])
def test_corrupt_headers_name_the_tensor(header, data, match):
    with pytest.raises(ValueError, match=match):
        loads_safetensors(_file(header, data))


def test_header_level_corruption():
    ok = _file(GOOD, DATA)
    n = struct.unpack("<Q", ok[:8])[0]
    with pytest.raises(ValueError, match="too short"):
        loads_safetensors(ok[:5])
    with pytest.raises(ValueError, match="exceeds the limit"):
        loads_safetensors(struct.pack("<Q", MAX_HEADER_SIZE + 1) + ok[8:])
    with pytest.raises(ValueError, match="runs past the end"):
        loads_safetensors(struct.pack("<Q", n + 100) + ok[8:])
    with pytest.raises(ValueError, match="UTF-8"):
        loads_safetensors(struct.pack("<Q", 4) + b"{\xff\xfe}")
    with pytest.raises(ValueError, match="starting with"):
        loads_safetensors(struct.pack("<Q", 4) + b"[1] ")
    with pytest.raises(ValueError, match="not valid JSON"):
        loads_safetensors(struct.pack("<Q", 4) + b"{'a'")
    dup = b'{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        loads_safetensors(struct.pack("<Q", len(dup)) + dup)
    nan = b'{"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,0]}}'
    with pytest.raises(ValueError, match=r"the header: a\.shape\[0\] is NaN, which is not a JSON number"):
        loads_safetensors(struct.pack("<Q", len(nan)) + nan)
    deep = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(ValueError, match="header"):
        loads_safetensors(struct.pack("<Q", len(deep)) + deep)
    bad_bool = {"f": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}}
    with pytest.raises(ValueError, match="tensor 'f'.*BOOL"):
        loads_safetensors(_file(bad_bool, b"\x01\x05"))


def test_every_truncation_of_a_file_is_a_value_error(tmp_path):
    data = dumps_safetensors(_tensors())
    for cut in range(len(data)):
        with pytest.raises(ValueError):
            loads_safetensors(data[:cut])
    p = tmp_path / "t.safetensors"
    p.write_bytes(data[: len(data) - 3])
    with pytest.raises(ValueError, match="tensor '.*'"):
        load_safetensors(p)


def test_bad_arguments(tmp_path):
    p = tmp_path / "x.safetensors"
    save_safetensors(p, {"a": np.zeros(2)})
    with pytest.raises(ValueError, match=r"no tensor named \['zz'\]"):
        load_safetensors(p, names=["zz"])
    with pytest.raises(TypeError, match="names"):
        load_safetensors(p, names="a")
    with pytest.raises(TypeError, match="path"):
        load_safetensors(3)
    with pytest.raises(ValueError, match="not a file"):
        load_safetensors(tmp_path / "missing.safetensors")
    with pytest.raises(TypeError, match="data must be bytes"):
        loads_safetensors("text")
    with pytest.raises(TypeError, match="dtype complex128"):
        dumps_safetensors({"c": np.zeros(2, dtype=complex)})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pos=st.integers(min_value=0, max_value=10_000), byte=st.integers(min_value=0, max_value=255))
def test_random_byte_corruption_never_crashes_differently(pos, byte):
    """Flip one byte anywhere: the reader either returns arrays consistent with the header
    or raises ValueError — never IndexError, KeyError, struct/NumPy errors."""
    data = bytearray(dumps_safetensors(_tensors()))
    data[pos % len(data)] = byte
    try:
        out = loads_safetensors(bytes(data))
    except ValueError:
        return
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(bytes(data[8:8 + n]))
    header.pop("__metadata__", None)
    assert set(out) == set(header)
    for k, a in out.items():
        assert a.shape == tuple(header[k]["shape"])
