"""Every supported Hugging Face encoder family, against transformers itself: outputs and every gradient,
import and export both ways, task-model prefixes, bare layers, and load_pretrained on a local folder.

Families: bert, ernie, roberta, xlm-roberta, camembert, data2vec-text (RoBERTa's position ids), distilbert,
albert (factorised embeddings, one shared layer), electra (factorised and not), mpnet (relative position bias;
longer sequences, its folder and sentence embeddings: test_parity_mpnet.py). Small random configs built
offline (no downloads), every weight randomised (LayerNorm γ/β and biases too), float64, padding in the batch
(a left-padded row too), token types where the family has them. Loss L = ⟨R, last_hidden_state⟩
(+ ⟨R_p, pooler_output⟩ where the family has a pooler), R = 0 at padded positions. Criterion
‖ours − HF‖/‖HF‖ ≤ 1e-10 for every tensor; the key-bias gradient, zero in exact arithmetic, must be
≤ 1e-10 ‖∂L/∂W_K‖ on both sides.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from helpers import nrel, randomise_

torch = pytest.importorskip("torch", reason="parity tests need PyTorch: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="HF parity tests need transformers: pip install transformers")

from transformer_np.errors import InputValueError, ModelConfigError  # noqa: E402
from transformer_np.io.families import HFEncoderConfig, hf_param_shapes  # noqa: E402
from transformer_np.io.hf_model import position_ids  # noqa: E402
from transformer_np.io.interop import (  # noqa: E402
    config_from_hf_dict,
    from_hf,
    hf_backward,
    hf_dict_from_config,
    hf_forward,
    hf_state_dict_from_params,
    params_from_hf_state_dict,
    to_hf_state_dict,
)
from transformer_np.model.heads import pooler_backward, pooler_forward  # noqa: E402

pytestmark = pytest.mark.hf

TOL64 = 1e-10
VOCAB = ["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]", "the", "bank", "river", "money", ",", ".", "!"] + \
        [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["##" + chr(c) for c in range(ord("a"), ord("z") + 1)]
V, PAD, D, B, N = len(VOCAB), 1, 8, 3, 7
COMMON = dict(vocab_size=V, hidden_size=D, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
              max_position_embeddings=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
              layer_norm_eps=1e-7, pad_token_id=PAD)


def family_config(name: str, **kw):
    T = transformers
    c = {
        "bert": lambda: T.BertConfig(**COMMON, type_vocab_size=3),
        "ernie": lambda: T.ErnieConfig(**COMMON, type_vocab_size=3),
        "roberta": lambda: T.RobertaConfig(**COMMON, type_vocab_size=1),
        "xlm-roberta": lambda: T.XLMRobertaConfig(**COMMON, type_vocab_size=1, hidden_act="gelu_new"),
        "camembert": lambda: T.CamembertConfig(**COMMON, type_vocab_size=1),
        "data2vec-text": lambda: T.Data2VecTextConfig(**COMMON, type_vocab_size=1, hidden_act="relu"),
        "distilbert": lambda: T.DistilBertConfig(vocab_size=V, dim=D, n_layers=2, n_heads=2, hidden_dim=12,
                                                 max_position_embeddings=24, dropout=0.0, attention_dropout=0.0,
                                                 pad_token_id=PAD),
        "albert": lambda: T.AlbertConfig(**dict(COMMON, num_hidden_layers=3), embedding_size=6, type_vocab_size=2),
        "electra": lambda: T.ElectraConfig(**COMMON, embedding_size=6, type_vocab_size=2),
        "electra-unfactorised": lambda: T.ElectraConfig(**COMMON, embedding_size=D, type_vocab_size=2),
        "mpnet": lambda: T.MPNetConfig(**COMMON),
    }[name]()
    for k, v in kw.items():
        setattr(c, k, v)
    return c


FAMILY_NAMES = ["bert", "ernie", "roberta", "xlm-roberta", "camembert", "data2vec-text", "distilbert", "albert",
                "electra", "electra-unfactorised", "mpnet"]
HAS_POOLER = {"bert", "ernie", "roberta", "xlm-roberta", "camembert", "data2vec-text", "albert", "mpnet"}
BARE_LAYERS = [n for n in FAMILY_NAMES if n != "mpnet"]   # an MPNet layer needs the model's relative table




def build(name: str, seed: int = 0, cls=None, attn="eager"):
    cfg = family_config(name)
    cfg._attn_implementation = attn
    model = transformers.AutoModel.from_config(cfg) if cls is None else cls(cfg)
    model = model.to(torch.float64).eval()
    randomise_(model, seed)
    return model


def batch(name: str, seed: int = 1):
    """ids with padding (row 1 right-padded, row 2 left-padded), token types where the family has them."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, V, size=(B, N))
    am = np.ones((B, N), dtype=np.int64)
    am[1, 5:] = 0
    am[2, :2] = 0
    ids[am == 0] = PAD
    n_types = {"bert": 3, "ernie": 3, "albert": 2, "electra": 2, "electra-unfactorised": 2}.get(name, 0)
    tt = rng.integers(0, n_types, size=(B, N)) if n_types else None
    return ids, am, tt


