"""Issue 16, model folders: every malformed file is a one-line error naming the file and the key
(API: ModelConfigError, ModelFolderError / ResourceLimitError, both ValueErrors; CLI `embed --model DIR`: exit 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from transformer_np.errors import FileFormatError, ModelConfigError, ModelFolderError, ResourceLimitError
from transformer_np.io.pretrained import load_pretrained
from transformer_np.io.safetensors import load_safetensors, read_safetensors_header, save_safetensors


def _refused(folder, match, cls=ModelFolderError):
    with pytest.raises(cls, match=match) as info:
        load_pretrained(folder)
    assert isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_the_fixture_folder_loads(tiny_folder):
    m = load_pretrained(tiny_folder)
    assert m.config.n_layers == 2 and m.max_seq_length == 24 and m.pooling == "mean"
    assert np.all(np.isfinite(m.encode(["the river bank."])))


@pytest.mark.parametrize("raw, want", [
    ('Infinity', r"config\.json: hidden_size is Infinity"),
    ('-Infinity', r"config\.json: hidden_size is -Infinity"),
    ('NaN', r"config\.json: hidden_size is NaN"),
])
def test_config_hidden_size_values(minilm_folder, raw, want):
    path = minilm_folder / "config.json"
    text = path.read_text()
    assert '"hidden_size": 384' in text
    path.write_text(text.replace('"hidden_size": 384', f'"hidden_size": {raw}'))
    _refused(minilm_folder, want)


# Type errors in a field are found by interop.config_from_hf_dict (every family's reader), which names
# the file, the field, what it expects and what it got.
@pytest.mark.parametrize("raw, got", [
    ('null', "got null"),
    ('"384"', "got the string '384'"),
    ('384.9', r"got the number 384\.9"),
    ('true', "got the boolean true"),
])
def test_config_hidden_size_types(minilm_folder, raw, got):
    path = minilm_folder / "config.json"
    text = path.read_text()
    assert '"hidden_size": 384' in text
    path.write_text(text.replace('"hidden_size": 384', f'"hidden_size": {raw}'))
    _refused(minilm_folder, rf"config\.json field 'hidden_size' must be an integer in \[1, \d+\], {got}",
             cls=ModelConfigError)


def test_config_deeply_nested_json(tiny_folder, probe):
    path = tiny_folder / "config.json"
    cfg = json.loads(path.read_text())
    text = json.dumps(cfg)[:-1] + ', "deep": ' + "[" * 200_000 + "]" * 200_000 + "}"
    path.write_text(text)
    msg = _refused(tiny_folder, r"config\.json: JSON nested 200001 levels deep")
    assert "at most" in msg


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json", "sentence_bert_config.json",
                                  "1_Pooling/config.json"])
def test_a_json_list_instead_of_an_object(tiny_folder, name):
    (tiny_folder / name).write_text("[1, 2, 3]")
    _refused(tiny_folder, rf"{name}: the file must hold a JSON object {{…}}, got an array")


@pytest.mark.parametrize("value", ["5", '"x"', '{"a": 1}'])
def test_modules_json_not_a_list(tiny_folder, value):
    (tiny_folder / "modules.json").write_text(value)
    _refused(tiny_folder, r"modules\.json: the file must hold a JSON array")


def test_modules_json_entries(tiny_folder, edit):
    edit(tiny_folder / "modules.json", lambda m: m.append(5))
    _refused(tiny_folder, r"modules\.json: entry \[3\] must be an object")
    edit(tiny_folder / "modules.json", lambda m: m.__setitem__(3, {"type": 7, "path": ""}))
    _refused(tiny_folder, r"modules\.json: \[3\]\.type must be a string")


@pytest.mark.parametrize("path", ["../outside", "1_Pooling/../../outside", "/etc", "/"])
def test_pooling_path_outside_the_folder(tiny_folder, edit, path):
    outside = tiny_folder.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    edit(tiny_folder / "modules.json", lambda m: m[1].update(path=path))
    msg = _refused(tiny_folder, r"modules\.json: \[1\]\.path")
    assert "outside the model folder" in msg or "absolute path" in msg


def test_pooling_path_symlink_out_of_the_folder(tiny_folder, edit):
    outside = tiny_folder.parent / "elsewhere"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    (tiny_folder / "linked").symlink_to(outside, target_is_directory=True)
    edit(tiny_folder / "modules.json", lambda m: m[1].update(path="linked"))
    _refused(tiny_folder, r"leads outside the model folder")


def test_pooling_flags_must_be_booleans(tiny_folder, edit):
    edit(tiny_folder / "1_Pooling" / "config.json", lambda c: c.update(pooling_mode_mean_tokens="yes"))
    _refused(tiny_folder, r"1_Pooling/config\.json: pooling_mode_mean_tokens must be true or false")


@pytest.mark.parametrize("value", ["256", 1.5, 1, True])
def test_max_seq_length_must_be_an_integer(tiny_folder, edit, value):
    edit(tiny_folder / "sentence_bert_config.json", lambda c: c.update(max_seq_length=value))
    _refused(tiny_folder, r"sentence_bert_config\.json: max_seq_length must be an integer >= 2")


def test_tokenizer_json_without_model_vocab(tiny_folder, edit):
    edit(tiny_folder / "tokenizer.json", lambda t: t["model"].pop("vocab"))
    _refused(tiny_folder, r"tokenizer\.json: model\.vocab must be a non-empty object of token -> id, got None")


def test_tokenizer_json_without_model(tiny_folder, edit):
    edit(tiny_folder / "tokenizer.json", lambda t: t.pop("model"))
    _refused(tiny_folder, r"tokenizer\.json: model is missing")


def test_vocabulary_id_minus_five(tiny_folder, edit):
    edit(tiny_folder / "tokenizer.json", lambda t: t["model"]["vocab"].update(river=-5))
    _refused(tiny_folder, r"tokenizer\.json: model\.vocab\['river'\] must be a non-negative id, got -5")


@pytest.mark.parametrize("value, match", [("7", r"vocab\['river'\] must be an integer id"),
                                          (6, r"vocab ids must be distinct: 'bank' and 'river' both have id 6")])
def test_vocabulary_ids_must_be_distinct_integers(tiny_folder, edit, value, match):
    edit(tiny_folder / "tokenizer.json", lambda t: t["model"]["vocab"].update(river=value))
    _refused(tiny_folder, match)


def test_vocabulary_id_beyond_vocab_size(tiny_folder, edit):
    edit(tiny_folder / "tokenizer.json", lambda t: t["model"]["vocab"].update(river=10_000))
    _refused(tiny_folder, r"does not fit the model's vocab_size 36")


def test_special_token_missing_or_with_another_id(tiny_folder, edit):
    edit(tiny_folder / "tokenizer.json", lambda t: t["model"]["vocab"].pop("[SEP]"))
    _refused(tiny_folder, r"tokenizer\.json: sep_token '\[SEP\]' is not in the vocabulary")


def test_added_token_id_disagreeing_with_the_vocabulary(tiny_folder, edit):
    edit(tiny_folder / "tokenizer.json", lambda t: t["added_tokens"][2].update(id=30))
    _refused(tiny_folder, r"added_tokens\[2\] gives '\[CLS\]' the id 30, but model\.vocab gives it 2")


def test_nan_weights_are_refused_naming_the_tensor(tiny_folder):
    state = load_safetensors(tiny_folder / "model.safetensors")
    name = "encoder.layer.1.output.dense.weight"
    state[name][3, 4] = np.nan
    save_safetensors(tiny_folder / "model.safetensors", state)
    _refused(tiny_folder, rf"model\.safetensors: tensor '{name}' contains 1 NaN/inf values")


def test_inf_weights_are_refused_naming_the_tensor(tiny_folder):
    state = load_safetensors(tiny_folder / "model.safetensors")
    name = "embeddings.word_embeddings.weight"
    state[name][0, :2] = np.inf
    save_safetensors(tiny_folder / "model.safetensors", state)
    _refused(tiny_folder, rf"tensor '{name}' contains 2 NaN/inf values")


def test_read_safetensors_header_on_a_missing_path(tmp_path):
    with pytest.raises(FileFormatError, match=r"is not a file \(it does not exist\)") as info:
        read_safetensors_header(tmp_path / "missing.safetensors")
    assert isinstance(info.value, ValueError)
    with pytest.raises(FileFormatError, match="it is a directory"):
        read_safetensors_header(tmp_path)


def test_config_with_a_million_layers_is_refused_at_once(minilm_folder, probe):
    path = minilm_folder / "config.json"
    path.write_text(path.read_text().replace('"num_hidden_layers": 6', '"num_hidden_layers": 1000000'))
    assert len(path.read_bytes()) < 1000
    rep = probe(f"""
        from transformer_np.io.pretrained import load_pretrained
        load_pretrained({str(minilm_folder)!r})
    """)
    assert rep["error"] == "ResourceLimitError", rep
    assert "ValueError" in rep["bases"]
    assert "loading the model in" in rep["message"] and "TiB" in rep["message"] and "8 GB" not in rep["message"]
    assert "TRANSFORMER_NP_MAX_BYTES=8G" in rep["message"]
    assert rep["seconds"] < 5, rep
    assert rep["max_rss_mb"] < 300, rep


def test_huge_d_model_in_config_is_refused_in_process(tiny_folder, edit):
    edit(tiny_folder / "config.json", lambda c: c.update(hidden_size=10**9, num_attention_heads=1))
    with pytest.raises(ResourceLimitError, match="nothing was allocated"):
        load_pretrained(tiny_folder)


@pytest.mark.parametrize("mutate, word", [
    (lambda d: (d / "config.json").write_text('{"hidden_size": Infinity}'), "hidden_size"),
    (lambda d: (d / "modules.json").write_text("5"), "modules.json"),
    (lambda d: (d / "config.json").write_text("[" * 200_000 + "]" * 200_000), "nested"),
    (lambda d: (d / "tokenizer.json").write_text('{"model": {"type": "WordPiece"}}'), "tokenizer.json"),
])
def test_cli_embed_reports_one_line(tiny_folder, refused_cli, mutate, word):
    mutate(tiny_folder)
    line = refused_cli("embed", "--model", tiny_folder, "a sentence")
    assert line.startswith("transformer-np embed: error:") and word in line
