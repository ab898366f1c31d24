"""Issue 37, items 1-2: one bounded path for every file a model folder is read through — regular files only,
opened without blocking; safetensors headers through the strict JSON scan, parsed once, shapes checked; names,
dtypes, shapes and the memory budget checked before any tensor is read; a vocabulary compared with vocab_size
while it is read. Each refusal: one line naming the file (and tensor or line), exit status 2 from `embed`, in a
fresh process under a 4 GB address-space limit, < 1 s of CPU and < 200 MB peak."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
from hostile import GIB, header_shapes, make_special, special_kinds, write_long_vocab, write_st, write_st_sparse

from transformer_np.errors import FileFormatError, ModelFolderError, ResourceLimitError
from transformer_np.io import safetensors as st_module
from transformer_np.io.pretrained import load_pretrained
from transformer_np.io.safetensors import load_safetensors, loads_safetensors, read_safetensors_header

AS_LIMIT = 4 * GIB
FOLDER_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "modules.json", "1_Pooling/config.json",
                "sentence_bert_config.json", "model.safetensors", "vocab.txt"]


def _embed_refused(probe, folder, name_in_line, *more):
    """`embed --model folder` in a fresh process under RLIMIT_AS 4 GB: exit 2, one line naming the file."""
    rep = probe(f"""
        import contextlib, io
        from transformer_np.cli import build_parser, main
        build_parser()
        err = io.StringIO()
        t1 = time.process_time()
        with contextlib.redirect_stderr(err):
            out["exit"] = main(["embed", "--model", {str(folder)!r}, "a sentence"])
        out["refusal_seconds"] = time.process_time() - t1
        out["message"] = err.getvalue()
    """, timeout=30, rlimit_as=AS_LIMIT)
    lines = rep["message"].strip().splitlines()
    assert rep["error"] is None and rep["exit"] == 2, rep
    assert len(lines) == 1 and "Traceback" not in rep["message"], rep
    for text in (name_in_line, *more):
        assert text in lines[0], (text, lines[0])
    assert rep["refusal_seconds"] < 1.0 and rep["seconds"] < 2.0, rep
    assert rep["max_rss_mb"] < 200, rep
    return lines[0]


def _with_vocab_txt(folder):
    """The tiny folder with vocab.txt (its vocabulary, one token per line) instead of tokenizer.json."""
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    (folder / "tokenizer.json").unlink()
    (folder / "vocab.txt").write_text("".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])))
    return folder


class _Deadline:
    """Raise TimeoutError in this thread after ``seconds`` (an open() that blocks forever is interrupted)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def _fire(self, *_):
        raise TimeoutError(f"blocked for more than {self.seconds} s")

    def __enter__(self):
        self.old = signal.signal(signal.SIGALRM, self._fire)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)


# ----------------------------------------------------------------------------- item 1: special files
@pytest.mark.parametrize("name", FOLDER_FILES)
def test_a_fifo_in_place_of_any_file_is_refused_without_blocking(tiny_folder, name):
    if name == "vocab.txt":
        _with_vocab_txt(tiny_folder)
    make_special(tiny_folder / name, "fifo")
    with _Deadline(5), pytest.raises(FileFormatError) as info:
        load_pretrained(tiny_folder)
    msg = str(info.value)
    assert str(tiny_folder / name) in msg and "FIFO" in msg and "\n" not in msg


@pytest.mark.parametrize("kind", special_kinds())
@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "vocab.txt"])
def test_special_files_are_refused_in_one_line_fast_and_small(tiny_folder, probe, name, kind):
    if name == "vocab.txt":
        _with_vocab_txt(tiny_folder)
    sock = make_special(tiny_folder / name, kind)
    try:
        _embed_refused(probe, tiny_folder, str(tiny_folder / name))
    finally:
        if sock is not None:
            sock.close()


def test_a_vocabulary_linked_to_proc_pagemap_is_refused_at_the_bound(tiny_folder, probe):
    # os.path.getsize() says 0 for /proc files, which then yield gigabytes: the bound is on the bytes read
    # (in a child under RLIMIT_AS: the reader this replaces read gigabytes)
    _with_vocab_txt(tiny_folder)
    make_special(tiny_folder / "vocab.txt", "proc-pagemap")
    _embed_refused(probe, tiny_folder, str(tiny_folder / "vocab.txt"))


