"""The seeds' checkable claims, computed with the library (the ledger docs/claims.md names these tests)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import transformer_np as tnp
from transformer_np import EncoderConfig
from transformer_np.course import anatomy
from transformer_np.model.params import init_params


# ----------------------------------------------------------------------------- worked example
@pytest.fixture(scope="module")
def ex():
    return anatomy.worked_example_layer1()


def test_worked_example_scores(ex):
    H0 = np.array(ex["H0"])
    expected = np.array([[(H0[i] @ H0[j]) / 2.0 for j in range(3)] for i in range(3)])  # by hand: /√4
    np.testing.assert_allclose(ex["scores"], expected, atol=1e-15)
    np.testing.assert_allclose(ex["scores"], [[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.5, 0.5, 1.0]], atol=1e-15)


def test_worked_example_softmax_is_not_the_articles(ex):
    e = [math.exp(1.0), math.exp(0.0), math.exp(0.5)]
    by_hand = np.array(e) / sum(e)
    np.testing.assert_allclose(ex["weights"][0], by_hand, rtol=1e-14)
    # the article prints (0.44, 0.16, 0.40): off by more than its 2-decimal rounding
    assert np.abs(np.round(ex["weights"][0], 2) - ex["article_weights"]).max() > 0.05


def test_worked_example_weighted_sum_and_residual(ex):
    w = ex["weights"][0]
    H0 = np.array(ex["H0"])
    np.testing.assert_allclose(ex["attn_out"][0], w @ H0, rtol=1e-14)
    np.testing.assert_allclose(ex["residual"][0], H0[0] + w @ H0, rtol=1e-14)
    # the article's arithmetic is right from its wrong weights
    np.testing.assert_allclose(ex["article_attn_out"], [0.84, 0.56, 0.44, 0.16], atol=1e-12)
    np.testing.assert_allclose(ex["article_residual"], [1.84, 0.56, 1.44, 0.16], atol=1e-12)
    assert np.abs(ex["attn_out"][0] - ex["article_attn_out"]).max() > 0.05


def test_worked_example_residual_mean_is_one_not_075(ex):
    np.testing.assert_allclose(ex["residual_mean"], [1.0, 1.0, 1.0], atol=1e-14)
    assert ex["article_residual_mean"] == pytest.approx(1.0)        # even the article's own vector
    assert abs(ex["residual_mean"][0] - 0.75) > 0.2


def test_worked_example_layernorm_keeps_order_and_standardises(ex):
    for r, z in zip(ex["residual"], ex["ln"]):
        # exact: integer indices; LayerNorm is increasing along each row
        assert np.array_equal(np.argsort(r, kind="stable"), np.argsort(z, kind="stable"))
        assert abs(z.mean()) < 1e-12 and abs(z.var() - 1.0) < 1e-9


def test_worked_example_bidirectional_vs_causal(ex):
    assert ex["weights"][0, 2] > 0.3                                 # "the" attends forward to "sat"
    # exact: one unmasked key: weight exp(0)/exp(0) = 1, masked ones exp(−huge) = 0
    np.testing.assert_array_equal(ex["causal_weights"][0], [1.0, 0.0, 0.0])


# ----------------------------------------------------------------------------- Figure 1
def test_post_vs_pre_same_weights():
    r = anatomy.compare_norm_positions(n_layers=12, d_model=16)
    # Post-LN renormalises the stream: every row has norm √d (γ = 1, β = 0) after every layer
    np.testing.assert_allclose(r["post_norms"][1:], r["sqrt_d"], rtol=1e-9)
    # Pre-LN never renormalises the stream: its norm grows with depth
    assert r["pre_norms"][-1] > 2 * r["pre_norms"][0]
    assert np.all(r["pre_norms"][1:] > r["sqrt_d"])
    assert r["rel_diff"] > 0.1                                        # same weights, different function


def test_pre_ln_identity_path_post_ln_normalises_it():
    """Silence the sublayers (W_O = b_O = W_2 = b_2 = 0): Pre-LN's ∂H^(N)/∂H^(0) is exactly I;
    Post-LN's is a product of LayerNorm Jacobians — the identity term does not survive as is."""
    d, N = 8, 6
    for norm in ("pre", "post"):
        cfg = EncoderConfig(n_layers=N, d_model=d, n_heads=2, d_ff=32, dropout=0.0, norm_position=norm,
                            final_layer_norm=False)
        p = init_params(cfg, seed=0, init="xavier")
        for ell in range(N):
            for k in ("attn.W_O", "attn.b_O", "ffn.W_2", "ffn.b_2"):
                p[f"layers.{ell}.{k}"] = np.zeros_like(p[f"layers.{ell}.{k}"])
        H0 = np.random.default_rng(1).normal(size=(1, 4, d)) * 3.0
        H, cache = tnp.encoder_forward(p, cfg, inputs_embeds=H0)
        dH = np.random.default_rng(2).normal(size=H.shape)
        g = tnp.encoder_backward(dH, cache)["inputs_embeds"]
        if norm == "pre":
            # exact: the silenced sublayers add exact zeros, so g = dH and H = H0
            np.testing.assert_array_equal(g, dH)
            np.testing.assert_array_equal(H, H0)   # exact: as above
        else:
            assert np.abs(g - dH).max() > 0.1


