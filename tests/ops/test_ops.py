"""Per-op checks: gradients by finite differences (float64, random upstream gradient),
shapes and dtypes, and the numerical edge cases each op promises to handle."""

from __future__ import annotations

import math

import numpy as np
import pytest

import transformer_np as tnp
from transformer_np.errors import NonFiniteError
from transformer_np.model import gradcheck as gc


@pytest.fixture(scope="module")
def results():
    return {r.name: r for r in gc.run_all(seed=0)}


EXPECTED_CHECKS = [
    "linear", "softmax", "attention (scaled dot-product, padding mask)", "multi-head attention",
    "multi-head attention (padding mask, attention dropout)", "layernorm", "relu", "gelu", "gelu_tanh",
    "feed-forward (gelu)", "feed-forward (gelu_tanh)", "feed-forward (relu)", "residual",
    "dropout (training, fixed mask)", "token embedding (lookup, repeated ids)",
    "embeddings (learned positions, token types, embedding LayerNorm)",
    "embeddings (sinusoidal positions, token types, embedding LayerNorm)",
    "encoder layer (post-LN, padding mask)", "encoder layer (pre-LN, padding mask)",
    "encoder stack (post-LN, ids + token types, padding, dropout)",
    "encoder stack (pre-LN + final LN, inputs_embeds, padding, dropout)",
    "encoder stack (pre-LN, sinusoidal positions, gelu_tanh)",
    "encoder stack (weight sharing across 3 layers, ALBERT)",
    "mean pooling (attention mask)", "[CLS] sequence classifier", "BERT pooler (tanh)", "per-token tagger",
    "softmax cross-entropy (ignore_index)", "stack + [CLS] classifier + cross-entropy (end to end)",
    # MPNet (transformer_np.model.gradcheck_families)
    "relative position bias (MPNet buckets, 20 tokens)",
    "multi-head attention with a score bias (padding mask, attention dropout)",
    "MPNet layer (relative bias, padding mask, dropout)",
    "MPNet stack (2 layers, one shared relative table, padding, dropout)",
    # ModernBERT
    "rotary position embedding (RoPE, half split)", "GeGLU (GELU(input) ⊙ gate)",
    "gated feed-forward (no biases, dropout)", "gated feed-forward (biases, dropout)",
    "local sliding-window attention (window 2, padding mask)",
    "ModernBERT layer (first, no attention norm, biases, RoPE, padding, dropout)",
    "ModernBERT layer (attention norm, biases, RoPE, padding, dropout)",
    "ModernBERT model (no biases; full and sliding layers, padding, dropout)",
    "ModernBERT model (biases; full and sliding layers, padding, dropout)",
    # DeBERTa-v2 (transformer_np.model.gradcheck_deberta)
    "DeBERTa disentangled scores (c2p and p2c; log buckets, clipped distances)",
    "DeBERTa disentangled scores (c2p only; log buckets, clipped distances)",
    "DeBERTa disentangled scores (p2c only; log buckets, clipped distances)",
    "attention with DeBERTa's replacing mask (padded query rows, dropout)",
    "DeBERTa attention (shared keys, buckets, padding, dropout)",
    "DeBERTa attention (own position projections, padding, dropout)",
    "DeBERTa layer (shared keys, buckets, padding, dropout)",
    "DeBERTa model (v3-like: shared keys, buckets, relative LayerNorm; padding, dropout)",
    "DeBERTa model (v2-like: own projections, absolute positions, token types, E = 6; padding, dropout)",
]


@pytest.mark.parametrize("name", EXPECTED_CHECKS)
def test_gradcheck(results, name):
    r = results[name]
    assert r.checked > 0
    assert r.max_rel_error < 1e-7, (name, r.per_tensor)


def test_gradcheck_other_seed():
    worst = max(r.max_rel_error for r in gc.run_all(seed=5, max_coords=8))
    assert worst < 1e-7


def test_gradcheck_detects_a_wrong_backward():
    """The checker must be able to fail: a LayerNorm backward missing the mean term."""
    rng = np.random.default_rng(0)
    x, g, b = rng.standard_normal((3, 6)), 1 + rng.standard_normal(6), rng.standard_normal(6)

    def wrong_back(R, c):
        dx, dg, db = tnp.layernorm_backward(R, c)
        return {"x": dx + (R * c["gamma"]).mean(axis=-1, keepdims=True) * c["rstd"], "gamma": dg, "beta": db}

    r = gc.check_op("bad layernorm", lambda a: tnp.layernorm_forward(a["x"], a["gamma"], a["beta"]),
                    wrong_back, {"x": x, "gamma": g, "beta": b})
    assert r.per_tensor["x"] > 1e-3


def test_rel_error_definition():
    a = np.array([1.0, -2.0, 0.0])
    n = np.array([1.0, -2.0, 1e-3])
    assert gc.rel_error(a, n) == pytest.approx(1e-3 / 4.0)
    with pytest.raises(ValueError):
        gc.rel_error(a, n[:2])


