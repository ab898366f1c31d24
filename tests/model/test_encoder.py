"""The encoder layer and stack: shapes, dtypes, parameter counts, and the seeds'
structural claims (bidirectional, permutation-equivariant without positions,
positions added once, padding invariance, dropout off at eval)."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_np as tnp
from helpers import assert_paths_close
from transformer_np.model.gradcheck import random_params


def small_cfg(**kw):
    base = dict(n_layers=2, d_model=8, n_heads=2, d_ff=16, dropout=0.1, vocab_size=20, max_len=16,
                type_vocab_size=2)
    base.update(kw)
    return tnp.EncoderConfig(**base)


# ---------------------------------------------------------------- config and counts
def test_bert_base_parameter_counts():
    cfg = tnp.EncoderConfig.bert_base()
    assert tnp.count_parameters(cfg) == 108_891_648
    d = cfg.d_model
    assert tnp.count_parameters(cfg, embeddings=False) == 85_054_464 == 12 * (12 * d * d + 13 * d)


def test_count_matches_init_params():
    for cfg in (small_cfg(), small_cfg(norm_position="pre"), small_cfg(share_layers=True, n_layers=4),
                small_cfg(positional="sinusoidal", type_vocab_size=0)):
        params = tnp.init_params(cfg, seed=0)
        assert tnp.count_parameters(cfg) == sum(a.size for a in params.values())
        emb = sum(a.size for k, a in params.items() if k.startswith("embeddings."))
        assert tnp.count_parameters(cfg, embeddings=False) == tnp.count_parameters(cfg) - emb


def test_bert_large_preset():
    cfg = tnp.EncoderConfig.bert_large()
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.d_k) == (24, 1024, 16, 4096, 64)
    d = 1024
    assert tnp.count_parameters(cfg, embeddings=False) == 24 * (12 * d * d + 13 * d)


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=10, n_heads=3), "divisible"),
    (dict(activation="swish"), "activation"),
    (dict(norm_position="middle"), "norm_position"),
    (dict(dropout=1.0), "dropout"),
    (dict(dropout=-0.1), "dropout"),
    (dict(layer_norm_eps=0.0), "layer_norm_eps"),
    (dict(n_layers=0), "n_layers"),
    (dict(positional="rotary"), "positional"),
    (dict(vocab_size=0), "vocab_size"),
])
def test_invalid_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        small_cfg(**kwargs)


def test_invalid_config_types():
    with pytest.raises(TypeError, match="n_layers"):
        small_cfg(n_layers=2.0)
    with pytest.raises(TypeError, match="share_layers"):
        small_cfg(share_layers="yes")


def test_init_is_deterministic_and_dtype_consistent():
    cfg = small_cfg()
    a, b = tnp.init_params(cfg, seed=3), tnp.init_params(cfg, seed=3)
    assert all(np.array_equal(a[k], b[k]) for k in a)                  # exact: the same call twice, one process
    c = tnp.init_params(cfg, seed=4)
    assert not np.array_equal(a["layers.0.attn.W_Q"], c["layers.0.attn.W_Q"])   # exact: another seed, other draws
    f32 = tnp.init_params(cfg, seed=3, dtype=np.float32)
    assert all(v.dtype == np.float32 for v in f32.values())
    np.testing.assert_allclose(f32["layers.1.ffn.W_2"], a["layers.1.ffn.W_2"], rtol=1e-6)


# ---------------------------------------------------------------- forward / backward basics
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_dtype_preserved_end_to_end(dtype, norm):
    cfg = small_cfg(norm_position=norm)
    params = tnp.init_params(cfg, seed=0, dtype=dtype)
    ids = np.array([[1, 2, 3, 4], [5, 6, 0, 0]])
    am = np.array([[1, 1, 1, 1], [1, 1, 0, 0]])
    H, cache = tnp.encoder_forward(params, cfg, input_ids=ids, attention_mask=am, training=True,
                                   rng=np.random.default_rng(0))
    assert H.dtype == dtype and H.shape == (2, 4, 8)
    assert all(h.dtype == dtype for h in cache["hidden_states"])
    assert all(a.dtype == dtype and a.shape == (2, 2, 4, 4) for a in cache["attentions"])
    grads = tnp.encoder_backward(np.ones_like(H), cache)
    assert set(grads) == set(params)
    for k, g in grads.items():
        assert g.shape == params[k].shape and g.dtype == dtype, k


def test_float32_agrees_with_float64():
    cfg = small_cfg(dropout=0.0)
    p64 = tnp.init_params(cfg, seed=0, std=0.2)
    p32 = {k: v.astype(np.float32) for k, v in p64.items()}
    ids = np.array([[1, 2, 3, 4, 5]])
    H64, _ = tnp.encoder_forward(p64, cfg, input_ids=ids)
    H32, _ = tnp.encoder_forward(p32, cfg, input_ids=ids)
    assert np.max(np.abs(H64 - H32)) < 1e-4


def test_inputs_embeds_gradient_and_keys():
    cfg = small_cfg(vocab_size=None, type_vocab_size=0, dropout=0.0)
    params = tnp.init_params(cfg, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 3, 8))
    H, cache = tnp.encoder_forward(params, cfg, inputs_embeds=x)
    grads = tnp.encoder_backward(np.ones_like(H), cache)
    assert set(grads) == set(params) | {"inputs_embeds"}
    assert grads["inputs_embeds"].shape == x.shape


def test_hidden_grads():
    cfg = small_cfg(dropout=0.0, norm_position="pre")
    params = random_params(cfg)
    x = np.random.default_rng(0).standard_normal((1, 4, 8))
    H, cache = tnp.encoder_forward(params, cfg, inputs_embeds=x)
    R = np.random.default_rng(1).standard_normal(H.shape)
    grads, dh = tnp.encoder_backward(R, cache, return_hidden_grads=True)
    assert len(dh) == cfg.n_layers + 1
    np.testing.assert_array_equal(dh[0], grads["inputs_embeds"])   # exact: the same array, returned twice


def test_weight_sharing_sums_gradients_over_depth():
    cfg = small_cfg(dropout=0.0, share_layers=True, n_layers=3)
    params = random_params(cfg)
    assert not any(k.startswith("layers.1.") for k in params)
    ids = np.array([[1, 2, 3]])
    H, cache = tnp.encoder_forward(params, cfg, input_ids=ids)
    R = np.random.default_rng(0).standard_normal(H.shape)
    grads = tnp.encoder_backward(R, cache)
    # the shared gradient is the sum of what each layer's backward produced
    per_layer = []
    dH = R
    for layer in reversed(range(3)):
        dH, g = tnp.encoder_layer_backward(dH, cache["layers"][layer])
        per_layer.append(g["ffn.W_1"])
    np.testing.assert_allclose(grads["layers.0.ffn.W_1"], sum(per_layer), rtol=1e-12)


# ---------------------------------------------------------------- the seeds' structural claims
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_encoder_is_bidirectional(norm):
    """Changing any one token changes every real position's output (no causal mask)."""
    cfg = small_cfg(dropout=0.0, norm_position=norm)
    params = random_params(cfg)
    ids = np.array([[3, 4, 5, 6, 7]])
    H, _ = tnp.encoder_forward(params, cfg, input_ids=ids)
    for j in range(5):
        ids2 = ids.copy()
        ids2[0, j] = 11
        H2, _ = tnp.encoder_forward(params, cfg, input_ids=ids2)
        moved = np.abs(H2 - H).max(axis=-1)[0]      # (n,)
        assert np.all(moved > 1e-6), (j, moved)


