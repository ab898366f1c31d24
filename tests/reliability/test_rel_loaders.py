"""Issue 26, loader validation (NumPy-only folders): weights that do not match config.json are a ModelFolderError
naming the file and the tensor; tokenizer.json settings that cannot be honoured (max_input_chars_per_word <= 0, a
post-processor template other than [CLS] $A [SEP]) are refused, not silently replaced."""

from __future__ import annotations

import pytest

from helpers import assert_folder_refused
from transformer_np.io.pretrained import load_pretrained
from transformer_np.io.safetensors import load_safetensors, save_safetensors

_refused = assert_folder_refused


def test_the_tiny_folder_loads(tiny_folder):
    assert load_pretrained(tiny_folder).tokenizer.max_input_chars_per_word == 100


def test_a_missing_tensor_names_the_weights_file_config_and_tensor(tiny_folder):
    w = tiny_folder / "model.safetensors"
    state = load_safetensors(w)
    name = next(k for k in state if k.endswith("attention.self.query.weight"))
    del state[name]
    save_safetensors(w, state)
    _refused(tiny_folder, f"{w} does not match {tiny_folder / 'config.json'}", name)


def test_an_extra_tensor_is_named(tiny_folder):
    w = tiny_folder / "model.safetensors"
    state = load_safetensors(w)
    state["encoder.layer.9.output.dense.weight"] = state[next(k for k in state if k.endswith("output.dense.weight"))]
    save_safetensors(w, state)
    _refused(tiny_folder, str(w), "encoder.layer.9.output.dense.weight")


def test_a_misshapen_tensor_is_named(tiny_folder):
    w = tiny_folder / "model.safetensors"
    state = load_safetensors(w)
    name = next(k for k in state if k.endswith("attention.self.query.weight"))
    state[name] = state[name][:, :8].copy()
    save_safetensors(w, state)
    _refused(tiny_folder, str(w), name, "shape")


def test_a_mismatch_is_exit_2_from_the_cli(tiny_folder, refused_cli):
    w = tiny_folder / "model.safetensors"
    state = load_safetensors(w)
    del state[next(k for k in state if k.endswith("attention.self.key.bias"))]
    save_safetensors(w, state)
    assert str(w) in refused_cli("embed", "--model", tiny_folder, "a sentence")


@pytest.mark.parametrize("value", [0, -1])
def test_max_input_chars_per_word_must_be_positive(tiny_folder, edit, value):
    edit(tiny_folder / "tokenizer.json", lambda t: t["model"].update(max_input_chars_per_word=value))
    _refused(tiny_folder, "tokenizer.json: model.max_input_chars_per_word must be an integer >= 1", str(value))


CLS = {"SpecialToken": {"id": "[CLS]", "type_id": 0}}
SEP = {"SpecialToken": {"id": "[SEP]", "type_id": 0}}
A = {"Sequence": {"id": "A", "type_id": 0}}


@pytest.mark.parametrize("single", [[A], [CLS, A], [CLS, A, SEP, SEP], [CLS, {"Sequence": {"id": "B", "type_id": 0}},
                                                                          SEP],
                                    [CLS, {"Sequence": {"id": "A", "type_id": 1}}, SEP], [SEP, CLS, A]])
def test_a_template_other_than_cls_a_sep_is_refused(tiny_folder, edit, single):
    edit(tiny_folder / "tokenizer.json", lambda t: t["post_processor"].update(single=single))
    _refused(tiny_folder, "tokenizer.json", "post_processor")


def test_a_template_with_other_special_token_names_is_honoured(tiny_folder, edit):
    # [CLS] $A [SEP] with the specials spelled differently in the vocabulary: read from the template, not replaced
    def rename(t):
        v = t["model"]["vocab"]
        v["<s>"], v["</s>"] = v.pop("[CLS]"), v.pop("[SEP]")
        for a in t["added_tokens"]:
            a["content"] = {"[CLS]": "<s>", "[SEP]": "</s>"}.get(a["content"], a["content"])
        t["post_processor"]["single"] = [{"SpecialToken": {"id": "<s>", "type_id": 0}}, A,
                                         {"SpecialToken": {"id": "</s>", "type_id": 0}}]
    edit(tiny_folder / "tokenizer.json", rename)
    tok = load_pretrained(tiny_folder).tokenizer
    assert (tok.cls_token, tok.sep_token) == ("<s>", "</s>")


def test_an_unknown_post_processor_type_is_refused(tiny_folder, edit):
    # (RobertaProcessing, once refused here, is accepted since MPNet: for one sentence it is BertProcessing)
    edit(tiny_folder / "tokenizer.json", lambda t: t.update(post_processor={"type": "ByteLevel",
                                                                            "trim_offsets": True}))
    _refused(tiny_folder, "post_processor.type = 'ByteLevel'")
