"""Issue 26, loaders that implement or refuse: a sentence-transformers folder with a Dense module (built here, from
a tiny random BERT, and saved by sentence-transformers itself) encodes exactly as sentence-transformers does; any
module type, pooling mode or setting that is not implemented is refused naming modules.json[i].type or the file
and key — never skipped."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from helpers import assert_folder_refused
from transformer_np.io.pretrained import load_pretrained

pytestmark = [pytest.mark.torch, pytest.mark.hf]  # test lane (pyproject.toml markers)

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "bank", "river", "money", "of", ".", ","] + \
    [chr(c) for c in range(ord("a"), ord("z") + 1)]
SENTENCES = ["the bank of the river.", "money", "the river, the bank, the money.", "a b c d e f g", "bank"]


def _st_folder(tmp_path, name, *, activation="Tanh", bias=True, normalize=True, two_dense=False):
    """A tiny BERT (random weights, transformers) with Pooling(mean), Dense module(s) and optionally Normalize,
    saved by sentence-transformers; returns (folder, the loaded SentenceTransformer)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    st = pytest.importorskip("sentence_transformers")
    try:                                          # sentence-transformers >= 6; older releases: .models
        from sentence_transformers.sentence_transformer import modules as st_models
    except ImportError:
        from sentence_transformers import models as st_models
    from torch import nn

    base = tmp_path / f"{name}_bert"
    base.mkdir()
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tok = transformers.BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt"))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(cfg, add_pooling_layer=False).save_pretrained(base)
    tok.save_pretrained(base)
    act = {"Tanh": nn.Tanh(), "Identity": nn.Identity(), "ReLU": nn.ReLU(), "Sigmoid": nn.Sigmoid()}[activation]
    modules = [st_models.Transformer(str(base), max_seq_length=48), st_models.Pooling(32, "mean"),
               st_models.Dense(32, 24, bias=bias, activation_function=act)]
    if two_dense:
        modules.append(st_models.Dense(24, 8, activation_function=nn.Tanh()))
    if normalize:
        modules.append(st_models.Normalize())
    model = st.SentenceTransformer(modules=modules, device="cpu")
    for m in model.modules():                     # the Dense layers' random init is small; make them matter
        if isinstance(m, nn.Linear):
            with torch.no_grad():
                m.weight.normal_(0, 0.5)
                if m.bias is not None:
                    m.bias.normal_(0, 0.5)
    folder = tmp_path / name
    model.save(str(folder))
    return folder, model


@pytest.mark.parametrize("activation, bias, normalize, two", [("Tanh", True, True, False),
                                                             ("Identity", False, False, False),
                                                             ("ReLU", True, False, True),
                                                             ("Sigmoid", True, True, False)])
def test_dense_folders_encode_as_sentence_transformers(tmp_path, activation, bias, normalize, two):
    torch = pytest.importorskip("torch")
    folder, st_model = _st_folder(tmp_path, "st", activation=activation, bias=bias, normalize=normalize,
                                  two_dense=two)
    ours = load_pretrained(folder)
    assert len(ours.dense) == (2 if two else 1) and ours.embedding_dim == (8 if two else 24)
    assert ours.dense[0].activation == activation.lower()
    ref = st_model.to(torch.float64).encode(SENTENCES, batch_size=2, convert_to_numpy=True)
    got = ours.encode(SENTENCES, normalize=normalize, dtype=np.float64, batch_size=2)
    assert got.shape == ref.shape == (len(SENTENCES), 8 if two else 24)
    # float64 on both sides; two BLAS paths over reductions of at most 64 terms: 1e-10 is ~10^5 ulp of slack
    err = float(np.abs(got - ref).max())
    assert err <= 1e-10, f"max |Δe| = {err:.3e}"
    # the Dense module is not a no-op here: without it the vectors would not even have the same width
    assert ours.config.d_model == 32


def _folder(tmp_path):
    folder, _ = _st_folder(tmp_path, "st")
    return folder


def _edit(path, fn):
    value = json.loads(path.read_text())
    fn(value)
    path.write_text(json.dumps(value))


_refused = assert_folder_refused


def test_unknown_module_types_are_refused_naming_the_entry(tmp_path):
    folder = _folder(tmp_path)
    _edit(folder / "modules.json", lambda m: m.insert(3, {"idx": 3, "name": "3", "path": "3_LayerNorm",
                                                          "type": "sentence_transformers.models.LayerNorm"}))
    _refused(folder, "modules.json: [3].type = 'sentence_transformers.models.LayerNorm'", "refusing rather than")