def hf_run(model, ids, am, tt, R, Rp):
    kw = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(am)}
    if tt is not None:
        kw["token_type_ids"] = torch.tensor(tt)
    out = model(**kw)
    loss = (out.last_hidden_state * torch.tensor(R)).sum()
    if Rp is not None:
        loss = loss + (out.pooler_output * torch.tensor(Rp)).sum()
    loss.backward()
    return out


def ours_run(params, config, ids, am, tt, R, Rp):
    H, cache = hf_forward(params, config, input_ids=ids, attention_mask=am, token_type_ids=tt)
    dH, extra, pooled = R, {}, None
    if Rp is not None:
        pooled, pc = pooler_forward(H, params["pooler.W"], params["pooler.b"])
        dH_pool, extra["pooler.W"], extra["pooler.b"] = pooler_backward(Rp, pc)
        dH = R + dH_pool
    grads = hf_backward(dH, cache)
    grads.update(extra)
    return H, pooled, grads


def check_every_gradient(model, mapped, config):
    hf_params = dict(model.named_parameters())
    assert set(mapped) == set(hf_params)                  # every parameter: embeddings, projection, pooler
    errs = {}
    for name, p in hf_params.items():
        ours = mapped[name].numpy()
        if name.endswith(("attention.self.key.bias", "attention.key.bias", "attention.k_lin.bias", "attn.k.bias")):
            scale = np.linalg.norm(mapped[name.replace("bias", "weight")].numpy())
            assert np.linalg.norm(ours) <= 1e-10 * scale and float(p.grad.norm()) <= 1e-10 * scale, name
            continue
        errs[name] = nrel(ours, p.grad)
        assert errs[name] <= TOL64, (name, errs[name])
    return errs


# ----------------------------------------------------------------------------- outputs and every gradient
# MPNet's attention is its own code (MPNetSelfAttention), with no sdpa implementation: transformers refuses "sdpa"
@pytest.mark.parametrize("name, attn", [(n, a) for n in FAMILY_NAMES for a in ("eager", "sdpa")
                                        if (n, a) != ("mpnet", "sdpa")])
def test_output_and_every_gradient(name, attn):
    model = build(name, seed=FAMILY_NAMES.index(name), attn=attn)
    config, params = from_hf(model)
    assert isinstance(config, HFEncoderConfig if name != "bert" else type(config))
    ids, am, tt = batch(name)
    rng = np.random.default_rng(2)
    R = rng.normal(size=(B, N, D)) * am[:, :, None]      # nothing flows in at padded positions
    # the pooler reads position 0, which is padding in the left-padded row: nothing flows in there either
    Rp = rng.normal(size=(B, D)) * am[:, :1] if name in HAS_POOLER else None
    out = hf_run(model, ids, am, tt, R, Rp)
    H, pooled, grads = ours_run(params, config, ids, am, tt, R, Rp)
    assert nrel(H, out.last_hidden_state) <= TOL64        # padded positions too (same position ids, same masking)
    if Rp is not None:
        assert nrel(pooled, out.pooler_output) <= TOL64
    check_every_gradient(model, to_hf_state_dict(grads, config), config)


