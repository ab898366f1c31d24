"""A third, independent autodiff: our forward and every gradient against ``jax.grad`` (``nnx.grad``) of the same
encoder built from Flax NNX layers (MultiHeadAttention, LayerNorm, Linear, Embed), weights mapped by
:mod:`transformer_np.io.interop_jax`. float64 (jax_enable_x64); criterion: max |ours − jax| / max |jax| ≤ 1e-10 per
tensor (the key bias, zero in exact arithmetic: ≤ 1e-10 · max |∂L/∂W_K| on both sides).
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the JAX lane needs jax and flax: pip install 'transformer_np[jax]'")
pytest.importorskip("flax", reason="the JAX lane needs jax and flax: pip install 'transformer_np[jax]'")
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from transformer_np import EncoderConfig, encoder_backward, encoder_forward  # noqa: E402
from transformer_np.errors import InputValueError  # noqa: E402
from transformer_np.io.interop_jax import from_flax, to_flax  # noqa: E402
from transformer_np.model.gradcheck import random_params  # noqa: E402

pytestmark = pytest.mark.jax
TOL = 1e-10
B, N, D = 3, 6, 8


def scaled(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


CASES = {
    "post-gelu": dict(norm_position="post"),
    "pre-gelu-final-ln": dict(norm_position="pre"),
    "post-relu-shared": dict(norm_position="post", activation="relu", share_layers=True),
    "pre-tanh-no-final-ln": dict(norm_position="pre", activation="gelu_tanh", final_layer_norm=False),
    "bert-embeddings": dict(vocab_size=20, type_vocab_size=2, max_len=10),
    "albert-like-shared-embeddings": dict(vocab_size=20, type_vocab_size=2, max_len=10, share_layers=True,
                                          activation="gelu_tanh"),
    "sinusoidal-no-emb-ln": dict(vocab_size=20, positional="sinusoidal", embedding_layer_norm=False,
                                 norm_position="pre"),
}


def run_both(config, fast_attention=False, seed=0):
    params = random_params(config, seed=seed)
    rng = np.random.default_rng(seed + 1)
    am = np.ones((B, N), dtype=np.int64)
    am[1, 4:] = 0
    am[2, 1:] = 0
    R = rng.normal(size=(B, N, D))
    if config.has_embeddings:
        inp = {"input_ids": rng.integers(0, config.vocab_size, size=(B, N))}
        if config.type_vocab_size:
            inp["token_type_ids"] = rng.integers(0, config.type_vocab_size, size=(B, N))
    else:
        inp = {"inputs_embeds": rng.normal(size=(B, N, D))}
    H, cache = encoder_forward(params, config, attention_mask=am, **inp)
    ours = encoder_backward(R, cache)

    model = to_flax(params, config, fast_attention=fast_attention)
    jin = {k: jnp.asarray(v) for k, v in inp.items()}

    def loss(m, jin):
        return jnp.sum(m(attention_mask=jnp.asarray(am), **jin) * R)

    out = np.asarray(model(attention_mask=jnp.asarray(am), **jin))
    if config.has_embeddings:                            # integer ids: differentiate the model only
        theirs = from_flax(nnx.grad(loss)(model, jin), config)
    else:
        g_model, g_in = nnx.grad(loss, argnums=(0, 1))(model, jin)
        theirs = from_flax(g_model, config)
        theirs["inputs_embeds"] = np.asarray(g_in["inputs_embeds"])
    return H, out, ours, theirs


@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_every_gradient_match_jax_grad(case):
    config = EncoderConfig(n_layers=3, d_model=D, n_heads=2, d_ff=12, layer_norm_eps=1e-6, **CASES[case])
    H, out, ours, theirs = run_both(config, seed=list(CASES).index(case))
    assert out.dtype == np.float64 and scaled(H, out) <= TOL
    assert set(theirs) == set(ours)                      # every parameter (and the input when fed H^(0))
    for name in ours:
        if name.endswith("attn.b_K"):
            scale = np.abs(ours[name.replace("b_K", "W_K")]).max()
            assert np.abs(ours[name]).max() <= TOL * scale and np.abs(theirs[name]).max() <= TOL * scale, name
            continue
        assert scaled(ours[name], theirs[name]) <= TOL, (name, scaled(ours[name], theirs[name]))


def test_weights_map_both_ways_exactly():
    config = EncoderConfig(n_layers=2, d_model=D, n_heads=4, d_ff=12, vocab_size=20, type_vocab_size=2, max_len=9)
    params = random_params(config, seed=3)
    back = from_flax(to_flax(params, config), config)
    assert set(back) == set(params)
    for k in params:
        # exact: float64 copied through Flax and back
        assert back[k].dtype == np.float64 and np.array_equal(back[k], params[k]), k


def test_flax_default_attention_computes_softmax_in_float32():
    """The finding behind the explicit path: jax.nn.dot_product_attention (Flax's default without dropout) runs the
    softmax in float32 even for float64 inputs, so it misses float64 agreement by orders of magnitude."""
    config = EncoderConfig(n_layers=2, d_model=D, n_heads=2, d_ff=12, layer_norm_eps=1e-6)
    H, out, ours, theirs = run_both(config, fast_attention=True, seed=5)
    err = scaled(H, out)
    assert 1e-9 < err < 1e-5, err                        # float32-sized, not float64-sized
    H2, out2, _, _ = run_both(config, fast_attention=False, seed=5)
    assert scaled(H2, out2) <= 1e-13


def test_float64_without_x64_is_refused():
    config = EncoderConfig(n_layers=1, d_model=D, n_heads=2, d_ff=12)
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(InputValueError, match="jax_enable_x64"):
            to_flax(random_params(config), config)
    finally:
        jax.config.update("jax_enable_x64", True)
