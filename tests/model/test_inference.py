"""The inference forward (``for_backward=False``): the same outputs as the forward that keeps a cache
(within the tolerance rule of CONTRIBUTING.md, against both paths), a cache that keeps only what the API
reports and that every backward refuses by name, non-finite parameters still refused and named, and the
value-only kernels it runs (float32 GELU, LayerNorm) against their references."""

from __future__ import annotations

import math

import numpy as np
import pytest

import transformer_np as tnp
from helpers import assert_paths_close, lagrange_monomials, nontrivial_params
from transformer_np import fast
from transformer_np.errors import InputTypeError, InputValueError, NonFiniteError
from transformer_np.fast import ffn as fast_ffn
from transformer_np.fast import gelu64 as _gelu64
from transformer_np.io.hf_model import hf_backward, hf_forward
from transformer_np.model.encoder import encoder_layer_backward, encoder_layer_forward
from transformer_np.model.params import sub_params
from transformer_np.ops import kernels as plain
from transformer_np.ops.masks import _padding_mask


def _cfg(**kw):
    base = dict(n_layers=2, d_model=16, n_heads=4, d_ff=40, vocab_size=50, max_len=12, dropout=0.0)
    base.update(kw)
    return tnp.EncoderConfig(**base)




def _inputs(cfg, ids: bool, dtype, B=3, n=7):
    rng = np.random.default_rng(3)
    mask = np.ones((B, n), dtype=np.int64)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    kw = dict(input_ids=rng.integers(0, cfg.vocab_size, (B, n))) if ids else \
        dict(inputs_embeds=rng.standard_normal((B, n, cfg.d_model)).astype(dtype))
    return dict(attention_mask=mask, **kw)


def _k(cfg, n=7) -> int:
    return max(cfg.d_ff, cfg.d_model, n)        # the longest reduction behind an output


CASES = [dict(norm_position=norm, activation=act) for norm in ("post", "pre") for act in ("gelu", "gelu_tanh", "relu")]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['norm_position']}-{c['activation']}")
@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("ids", [True, False])
def test_inference_gives_the_outputs_of_both_paths(case, dtype, store, ids):
    cfg = _cfg(**case)
    p, inp = nontrivial_params(cfg, 0, dtype), _inputs(cfg, ids, dtype)
    H, c = tnp.encoder_forward(p, cfg, **inp, store_attention=store, for_backward=False)
    H_fast, c_fast = tnp.encoder_forward(p, cfg, **inp)                     # the training forward, fast path
    H_plain, c_plain = tnp.encoder_forward(p, cfg, **inp, fast=False)
    k = _k(cfg)
    for other, name in ((H_fast, "fast"), (H_plain, "plain")):
        assert_paths_close(H, other, paths=("inference", name), k=k)
    for h, h_plain in zip(c["hidden_states"], c_plain["hidden_states"], strict=True):
        assert_paths_close(h, h_plain, paths=("inference", "plain"), k=k)
    assert len(c["attentions"]) == cfg.n_layers
    for a, a_plain in zip(c["attentions"], c_plain["attentions"]):
        if store:
            assert_paths_close(a, a_plain, paths=("inference", "plain"), k=k)
        else:
            assert a is None
    H_pi, c_pi = tnp.encoder_forward(p, cfg, **inp, fast=False, for_backward=False)
    # exact: the plain path's inference forward runs the same kernels on the same arrays and drops its caches
    np.testing.assert_array_equal(H_pi, H_plain)
    for a, b in zip(c_pi["attentions"], c_plain["attentions"]):
        np.testing.assert_array_equal(a, b)      # exact: as above


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_inference_with_dropout_draws_what_the_training_forward_draws(norm):
    cfg = _cfg(norm_position=norm, dropout=0.2)
    p, inp = nontrivial_params(cfg, 0, np.float64), _inputs(cfg, True, np.float64)
    H, _ = tnp.encoder_forward(p, cfg, **inp, training=True, rng=np.random.default_rng(5), for_backward=False)
    H_t, _ = tnp.encoder_forward(p, cfg, **inp, training=True, rng=np.random.default_rng(5))
    assert_paths_close(H, H_t, paths=("inference", "training forward"), k=_k(cfg))