def test_hf_zeroes_the_padding_rows_we_do_not():
    """With an upstream gradient at padded positions, HF's nn.Embedding(padding_idx) rows get exactly 0 while
    ours get the true derivative; every other row still agrees (the documented convention difference)."""
    model = build("roberta", seed=3)
    config, params = from_hf(model)
    ids, am, tt = batch("roberta")
    R = np.random.default_rng(4).normal(size=(B, N, D))   # nonzero at padded positions too
    hf_run(model, ids, am, tt, R, None)
    _, _, grads = ours_run(params, config, ids, am, tt, R, None)
    mapped = to_hf_state_dict(grads, config)
    for table in ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight"):
        theirs = dict(model.named_parameters())[table].grad.numpy()
        ours = mapped[table].numpy()
        assert np.all(theirs[PAD] == 0) and np.linalg.norm(ours[PAD]) > 0.1, table
        keep = np.arange(len(ours)) != PAD
        assert nrel(ours[keep], theirs[keep]) <= TOL64, table


# ----------------------------------------------------------------------------- import / export both ways
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_hf_to_ours_to_hf_is_exact(name):
    model = build(name, seed=5)
    sd = {k: v.numpy() for k, v in model.state_dict().items()
          if not k.endswith(("position_ids", "token_type_ids"))}
    config = config_from_hf_dict(model.config.to_dict())
    back = hf_state_dict_from_params(params_from_hf_state_dict(sd, config), config)
    assert set(back) == set(sd)
    for k in sd:
        # exact: the round trip copies values (float32 → float64 is exact)
        assert back[k].dtype == np.float64 and np.array_equal(back[k], sd[k]), k


def _random_family_params(config, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for k, shape in hf_param_shapes(config).items():
        out[k] = (1.0 + 0.3 * rng.normal(size=shape)) if k.endswith("gamma") else 0.5 * rng.normal(size=shape)
    if config.family.pooler:
        out["pooler.W"], out["pooler.b"] = 0.5 * rng.normal(size=(D, D)), 0.3 * rng.normal(size=D)
    return out


@pytest.mark.parametrize("name", [n for n in FAMILY_NAMES if n != "bert"])
def test_ours_to_hf_to_ours(name):
    """Our config and params → a transformers model of the family (its config from hf_dict_from_config,
    its weights from to_hf_state_dict, strict) → the same outputs, and from_hf gives back exactly our params."""
    config = config_from_hf_dict(family_config(name).to_dict())
    assert config_from_hf_dict(hf_dict_from_config(config)) == config
    params = _random_family_params(config, seed=6)
    hf_cfg = transformers.AutoConfig.for_model(**hf_dict_from_config(config))
    hf_cfg._attn_implementation = "eager"
    model = transformers.AutoModel.from_config(hf_cfg).to(torch.float64).eval()
    model.load_state_dict(to_hf_state_dict(params, config), strict=True)
    config2, params2 = from_hf(model)
    assert config2 == config and set(params2) == set(params)
    for k in params:
        # exact: copied through torch and back
        assert np.array_equal(params2[k], params[k]), k
    ids, am, tt = batch(name, seed=7)
    kw = {"token_type_ids": torch.tensor(tt)} if tt is not None else {}
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am), **kw).last_hidden_state
    H, _ = hf_forward(params, config, input_ids=ids, attention_mask=am, token_type_ids=tt)
    assert nrel(H, ref) <= TOL64


@pytest.mark.parametrize("name, cls", [("roberta", "RobertaForMaskedLM"), ("distilbert", "DistilBertForMaskedLM"),
                                       ("albert", "AlbertForSequenceClassification"),
                                       ("electra", "ElectraForPreTraining"), ("xlm-roberta", "XLMRobertaForMaskedLM"),
                                       ("mpnet", "MPNetForMaskedLM")])
def test_task_models_read_their_base_model(name, cls):
    model = build(name, seed=8, cls=getattr(transformers, cls))
    config, params = from_hf(model)                       # the base-model prefix detected, task heads ignored
    _, inner = from_hf(model.base_model)
    assert set(params) == set(inner)
    for k in params:
        assert np.array_equal(params[k], inner[k]), k   # exact: the same tensors, copied
    prefix = model.base_model_prefix + "."
    sd = to_hf_state_dict(params, config, prefix=prefix)
    own = model.state_dict()
    for k, v in sd.items():
        assert torch.equal(v, own[k]), k