def test_causal_mask_blocks_the_future():
    cfg = small_cfg(dropout=0.0)
    params = random_params(cfg)
    ids = np.array([[3, 4, 5, 6, 7]])
    cm = tnp.causal_mask(5)
    H, _ = tnp.encoder_forward(params, cfg, input_ids=ids, extra_mask=cm)
    ids2 = ids.copy()
    ids2[0, 4] = 11
    H2, _ = tnp.encoder_forward(params, cfg, input_ids=ids2, extra_mask=cm)
    # exact: the same path on the same shapes; the masked key's weight is exactly 0, so 0·V adds nothing
    np.testing.assert_array_equal(H[0, :4], H2[0, :4])   # earlier positions can't see token 4
    assert np.abs(H[0, 4] - H2[0, 4]).max() > 1e-6


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_permutation_equivariance_without_positions(norm):
    cfg = small_cfg(dropout=0.0, norm_position=norm, positional="none", type_vocab_size=0)
    params = random_params(cfg)
    ids = np.array([[3, 4, 5, 6, 7, 8]])
    perm = np.random.default_rng(0).permutation(6)
    H, _ = tnp.encoder_forward(params, cfg, input_ids=ids)
    Hp, _ = tnp.encoder_forward(params, cfg, input_ids=ids[:, perm])
    np.testing.assert_allclose(Hp, H[:, perm], rtol=1e-12, atol=1e-12)