def test_layer_shapes_from_a_real_forward():
    cfg = EncoderConfig(n_layers=3, d_model=12, n_heads=3, d_ff=40)
    shapes = dict(anatomy.layer_shapes(cfg, batch=2, n=5))
    assert shapes["H^(ℓ−1)"] == (2, 5, 12)
    assert shapes["Q, K, V per head"] == (2, 3, 5, 4)
    assert shapes["scores QKᵀ/√d_k"] == (2, 3, 5, 5)
    assert shapes["· W_1 + b_1 → GELU"] == (2, 5, 40)
    assert shapes["· W_2 + b_2 → FFN"] == (2, 5, 12)
    assert shapes["concat heads"] == (2, 5, 12)                      # h · d_k = d: W_O maps d → d
    # d stays constant through the layer: every residual is well-typed
    assert anatomy.layer_shapes(cfg, 2, 5)[-1][1] == (2, 5, 12)


def test_every_hidden_state_is_n_by_d():
    cfg = EncoderConfig(n_layers=5, d_model=8, n_heads=2, d_ff=32, dropout=0.0)
    H0 = np.random.default_rng(0).normal(size=(2, 7, 8))
    _, cache = tnp.encoder_forward(init_params(cfg), cfg, inputs_embeds=H0)
    assert [h.shape for h in cache["hidden_states"]] == [(2, 7, 8)] * 6
    assert [a.shape for a in cache["attentions"]] == [(2, 2, 7, 7)] * 5   # space: h·n² per layer


# ----------------------------------------------------------------------------- Figure 2
@pytest.fixture(scope="module")
def maps():
    return anatomy.figure2_maps(n=9, window=1, n_layers=4)


def test_reach_is_global_after_one_layer(maps):
    full = maps["full"]
    assert maps["reach_full"] == [8, 8, 8, 8]
    assert full.min() > 1e-3 * full.max()                            # every entry clearly nonzero


def test_windowed_reach_grows_with_depth(maps):
    assert maps["reach_windowed"] == [1, 2, 3, 4]
    n = 9
    dist = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    for ell, m in enumerate(maps["windowed"], start=1):
        assert np.all(m[dist > ell] == 0.0)                          # exactly zero beyond ℓ·w
        assert np.all(m[dist <= ell] > 0.0)


def test_dependency_map_matches_finite_differences():
    cfg = anatomy.demo_config("post", 2, 4, n_heads=1)
    params = anatomy.demo_params(cfg, seed=3)
    H0 = np.random.default_rng(4).normal(size=(3, 4))
    D = anatomy.dependency_maps(cfg, params, H0)
    h = 1e-6
    for ell in (1, 2):
        J = np.zeros((3, 4, 3, 4))
        for j in range(3):
            for m in range(4):
                Hp, Hm = H0.copy(), H0.copy()
                Hp[j, m] += h
                Hm[j, m] -= h
                _, cp = tnp.encoder_forward(params, cfg, inputs_embeds=Hp[None])
                _, cm = tnp.encoder_forward(params, cfg, inputs_embeds=Hm[None])
                J[:, :, j, m] = (cp["hidden_states"][ell][0] - cm["hidden_states"][ell][0]) / (2 * h)
        np.testing.assert_allclose(D[ell - 1], np.sqrt((J ** 2).sum(axis=(1, 3))), rtol=1e-6, atol=1e-8)


def test_only_attention_mixes_positions():
    """With attention restricted to the diagonal (window 0), LN, FFN and residuals alone leave
    every position's output depending on that position only."""
    cfg = anatomy.demo_config("pre", 3, 8)
    D = anatomy.dependency_maps(cfg, anatomy.demo_params(cfg), np.random.default_rng(0).normal(size=(5, 8)),
                                extra_mask=anatomy.band_mask(5, 0))
    off = ~np.eye(5, dtype=bool)
    assert np.all(D[:, off] == 0.0) and np.all(D[:, ~off] > 0)


