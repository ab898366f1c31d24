"""DeBERTa-v2/v3 against transformers' DebertaV2Model, float64, small random configs.

Checked at ‖ours − HF‖/‖HF‖ ≤ 1e-10: the output (padded positions too: HF's masked_fill makes a padded query
attend uniformly, as ours does), every parameter's gradient and the gradient of the word lookup's output (HF's
``inputs_embeds``), for configs that vary share_att_key, pos_att_type (["p2c", "c2p"], ["c2p"], ["p2c"]),
log buckets on and off, max_relative_positions from the config or from max_position_embeddings, the relative
LayerNorm, absolute positions, token types and a factorised embedding; with and without padding. Then the
conversions both ways, a task model's prefix, the older config format and what is refused.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import pytest

from helpers import nrel, randomise_

torch = pytest.importorskip("torch", reason="parity tests need PyTorch: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="HF parity tests need transformers: pip install transformers")

from transformer_np.errors import ModelConfigError  # noqa: E402
from transformer_np.io.families import hf_param_shapes  # noqa: E402
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

pytestmark = pytest.mark.hf

TOL64 = 1e-10
V, PAD, D, B, N = 40, 0, 16, 3, 24

#: name → DebertaV2Config fields beyond the shared ones. v3: no absolute positions, buckets, shared keys.
CONFIGS = {
    "v3 (shared keys, buckets, p2c+c2p, relative LayerNorm)": dict(
        position_biased_input=False, relative_attention=True, pos_att_type=["p2c", "c2p"], share_att_key=True,
        position_buckets=8, max_relative_positions=20, norm_rel_ebd="layer_norm"),
    "v2 (own position projections, no buckets, absolute positions, token types)": dict(
        position_biased_input=True, relative_attention=True, pos_att_type=["p2c", "c2p"], share_att_key=False,
        max_relative_positions=6, type_vocab_size=2),
    "c2p only, own projection, buckets, span from max_position_embeddings": dict(
        position_biased_input=False, relative_attention=True, pos_att_type=["c2p"], share_att_key=False,
        position_buckets=6, norm_rel_ebd="layer_norm"),
    "p2c only, shared, factorised embedding (E = 12)": dict(
        position_biased_input=True, relative_attention=True, pos_att_type="p2c", share_att_key=True,
        max_relative_positions=10, embedding_size=12),
    "no relative attention (BERT with DeBERTa's scale and mask)": dict(
        position_biased_input=True, relative_attention=False, pos_att_type=["c2p"]),
}


V3 = next(iter(CONFIGS))


def deberta_config(**kw):
    return transformers.DebertaV2Config(**{**dict(
        vocab_size=V, hidden_size=D, num_hidden_layers=2, num_attention_heads=2, intermediate_size=20,
        max_position_embeddings=40, layer_norm_eps=1e-7, pad_token_id=PAD, hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1), **kw})


def build(seed: int, cls=None, **kw):
    model = (cls or transformers.DebertaV2Model)(deberta_config(**kw)).to(torch.float64).eval()
    randomise_(model, seed)
    return model


def batch(seed: int = 1, padded: bool = True):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, V, size=(B, N))
    am = np.ones((B, N), dtype=np.int64)
    if padded:
        am[1, 15:] = 0
        am[2, :3] = 0
        ids[am == 0] = PAD
    tt = rng.integers(0, 2, size=(B, N))
    return ids, am, tt


def hf_run(model, ids, am, tt, R):
    kept = {}

    def keep(_module, _inputs, out):
        out.retain_grad()
        kept["e"] = out

    hook = model.embeddings.word_embeddings.register_forward_hook(keep)
    try:
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am),
                    token_type_ids=torch.tensor(tt) if model.config.type_vocab_size else None).last_hidden_state
    finally:
        hook.remove()
    (out * torch.tensor(R)).sum().backward()
    return out, kept["e"].grad


def zero_in_exact_arithmetic(name: str, config) -> bool:
    """Biases whose every path to the scores is constant along a softmax row: q_i·b_PK (c2p), and, when no p2c
    term reads K against the positions, q_i·b_K and the relative LayerNorm's β (it shifts every row of P_K alike)."""
    no_p2c = not config.deberta.p2c
    return name.endswith("pos_key_proj.bias") or (no_p2c and (name.endswith("self.key_proj.bias")
                                                              or name == "encoder.LayerNorm.bias"))


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_output_and_every_gradient(name, padded):
    seed = 50 + list(CONFIGS).index(name)
    model = build(seed=seed, **CONFIGS[name])
    config, params = from_hf(model)
    ids, am, tt = batch(seed, padded)
    R = np.random.default_rng(seed).normal(size=(B, N, D))     # padded rows' outputs are compared too
    out, de_ref = hf_run(model, ids, am, tt, R)
    H, cache = hf_forward(params, config, input_ids=ids, attention_mask=am,
                          token_type_ids=tt if config.type_vocab_size else None)
    grads = hf_backward(R, cache, input_grad=True)
    assert nrel(H, out) <= TOL64
    assert nrel(grads.pop("inputs_embeds"), de_ref) <= TOL64
    mapped = to_hf_state_dict(grads, config)
    hf_params = dict(model.named_parameters())
    assert set(mapped) == set(hf_params)
    for hf_name, p in hf_params.items():
        ours = mapped[hf_name].numpy()
        if zero_in_exact_arithmetic(hf_name, config):
            scale = np.linalg.norm(mapped[hf_name.replace("bias", "weight")].numpy())
            assert np.linalg.norm(ours) <= 1e-10 * scale and float(p.grad.norm()) <= 1e-10 * scale, hf_name
            continue
        assert nrel(ours, p.grad) <= TOL64, hf_name