@pytest.mark.parametrize("fast_path", [True, False])
def test_the_inference_cache_keeps_what_the_api_reports_and_backwards_refuse_it(fast_path):
    cfg = _cfg()
    p, inp = nontrivial_params(cfg, 0, np.float64), _inputs(cfg, True, np.float64)
    H, c = tnp.encoder_forward(p, cfg, **inp, fast=fast_path, for_backward=False)
    assert {"hidden_states", "attentions"} <= set(c)
    assert not {"layers", "guard", "embeddings", "emb_drop", "final_ln"} & set(c)
    assert len(c["hidden_states"]) == cfg.n_layers + 1
    with pytest.raises(InputValueError, match=r"encoder_forward\(\.\.\., for_backward=False\)"):
        tnp.encoder_backward(np.ones_like(H), c)
    x = c["hidden_states"][0]
    mask = _padding_mask(inp["attention_mask"], np.float64)                # (B, 1, 1, n)
    out, lc = encoder_layer_forward(x, sub_params(p, "layers.0."), cfg, mask, fast=fast_path, for_backward=False)
    assert_paths_close(out, c["hidden_states"][1], paths=("layer API", "stack"), k=_k(cfg))
    assert lc["attn"]["attn"]["weights"].shape == (3, cfg.n_heads, 7, 7)
    with pytest.raises(InputValueError, match=r"encoder_layer_forward\(\.\.\., for_backward=False\)"):
        encoder_layer_backward(np.ones_like(out), lc)
    _, hc = hf_forward(p, cfg, **inp, for_backward=False)
    with pytest.raises(InputValueError, match="for_backward=False"):
        hf_backward(np.ones_like(H), hc)


def test_the_kernels_refuse_an_inference_cache():
    r = np.random.default_rng(0)
    z = r.standard_normal((2, 3, 4))
    p = {"W_1": r.standard_normal((4, 6)), "b_1": r.standard_normal(6), "W_2": r.standard_normal((6, 4)),
         "b_2": r.standard_normal(4)}
    out, c = fast.ffn_forward(z, p, "gelu", for_backward=False)
    assert_paths_close(out, plain.ffn_forward(z, p, "gelu")[0], paths=("inference", "plain"), k=6)
    with pytest.raises(InputValueError, match=r"ffn_forward\(\.\.\., for_backward=False\)"):
        fast.ffn_backward(out, c)
    a, ca = fast.activation_forward(z, "relu", for_backward=False)
    assert set(ca) == {"kind", "activation", "for_backward"}
    with pytest.raises(InputValueError, match=r"activation_forward\(\.\.\., for_backward=False\)"):
        fast.activation_backward(a, ca)


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("name", ["layers.1.ffn.W_1", "layers.0.attn.b_K", "layers.1.ln2.gamma", "embeddings.ln.beta"])
@pytest.mark.parametrize("fast_path", [True, False])
def test_a_nonfinite_parameter_is_still_refused_and_named(name, value, fast_path):
    cfg = _cfg()
    p, inp = nontrivial_params(cfg, 0, np.float32), _inputs(cfg, True, np.float32)
    p[name].flat[1] = value
    with pytest.raises(NonFiniteError, match=rf"params\['{name}'\] must contain only finite values, got 1 NaN/inf"):
        tnp.encoder_forward(p, cfg, **inp, fast=fast_path, for_backward=False)


@pytest.mark.parametrize("fast_path", [True, False])
def test_the_layer_api_names_a_nonfinite_parameter_and_reports_an_overflow(fast_path):
    cfg = _cfg()
    p = sub_params(nontrivial_params(cfg, 0, np.float32), "layers.0.")
    x = np.random.default_rng(0).standard_normal((2, 5, cfg.d_model)).astype(np.float32)
    bad = dict(p)
    bad["ffn.b_2"] = p["ffn.b_2"].copy()
    bad["ffn.b_2"][3] = np.nan
    with pytest.raises(NonFiniteError, match=r"p\['ffn.b_2'\] must contain only finite values"):
        encoder_layer_forward(x, bad, cfg, fast=fast_path, for_backward=False)
    huge = dict(p)
    huge["ffn.W_2"] = p["ffn.W_2"] * np.float32(1e37)                     # finite, but the product overflows
    with pytest.raises(NonFiniteError, match=r"overflowed float32 in this layer|variance of x is not finite"):
        encoder_layer_forward(x, huge, cfg, fast=fast_path, for_backward=False)


def test_an_overflow_with_finite_parameters_is_reported_as_one():
    cfg = _cfg()
    p = nontrivial_params(cfg, 0, np.float32)
    p["layers.0.ffn.W_2"] = p["layers.0.ffn.W_2"] * np.float32(1e37)
    for fast_path in (True, False):       # as the training forward reports it (tests/model/test_edge_cases.py)
        with pytest.raises(NonFiniteError, match=r"overflowed float32 in layer \d|variance of x is not finite"):
            tnp.encoder_forward(p, cfg, **_inputs(cfg, True, np.float32), fast=fast_path, for_backward=False)


