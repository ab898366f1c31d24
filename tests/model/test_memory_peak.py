"""The fast training layer's peak memory (tracemalloc): what a forward + backward holds beyond its cache.

With ``free_cache=True`` the backward of a layer makes no array beyond its gradients that outlives a
step: at its peak it holds the cache (as much of it as is not yet released), the gradients so far and
one new weight gradient of the FFN — dW₂, made while f(U) and f'(U) are still alive. The bounds below
are that, plus a quarter of dW₂ for small arrays (row statistics, bias gradients, fingerprints, block
temporaries); the code before this round held ∂L/∂r of LayerNorm 2 and the skip gradient next to it
(1.8 dW₂ beyond the cache here). The ops that make it so are checked for their results beside it.
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from helpers import assert_paths_close, nontrivial_params
from transformer_np import EncoderConfig, fast
from transformer_np.fast.ffn import (
    _ffn_backward,
    _layernorm_backward,
    _layernorm_forward,
    lin1_from_layernorm,
)
from transformer_np.model.encoder import encoder_layer_backward, encoder_layer_forward
from transformer_np.model.params import sub_params
from transformer_np.perf.memory import cache_nbytes

# activations outweigh the FFN weights as in bert-base at B = 8, n = 128 (B·n = 512 rows, d_ff = 4d)
B, N, D, H, D_FF = 8, 64, 256, 4, 1024


def _layer(norm: str):
    cfg = EncoderConfig(n_layers=1, d_model=D, n_heads=H, d_ff=D_FF, dropout=0.0, norm_position=norm)
    p = sub_params(nontrivial_params(cfg, 0, "float32"), "layers.0.")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, N, D)).astype(np.float32)
    dy = rng.standard_normal((B, N, D)).astype(np.float32)
    return cfg, p, x, dy


def _traced_fwd_bwd(cfg, p, x, dy) -> dict:
    """Bytes traced by tracemalloc over one fwd + bwd (free_cache=True) after a warm-up call (the inputs
    and parameters were allocated before tracing starts, so they are not counted)."""
    out, cache = encoder_layer_forward(x, p, cfg)
    encoder_layer_backward(dy, cache, free_cache=True)
    del out, cache
    gc.collect()
    tracemalloc.start()
    try:
        out, cache = encoder_layer_forward(x, p, cfg)
        held = cache_nbytes(cache)["total"] - x.nbytes        # the cache's arrays made by this forward
        start, fwd_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        encoder_layer_backward(dy, cache, free_cache=True)
        bwd_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return {"cache": held, "out": out.nbytes, "start": start, "fwd_peak": fwd_peak, "bwd_peak": bwd_peak,
            "dW2": p["ffn.W_2"].nbytes}


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_backward_holds_one_ffn_weight_gradient_beyond_its_cache(norm, fast_thread_defaults):
    m = _traced_fwd_bwd(*_layer(norm))
    assert m["bwd_peak"] - m["start"] <= 1.25 * m["dW2"], m


def test_post_ln_forward_and_backward_peak_is_the_cache_the_output_and_dw2(fast_thread_defaults):
    """Post-LN (BERT, the bench's layer): the whole fwd + bwd never holds more than the forward's
    cache, its output and dW₂ (and small arrays): no sublayer output outlives its use in the forward
    (the residual sums and x̂ are written in the sublayer outputs' buffers) and no (…, d) gradient
    is made while the FFN backward's d_ff arrays are alive."""
    m = _traced_fwd_bwd(*_layer("post"))
    bound = m["cache"] + m["out"] + 1.25 * m["dW2"]
    assert max(m["fwd_peak"], m["bwd_peak"]) <= bound, m


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_training_cache_keeps_the_ffn_input_as_its_layernorm(norm):
    cfg, p, x, _ = _layer(norm)
    _, cache = encoder_layer_forward(x, p, cfg)
    lin1 = cache["ffn"]["lin1"]
    ln = cache["ln1" if norm == "post" else "ln2"]
    assert lin1["x"] is None
    assert lin1["ln"]["xhat"] is ln["xhat"] and lin1["ln"]["gamma"] is ln["gamma"]
    assert lin1["ln"]["beta"] is p["ln1.beta" if norm == "post" else "ln2.beta"]
    rep = cache_nbytes(cache)
    assert {"ffn.lin1.ln.gamma", "ffn.lin1.ln.beta"} <= set(rep["param_refs"])   # parameters, not activations
    assert "ffn.lin1.ln.beta" not in rep["entries"]
    _, plain = encoder_layer_forward(x, p, cfg, fast=False)
    assert plain["ffn"]["lin1"]["x"] is not None               # the plain path keeps the textbook cache


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ffn_backward_with_the_input_kept_as_its_layernorm(dtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 7, 16)).astype(dtype)
    gamma, beta = (1 + 0.3 * rng.standard_normal(16)).astype(dtype), (0.3 * rng.standard_normal(16)).astype(dtype)
    p = {"W_1": (rng.standard_normal((16, 40)) / 4).astype(dtype), "b_1": (0.3 * rng.standard_normal(40)).astype(dtype),
         "W_2": (rng.standard_normal((40, 16)) / 6).astype(dtype), "b_2": (0.3 * rng.standard_normal(16)).astype(dtype)}
    dy = rng.standard_normal(x.shape).astype(dtype)
    z, ln = fast.layernorm_forward(x, gamma, beta)
    _, c_z = fast.ffn_forward(z, p)
    _, c_ln = fast.ffn_forward(z, p)
    lin1_from_layernorm(c_ln, ln, beta)
    rebuilt = ln["xhat"] * gamma
    rebuilt += beta
    np.testing.assert_array_equal(rebuilt, z)   # exact: z rebuilt by the forward's two operations, in order
    dz_ref, g_ref = fast.ffn_backward(dy, c_z)
    dz, g = fast.ffn_backward(dy, c_ln, free_cache=True)
    np.testing.assert_array_equal(dz, dz_ref)   # exact: the same products on the same arrays (z is not read)
    for k in ("b_1", "W_2", "b_2"):   # exact: as above
        np.testing.assert_array_equal(g[k], g_ref[k], err_msg=k)   # exact: as above
    assert_paths_close(g["W_1"], g_ref["W_1"], paths=("z by column blocks", "z whole"), k=x.shape[0] * x.shape[1])
    acc = rng.standard_normal(x.shape).astype(dtype)
    _, c_acc = fast.ffn_forward(z, p)
    total, _ = _ffn_backward(dy, c_acc, True, acc=acc.copy())
    assert_paths_close(total, acc + dz_ref, paths=("dz added by row blocks", "dz + acc"), k=40)


@pytest.mark.parametrize("shape", [(2, 5, 12), (300, 33), (7,)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layernorm_over_its_input_and_dx_over_xhat_are_the_same_op(shape, dtype):
    rng = np.random.default_rng(3)
    x = (2 * rng.standard_normal(shape) + 1).astype(dtype)
    gamma, beta = rng.standard_normal(shape[-1]).astype(dtype), rng.standard_normal(shape[-1]).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y_ref, c_ref = fast.layernorm_forward(x, gamma, beta)
    mine = x.copy()
    y, c = _layernorm_forward(mine, gamma, beta, 1e-5, overwrite=True)
    assert np.shares_memory(c["xhat"], mine)
    # exact: the same operations in the same order, written into x's buffer instead of a new one
    np.testing.assert_array_equal(y, y_ref)                    # exact: as said above
    np.testing.assert_array_equal(c["xhat"], c_ref["xhat"])   # exact: as above
    np.testing.assert_array_equal(c["rstd"], c_ref["rstd"])   # exact: as above
    ref = fast.layernorm_backward(dy, c_ref)
    got = _layernorm_backward(dy, c, True)
    assert got[0] is c["xhat"]                                   # dx written over x̂
    for a, b in zip(got, ref):   # exact: one blocked loop for both, only dx's buffer differs
        np.testing.assert_array_equal(a, b)                   # exact: as said on the loop