def test_band_mask_bad_input():
    with pytest.raises(ValueError, match="window"):
        anatomy.band_mask(4, -1)
    with pytest.raises(ValueError, match="H0"):
        cfg = anatomy.demo_config("post", 1, 8)
        anatomy.dependency_maps(cfg, anatomy.demo_params(cfg), np.zeros((3, 6)))


# ----------------------------------------------------------------------------- Figure 3
def test_cls_attends_to_every_real_token_at_every_layer():
    r = anatomy.cls_attention()
    real = r["attention_mask"] == 1
    assert np.all(r["weights"][:, real] > 0.0)
    assert np.all(r["weights"][:, ~real] == 0.0)                     # padding is the only mask
    np.testing.assert_allclose(r["weights"].sum(axis=1), 1.0, rtol=1e-12)


def test_classifier_on_position_0_reaches_every_token():
    r = anatomy.cls_gradient_map()
    G, real = r["grad_norms"], r["attention_mask"] == 1
    assert G[-1, 0] > 0 and np.all(G[-1, 1:] == 0.0)                 # the head reads H^(N)_0 only
    assert np.all(G[:-1][:, real] > 0.0)                             # …but every real input gets gradient
    assert np.all(G[:, ~real] == 0.0)


# ----------------------------------------------------------------------------- pitfalls
def test_pitfall_causal_mask_in_an_encoder():
    r = anatomy.pitfall_causal_mask()
    # exact: one unmasked key: weights 1 and exactly 0
    np.testing.assert_array_equal(r["causal_row_the"], [1.0, 0.0, 0.0])
    assert r["future_dependence_causal"] == 0.0 and r["future_dependence_full"] > 0.0


def test_pitfall_no_positional_encoding_is_a_bag_of_words():
    r = anatomy.pitfall_no_positional()
    assert max(r["equivariance_error_no_pe"]) < 1e-13
    assert min(r["equivariance_error_learned"]) > 0.1


def test_pitfall_pe_once_is_enough_and_readding_changes_the_function():
    r = anatomy.pitfall_pe_every_layer()
    assert min(r["order_sensitivity_once"]) > 0.1                    # order survives every layer
    assert r["rel_change"] > 0.1


def test_pitfall_mismatched_residual_widths_fail_loudly():
    msgs = anatomy.pitfall_residual_width()
    assert set(msgs) == {"residual_forward", "encoder_forward", "ffn_forward"}
    assert "(1, 3, 4)" in msgs["residual_forward"] and "(1, 3, 6)" in msgs["residual_forward"]
    assert "d_model" in msgs["encoder_forward"]
    with pytest.raises(ValueError, match="residual"):
        tnp.residual_forward(np.zeros((2, 4)), np.zeros((2, 5)))


def test_pitfall_no_layernorm_at_depth():
    r = anatomy.pitfall_no_layernorm(n_layers=24, d_model=16)
    assert r["no_ln"][-1] > 100 * r["no_ln"][0]                      # residual only: the scale runs away
    np.testing.assert_allclose(r["post_ln"][1:], 4.0, rtol=1e-9)     # Post-LN: √16 at every layer
    assert r["pre_ln"][-1] < 10 * r["pre_ln"][0]                     # Pre-LN stream grows, but slowly


def test_pitfall_dropout_left_on_at_eval():
    r = anatomy.pitfall_dropout_at_eval()
    assert r["train_mode_rel_diff"] > 0.05
    assert r["eval_mode_max_diff"] == 0.0


# ----------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("name,N,d,h", [("bert_base", 12, 768, 12), ("bert_large", 24, 1024, 16)])
def test_bert_configs_and_parameter_budget(name, N, d, h):
    cfg = getattr(EncoderConfig, name)()
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_k, cfg.d_ff) == (N, d, h, 64, 4 * d)
    assert cfg.activation == "gelu" and cfg.norm_position == "post"
    b = anatomy.parameter_budget(cfg)
    assert b["attn_weights"] == 4 * d * d and b["ffn_weights"] == 8 * d * d
    assert b["per_layer"] == 12 * d * d + 13 * d
    assert 1.0 < b["per_layer_over_12d2"] < 1.002                    # "about 12d²": within 0.2 %
    assert b["layers"] + b["embeddings"] + b["final_ln"] == b["total"] == tnp.count_parameters(cfg)


def test_bert_totals():
    assert anatomy.parameter_budget(EncoderConfig.bert_base())["total"] == 108_891_648
    assert anatomy.parameter_budget(EncoderConfig.bert_large())["total"] == 334_092_288