def test_for_backward_is_a_keyword_bool():
    cfg = _cfg()
    p, inp = nontrivial_params(cfg, 0, np.float64), _inputs(cfg, True, np.float64)
    with pytest.raises(InputTypeError, match="for_backward"):
        tnp.encoder_forward(p, cfg, **inp, for_backward=0)
    with pytest.raises(InputTypeError, match="for_backward"):
        encoder_layer_forward(np.zeros((1, 2, cfg.d_model)), sub_params(p, "layers.0."), cfg, for_backward="no")


# ----------------------------------------------------------------------------- the value-only kernels
def test_value_only_float32_gelu_against_math_erfc():
    """The value-only float32 GELU against the exact values (math.erfc in float64) of the same float32
    inputs: the fused kernel's bounds (relative ≤ 1e-6 for z ≥ −3, ≤ 1.7e-5 below, where exp(−z²/2)
    carries z²'s rounding error times z²/2), signed zeros and tiny values to 0 or z/2."""
    z = np.concatenate([np.linspace(-12, 12, 200_001), 3 * np.random.default_rng(0).standard_normal(100_000),
                        [0.0, -0.0, 1e-30, -1e-30, 1e-6, -1e-6]]).astype(np.float32)
    f, c = fast.activation_forward(z, "gelu", for_backward=False)
    assert "grad" not in c
    z64 = z.astype(np.float64)
    exact = z64 * np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in z64])
    err = np.abs(f - exact)
    near = z64 >= -3
    assert np.all(err[near] <= 1e-6 * np.abs(exact[near]) + 1e-45)
    assert np.all(err[~near] <= 1.7e-5 * np.abs(exact[~near]))
    assert f[-6] == 0.0 and f[-5] == 0.0                      # exact: relu(±0) − 0·Φ(0)


def test_value_only_gelu_coefficients_are_the_interpolant_they_claim_to_be():
    """g, the value-only kernel's polynomial: degree 6 in s = a/(a + K) through N/s at the listed
    nodes, N = a Φ(−a)·2^(−C a²) (C the float32 constant the kernel multiplies z² by), recomputed from
    math.erfc without BLAS. The monomial basis is ill-conditioned (coefficients move by ~3e-10 for a
    change of ~1e-15 in the values), so the two polynomials are compared by their values on
    [0, s_max] (s_max: a = 13.2, where exp(−z²/2) underflows), which is what the kernel uses."""
    from numpy.polynomial import polynomial as P
    K, C, nodes = fast_ffn._GELU32V_K, float(np.float32(fast_ffn._GELU32V_C)), fast_ffn._GELU32V_NODES
    assert len(fast_ffn._GELU32V_G) == len(nodes) == 7
    values = [(a + K) * 0.5 * math.erfc(a / math.sqrt(2)) * 2.0 ** (-C * a * a) for a in nodes]   # N/s
    mono = lagrange_monomials(nodes, values, K)
    s = np.linspace(0, 13.2 / (13.2 + K), 10_001)
    assert_paths_close(P.polyval(s, fast_ffn._GELU32V_G), P.polyval(s, mono), paths=("constants", "recomputed"),
                       k=len(nodes))


# block edges of the value-only GELU block sizes (float32 128 Ki, float64 64 Ki)
@pytest.mark.parametrize("size", [1, 5, 65_535, 65_536, 200_003, fast_ffn._GELU32_VALUE_BLOCK,
                                  2 * fast_ffn._GELU32_VALUE_BLOCK + 3, fast_ffn._GELU64_VALUE_BLOCK + 1,
                                  3 * fast_ffn._GELU64_VALUE_BLOCK - 1])
def test_value_only_kernels_by_blocks(size):
    """f(z) by blocks is the one-block kernel (GELU: float32 fast_ffn._gelu32_value, float64
    fast/gelu64.py), and the plain op's value bit for bit (the other activations); the fused kernel's
    f(z) agrees with the value-only one."""
    r = np.random.default_rng(size)
    for dtype in (np.float32, np.float64):
        z = (3 * r.standard_normal(size)).astype(dtype)
        for act in ("gelu", "gelu_tanh", "relu"):
            f, _ = fast.activation_forward(z, act, for_backward=False)
            ref = plain.activation_forward(z, act)[0]
            if act == "gelu":
                one = np.empty_like(z)
                value_kernel = fast_ffn._gelu32_value if dtype == np.float32 else _gelu64._gelu64_value
                value_kernel(z, one, *(np.empty_like(z) for _ in range(3)))
                np.testing.assert_array_equal(f, one)          # exact: elementwise, the same kernel on the same values
                assert_paths_close(f, fast.activation_forward(z, act)[0], paths=("value-only", "fused"), k=1)
                assert_paths_close(f, ref, paths=("value-only", "plain"), k=1, atol_scale=1.0)
            else:
                np.testing.assert_array_equal(f, ref)          # exact: elementwise, the same ufuncs per element


