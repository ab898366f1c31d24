"""ModernBERT against transformers' ModernBertModel (eager attention), float64, small random configs.

Hugging Face's ModernBERT rounds to float32 in three places whatever the model's dtype
(modeling_modernbert.py): the rotary tables (``position_ids.float() * inv_freq``, ``.cos()``), the rotated
queries and keys (``q.float() * cos + rotate_half(q.float()) * sin``) and the eager softmax
(``softmax(..., dtype=torch.float32)``). A float64 HF model therefore agrees with an exact float64
computation only to float32's resolution. The 1e-10 comparison runs HF with those three roundings lifted
(``hf_float64``: HF's own three functions with the casts removed, nothing else replaced); a second test
compares with HF as it is, at a float32-sized tolerance, which shows what the roundings cost.

Checked at ‖ours − HF‖/‖HF‖ ≤ 1e-10: the output, every parameter's gradient and the gradient of the word
lookup's output (HF's ``inputs_embeds``); configs with and without biases, full and sliding layers, a
right-padded row (its padding longer than the window), a left-padded row. Then conversions both ways, a task
model's prefix, configs in the older format, and what is refused.
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

from transformers.models.modernbert import modeling_modernbert as MM  # noqa: E402

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
V, PAD, D, B, N = 40, 1, 16, 3, 20
SPECIAL = dict(pad_token_id=PAD, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)


def modernbert_config(biases: bool = False, **kw):
    cfg = transformers.ModernBertConfig(**{**dict(
        vocab_size=V, hidden_size=D, num_hidden_layers=4, num_attention_heads=2, intermediate_size=12,
        max_position_embeddings=64, local_attention=8, norm_eps=1e-7, attention_bias=biases, mlp_bias=biases,
        norm_bias=biases, global_rope_theta=1000.0, local_rope_theta=500.0, **SPECIAL), **kw})
    cfg._attn_implementation = "eager"
    return cfg


def build(seed: int, biases: bool = False, cls=None, **kw):
    cfg = modernbert_config(biases, **kw)
    model = (cls or transformers.ModernBertModel)(cfg).to(torch.float64).eval()
    randomise_(model, seed)
    return model


@pytest.fixture
def hf_float64(monkeypatch):
    """HF's ModernBERT without its three float32 roundings: each function below is HF's own, cast removed."""
    def rope_forward(self, x, position_ids, layer_type):           # ModernBertRotaryEmbedding.forward
        theta = self.config.rope_parameters[layer_type]["rope_theta"]
        dim = self.config.hidden_size // self.config.num_attention_heads
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + MM.rotate_half(q) * sin, k * cos + MM.rotate_half(k) * sin

    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        w = torch.matmul(query, key.transpose(2, 3)) * scaling
        if attention_mask is not None:
            w = w + attention_mask
        w = torch.nn.functional.softmax(w, dim=-1)                  # in the query's dtype
        w = torch.nn.functional.dropout(w, p=dropout, training=module.training)
        return torch.matmul(w, value).transpose(1, 2).contiguous(), w

    monkeypatch.setattr(MM.ModernBertRotaryEmbedding, "forward", rope_forward)
    monkeypatch.setattr(MM, "apply_rotary_pos_emb", apply_rotary_pos_emb)
    monkeypatch.setattr(MM, "eager_attention_forward", eager_attention_forward)


def batch(seed: int = 1, long_padding: bool = True):
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, V, size=(B, N))
    am = np.ones((B, N), dtype=np.int64)
    am[1, (13 if long_padding else 17):] = 0     # 7 padded: past the window's half-width w = 4, or 3: within it
    am[2, :3] = 0
    ids[am == 0] = PAD
    return ids, am


def hf_run(model, ids, am, R):
    kept = {}

    def keep(_module, _inputs, out):
        out.retain_grad()
        kept["e"] = out

    hook = model.embeddings.tok_embeddings.register_forward_hook(keep)
    try:
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am)).last_hidden_state
    finally:
        hook.remove()
    (out * torch.tensor(R)).sum().backward()
    return out, kept["e"].grad


@pytest.mark.parametrize("biases", [False, True])
def test_output_and_every_gradient(hf_float64, biases):
    model = build(seed=40 + biases, biases=biases)
    config, params = from_hf(model)
    assert config.modernbert.layer_types == ("full", "sliding", "sliding", "full")
    assert config.modernbert.window == 4 and ("layers.0.ln1.gamma" not in params)
    ids, am = batch()
    R = np.random.default_rng(2).normal(size=(B, N, D)) * am[:, :, None]
    out, de_ref = hf_run(model, ids, am, R)
    H, cache = hf_forward(params, config, input_ids=ids, attention_mask=am)
    grads = hf_backward(R, cache, input_grad=True)
    assert nrel(H, out) <= TOL64                      # padded positions too
    assert nrel(grads.pop("inputs_embeds"), de_ref) <= TOL64
    mapped = to_hf_state_dict(grads, config)
    hf_params = dict(model.named_parameters())
    assert set(mapped) == set(hf_params)
    for name, p in hf_params.items():
        # the key bias's gradient too: rotated by position, q·R_m b_K is no constant along a row (unlike BERT's)
        assert nrel(mapped[name].numpy(), p.grad) <= TOL64, name


def test_hf_as_it_is_differs_by_its_float32_roundings():
    """HF unmodified (float32 rotary tables, rotations and softmax): the output agrees to float32's resolution,
    not float64's. Padding within the window: a padded query whose window holds only padding makes HF's float32
    softmax of float64's min (−inf once cast) a NaN row, which then spreads through A·V — HF's, not ours."""
    model = build(seed=42)
    config, params = from_hf(model)
    ids, am = batch(long_padding=False)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am)).last_hidden_state
    H, _ = hf_forward(params, config, input_ids=ids, attention_mask=am)
    err = nrel(H, ref)
    eps32 = float(np.finfo(np.float32).eps)
    assert 1e-10 < err <= 100 * eps32, err


def test_hf_to_ours_to_hf_is_exact_and_ours_to_hf_runs(hf_float64):
    model = build(seed=43, biases=True)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    config = config_from_hf_dict(model.config.to_dict())
    back = hf_state_dict_from_params(params_from_hf_state_dict(sd, config), config)
    assert set(back) == set(sd)
    for k in sd:
        assert np.array_equal(back[k], sd[k]), k      # exact: values copied
    rng = np.random.default_rng(6)
    for biases in (False, True):
        config = config_from_hf_dict(modernbert_config(biases).to_dict())
        assert config_from_hf_dict(hf_dict_from_config(config)) == config
        params = {k: (1 + 0.3 * rng.normal(size=s)) if k.endswith("gamma") else 0.5 * rng.normal(size=s)
                  for k, s in hf_param_shapes(config).items()}
        hf_cfg = transformers.AutoConfig.for_model(**hf_dict_from_config(config), **{
            k: v for k, v in SPECIAL.items() if k != "pad_token_id"})
        hf_cfg._attn_implementation = "eager"
        m = transformers.AutoModel.from_config(hf_cfg).to(torch.float64).eval()
        m.load_state_dict(to_hf_state_dict(params, config), strict=True)
        config2, params2 = from_hf(m)
        assert config2 == config and set(params2) == set(params)
        for k in params:
            assert np.array_equal(params2[k], params[k]), k   # exact: copied through torch and back
        ids, am = batch(seed=7)
        with torch.no_grad():
            ref = m(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am)).last_hidden_state
        assert nrel(hf_forward(params, config, input_ids=ids, attention_mask=am)[0], ref) <= TOL64


def test_task_model_reads_its_base_model():
    model = build(seed=44, cls=transformers.ModernBertForMaskedLM)
    config, params = from_hf(model)
    _, inner = from_hf(model.model)
    # exact: both conversions copy the same tensors, no arithmetic
    assert set(params) == set(inner) and all(np.array_equal(params[k], inner[k]) for k in params)


def test_older_config_format_and_what_is_refused():
    new = modernbert_config().to_dict()
    old = {k: v for k, v in new.items() if k not in ("layer_types", "rope_parameters")}
    old.update(global_attn_every_n_layers=3, global_rope_theta=1000.0, local_rope_theta=500.0)
    assert config_from_hf_dict(old) == config_from_hf_dict(new)
    assert config_from_hf_dict(dict(old, global_attn_every_n_layers=2)).modernbert.layer_types == \
        ("full", "sliding", "full", "sliding")
    scaled = dict(new, rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 1.0, "factor": 2.0},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 1.0}})
    with pytest.raises(ModelConfigError, match=r"rope_parameters.full_attention.rope_type.*'linear'"):
        config_from_hf_dict(scaled)
    with pytest.raises(ModelConfigError, match="layer_types.*4 entries"):
        config_from_hf_dict(dict(new, layer_types=["full_attention"]))
    with pytest.raises(ModelConfigError, match="head width.*must be even"):
        config_from_hf_dict(dict(new, hidden_size=6, num_attention_heads=2))
    with pytest.raises(ModelConfigError, match="bare modernbert layer cannot run alone"):
        from_hf(build(seed=0).layers[1])