# ----------------------------------------------------------------------------- memory
def test_space_attention_maps_vs_ffn_activations():
    """Article: "Space is dominated by the attention score matrices, O(n²) per layer … plus O(nd)".
    Measured on a real BERT-base-width layer's cache: the maps are B·h·n² (h·n², not n²), the rest
    grows linearly in n (14nd + 2n: the fast layer keeps its FFN input as LN_1's x̂) — and is the larger part
    until n is near 14d/h = 896."""
    cfg = EncoderConfig.bert_base()
    m = {n: anatomy.layer_activation_floats(cfg, 1, n) for n in (128, 256, 512, 1024)}
    for n, r in m.items():
        assert r["attention_maps"] == 12 * n * n
        assert r["other"] > n * cfg.d_ff                              # at least the FFN activation
    assert m[256]["other"] == 2 * m[128]["other"] and m[1024]["other"] == 2 * m[512]["other"]   # O(n)
    assert m[512]["attention_maps"] < m[512]["other"] and m[1024]["attention_maps"] > m[1024]["other"]
    assert anatomy.layer_activation_floats(cfg, 3, 128)["total"] == 3 * m[128]["total"]


def test_lesson_W1_is_the_transpose_of_ours():
    """Lesson: W_1 ∈ R^{d_ff×d} acting on column vectors; the library stores (d, d_ff) for rows."""
    cfg = EncoderConfig(n_layers=1, d_model=8, n_heads=2, d_ff=32)
    p = init_params(cfg, seed=0, init="xavier")
    assert p["layers.0.ffn.W_1"].shape == (8, 32) and p["layers.0.ffn.W_2"].shape == (32, 8)
    z = np.random.default_rng(0).normal(size=(8,))
    W1_lesson, W2_lesson = p["layers.0.ffn.W_1"].T, p["layers.0.ffn.W_2"].T        # (d_ff, d), (d, d_ff)
    ffn = {k[len("layers.0.ffn."):]: v for k, v in p.items() if k.startswith("layers.0.ffn.")}
    ours, _ = tnp.ffn_forward(z[None, None], ffn)
    lesson = W2_lesson @ tnp.gelu_forward(W1_lesson @ z + ffn["b_1"])[0] + ffn["b_2"]
    np.testing.assert_allclose(ours[0, 0], lesson, rtol=1e-12, atol=1e-14)


def _silenced(cfg):
    p = init_params(cfg, seed=0, init="xavier")
    for ell in range(cfg.n_layers):
        for k in ("attn.W_O", "attn.b_O", "ffn.W_2", "ffn.b_2"):
            p[f"layers.{ell}.{k}"] = np.zeros_like(p[f"layers.{ell}.{k}"])
    return p


def test_a_layer_can_be_the_identity():
    """FAQ: "each layer can learn to approximate an identity function (the residual path makes this
    trivial)". Pre-LN: zero output projections give exactly the identity. Post-LN: the layer becomes
    LN(LN(x)) — the identity only on inputs that are already normalised."""
    x = np.random.default_rng(0).normal(size=(1, 5, 8)) * 3.0 + 1.0
    pre = EncoderConfig(n_layers=1, d_model=8, n_heads=2, d_ff=32, norm_position="pre", final_layer_norm=False)
    H, _ = tnp.encoder_forward(_silenced(pre), pre, inputs_embeds=x)
    np.testing.assert_array_equal(H, x)   # exact: zero projections add exact zeros
    post = pre.replace(norm_position="post")
    H, _ = tnp.encoder_forward(_silenced(post), post, inputs_embeds=x)
    assert np.abs(H - x).max() > 1.0                                 # a raw input is not preserved
    xn = (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)   # an LN-normalised input is
    H, _ = tnp.encoder_forward(_silenced(post), post, inputs_embeds=xn)
    np.testing.assert_allclose(H, xn, atol=1e-9)


@pytest.mark.parametrize("init", ["bert", "xavier"])
def test_no_residual_stack_collapses_tokens_rather_than_vanishing(init):
    """FAQ: "removing residuals from normalized stacks reintroduces the vanishing-gradient problem at
    depth". Measured at depth 24 (LayerNorm kept, skips removed): the gradient reaching H^(0) is not
    small, but every token's representation has collapsed onto the same direction."""
    gf = pytest.importorskip("transformer_np.course.gradflow", reason="gradflow (issue 5) not present")
    dims = {"d_model": 16, "n_heads": 2, "d_ff": 32, "n": 4, "batch": 2}
    r = gf.measure("no-residual", 24, init, 0, **dims)
    g = r["grad_norm_by_layer"]
    assert g[0] / g[-1] > 0.5                                        # no vanishing …
    assert r["token_cosine_by_layer"][-1] > 0.999                    # … but the tokens are one vector
    pre = gf.measure("pre", 24, init, 0, **dims)
    assert pre["token_cosine_by_layer"][-1] < 0.95