@pytest.mark.parametrize("for_backward", [True, False])
@pytest.mark.parametrize("shape", [(3, 5), (70, 1536), (2, 40_000), (65_537, 1), (200, 1536), (300_001, 1)])
def test_the_bias_added_by_blocks_is_the_separate_add(for_backward, shape):
    """ffn_forward adds b_1 to each block of rows just before its activation: f(U + b) bit for bit."""
    r = np.random.default_rng(shape[0])
    for dtype in (np.float32, np.float64):
        U = (2 * r.standard_normal(shape)).astype(dtype)
        b = r.standard_normal(shape[-1]).astype(dtype)
        for act in ("gelu", "relu"):
            ref, c_ref = fast_ffn._activation(U + b, act, for_backward=for_backward)
            f, c = fast_ffn._activation(U.copy(), act, in_place=True, for_backward=for_backward, bias=b)
            np.testing.assert_array_equal(f, ref)      # exact: the same z + b, then the same kernel per element
            if for_backward:
                np.testing.assert_array_equal(c["grad"], c_ref["grad"])   # exact: as above
            f_view, _ = fast_ffn._activation(U.T.copy().T, act, in_place=True, for_backward=for_backward, bias=b)
            np.testing.assert_array_equal(f_view, ref)   # exact: an F-ordered U is copied with the bias first


@pytest.mark.parametrize("for_backward", [True, False])
def test_activations_of_a_transposed_or_strided_input(for_backward):
    """A non-C-contiguous z (a transpose, a strided view): f(z) was written into a copy and lost before."""
    r = np.random.default_rng(1)
    for dtype in (np.float32, np.float64):
        for z in (r.standard_normal((64, 3)).astype(dtype).T, r.standard_normal((3, 64)).astype(dtype)[:, ::2]):
            for act in ("gelu", "gelu_tanh", "relu"):
                f, c = fast.activation_forward(z, act, for_backward=for_backward)
                f_plain, c_plain = plain.activation_forward(z, act)
                assert_paths_close(f, f_plain, paths=("fast", "plain"), k=1)
                if for_backward:
                    assert_paths_close(c["grad"], c_plain["grad"], paths=("fast", "plain"), k=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 16), (4, 33, 384), (5, 7)])
def test_value_only_layernorm(dtype, shape):
    r = np.random.default_rng(len(shape))
    x = (2 * r.standard_normal(shape) + 0.5).astype(dtype)
    g = (1 + 0.1 * r.standard_normal(shape[-1])).astype(dtype)
    b = (0.1 * r.standard_normal(shape[-1])).astype(dtype)
    ref = plain.layernorm_forward(x, g, b, 1e-5)[0]
    y = fast_ffn._layernorm_value(x, g, b, 1e-5)
    assert_paths_close(y, ref, paths=("value-only", "plain"), k=shape[-1])
    x_own = x.copy()
    y_in = fast_ffn._layernorm_value(x_own, g, b, 1e-5, out=x_own)
    assert y_in is x_own
    np.testing.assert_array_equal(y_in, y)                   # exact: the same operations, in place or not
    view = np.asfortranarray(x) if x.ndim == 2 else x[:, ::1, :]
    assert_paths_close(fast_ffn._layernorm_value(view, g, b, 1e-5), ref, paths=("strided", "plain"), k=shape[-1])


def test_the_inference_layer_never_writes_its_input():
    cfg = _cfg(norm_position="pre")
    p = sub_params(nontrivial_params(cfg, 0, np.float32), "layers.1.")
    x = np.random.default_rng(0).standard_normal((2, 5, cfg.d_model)).astype(np.float32)
    before = x.copy()
    mask = _padding_mask(np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]), np.float32)
    for norm in ("post", "pre"):
        encoder_layer_forward(x, p, _cfg(norm_position=norm), mask, for_backward=False)
        np.testing.assert_array_equal(x, before)             # exact: x is only read