def test_positions_break_equivariance():
    cfg = small_cfg(dropout=0.0, type_vocab_size=0)
    params = random_params(cfg)
    ids = np.array([[3, 4, 5, 6]])
    perm = np.array([3, 2, 1, 0])
    H, _ = tnp.encoder_forward(params, cfg, input_ids=ids)
    Hp, _ = tnp.encoder_forward(params, cfg, input_ids=ids[:, perm])
    assert np.abs(Hp - H[:, perm]).max() > 1e-3


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_positional_encoding_added_once(positional):
    """Position enters only through H^(0): running the layers on H^(0) reproduces the
    output, and the layers themselves are position-blind (equivariant)."""
    cfg = small_cfg(dropout=0.0, positional=positional)
    params = random_params(cfg)
    ids = np.array([[3, 4, 5, 6, 7]])
    H, cache = tnp.encoder_forward(params, cfg, input_ids=ids)
    layers_only = {k: v for k, v in params.items() if not k.startswith("embeddings.")}
    cfg_no_emb = cfg.replace(vocab_size=None, type_vocab_size=0)
    H0 = cache["hidden_states"][0]
    H_again, _ = tnp.encoder_forward(layers_only, cfg_no_emb, inputs_embeds=H0)
    np.testing.assert_allclose(H_again, H, rtol=1e-13, atol=1e-13)
    perm = np.array([4, 0, 3, 1, 2])
    Hp, _ = tnp.encoder_forward(layers_only, cfg_no_emb, inputs_embeds=H0[:, perm])
    np.testing.assert_allclose(Hp, H[:, perm], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("n_pad", [1, 3, 7])
def test_padding_invariance(norm, n_pad):
    cfg = small_cfg(dropout=0.0, norm_position=norm)
    params = random_params(cfg)
    ids = np.array([[3, 4, 5, 6]])
    tt = np.array([[0, 0, 1, 1]])
    H, _ = tnp.encoder_forward(params, cfg, input_ids=ids, token_type_ids=tt)
    ids_p = np.concatenate([ids, np.zeros((1, n_pad), dtype=int)], axis=1)
    tt_p = np.concatenate([tt, np.zeros((1, n_pad), dtype=int)], axis=1)
    am = (np.arange(4 + n_pad) < 4).astype(int)[None]
    Hp, cache = tnp.encoder_forward(params, cfg, input_ids=ids_p, token_type_ids=tt_p, attention_mask=am)
    assert np.max(np.abs(Hp[:, :4] - H)) < 1e-12
    assert np.all(cache["attentions"][0][..., 4:] == 0.0)   # padding keys get exactly zero weight
    # and the gradient through padding does not leak into real tokens' parameters
    grads = tnp.encoder_backward(np.concatenate([np.ones_like(H), np.zeros((1, n_pad, 8))], axis=1), cache)
    _, c0 = tnp.encoder_forward(params, cfg, input_ids=ids, token_type_ids=tt)
    g0 = tnp.encoder_backward(np.ones_like(H), c0)
    for k in g0:
        if k == "embeddings.position":
            np.testing.assert_allclose(grads[k][:4], g0[k][:4], atol=1e-12)
        else:
            np.testing.assert_allclose(grads[k], g0[k], rtol=1e-10, atol=1e-12)


def test_fully_padded_sequence_is_finite_forward_and_backward():
    cfg = small_cfg(dropout=0.0)
    params = random_params(cfg)
    ids = np.array([[3, 4, 5], [0, 0, 0]])
    am = np.array([[1, 1, 1], [0, 0, 0]])
    with np.errstate(all="raise"):
        H, cache = tnp.encoder_forward(params, cfg, input_ids=ids, attention_mask=am)
        grads = tnp.encoder_backward(np.ones_like(H), cache)
    assert np.all(np.isfinite(H))
    assert all(np.all(np.isfinite(g)) for g in grads.values())


def test_dropout_is_off_at_eval_and_on_in_training():
    cfg = small_cfg(dropout=0.3)
    params = random_params(cfg)
    ids = np.array([[3, 4, 5, 6]])
    H1, _ = tnp.encoder_forward(params, cfg, input_ids=ids)
    H2, _ = tnp.encoder_forward(params, cfg, input_ids=ids, training=False, rng=np.random.default_rng(9))
    np.testing.assert_array_equal(H1, H2)         # exact: at eval the rng is not used, the same ops run
    cfg0 = cfg.replace(dropout=0.0)
    H0, _ = tnp.encoder_forward(params, cfg0, input_ids=ids)
    np.testing.assert_array_equal(H1, H0)         # exact: eval = the network without dropout, the same ops
    Ht, _ = tnp.encoder_forward(params, cfg, input_ids=ids, training=True, rng=np.random.default_rng(1))
    Ht2, _ = tnp.encoder_forward(params, cfg, input_ids=ids, training=True, rng=np.random.default_rng(1))
    assert np.abs(Ht - H1).max() > 1e-3
    np.testing.assert_array_equal(Ht, Ht2)       # exact: deterministic given the seed (one process, same threads)


def test_layers_are_parameter_independent():
    cfg = small_cfg(dropout=0.0)
    params = random_params(cfg)
    assert not np.array_equal(params["layers.0.attn.W_Q"], params["layers.1.attn.W_Q"])   # exact: separate draws
    ids = np.array([[3, 4]])
    H, cache = tnp.encoder_forward(params, cfg, input_ids=ids)
    g = tnp.encoder_backward(np.ones_like(H), cache)
    assert not np.allclose(g["layers.0.attn.W_V"], g["layers.1.attn.W_V"])


def test_postln_matches_the_lessons_equations():
    """Z = LN(H + MHA(H)); H' = LN(Z + FFN(Z)), composed from the ops by hand."""
    cfg = small_cfg(dropout=0.0, n_layers=1, vocab_size=None, type_vocab_size=0)
    params = random_params(cfg)
    x = np.random.default_rng(0).standard_normal((2, 3, 8))
    H, _ = tnp.encoder_forward(params, cfg, inputs_embeds=x)
    p = {k[len("layers.0."):]: v for k, v in params.items()}
    attn = {k[5:]: v for k, v in p.items() if k.startswith("attn.")}
    ffn = {k[4:]: v for k, v in p.items() if k.startswith("ffn.")}
    eps = cfg.layer_norm_eps
    Z = tnp.layernorm_forward(x + tnp.mha_forward(x, attn, 2)[0], p["ln1.gamma"], p["ln1.beta"], eps)[0]
    ref = tnp.layernorm_forward(Z + tnp.ffn_forward(Z, ffn)[0], p["ln2.gamma"], p["ln2.beta"], eps)[0]
    assert_paths_close(H, ref, paths=("encoder_forward (fast)", "the plain ops"), k=16)   # k = d_ff
    cfg_pre = cfg.replace(norm_position="pre", final_layer_norm=False)
    H, _ = tnp.encoder_forward(params, cfg_pre, inputs_embeds=x)
    Zp = x + tnp.mha_forward(tnp.layernorm_forward(x, p["ln1.gamma"], p["ln1.beta"], eps)[0], attn, 2)[0]
    ref = Zp + tnp.ffn_forward(tnp.layernorm_forward(Zp, p["ln2.gamma"], p["ln2.beta"], eps)[0], ffn)[0]
    np.testing.assert_allclose(H, ref, rtol=1e-14, atol=1e-14)