def test_the_configs_exercise_what_they_name():
    """The parity cases above read the log buckets, clip the distances and skip what they should."""
    c = {k: from_hf(build(seed=0, **v))[0].deberta for k, v in CONFIGS.items()}
    v3, v2, c2p, p2c, none = c.values()
    assert (v3.span, v3.share_att_key, v3.norm_rel_ebd, v3.position_biased_input) == (8, True, True, False)
    assert N - 1 > v3.position_buckets // 2          # distances past the exact range: log buckets are read
    assert (v2.span, v2.share_att_key) == (6, False) and N - 1 > v2.span   # distances clipped to the table
    assert c2p.span == 6 and c2p.pos_att_type == ("c2p",) and not c2p.p2c
    assert p2c.pos_att_type == ("p2c",) and p2c.embedding_size == 12
    assert not none.relative_attention and none.scale_factor == 2


def test_hf_to_ours_to_hf_is_exact_and_ours_to_hf_runs():
    rng = np.random.default_rng(6)
    for i, kw in enumerate(CONFIGS.values()):
        model = build(seed=60 + i, **kw)
        sd = {k: v.numpy() for k, v in model.state_dict().items() if k != "embeddings.position_ids"}
        config = config_from_hf_dict(model.config.to_dict())
        back = hf_state_dict_from_params(params_from_hf_state_dict(sd, config), config)
        assert set(back) == set(sd)
        for k in sd:
            assert np.array_equal(back[k], sd[k]), k      # exact: values copied
        assert config_from_hf_dict(hf_dict_from_config(config)) == config
        params = {k: (1 + 0.3 * rng.normal(size=s)) if k.endswith("gamma") else 0.5 * rng.normal(size=s)
                  for k, s in hf_param_shapes(config).items()}
        m = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(**hf_dict_from_config(config)))
        m = m.to(torch.float64).eval()
        m.load_state_dict(to_hf_state_dict(params, config), strict=False)
        config2, params2 = from_hf(m)
        assert config2 == config and set(params2) == set(params)
        for k in params:
            assert np.array_equal(params2[k], params[k]), k   # exact: copied through torch and back
        ids, am, tt = batch(seed=7)
        tt = tt if config.type_vocab_size else None
        with torch.no_grad():
            ref = m(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am),
                    token_type_ids=None if tt is None else torch.tensor(tt)).last_hidden_state
        assert nrel(hf_forward(params, config, input_ids=ids, attention_mask=am, token_type_ids=tt)[0], ref) <= TOL64


