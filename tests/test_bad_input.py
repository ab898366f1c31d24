"""Every bad input of the foundation's public API gets a ValueError/TypeError that names
the argument — never a broadcasting traceback from inside NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_np as tnp


@pytest.fixture(scope="module")
def model():
    cfg = tnp.EncoderConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16, vocab_size=20, max_len=6,
                            type_vocab_size=2)
    return cfg, tnp.init_params(cfg, seed=0)


IDS = np.array([[1, 2, 3], [4, 5, 6]])


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(input_ids=np.array([[1, 2, 20]])), ValueError, "input_ids"),            # outside the vocabulary
    (dict(input_ids=np.array([[1, -1, 2]])), ValueError, "input_ids"),
    (dict(input_ids=np.array([[1.0, 2.0]])), TypeError, "input_ids"),              # not integers
    (dict(input_ids=np.array([1, 2, 3])), ValueError, "input_ids"),                # wrong rank
    (dict(input_ids=np.ones((1, 7), dtype=int)), ValueError, "max_len"),           # too long
    (dict(input_ids=IDS, attention_mask=np.ones((2, 4))), ValueError, "attention_mask"),
    (dict(input_ids=IDS, attention_mask=np.full((2, 3), 2)), ValueError, "attention_mask"),
    (dict(input_ids=IDS, attention_mask=np.full((2, 3), 0.5)), ValueError, "attention_mask"),
    (dict(input_ids=IDS, token_type_ids=np.full((2, 3), 2)), ValueError, "token_type_ids"),
    (dict(input_ids=IDS, token_type_ids=np.zeros((2, 2), dtype=int)), ValueError, "token_type_ids"),
    (dict(inputs_embeds=np.zeros((2, 3, 5))), ValueError, "inputs_embeds"),        # wrong width
    (dict(inputs_embeds=np.zeros((3, 8))), ValueError, "inputs_embeds"),           # wrong rank
    (dict(inputs_embeds=np.zeros((2, 3, 8), dtype=np.float32)), TypeError, "inputs_embeds"),
    (dict(inputs_embeds=np.full((1, 3, 8), np.nan)), ValueError, "inputs_embeds"),  # non-finite
    (dict(inputs_embeds=[[[0.0] * 8]]), TypeError, "inputs_embeds"),
    (dict(input_ids=IDS, inputs_embeds=np.zeros((2, 3, 8))), ValueError, "exactly one"),
    (dict(), ValueError, "exactly one"),
    (dict(input_ids=IDS, training=True), ValueError, "rng"),                       # dropout needs a generator
    (dict(input_ids=IDS, training=True, rng=np.random.RandomState(0)), TypeError, "rng"),
    (dict(input_ids=IDS, training=1), TypeError, "training"),
    (dict(input_ids=np.zeros((2, 0), dtype=int)), ValueError, "at least one"),
])
def test_encoder_forward_bad_inputs(model, kwargs, exc, match):
    cfg, params = model
    with pytest.raises(exc, match=match):
        tnp.encoder_forward(params, cfg, **kwargs)


def test_bad_params(model):
    cfg, params = model
    missing = {k: v for k, v in params.items() if k != "layers.1.ffn.b_1"}
    with pytest.raises(ValueError, match=r"missing.*layers\.1\.ffn\.b_1"):
        tnp.encoder_forward(missing, cfg, input_ids=IDS)
    extra = {**params, "layers.2.ffn.b_1": np.zeros(16)}
    with pytest.raises(ValueError, match=r"unexpected.*layers\.2\.ffn\.b_1"):
        tnp.encoder_forward(extra, cfg, input_ids=IDS)
    wrong = {**params, "layers.0.attn.W_Q": np.zeros((8, 4))}
    with pytest.raises(ValueError, match=r"layers\.0\.attn\.W_Q.*\(8, 8\).*\(8, 4\)"):
        tnp.encoder_forward(wrong, cfg, input_ids=IDS)
    mixed = {**params, "layers.0.attn.W_Q": params["layers.0.attn.W_Q"].astype(np.float32)}
    with pytest.raises(TypeError, match="dtype"):
        tnp.encoder_forward(mixed, cfg, input_ids=IDS)
    with pytest.raises(TypeError, match="params"):
        tnp.encoder_forward(list(params.values()), cfg, input_ids=IDS)
    with pytest.raises(TypeError, match="config"):
        tnp.encoder_forward(params, {"n_layers": 2}, input_ids=IDS)


def test_bad_backward(model):
    cfg, params = model
    H, cache = tnp.encoder_forward(params, cfg, input_ids=IDS)
    with pytest.raises(ValueError, match=r"dH.*\(2, 3, 8\)"):
        tnp.encoder_backward(np.ones((2, 3, 4)), cache)
    with pytest.raises(TypeError, match="dH"):
        tnp.encoder_backward(np.ones((2, 3, 8), dtype=np.float32), cache)
    with pytest.raises(ValueError, match="dH"):
        tnp.encoder_backward(np.full((2, 3, 8), np.inf), cache)
    with pytest.raises(TypeError, match="cache"):
        tnp.encoder_backward(np.ones_like(H), {"kind": "mha"})


def test_config_without_embeddings_rejects_ids():
    cfg = tnp.EncoderConfig(n_layers=1, d_model=4, n_heads=1, d_ff=8)
    params = tnp.init_params(cfg)
    with pytest.raises(ValueError, match="inputs_embeds"):
        tnp.encoder_forward(params, cfg, input_ids=np.array([[0, 1]]))


def test_op_level_errors():
    x = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="x must have last dimension"):
        tnp.linear_forward(x, np.zeros((5, 2)), np.zeros(2))
    with pytest.raises(ValueError, match="b must have shape"):
        tnp.linear_forward(x, np.zeros((4, 2)), np.zeros(3))
    with pytest.raises(TypeError, match="W must have dtype float64"):
        tnp.linear_forward(x, np.zeros((4, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="gamma"):
        tnp.layernorm_forward(x, np.ones(3), np.zeros(4))
    with pytest.raises(ValueError, match="residual"):
        tnp.residual_forward(x, np.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match="activation"):
        tnp.activation_forward(x, "swish")
    with pytest.raises(ValueError, match="dropout probability"):
        tnp.dropout_forward(x, 1.0, True, np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        tnp.dropout_forward(x, 0.5, True, None)
    with pytest.raises(ValueError, match="divisible"):
        tnp.mha_forward(np.zeros((1, 2, 6)), {}, 4)
    with pytest.raises(ValueError, match="W_Q"):
        tnp.mha_forward(np.zeros((1, 2, 4)), {}, 2)
    with pytest.raises(ValueError, match="ids must lie"):
        tnp.embedding_forward(np.array([5]), np.zeros((5, 2)))
    with pytest.raises(ValueError, match="labels"):
        tnp.cross_entropy_forward(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="labels must have shape"):
        tnp.cross_entropy_forward(np.zeros((2, 3)), np.array([0, 1, 2]))
    _, c = tnp.linear_forward(x, np.zeros((4, 2)))
    with pytest.raises(ValueError, match="dy must have the shape"):
        tnp.linear_backward(np.zeros((2, 3, 3)), c)
    with pytest.raises(TypeError, match="layernorm_forward, got the cache of linear_forward"):
        tnp.layernorm_backward(np.zeros((2, 3, 2)), c)
    with pytest.raises(ValueError, match="mask"):
        tnp.attention_forward(np.zeros((1, 3, 2)), np.zeros((1, 3, 2)), np.zeros((1, 3, 2)), np.zeros((1, 4, 4)))
    with pytest.raises(ValueError, match="attention_mask"):
        tnp.padding_mask(np.array([1, 0]))