# ---------------------------------------------------------------- erf and activations
def test_erf_matches_math_erf_to_1e15():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-6, 6, 50_000), rng.normal(0, 1, 50_000), np.linspace(-0.5, 0.5, 1001),
                        [0.0, 0.46875, -0.46875, 4.0, -4.0, 26.0, -30.0, 1e-300]])
    ref = np.array([math.erf(v) for v in x])
    got = tnp.erf(x)
    rel = np.abs(got - ref) / np.maximum(np.abs(ref), 1e-300)
    assert rel[ref != 0].max() < 1e-15
    assert got.dtype == np.float64


def test_erf_float32_and_specials():
    x = np.linspace(-5, 5, 1001, dtype=np.float32)
    got = tnp.erf(x)
    assert got.dtype == np.float32
    ref = np.array([math.erf(float(v)) for v in x])
    assert np.max(np.abs(got - ref)) < 1e-6
    # the kernel maps the specials as math does; the public erf refuses them, like every public op (issue 26)
    from transformer_np.ops.erf import _erf

    out = _erf(np.array([np.nan, np.inf, -np.inf, 1e308]))
    assert np.isnan(out[0]) and out[1] == 1.0 and out[2] == -1.0 and out[3] == 1.0
    assert tnp.erf(np.array([1e308]))[0] == 1.0
    with pytest.raises(NonFiniteError, match="x must contain only finite values"):
        tnp.erf(np.array([0.0, np.nan]))


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh"])
def test_activation_derivative_is_exact(name):
    rng = np.random.default_rng(1)
    z = rng.uniform(-4, 4, 2000)
    z = z[np.abs(z) > 1e-3]
    _, c = tnp.activation_forward(z, name)
    h = 1e-6
    num = (tnp.activation_forward(z + h, name)[0] - tnp.activation_forward(z - h, name)[0]) / (2 * h)
    assert np.max(np.abs(c["grad"] - num)) < 1e-8


def test_gelu_values():
    z = np.array([-3.0, -1.0, 0.0, 0.5, 2.0])
    exact = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in z])
    np.testing.assert_allclose(tnp.gelu_forward(z)[0], exact, rtol=1e-15, atol=1e-17)
    t = np.array([0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in z])
    np.testing.assert_allclose(tnp.gelu_tanh_forward(z)[0], t, rtol=1e-14, atol=1e-17)


# ---------------------------------------------------------------- softmax / layernorm / masks
def test_softmax_stable_and_shift_invariant():
    x = np.array([[1e4, -1e4, 0.0], [1000.0, 1000.0, 1000.0]])
    s, _ = tnp.softmax_forward(x)
    assert np.all(np.isfinite(s))
    np.testing.assert_allclose(s.sum(-1), 1.0)
    np.testing.assert_allclose(tnp.softmax_forward(x + 123.0)[0], s)


def test_softmax_float32_near_overflow():
    x = np.array([[88.0, 89.0, 300.0]], dtype=np.float32)
    s, _ = tnp.softmax_forward(x)
    assert s.dtype == np.float32 and np.all(np.isfinite(s))


def test_layernorm_zero_variance_is_finite():
    x = np.full((2, 4), 3.0)
    y, c = tnp.layernorm_forward(x, np.ones(4), np.zeros(4), eps=1e-12)
    assert np.all(y == 0)
    dx, dg, db = tnp.layernorm_backward(np.ones_like(y), c)
    assert np.all(np.isfinite(dx))


def test_layernorm_biased_variance():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 7))
    y, _ = tnp.layernorm_forward(x, np.ones(7), np.zeros(7), eps=1e-5)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)  # ddof=0
    np.testing.assert_allclose(y, ref, rtol=1e-12)


def test_fully_padded_row_gives_no_nan():
    rng = np.random.default_rng(0)
    Q = rng.standard_normal((1, 1, 3, 4))
    m = tnp.padding_mask(np.array([[0, 0, 0]]))
    out, c = tnp.attention_forward(Q, Q, Q, m)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(c["weights"], 1 / 3)       # uniform, not 0/0
    grads = tnp.attention_backward(np.ones_like(out), c)
    assert all(np.all(np.isfinite(g)) for g in grads)


