"""The FLOP model of one layer against the matmuls the layer actually performs, and its crossover."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_np import EncoderConfig
from transformer_np.model.encoder import encoder_layer_forward
from transformer_np.model.flops import crossover_n, layer_flops, stack_flops
from transformer_np.model.params import init_params, sub_params


def _walk(cache):
    """Every dict inside a forward cache (depth-first)."""
    if isinstance(cache, dict):
        yield cache
        for v in cache.values():
            yield from _walk(v)


def counted_matmul_flops(config: EncoderConfig, batch: int, n: int) -> dict:
    """2·m·k·p for every matmul the forward really ran, read off the layer's cache."""
    cfg = config.replace(n_layers=1, dropout=0.0)
    p = sub_params(init_params(cfg, seed=0), "layers.0.")
    x = np.random.default_rng(0).normal(size=(batch, n, cfg.d_model))
    _, cache = encoder_layer_forward(x, p, cfg)
    out = {"linear": 0, "attention": 0}
    for c in _walk(cache):
        if c.get("kind") == "linear":
            x = c["x"] if c["x"] is not None else c["ln"]["xhat"]    # the fast training layer keeps FFN's
            rows = int(np.prod(x.shape[:-1]))                       # input z as its LayerNorm's x̂, γ, β
            out["linear"] += 2 * rows * c["W"].shape[0] * c["W"].shape[1]
        elif c.get("kind") == "qkv":                                     # the fast path's X W_Q, X W_K, X W_V
            rows = int(np.prod(c["x"].shape[:-1]))
            out["linear"] += sum(2 * rows * W.shape[0] * W.shape[1] for W in c["W"])
        elif c.get("kind") == "attention":
            Q, K, V = c["Q"], c["K"], c["V"]
            lead = int(np.prod(Q.shape[:-1]))                        # B·h·n_q
            out["attention"] += 2 * lead * K.shape[-2] * Q.shape[-1]   # Q Kᵀ
            out["attention"] += 2 * lead * K.shape[-2] * V.shape[-1]   # A V
    return out


@pytest.mark.parametrize("d,h,d_ff,batch,n", [(8, 2, 32, 2, 5), (12, 3, 20, 1, 7), (16, 4, 64, 3, 1)])
def test_model_matches_the_matmuls_the_layer_runs(d, h, d_ff, batch, n):
    cfg = EncoderConfig(n_layers=1, d_model=d, n_heads=h, d_ff=d_ff)
    f = layer_flops(cfg, batch, n)
    counted = counted_matmul_flops(cfg, batch, n)
    assert f["attention_scores"] == counted["attention"]
    assert f["projections"] + f["ffn"] == counted["linear"]
    assert f["total"] == counted["attention"] + counted["linear"]


def test_terms_have_the_articles_orders():
    cfg = EncoderConfig.bert_base()
    f1, f2 = layer_flops(cfg, 1, 128), layer_flops(cfg, 1, 256)
    assert f2["attention_scores"] == 4 * f1["attention_scores"]    # n²
    assert f2["projections"] == 2 * f1["projections"]              # n
    assert f2["ffn"] == 2 * f1["ffn"]
    wide = cfg.replace(d_model=1536, d_ff=6144, n_heads=12)
    g = layer_flops(wide, 1, 128)
    assert g["attention_scores"] == 2 * f1["attention_scores"]     # d
    assert g["projections"] == 4 * f1["projections"]               # d²
    assert g["ffn"] == 4 * f1["ffn"]                               # d·d_ff, d_ff = 4d


def test_heads_do_not_change_the_cost():
    a = layer_flops(EncoderConfig(n_layers=1, d_model=64, n_heads=1, d_ff=256), 2, 10)
    b = layer_flops(EncoderConfig(n_layers=1, d_model=64, n_heads=16, d_ff=256), 2, 10)
    assert a == b


