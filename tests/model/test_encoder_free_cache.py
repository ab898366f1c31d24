"""backward(..., free_cache=True): the same gradients as the default backward, the cache
released as the backward goes, and a clear error on a second backward through a freed cache."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_np as tnp
from transformer_np.model.encoder import FREED_MESSAGE
from transformer_np.perf.memory import cache_nbytes
from transformer_np.model.params import sub_params


def _cfg(**kw):
    base = dict(n_layers=2, d_model=16, n_heads=4, d_ff=32, vocab_size=50, max_len=12, dropout=0.0)
    base.update(kw)
    return tnp.EncoderConfig(**base)


def _run(cfg, training=False, ids=True, seed=0):
    params = tnp.init_params(cfg, seed=seed, dtype="float64")
    rng = np.random.default_rng(seed)
    B, n = 3, 7
    mask = np.ones((B, n), dtype=np.int64)
    mask[1, 5:] = 0
    kw = dict(input_ids=rng.integers(0, cfg.vocab_size, (B, n))) if ids else \
        dict(inputs_embeds=rng.standard_normal((B, n, cfg.d_model)))
    H, cache = tnp.encoder_forward(params, cfg, attention_mask=mask, training=training,
                                   rng=np.random.default_rng(1), **kw)
    return H, cache, rng.standard_normal(H.shape)


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("training,ids", [(False, True), (True, True), (False, False)])
def test_free_cache_gives_the_same_gradients(norm, training, ids):
    cfg = _cfg(norm_position=norm, dropout=0.1 if training else 0.0)
    _, cache_a, dH = _run(cfg, training, ids)
    _, cache_b, _ = _run(cfg, training, ids)
    ga, dh_a = tnp.encoder_backward(dH, cache_a, return_hidden_grads=True)
    gb, dh_b = tnp.encoder_backward(dH, cache_b, return_hidden_grads=True, free_cache=True)
    assert ga.keys() == gb.keys()
    for k in ga:
        np.testing.assert_array_equal(ga[k], gb[k], err_msg=k)
    for a, b in zip(dh_a, dh_b):
        np.testing.assert_array_equal(a, b)


def test_free_cache_releases_the_layers_and_a_second_backward_errors():
    cfg = _cfg()
    _, cache, dH = _run(cfg)
    before = cache_nbytes(cache)["total"]
    tnp.encoder_backward(dH, cache, free_cache=True)
    assert cache["layers"] == [None] * cfg.n_layers
    assert cache["attentions"] == [None] * cfg.n_layers
    assert cache["hidden_states"] == [None] * (cfg.n_layers + 1)
    assert "embeddings" not in cache
    assert cache_nbytes(cache)["total"] < before / 20      # only bookkeeping is left
    with pytest.raises(ValueError, match="freed by a previous backward with free_cache=True"):
        tnp.encoder_backward(dH, cache)
    with pytest.raises(ValueError, match="freed by a previous backward with free_cache=True"):
        tnp.encoder_backward(dH, cache, free_cache=True)


def test_default_backward_keeps_the_cache_reusable():
    cfg = _cfg()
    _, cache, dH = _run(cfg)
    g1 = tnp.encoder_backward(dH, cache)
    g2 = tnp.encoder_backward(dH, cache)
    for k in g1:
        np.testing.assert_array_equal(g1[k], g2[k])
    assert all(c is not None for c in cache["layers"])


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_layer_backward_free_cache(norm):
    cfg = _cfg(norm_position=norm)
    p = sub_params(tnp.init_params(cfg, seed=0, dtype="float64"), "layers.0.")
    x = np.random.default_rng(0).standard_normal((2, 5, cfg.d_model))
    dy = np.random.default_rng(1).standard_normal(x.shape)
    _, c1 = tnp.encoder_layer_forward(x, p, cfg)
    _, c2 = tnp.encoder_layer_forward(x, p, cfg)
    dx1, g1 = tnp.encoder_layer_backward(dy, c1)
    dx2, g2 = tnp.encoder_layer_backward(dy, c2, free_cache=True)
    np.testing.assert_array_equal(dx1, dx2)
    for k in g1:
        np.testing.assert_array_equal(g1[k], g2[k], err_msg=k)
    assert not ({"attn", "ffn", "ln1", "ln2"} & set(c2))    # every sublayer's cache was dropped
    with pytest.raises(ValueError, match="freed by a previous backward"):
        tnp.encoder_layer_backward(dy, c2)


def test_free_cache_must_be_a_bool():
    cfg = _cfg()
    _, cache, dH = _run(cfg)
    with pytest.raises(TypeError, match="free_cache"):
        tnp.encoder_backward(dH, cache, free_cache="yes")
    assert FREED_MESSAGE.startswith("this cache was freed")