def test_attention_cache_documents_every_step():
    """The plain op's cache holds S = QKᵀ/√d_k + M ("scores"), A = softmax(S) ("weights"), A after
    dropout ("A_drop") and Q, K, V: what a hand calculation checks, step by step."""
    rng = np.random.default_rng(0)
    Q, K, V = (rng.standard_normal((2, 3, 4, 5)) for _ in range(3))
    m = tnp.padding_mask(np.array([[1, 1, 1, 0], [1, 1, 1, 1]]))
    O, c = tnp.attention_forward(Q, K, V, m)
    S = np.einsum("bhik,bhjk->bhij", Q, K) / math.sqrt(5) + m
    np.testing.assert_allclose(c["scores"], S, rtol=1e-14)
    E = np.exp(S - S.max(-1, keepdims=True))
    np.testing.assert_allclose(c["weights"], E / E.sum(-1, keepdims=True), rtol=1e-14)
    assert c["A_drop"] is c["weights"]                       # eval: no dropout
    np.testing.assert_allclose(O, c["weights"] @ V, rtol=1e-14)
    assert c["Q"] is Q and c["K"] is K and c["V"] is V


def test_masked_keys_get_exactly_zero_weight():
    rng = np.random.default_rng(0)
    Q = rng.standard_normal((2, 1, 4, 3))
    m = tnp.padding_mask(np.array([[1, 1, 0, 0], [1, 1, 1, 1]]))
    _, c = tnp.attention_forward(Q, Q, Q, m)
    assert np.all(c["weights"][0, :, :, 2:] == 0.0)


def test_causal_mask_and_combination():
    cm = tnp.causal_mask(3)
    assert cm[0, 1] < -1e300 and cm[1, 0] == 0 and cm[2, 2] == 0
    pm = tnp.padding_mask(np.array([[1, 1, 0]]))
    both = tnp.combine_masks(pm, cm)
    assert np.all(np.isfinite(both))
    assert both.shape == (1, 1, 3, 3)


def test_dropout_eval_identity_and_training_scale():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 300))
    out, _ = tnp.dropout_forward(x, 0.5, training=False)
    assert out is x
    out, c = tnp.dropout_forward(x, 0.25, training=True, rng=np.random.default_rng(1))
    kept = c["mask"] != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_allclose(out[kept], x[kept] / 0.75)
    out2, _ = tnp.dropout_forward(x, 0.25, training=True, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(out, out2)          # exact: the same call with the same seed, one process


def test_embedding_backward_accumulates_repeated_ids():
    table = np.arange(12.0).reshape(4, 3)
    ids = np.array([[1, 1, 2]])
    out, c = tnp.embedding_forward(ids, table)
    d = tnp.embedding_backward(np.ones_like(out), c)
    # exact: sums of ones (small integers in floating point)
    np.testing.assert_array_equal(d[1], [2, 2, 2])
    np.testing.assert_array_equal(d[2], [1, 1, 1])   # exact: as above
    np.testing.assert_array_equal(d[0], 0)           # exact: an id never looked up gets no gradient


def test_sinusoidal_positional_encoding():
    pe = tnp.sinusoidal_positional_encoding(50, 6)
    i, k = 7, 1
    assert pe[i, 2 * k] == pytest.approx(math.sin(i / 10000 ** (2 * k / 6)))
    assert pe[i, 2 * k + 1] == pytest.approx(math.cos(i / 10000 ** (2 * k / 6)))
    assert tnp.sinusoidal_positional_encoding(4, 5).shape == (4, 5)


def test_mha_splits_heads_like_the_articles_loop():
    """The vectorised MHA equals the article's per-head loop with W_Q[h] = column block h."""
    rng = np.random.default_rng(0)
    B, n, d, h = 2, 5, 8, 4
    dk = d // h
    x = rng.standard_normal((B, n, d))
    p = {k: rng.standard_normal((d, d)) for k in ("W_Q", "W_K", "W_V", "W_O")}
    p.update({k: rng.standard_normal(d) for k in ("b_Q", "b_K", "b_V", "b_O")})
    out, _ = tnp.mha_forward(x, p, h)
    heads = []
    for j in range(h):
        cols = slice(j * dk, (j + 1) * dk)
        Q = x @ p["W_Q"][:, cols] + p["b_Q"][cols]
        K = x @ p["W_K"][:, cols] + p["b_K"][cols]
        V = x @ p["W_V"][:, cols] + p["b_V"][cols]
        S = Q @ K.transpose(0, 2, 1) / math.sqrt(dk)
        A = np.exp(S - S.max(-1, keepdims=True))
        A /= A.sum(-1, keepdims=True)
        heads.append(A @ V)
    ref = np.concatenate(heads, axis=-1) @ p["W_O"] + p["b_O"]
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ops_preserve_dtype(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4)).astype(dtype)
    W = rng.standard_normal((4, 4)).astype(dtype)
    b = rng.standard_normal(4).astype(dtype)
    for out in (tnp.linear_forward(x, W, b)[0], tnp.softmax_forward(x)[0],
                tnp.layernorm_forward(x, b, b)[0], tnp.gelu_forward(x)[0], tnp.gelu_tanh_forward(x)[0],
                tnp.relu_forward(x)[0], tnp.dropout_forward(x, 0.5, True, rng)[0]):
        assert out.dtype == dtype