def test_backward_is_twice_the_forward():
    cfg = EncoderConfig.bert_base()
    f, fb = layer_flops(cfg, 2, 64), layer_flops(cfg, 2, 64, mode="fwd+bwd")
    assert all(fb[k] == 3 * f[k] for k in f)


def test_stack_is_N_times_a_layer():
    cfg = EncoderConfig.bert_large()
    assert stack_flops(cfg, 1, 512) == {k: 24 * v for k, v in layer_flops(cfg, 1, 512).items()}


@pytest.mark.parametrize("against", ["projections+ffn", "projections", "ffn"])
@pytest.mark.parametrize("cfg", [EncoderConfig.bert_base(), EncoderConfig.bert_large(),
                                 EncoderConfig(n_layers=1, d_model=64, n_heads=4, d_ff=100)])
def test_crossover_is_where_the_terms_meet(cfg, against):
    def other(f):
        return {"projections+ffn": f["projections"] + f["ffn"], "projections": f["projections"],
                "ffn": f["ffn"]}[against]
    n_star = crossover_n(cfg, against)
    assert n_star == int(n_star)
    f = layer_flops(cfg, 1, int(n_star))
    assert f["attention_scores"] == other(f)
    lo, hi = layer_flops(cfg, 1, int(n_star) - 1), layer_flops(cfg, 1, int(n_star) + 1)
    assert lo["attention_scores"] < other(lo) and hi["attention_scores"] > other(hi)


def test_bert_base_crossover_and_ratio_at_512():
    cfg = EncoderConfig.bert_base()
    assert crossover_n(cfg) == 6 * 768
    f = layer_flops(cfg, 1, 512)
    assert (f["projections"] + f["ffn"]) / f["attention_scores"] == pytest.approx(9.0)


def test_bad_input():
    cfg = EncoderConfig.bert_base()
    with pytest.raises(TypeError, match="config must be an EncoderConfig"):
        layer_flops({"d_model": 4}, 1, 3)
    with pytest.raises(ValueError, match="mode"):
        layer_flops(cfg, 1, 3, mode="bwd")
    with pytest.raises(ValueError, match="n"):
        layer_flops(cfg, 1, 0)
    with pytest.raises((TypeError, ValueError), match="batch"):
        layer_flops(cfg, 1.5, 3)
    with pytest.raises(ValueError, match="against"):
        crossover_n(cfg, "attention")


def test_ffn_cost_and_parameters_are_linear_in_d_ff():
    from transformer_np import count_parameters
    cfgs = [EncoderConfig(n_layers=1, d_model=64, n_heads=4, d_ff=f) for f in (128, 256, 384)]
    ffn = [layer_flops(c, 1, 32)["ffn"] for c in cfgs]
    params = [count_parameters(c) for c in cfgs]
    assert ffn[2] - ffn[1] == ffn[1] - ffn[0] and ffn[0] == 4 * 32 * 64 * 128
    assert params[2] - params[1] == params[1] - params[0] == 128 * (2 * 64 + 1)


def test_softmax_is_h_n2_work_not_n2d():
    """Article: "plus the softmax and weighted sum over values, also O(n²d)". The weighted sum A·V is
    2·B·n²·d FLOPs; the softmax touches B·h·n² scores — d_k times fewer than the QKᵀ product's n²·d."""
    cfg = EncoderConfig(n_layers=1, d_model=32, n_heads=4, d_ff=128, dropout=0.0)
    B, n = 2, 9
    p = sub_params(init_params(cfg, seed=0), "layers.0.")
    _, cache = encoder_layer_forward(np.zeros((B, n, 32)), p, cfg)
    sm = [c for c in _walk(cache) if c.get("kind") == "softmax"]
    assert len(sm) == 1 and sm[0]["s"].size == B * cfg.n_heads * n * n
    assert layer_flops(cfg, B, n)["attention_scores"] == 2 * (2 * B * n * n * cfg.d_model)   # QKᵀ + AV
    assert (B * n * n * cfg.d_model) // sm[0]["s"].size == cfg.d_k
