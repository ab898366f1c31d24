"""Numerical edge cases: none may produce NaN/inf or a RuntimeWarning silently.

Every test runs with NumPy floating-point errors raised and RuntimeWarnings turned into
errors, so an overflow that happens to end in a finite number still fails the test.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import transformer_np as tnp
from transformer_np.errors import NonFiniteError
from transformer_np.model.gradcheck import random_params


@pytest.fixture(autouse=True)
def strict_floating_point():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            yield


def _all_finite(*arrays):
    return all(np.all(np.isfinite(a)) for a in arrays)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_and_cross_entropy_with_extreme_logits(dtype):
    z = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [88.7, 89.0, 3e4]], dtype=dtype)
    s, c = tnp.softmax_forward(z)
    assert _all_finite(s, tnp.softmax_backward(np.ones_like(s), c))
    loss, c = tnp.cross_entropy_forward(z, np.array([1, 0, 0]))
    assert np.isfinite(loss) and loss > 1e3          # label 1 has logit 2e4 below the max
    assert _all_finite(tnp.cross_entropy_backward(1.0, c))


def test_cross_entropy_all_ignored_is_zero_not_nan():
    loss, c = tnp.cross_entropy_forward(np.zeros((2, 3)), np.array([-100, -100]))
    assert loss == 0.0
    assert np.all(tnp.cross_entropy_backward(1.0, c) == 0)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_tiny_shapes(dtype, norm, fast):
    """n = 1, batch 1, d_k = 1 (d_model = n_heads), one layer."""
    cfg = tnp.EncoderConfig(n_layers=1, d_model=2, n_heads=2, d_ff=1, norm_position=norm, dropout=0.0)
    params = {k: v.astype(dtype) for k, v in random_params(cfg).items()}
    x = np.array([[[0.3, -1.2]]], dtype=dtype)
    H, cache = tnp.encoder_forward(params, cfg, inputs_embeds=x, fast=fast)
    assert H.shape == (1, 1, 2) and H.dtype == dtype
    grads = tnp.encoder_backward(np.ones_like(H), cache)
    assert _all_finite(H, *grads.values())
    np.testing.assert_allclose(cache["attentions"][0], 1.0)   # one key: all weight on it


def test_sequence_at_exactly_max_len():
    cfg = tnp.EncoderConfig(n_layers=1, d_model=4, n_heads=2, d_ff=8, vocab_size=9, max_len=5, dropout=0.0)
    params = tnp.init_params(cfg, seed=0)
    H, cache = tnp.encoder_forward(params, cfg, input_ids=np.arange(5)[None] % 9)
    g = tnp.encoder_backward(np.ones_like(H), cache)
    assert _all_finite(H, *g.values())
    assert np.any(g["embeddings.position"][4] != 0)    # the last position's row is used
    with pytest.raises(ValueError, match="max_len"):
        tnp.encoder_forward(params, cfg, input_ids=np.zeros((1, 6), dtype=int))


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_fully_padded_rows_forward_and_backward(dtype, norm, fast):
    cfg = tnp.EncoderConfig(n_layers=2, d_model=4, n_heads=2, d_ff=8, vocab_size=9, max_len=8,
                            dropout=0.0, norm_position=norm)
    params = tnp.init_params(cfg, seed=0, dtype=dtype)
    ids = np.array([[1, 2, 3, 4], [0, 0, 0, 0], [5, 0, 0, 0]])
    am = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]])
    H, cache = tnp.encoder_forward(params, cfg, input_ids=ids, attention_mask=am, fast=fast)
    grads = tnp.encoder_backward(np.ones_like(H), cache)
    assert _all_finite(H, *grads.values())
    pooled, c = tnp.mean_pool_forward(H, am)
    assert _all_finite(pooled, tnp.mean_pool_backward(np.ones_like(pooled), c))
    assert np.all(pooled[1] == 0)                      # nothing to average: 0, not 0/0


@pytest.mark.parametrize("dtype, scale", [(np.float64, 1e-30), (np.float64, 1e6), (np.float32, 1e-20),
                                          (np.float32, 1e4)])
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("fast", [True, False])
def test_huge_and_tiny_inputs_embeds(dtype, scale, norm, fast):
    cfg = tnp.EncoderConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16, norm_position=norm, dropout=0.0)
    params = tnp.init_params(cfg, seed=0, dtype=dtype)
    x = (scale * np.random.default_rng(0).standard_normal((2, 3, 8))).astype(dtype)
    with np.errstate(under="ignore"):                  # gradual underflow of tiny values is benign
        H, cache = tnp.encoder_forward(params, cfg, inputs_embeds=x, fast=fast)
        grads = tnp.encoder_backward(np.ones_like(H), cache)
    assert _all_finite(H, *grads.values())
    rms = np.sqrt(np.mean(H.astype(np.float64) ** 2))
    if scale > 1:
        # the last LayerNorm (post: LN_2; pre: the final LN) brings a large scale back to O(1)
        assert 0.1 < rms < 10
    # (below √ε the ε in √(σ² + ε) dominates and LN shrinks rather than normalises, while
    # each Pre-LN residual branch amplifies by up to 1/√ε: tiny inputs promise finiteness only)


def test_layernorm_constant_rows_and_large_offsets():
    x = np.concatenate([np.full((1, 6), 5.0), 1e8 + np.arange(6.0)[None]], axis=0)
    y, c = tnp.layernorm_forward(x, np.ones(6), np.zeros(6), eps=1e-12)
    assert _all_finite(y, *tnp.layernorm_backward(np.ones_like(y), c))
    assert np.all(y[0] == 0)
    np.testing.assert_allclose(y[1].mean(), 0, atol=1e-8)


def test_gelu_extreme_inputs():
    z = np.array([-1e4, -40.0, -10.0, 0.0, 10.0, 40.0, 1e4])
    for f in (tnp.gelu_forward, tnp.gelu_tanh_forward, tnp.relu_forward):
        with np.errstate(under="ignore"):
            a, c = f(z)
        assert _all_finite(a, c["grad"])
        np.testing.assert_allclose(a[-1], 1e4)
        assert abs(a[0]) < 1e-300 or a[0] == 0


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_overflow_is_a_clear_error_not_a_silent_nan(norm, fast):
    """float32 cannot hold the squares of 1e30: the forward says so, naming the layer."""
    cfg = tnp.EncoderConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16, norm_position=norm, dropout=0.0)
    params = tnp.init_params(cfg, seed=0, dtype=np.float32, std=1.0)
    x = (1e30 * np.random.default_rng(0).standard_normal((1, 3, 8))).astype(np.float32)
    # post-LN overflows in the attention scores of layer 1 (the stack names the layer); pre-LN in the
    # variance of its first LayerNorm (which would otherwise return y = β: finite and wrong)
    with pytest.raises(NonFiniteError, match=r"overflowed float32 in layer \d.*not finite|variance of x is not finite"):
        tnp.encoder_forward(params, cfg, inputs_embeds=x, fast=fast)
    # the same input in float64 is fine
    H, _ = tnp.encoder_forward({k: v.astype(np.float64) for k, v in params.items()}, cfg,
                               inputs_embeds=x.astype(np.float64))
    assert np.all(np.isfinite(H))


@pytest.mark.parametrize("fast", [True, False])
def test_backward_overflow_is_a_clear_error(fast):
    cfg = tnp.EncoderConfig(n_layers=1, d_model=8, n_heads=2, d_ff=16, dropout=0.0)
    params = tnp.init_params(cfg, seed=0, dtype=np.float32, std=1.0)
    x = np.random.default_rng(0).standard_normal((1, 3, 8)).astype(np.float32)
    H, cache = tnp.encoder_forward(params, cfg, inputs_embeds=x, fast=fast)
    with pytest.raises(NonFiniteError, match="backward pass overflowed float32.*not finite"):
        tnp.encoder_backward(np.full(H.shape, 3e38, dtype=np.float32), cache)
