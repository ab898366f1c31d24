"""Parity with Hugging Face ``transformers.BertModel`` through :func:`from_hf_bert` / :func:`to_hf_state_dict`.

A small random ``BertConfig`` (eager attention, dropout 0, 3 token types, eps 1e-7), every
weight randomised (LayerNorm γ/β and biases too), padding and token types in the batch,
float64. The loss is L = ⟨R, last_hidden_state⟩ + ⟨R_p, pooler_output⟩ with random R, R_p,
so *every* parameter — embeddings and pooler included — receives a gradient.
Criterion ‖ours − HF‖/‖HF‖ ≤ 1e-10 (float64), ≤ 1e-5 for float32 outputs.

The input gradient: HF's own ``inputs_embeds`` replaces only the word-embedding lookup
(positions, token types and the embedding LayerNorm are still added), whereas ours *is*
H^(0), the embedding block's output. So the input gradient compared is ∂L/∂H^(0), read in
HF from a forward hook on ``model.embeddings`` (``retain_grad``), and in ours both as
``dhidden[0]`` of the ids run and as ``grads["inputs_embeds"]`` when we feed H^(0) itself.

Two documented conventions differ from the plain derivative and are tested as such:
* ``word_embeddings`` is ``nn.Embedding(padding_idx=pad_token_id)``: torch *defines* the
  gradient of that row as 0 (a frozen row). transformer_np returns the true derivative of
  the forward (the row is used, so its gradient is generally nonzero). All other rows match.
* ∂L/∂b_K is exactly 0 in exact arithmetic (b_K shifts each score row by the constant q·b_K;
  softmax ignores shifts), so both sides return round-off: we check ‖·‖ ≤ 1e-10 ‖∂L/∂W_K‖.

Padded positions: HF's eager attention (like ours) computes padded *queries* normally
(attending to the real keys), so outputs agree there too; they are checked separately.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from helpers import nrel, randomise_

pytestmark = [pytest.mark.torch, pytest.mark.hf]  # test lane (pyproject.toml markers)

torch = pytest.importorskip("torch", reason="parity tests need PyTorch: pip install torch==2.13.0 "
                                            "(or pip install -e '.[test]')")
transformers = pytest.importorskip("transformers", reason="HF parity tests need transformers: "
                                                          "pip install transformers (or pip install -e '.[test]')")

from transformer_np import (  # noqa: E402
    encoder_backward,
    encoder_forward,
    pooler_backward,
    pooler_forward,
)
from transformer_np.io.interop import (  # noqa: E402
    config_from_hf_dict,
    from_hf_bert,
    hf_dict_from_config,
    hf_state_dict_from_params,
    params_from_hf_state_dict,
    to_hf_state_dict,
)
from transformer_np.model.gradcheck import random_params  # noqa: E402

pytestmark = pytest.mark.hf
TOL64, TOL32 = 1e-10, 1e-5
VOCAB, PAD = 30, 0
B, N_POS = 3, 7




def bert_config(hidden_act="gelu", **kw):
    base = dict(vocab_size=VOCAB, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=16, max_position_embeddings=12, type_vocab_size=3, hidden_act=hidden_act,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-7,
                pad_token_id=PAD, attn_implementation="eager")
    base.update(kw)
    return transformers.BertConfig(**base)




def build(hidden_act="gelu", dtype=torch.float64, seed=0, cls=None, **kw):
    model = (cls or transformers.BertModel)(bert_config(hidden_act, **kw)).to(dtype)
    randomise_(model, seed)
    model.eval()                                          # dropout is 0 anyway
    return model


def batch(seed=1):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(B, N_POS))
    tt = rng.integers(0, 3, size=(B, N_POS))
    am = np.ones((B, N_POS), dtype=np.int64)
    am[1, 5:] = 0
    am[2, 2:] = 0
    ids[am == 0] = PAD                                     # padded positions hold [PAD], as a tokenizer does
    tt[am == 0] = 0
    return ids, tt, am


ACTS = ["gelu", "gelu_new", "gelu_pytorch_tanh", "relu"]


@pytest.mark.parametrize("hidden_act", ACTS)
def test_bert_output_and_every_gradient(hidden_act):
    model = build(hidden_act)
    config, params = from_hf_bert(model)
    assert config.activation == {"gelu": "gelu", "relu": "relu"}.get(hidden_act, "gelu_tanh")
    assert "pooler.W" in params
    ids, tt, am = batch()
    rng = np.random.default_rng(2)
    R = rng.normal(size=(B, N_POS, config.d_model))
    Rp = rng.normal(size=(B, config.d_model))

    # --- HF: forward with a hook on the embedding block to capture H^(0) and its gradient
    seen = {}

    def hook(module, args, out):
        out.retain_grad()
        seen["H0"] = out

    handle = model.embeddings.register_forward_hook(hook)
    try:
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am),
                    token_type_ids=torch.tensor(tt))
    finally:
        handle.remove()
    ((out.last_hidden_state * torch.tensor(R)).sum() + (out.pooler_output * torch.tensor(Rp)).sum()).backward()

    # --- ours: the same loss
    H, cache = encoder_forward(params, config, input_ids=ids, attention_mask=am, token_type_ids=tt)
    pooled, pc = pooler_forward(H, params["pooler.W"], params["pooler.b"])
    dH_pool, dW_p, db_p = pooler_backward(Rp, pc)
    grads, dhidden = encoder_backward(R + dH_pool, cache, return_hidden_grads=True)
    grads["pooler.W"], grads["pooler.b"] = dW_p, db_p

    real = am.astype(bool)
    hf_H = out.last_hidden_state.detach().numpy()
    assert nrel(H[real], hf_H[real]) <= TOL64
    assert nrel(H[~real], hf_H[~real]) <= TOL64            # eager attention: padded queries computed alike
    assert nrel(pooled, out.pooler_output) <= TOL64
    assert nrel(cache["hidden_states"][0], seen["H0"]) <= TOL64   # H^(0)
    assert nrel(dhidden[0], seen["H0"].grad) <= TOL64               # ∂L/∂H^(0)

    mapped = to_hf_state_dict(grads, config)
    hf_params = dict(model.named_parameters())
    assert set(mapped) == set(hf_params)                   # every parameter, embeddings and pooler included
    for name, p in hf_params.items():
        ours = mapped[name].numpy()
        if name == "embeddings.word_embeddings.weight":
            assert torch.all(p.grad[PAD] == 0)             # torch's padding_idx convention: frozen row
            assert np.linalg.norm(ours[PAD]) > 0           # ours: the true derivative
            keep = np.arange(VOCAB) != PAD
            assert nrel(ours[keep], p.grad[keep]) <= TOL64, name
        elif name.endswith("attention.self.key.bias"):
            scale = np.linalg.norm(mapped[name.replace("bias", "weight")].numpy())
            assert np.linalg.norm(ours) <= 1e-10 * scale and float(p.grad.norm()) <= 1e-10 * scale, name
        else:
            assert nrel(ours, p.grad) <= TOL64, name


def test_input_gradient_through_inputs_embeds():
    """Feeding H^(0) as our inputs_embeds gives the same output and ∂L/∂H^(0) as HF."""
    model = build("gelu_new", seed=3)
    config, params = from_hf_bert(model)
    ids, tt, am = batch(4)
    seen = {}

    def hook(module, args, out):                          # returns None: the output is left as is
        out.retain_grad()
        seen["H0"] = out

    handle = model.embeddings.register_forward_hook(hook)
    try:
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am), token_type_ids=torch.tensor(tt))
    finally:
        handle.remove()
    R = np.random.default_rng(5).normal(size=(B, N_POS, config.d_model))
    out.last_hidden_state.backward(torch.tensor(R))
    H0 = seen["H0"].detach().numpy().copy()
    H, cache = encoder_forward(params, config, inputs_embeds=H0, attention_mask=am)
    grads = encoder_backward(R, cache)
    assert nrel(H, out.last_hidden_state) <= TOL64
    assert nrel(grads["inputs_embeds"], seen["H0"].grad) <= TOL64


def test_float32_outputs():
    model = build("gelu", dtype=torch.float32, seed=6)
    config, params = from_hf_bert(model)
    assert params["embeddings.word"].dtype == np.float32
    ids, tt, am = batch(7)
    H, _ = encoder_forward(params, config, input_ids=ids, attention_mask=am, token_type_ids=tt)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am), token_type_ids=torch.tensor(tt))
    assert H.dtype == np.float32
    assert nrel(H, out.last_hidden_state) <= TOL32


# ----------------------------------------------------------------------------- BertFor*, round trips, export
def test_bert_for_sequence_classification_prefix_and_heads():
    model = build("gelu", seed=8, cls=transformers.BertForSequenceClassification)
    config, params = from_hf_bert(model)                  # "bert." detected, classifier.* ignored
    _, params_inner = from_hf_bert(model.bert)
    assert list(params) == list(params_inner)
    assert all(np.array_equal(params[k], params_inner[k]) for k in params)   # exact: copied
    sd = to_hf_state_dict(params, config, prefix="bert.")
    result = model.load_state_dict(sd, strict=False)
    assert sorted(result.missing_keys) == ["classifier.bias", "classifier.weight"]
    assert result.unexpected_keys == []


@pytest.mark.parametrize("add_pooling_layer", [True, False])
def test_round_trip_is_exact(add_pooling_layer):
    model = transformers.BertModel(bert_config("relu"), add_pooling_layer=add_pooling_layer).double()
    randomise_(model, 9)
    config, params = from_hf_bert(model)
    assert ("pooler.W" in params) is add_pooling_layer
    sd = to_hf_state_dict(params, config)
    ref = model.state_dict()
    assert set(sd) == set(ref)
    for name, t in ref.items():
        assert torch.equal(sd[name], t), name               # HF → ours → HF: bit for bit
    again = params_from_hf_state_dict(hf_state_dict_from_params(params, config), config)
    assert list(again) == list(params)
    # exact: the round trip copies values
    assert all(np.array_equal(again[k], params[k]) for k in params)   # ours → HF → ours


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_model_built_here_runs_in_hf(activation):
    """A BERT built and initialised in transformer_np, exported, gives HF's output."""
    hf_cfg = bert_config()
    config = config_from_hf_dict(hf_cfg.to_dict()).replace(activation=activation)
    params = random_params(config, seed=10)
    kwargs = hf_dict_from_config(config)
    model = transformers.BertModel(transformers.BertConfig(**kwargs, pad_token_id=PAD, attn_implementation="eager"),
                                   add_pooling_layer=False).double()
    model.load_state_dict(to_hf_state_dict(params, config), strict=True)
    model.eval()
    ids, tt, am = batch(11)
    H, _ = encoder_forward(params, config, input_ids=ids, attention_mask=am, token_type_ids=tt)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am), token_type_ids=torch.tensor(tt))
    assert nrel(H, out.last_hidden_state) <= TOL64