# ----------------------------------------------------------------------------- bare layers
def _first_layer(model):
    base = model.base_model
    if hasattr(base, "transformer"):
        return base.transformer.layer[0]
    if hasattr(base.encoder, "albert_layer_groups"):
        return base.encoder.albert_layer_groups[0].albert_layers[0]
    return base.encoder.layer[0]


@pytest.mark.parametrize("name", BARE_LAYERS)
def test_bare_layer_parity_under_its_own_names(name):
    from transformers.masking_utils import create_bidirectional_mask

    model = build(name, seed=9, attn="sdpa")
    layer = _first_layer(model)
    config, params = from_hf(layer)
    assert config.bare_layer and config.n_layers == 1 and set(params) == {f"layers.0.{k}" for k in
                                                                          (p.split(".", 2)[2] for p in params)}
    rng = np.random.default_rng(10)
    x = rng.normal(size=(B, N, D))
    am = np.ones((B, N), dtype=np.int64)
    am[0, 4:] = 0
    R = rng.normal(size=(B, N, D)) * am[:, :, None]
    xt = torch.tensor(x, requires_grad=True)
    cfg = next(m.config for m in layer.modules() if hasattr(m, "config"))
    mask = create_bidirectional_mask(config=cfg, inputs_embeds=xt, attention_mask=torch.tensor(am))
    out = layer(xt, attention_mask=mask)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.tensor(R))
    H, cache = hf_forward(params, config, inputs_embeds=x, attention_mask=am)
    grads = hf_backward(R, cache)
    assert nrel(H, out) <= TOL64
    assert nrel(grads.pop("inputs_embeds"), xt.grad) <= TOL64
    mapped = to_hf_state_dict(grads, config)              # the layer's own names, no prefix
    check_every_gradient(layer, mapped, config)


# ----------------------------------------------------------------------------- RoBERTa's positions
def test_roberta_position_ids_are_hfs():
    config = config_from_hf_dict(family_config("roberta").to_dict())
    assert config.max_len == 24 - PAD - 1 and config.n_positions == 24
    ids = np.array([[5, 6, 7, PAD, PAD], [PAD, PAD, 5, 6, 7], [5, PAD, 6, PAD, 7]])
    ref = transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids(
        torch.tensor(ids), PAD).numpy()
    assert np.array_equal(position_ids(ids, config), ref)   # exact: integer positions
    params = _random_family_params(config)
    hf_forward(params, config, input_ids=np.full((1, 22), 5))                  # 22 = max_len tokens: fits
    with pytest.raises(InputValueError, match="position table has 24 rows"):
        hf_forward(params, config, input_ids=np.full((1, 23), 5))


# ----------------------------------------------------------------------------- unsupported architectures
def test_unsupported_architectures_list_the_supported_ones():
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20, n_positions=8))
    with pytest.raises(ModelConfigError, match=r"model_type.*gpt2.*supported: bert \(BertModel\).*roberta.*albert"):
        from_hf(gpt2)
    for mt in ("deberta", "funnel", "t5"):      # DeBERTa v1 ("deberta"); v2 is supported
        with pytest.raises(ModelConfigError, match=f"{mt}.*supported"):
            config_from_hf_dict(dict(COMMON, model_type=mt))
    with pytest.raises(ModelConfigError, match="num_hidden_groups"):
        config_from_hf_dict(dict(family_config("albert").to_dict(), num_hidden_groups=2))


# ----------------------------------------------------------------------------- load_pretrained on a folder
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_load_pretrained_reads_a_folder_of_the_family(name, tmp_path):
    from transformer_np.io.pretrained import load_pretrained

    model = build(name, seed=11)
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 512}))
    m = load_pretrained(tmp_path)
    assert m.config.d_model == D and m.config.vocab_size == V
    b = m.tokenize(["The river bank!", "money, the bank.", "a"])
    assert b["input_ids"][2, -1] == PAD
    kw = {k: torch.tensor(v) for k, v in b.items() if k != "token_type_ids" or name in
          ("bert", "ernie", "albert", "electra", "electra-unfactorised")}
    with torch.no_grad():
        ref = model(**kw).last_hidden_state.numpy()
    H = m.forward(b, dtype=np.float64)
    assert nrel(H, ref) <= TOL64