# ----------------------------------------------------------------------------- item 1: safetensors headers
def test_a_rank_65_shape_is_refused_naming_file_and_tensor(tmp_path):
    path = write_st(tmp_path / "w.safetensors", {"deep": {"dtype": "F32", "shape": [1] * 65,
                                                          "data_offsets": [0, 4]}}, b"\0" * 4)
    with pytest.raises(FileFormatError, match=r"w\.safetensors: tensor 'deep': shape has 65 dimensions; at most "
                                              r"8"):
        load_safetensors(path)


def test_a_rank_9_shape_is_refused(tmp_path):
    path = write_st(tmp_path / "w.safetensors", {"t": {"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}},
                    b"\0" * 4)
    with pytest.raises(FileFormatError, match=r"tensor 't': shape has 9 dimensions"):
        read_safetensors_header(path)


def test_a_dimension_beyond_the_data_buffer_is_refused_even_when_the_product_is_zero(tmp_path):
    path = write_st(tmp_path / "w.safetensors", {"t": {"dtype": "F32", "shape": [0, 2 ** 62],
                                                       "data_offsets": [0, 0]}})
    with pytest.raises(FileFormatError, match=r"tensor 't': shape\[1\] = 4611686018427387904 is more elements than"):
        read_safetensors_header(path)


def test_a_shape_whose_product_passes_the_file_is_refused_before_reading(tmp_path):
    # data_offsets agree with the shape (2^17 · 2^17 · 4 bytes = 64 GiB), the file holds 1 MiB: refused from the
    # header, nothing read — each dimension fits the buffer, their product does not
    path = write_st(tmp_path / "w.safetensors", {"t": {"dtype": "F32", "shape": [2 ** 17, 2 ** 17],
                                                       "data_offsets": [0, 2 ** 36]}}, data_len=2 ** 20)
    with pytest.raises(FileFormatError, match=r"tensor 't': shape \(131072, 131072\) of F32 needs 68719476736 "
                                              r"bytes, more than the file's 1048576-byte data buffer"):
        load_safetensors(path)


def test_a_49_million_zero_shape_is_refused_from_the_header_length(tmp_path, probe):
    # the finding: 99 MB of zeros, accepted by the old reader and refused 39 s later by NumPy naming nothing
    path = write_st(tmp_path / "w.safetensors", header_shapes(99 * 10 ** 6)["zeros in a shape"])
    rep = probe(f"""
        from transformer_np.io.safetensors import load_safetensors
        load_safetensors({str(path)!r})
    """, rlimit_as=AS_LIMIT)
    assert rep["error"] == "FileFormatError" and str(path) in rep["message"], rep
    assert rep["seconds"] < 1.0 and rep["max_rss_mb"] < 200, rep


@pytest.mark.parametrize("shape", sorted(header_shapes(1000)))
def test_a_16mb_weights_header_of_each_json_shape_is_refused_fast_and_small(tiny_folder, probe, shape):
    # 16 MB: the largest header this reader reads (a larger one is refused from its length alone)
    w = write_st(tiny_folder / "model.safetensors", header_shapes(16 * 10 ** 6)[shape])
    _embed_refused(probe, tiny_folder, str(w))


def test_the_header_goes_through_the_strict_json_reader():
    raw = b'{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"__metadata__":{"k":"v"},"b":[[[]]]}'
    with pytest.raises(FileFormatError, match=r"<bytes>: the header: JSON nested 4 levels deep"):
        loads_safetensors(len(raw).to_bytes(8, "little") + raw)


def test_load_pretrained_parses_the_weights_header_once(tiny_folder, monkeypatch):
    calls = []
    real = st_module._parse_header

    def counting(raw, data_len, where):
        calls.append(where)
        return real(raw, data_len, where)

    monkeypatch.setattr(st_module, "_parse_header", counting)
    load_pretrained(tiny_folder)
    assert calls == [str(tiny_folder / "model.safetensors")]


# ----------------------------------------------------------------------------- item 2: check before reading
def _tiny_state(folder):
    return load_safetensors(folder / "model.safetensors")


def test_an_unexpected_3gib_tensor_is_refused_by_name_without_being_read(tiny_folder, probe):
    w = tiny_folder / "model.safetensors"
    write_st_sparse(w, _tiny_state(tiny_folder), {"extra.weight": ("F32", (3 * 2 ** 28,))})
    assert w.stat().st_size > 3 * GIB and w.stat().st_blocks * 512 < 10 ** 6          # sparse: no disk used
    _embed_refused(probe, tiny_folder, str(w), "extra.weight")


def test_a_wrongly_shaped_16gib_embedding_is_refused_before_reading(tiny_folder, probe):
    w = tiny_folder / "model.safetensors"
    state = _tiny_state(tiny_folder)
    name = "embeddings.word_embeddings.weight"
    del state[name]
    write_st_sparse(w, state, {name: ("F32", (2 ** 28, 16))})
    _embed_refused(probe, tiny_folder, str(w), name, "shape")


def _dense(folder, sub, n_in, n_out):
    d = folder / sub
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"in_features": n_in, "out_features": n_out, "bias": True,
                                               "activation_function": "torch.nn.modules.activation.Tanh"}))
    write_st_sparse(d / "model.safetensors", {}, {"linear.bias": ("F32", (n_out,)),
                                                  "linear.weight": ("F32", (n_out, n_in))})