def test_a_custom_module_class_is_refused(tmp_path):
    folder = _folder(tmp_path)
    _edit(folder / "modules.json", lambda m: m[2].update(type="my_package.MyDense"))
    _refused(folder, "[2].type = 'my_package.MyDense'")


@pytest.mark.parametrize("key, value, fragment", [
    ("activation_function", "torch.nn.modules.activation.Softplus", "activation_function"),
    ("use_residual", True, "use_residual"),
    ("module_input_name", "token_embeddings", "module_input_name"),
    ("in_features", 31, "in_features is 31"),
    ("surprise", 1, "surprise is not a Dense setting"),
])
def test_dense_settings_not_implemented_are_refused_naming_the_key(tmp_path, key, value, fragment):
    folder = _folder(tmp_path)
    _edit(folder / "2_Dense" / "config.json", lambda c: c.update({key: value}))
    _refused(folder, str(folder / "2_Dense" / "config.json"), fragment)


def test_dense_weights_are_checked(tmp_path):
    from transformer_np.io.safetensors import load_safetensors, save_safetensors

    folder = _folder(tmp_path)
    w = folder / "2_Dense" / "model.safetensors"
    state = load_safetensors(w)
    state["linear.weight"] = state["linear.weight"][:, :31].copy()
    save_safetensors(w, state)
    _refused(folder, str(w), "'linear.weight'", "(24, 32)")
    state["linear.weight"] = np.full((24, 32), np.nan, np.float32)
    save_safetensors(w, state)
    _refused(folder, str(w), "NaN/inf")
    w.unlink()
    (folder / "2_Dense" / "pytorch_model.bin").write_bytes(b"pickle")
    _refused(folder, "has no model.safetensors", "pickle")


@pytest.mark.parametrize("config, fragment", [
    ({"embedding_dimension": 32, "pooling_mode": ["mean", "max"]}, "several pooling modes"),
    ({"embedding_dimension": 32, "pooling_mode": "weightedmean"}, "pooling_mode = 'weightedmean' is not implemented"),
    ({"embedding_dimension": 32, "pooling_mode": "lasttoken"}, "pooling_mode = 'lasttoken'"),
    ({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True},
     "pooling_mode_max_tokens and pooling_mode_mean_tokens"),
    ({"word_embedding_dimension": 32, "pooling_mode_weightedmean_tokens": True},
     "pooling_mode_weightedmean_tokens is not implemented"),
    ({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True, "pooling_mode_fancy_tokens": True},
     "pooling_mode_fancy_tokens is not a pooling flag"),
    ({"embedding_dimension": 16, "pooling_mode": "mean"}, "embedding_dimension is 16"),
])
def test_pooling_modes_not_implemented_are_refused_naming_the_flag(tmp_path, config, fragment):
    folder = _folder(tmp_path)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    _refused(folder, str(folder / "1_Pooling" / "config.json"), fragment)


@pytest.mark.parametrize("mode", ["mean", "cls", "max", "mean_sqrt_len_tokens"])
def test_both_pooling_file_formats_give_the_same_mode(tmp_path, mode):
    folder = _folder(tmp_path)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 32, "pooling_mode": mode}))
    new = load_pretrained(folder)
    legacy = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "mean": "pooling_mode_mean_tokens",
              "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens"}[mode]
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, legacy: True}))
    old = load_pretrained(folder)
    assert new.pooling == old.pooling == mode.replace("_tokens", "")


def test_a_normalize_before_a_dense_is_refused(tmp_path):
    folder = _folder(tmp_path)
    _edit(folder / "modules.json", lambda m: m.__setitem__(slice(2, 4), [m[3], m[2]]))
    _refused(folder, "not in an order this library implements")


def test_a_default_prompt_is_refused(tmp_path):
    folder = _folder(tmp_path)
    _edit(folder / "config_sentence_transformers.json",
          lambda c: c.update(prompts={"query": "query: ", "document": ""}, default_prompt_name="query"))
    _refused(folder, "config_sentence_transformers.json: default_prompt_name = 'query'")


def test_the_embed_command_uses_the_dense_width(tmp_path, capsys):
    from transformer_np.cli import main

    folder = _folder(tmp_path)
    assert main(["embed", "--model", str(folder), "--json", "the bank", "money"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dim"] == 24 and len(out["embeddings"][0]) == 24
    assert main(["embed", "--model", str(folder), "the bank", "money"]) == 0
    assert "(24-d mean-pooled embeddings" in capsys.readouterr().out