# ----------------------------------------------------------------------------- unsupported options
def test_rejects_relative_positions():
    model = transformers.BertModel(bert_config(position_embedding_type="relative_key"))
    with pytest.raises(ValueError, match="position_embedding_type"):
        from_hf_bert(model)


def test_rejects_unknown_activation():
    model = transformers.BertModel(bert_config("silu"))
    with pytest.raises(ValueError, match="hidden_act.*'silu'"):
        from_hf_bert(model)


def test_rejects_non_bert():
    with pytest.raises(TypeError, match="BertModel"):
        from_hf_bert(torch.nn.Linear(2, 2))


def test_default_sdpa_attention_matches_too():
    """transformers' default attention (SDPA) gives the same numbers as eager here, padded
    positions included."""
    model = build("gelu", seed=12, attn_implementation="sdpa")
    assert model.config._attn_implementation == "sdpa"
    config, params = from_hf_bert(model)
    ids, tt, am = batch(13)
    H, _ = encoder_forward(params, config, input_ids=ids, attention_mask=am, token_type_ids=tt)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am), token_type_ids=torch.tensor(tt))
    real = am.astype(bool)
    hf_H = out.last_hidden_state.numpy()
    assert nrel(H[real], hf_H[real]) <= TOL64
    assert nrel(H[~real], hf_H[~real]) <= TOL64