def test_two_dense_modules_at_the_bound_are_in_the_memory_estimate(tiny_folder, probe):
    _dense(tiny_folder, "2_Dense", 16, 1 << 16)
    _dense(tiny_folder, "3_Dense", 1 << 16, 1 << 16)                                  # 16 GiB of float32
    mods = json.loads((tiny_folder / "modules.json").read_text())
    mods[2:2] = [{"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
                 {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}]
    (tiny_folder / "modules.json").write_text(json.dumps(mods))
    line = _embed_refused(probe, tiny_folder, f"loading the model in {tiny_folder}", "Dense modules",
                          "nothing was allocated")
    assert "GiB" in line


def test_a_vocabulary_of_10_million_lines_is_refused_after_vocab_size_lines(tiny_folder, probe):
    _with_vocab_txt(tiny_folder)
    write_long_vocab(tiny_folder / "vocab.txt")
    assert (tiny_folder / "vocab.txt").stat().st_size < 64 * 2 ** 20                   # under the byte bound
    _embed_refused(probe, tiny_folder, str(tiny_folder / "vocab.txt"), "line 37 is token id 36",
                   "vocab_size is 36")


def test_a_tokenizer_json_vocabulary_larger_than_vocab_size_is_refused_before_it_is_checked(tiny_folder, edit):
    edit(tiny_folder / "tokenizer.json", lambda t: t["model"]["vocab"].update({f"w{i}": 100 + i for i in range(50)}))
    with pytest.raises(ModelFolderError, match=r"tokenizer\.json: model\.vocab has 86 tokens, more than the "
                                               r"model's vocab_size 36"):
        load_pretrained(tiny_folder)


def test_load_safetensors_checks_the_memory_before_reading(tmp_path, monkeypatch):
    path = write_st_sparse(tmp_path / "w.safetensors", {}, {"t": ("F32", (2 ** 20,))})     # 4 MiB
    monkeypatch.setenv("TRANSFORMER_NP_MAX_BYTES", str(2 ** 20))
    with pytest.raises(ResourceLimitError, match=rf"reading {tmp_path / 'w.safetensors'} would need"):
        load_safetensors(path)


def test_the_loaded_model_is_unchanged(tiny_folder):
    # the new reading path gives the same arrays as the file's bytes (exact: no arithmetic on them)
    m = load_pretrained(tiny_folder)
    raw = loads_safetensors((tiny_folder / "model.safetensors").read_bytes())
    assert np.array_equal(m.params["embeddings.word"], raw["embeddings.word_embeddings.weight"])   # exact: a copy