def test_a_v3_checkpoints_unused_position_table_is_ignored_as_transformers_ignores_it():
    model = build(seed=45, **CONFIGS[V3])
    config = config_from_hf_dict(model.config.to_dict())
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    extra = dict(sd, **{"embeddings.position_embeddings.weight": np.zeros((40, D))})
    params = params_from_hf_state_dict(extra, config)
    assert "embeddings.position" not in params and set(params) == set(params_from_hf_state_dict(sd, config))
    biased = config_from_hf_dict(dict(model.config.to_dict(), position_biased_input=True))
    assert "embeddings.position" in params_from_hf_state_dict(extra, biased)      # read when the config uses it
    with pytest.raises(ValueError, match=r"missing \['embeddings.position_embeddings.weight'\]"):
        params_from_hf_state_dict(sd, biased)


def test_task_model_reads_its_base_model():
    model = build(seed=44, cls=transformers.DebertaV2ForMaskedLM, **CONFIGS[V3])
    config, params = from_hf(model)
    _, inner = from_hf(model.deberta)
    # exact: both conversions copy the same tensors, no arithmetic
    assert set(params) == set(inner) and all(np.array_equal(params[k], inner[k]) for k in params)


def test_older_config_format_and_what_is_refused():
    new = deberta_config(**CONFIGS[V3]).to_dict()
    assert config_from_hf_dict(dict(new, pos_att_type="P2C|c2p")) == config_from_hf_dict(new)
    with pytest.raises(ModelConfigError, match=r"'conv_kernel_size' is 3.*not implemented"):
        config_from_hf_dict(dict(new, conv_kernel_size=3))
    with pytest.raises(ModelConfigError, match=r"pos_att_type.*\['p2p'\]"):
        config_from_hf_dict(dict(new, pos_att_type=["p2p"]))
    with pytest.raises(ModelConfigError, match=r"attention_head_size.*is 4"):
        config_from_hf_dict(dict(new, attention_head_size=4))
    with pytest.raises(ModelConfigError, match=r"norm_rel_ebd"):
        config_from_hf_dict(dict(new, norm_rel_ebd="batch_norm"))
    with pytest.raises(ModelConfigError, match=r"position_buckets = 40 needs max_relative_positions − 1 > "
                                               r"position_buckets // 2.*got max_relative_positions = 20"):
        config_from_hf_dict(dict(new, position_buckets=40, max_relative_positions=20))
    with pytest.raises(ModelConfigError, match="bare deberta-v2 layer cannot run alone"):
        from_hf(build(seed=0).encoder.layer[0])


def test_load_pretrained_reads_a_deberta_folder(tmp_path):
    """A saved DebertaV2Model with a WordPiece vocabulary (real DeBERTa-v3 folders ship a SentencePiece model, which
    the library's tokenizer does not read): the folder's weights run through load_pretrained's forward."""
    from transformer_np.io.pretrained import load_pretrained

    model = build(seed=12, **CONFIGS[V3])
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(V - 5)]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    m = load_pretrained(tmp_path)
    assert m.config.model_type == "deberta-v2" and m.config.deberta == from_hf(model)[0].deberta
    b = m.tokenize(["w1 w2 w3 w4", "w5"])
    assert b["input_ids"][1, -1] == PAD
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(b["input_ids"]),
                    attention_mask=torch.tensor(b["attention_mask"])).last_hidden_state.numpy()
    assert nrel(m.forward(b, dtype=np.float64), ref) <= TOL64
