"""The fast path (``transformer_np.fast``) computes what the plain path computes.

For every op that has both paths, and for the whole encoder stack (Post-LN and Pre-LN, forward,
every parameter gradient and every ∂L/∂H^(ℓ)), the two agree to ≤ 1e-12 in float64 and, op by
op, ≤ 1e-6 in float32 on random shapes (Hypothesis), with padding masks and with dropout (both
paths draw the same masks from generators seeded alike). A float32 stack of up to three layers
is held to "the fast path is as accurate as the plain path", both measured against the same
stack in float64 (:func:`_assert_as_accurate`): a fixed float32 threshold for a whole stack is
crossed by rounding alone on some Hypothesis versions' examples.

The measure is the parity tests' ``nrel``, ‖fast − plain‖ / ‖plain‖ (Frobenius), for outputs.
For gradients the denominator is max(‖plain‖, the largest gradient norm of the same backward)
— gradcheck's error floor: some gradients are zero in exact arithmetic (b_K: the softmax ignores
a constant added to a row of scores) or small by cancellation, and what both paths return for
those is rounding noise on the scale of the backward's arithmetic, not a value to compare.

Also here: the fast path's own tricks (row blocks of scores) against one block, and the path
switch (``fast=``) of the encoder.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import transformer_np as tnp
from helpers import PATH_C, assert_paths_close, attention_mask_case, lagrange_monomials, nontrivial_params
from transformer_np import fast
from transformer_np.fast import attention as fast_attention
from transformer_np.fast import blocks as _attention_blocks
from transformer_np.fast import ffn as fast_ffn
from transformer_np.fast import gelu64 as _gelu64
from transformer_np.model.gradcheck import rel_error
from transformer_np.model.params import sub_params
from transformer_np.ops import kernels as plain

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
TOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-6}
DTYPES = st.sampled_from([np.float64, np.float32])


def rel(a, b, floor: float = 0.0) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    den = max(float(np.linalg.norm(b)), floor)
    assert den > 0, "reference is exactly zero: the relative error is undefined"
    return float(np.linalg.norm(a - b) / den)


def assert_grads_agree(g_fast: dict, g_plain: dict, dtype, what: str = "") -> None:
    assert g_fast.keys() == g_plain.keys()
    floor = max(float(np.linalg.norm(np.asarray(g, dtype=np.float64))) for g in g_plain.values())
    if floor == 0.0:                        # every reference gradient is exactly zero (e.g. d_model = 1
        for k in g_plain:                   # behind a LayerNorm): then the fast ones must be too
            assert not np.any(g_fast[k]), (what, k)
        return
    for k in g_plain:
        assert g_fast[k].dtype == g_plain[k].dtype == dtype, (what, k)
        assert rel(g_fast[k], g_plain[k], floor) <= TOL[np.dtype(dtype)], (what, k, rel(g_fast[k], g_plain[k], floor))


def assert_agree(a, b, dtype, what: str = "") -> None:
    assert a.dtype == b.dtype == dtype, what
    if not np.any(b):
        # exact: a reference that is exactly zero is a structural zero (every weight of a row dropped out,
        # x − mean(x) for d_model = 1): the fast path computes the same zero
        assert not np.any(a), (what, "the plain path's result is exactly zero, the fast path's is not")
        return
    assert rel(a, b) <= TOL[np.dtype(dtype)], (what, rel(a, b))


def _rng(seed):
    return np.random.default_rng(seed)


# ----------------------------------------------------------------------------- the two kernel sets
#: the fast path's own: rebuilding A when the forward did not store it (store_attention=False)
FAST_ONLY = {"attention_weights", "get_num_threads", "set_num_threads", "get_batch_threads", "set_batch_threads"}


def test_both_paths_offer_the_same_kernels_with_the_same_signatures():
    assert set(fast.__all__) - FAST_ONLY == set(plain.__all__)
    for name in plain.__all__:
        f, p = list(inspect.signature(getattr(fast, name)).parameters), \
            list(inspect.signature(getattr(plain, name)).parameters)
        # fast.softmax adds out=, fast.attention_forward / mha_forward add store_attention=,
        # for_backward= (inference caches) and weights_out= (a shard's part of the batch's A),
        # fast.ffn_forward / activation_forward may add for_backward=
        assert f[:len(p)] == p and set(f[len(p):]) <= {"out", "store_attention", "for_backward", "weights_out"}, name


# ----------------------------------------------------------------------------- op by op
@SETTINGS
@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 9), st.integers(1, 9), st.booleans(), DTYPES,
       st.integers(0, 2**16))
def test_linear(B, n, d_in, d_out, bias, dtype, seed):
    r = _rng(seed)
    x, W = r.standard_normal((B, n, d_in)).astype(dtype), r.standard_normal((d_in, d_out)).astype(dtype)
    b = r.standard_normal(d_out).astype(dtype) if bias else None
    dy = r.standard_normal((B, n, d_out)).astype(dtype)
    (yf, cf), (yp, cp) = fast.linear_forward(x, W, b), plain.linear_forward(x, W, b)
    assert_agree(yf, yp, dtype, "y")
    names = ("x", "W", "b") if bias else ("x", "W")
    gf = dict(zip(names, fast.linear_backward(dy, cf)))
    gp = dict(zip(names, plain.linear_backward(dy, cp)))
    assert_grads_agree(gf, gp, dtype, "linear")


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 9), st.floats(0.1, 50.0), DTYPES, st.integers(0, 2**16))
def test_softmax_in_place_and_out(rows, cols, scale, dtype, seed):
    x = (scale * _rng(seed).standard_normal((rows, cols))).astype(dtype)
    ref = plain.softmax(x)
    assert_agree(fast.softmax(x), ref, dtype, "new array")
    out = np.empty_like(x)
    assert fast.softmax(x, out=out) is out
    assert_agree(out, ref, dtype, "out=")
    y = x.copy()
    fast.softmax(y, out=y)
    assert_agree(y, ref, dtype, "in place")
    assert_agree(tnp.softmax(x, out=np.empty_like(x)), ref, dtype, "public out=")




MASKS = st.sampled_from(["none", "padding", "full"])
DROPOUT = st.sampled_from([0.0, 0.3])


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 8), st.integers(1, 8), st.integers(1, 6),
       st.integers(1, 6), MASKS, DROPOUT, DTYPES, st.integers(0, 2**16))
# one query whose every key is dropped (or masked): O is exactly zero on both paths (found by random draws)
@example(1, 1, 1, 3, 6, 2, "padding", 0.3, np.float32, 12191)
@example(1, 1, 1, 1, 6, 5, "full", 0.3, np.float32, 33936)
def test_attention(B, h, n_q, n_k, d_k, d_v, mask_kind, p, dtype, seed):
    r = _rng(seed)
    Q = r.standard_normal((B, h, n_q, d_k)).astype(dtype)
    K = r.standard_normal((B, h, n_k, d_k)).astype(dtype)
    V = r.standard_normal((B, h, n_k, d_v)).astype(dtype)
    dO = r.standard_normal((B, h, n_q, d_v)).astype(dtype)
    mask = attention_mask_case(mask_kind, B, n_q, n_k, dtype, r)
    Op, cp = plain.attention_forward(Q, K, V, mask, p, p > 0, _rng(seed + 1))
    gp = dict(zip("QKV", plain.attention_backward(dO, cp)))
    for store in (True, False):                             # False: A recomputed by row blocks
        Of, cf = fast.attention_forward(Q, K, V, mask, p, p > 0, _rng(seed + 1), store_attention=store)
        assert_agree(Of, Op, dtype, f"O store={store}")
        assert_agree(fast.attention_weights(cf), cp["weights"], dtype, f"A store={store}")
        if store:
            assert_agree(cf["A_drop"], cp["A_drop"], dtype, "A_drop")
        else:
            assert cf["weights"] is None and cf["A_drop"] is None
        gf = dict(zip("QKV", fast.attention_backward(dO, cf)))
        assert_grads_agree(gf, gp, dtype, f"attention store={store}")


def _mha_params(d: int, dtype, r) -> dict:
    p = {k: (r.standard_normal((d, d)) / np.sqrt(d)) for k in ("W_Q", "W_K", "W_V", "W_O")}
    p.update({k: 0.1 * r.standard_normal(d) for k in ("b_Q", "b_K", "b_V", "b_O")})
    return {k: v.astype(dtype) for k, v in p.items()}


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 7), st.integers(1, 4), st.integers(1, 5), MASKS, DROPOUT, DTYPES,
       st.integers(0, 2**16), st.booleans())
def test_mha(B, n, h, d_k, mask_kind, p_drop, dtype, seed, free):
    r = _rng(seed)
    d = h * d_k
    x = r.standard_normal((B, n, d)).astype(dtype)
    dout = r.standard_normal((B, n, d)).astype(dtype)
    p = _mha_params(d, dtype, r)
    mask = attention_mask_case(mask_kind, B, n, n, dtype, r)
    op, cp = plain.mha_forward(x, p, h, mask, p_drop, p_drop > 0, _rng(seed + 1))
    A = cp["attn"]["weights"]
    dxp, gp = plain.mha_backward(dout, cp, free)
    for store in (True, False):
        of, cf = fast.mha_forward(x, p, h, mask, p_drop, p_drop > 0, _rng(seed + 1), store)
        assert_agree(of, op, dtype, f"out store={store}")
        assert_agree(fast.attention_weights(cf["attn"]), A, dtype, f"A store={store}")
        dxf, gf = fast.mha_backward(dout, cf, free)
        assert_grads_agree({"x": dxf, **gf}, {"x": dxp, **gp}, dtype, f"mha store={store}")


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 12), st.floats(0.01, 100.0), DTYPES,
       st.integers(0, 2**16))
def test_layernorm(B, n, d, scale, dtype, seed):
    r = _rng(seed)
    x = (scale * r.standard_normal((B, n, d)) + r.standard_normal()).astype(dtype)
    g, b = (1 + 0.3 * r.standard_normal(d)).astype(dtype), (0.3 * r.standard_normal(d)).astype(dtype)
    dy = r.standard_normal((B, n, d)).astype(dtype)
    (yf, cf), (yp, cp) = fast.layernorm_forward(x, g, b, 1e-5), plain.layernorm_forward(x, g, b, 1e-5)
    assert_agree(yf, yp, dtype, "y")
    gf = dict(zip(("x", "gamma", "beta"), fast.layernorm_backward(dy, cf)))
    gp = dict(zip(("x", "gamma", "beta"), plain.layernorm_backward(dy, cp)))
    assert_grads_agree(gf, gp, dtype, "layernorm")


@SETTINGS
@given(st.integers(1, 70_000), st.sampled_from(["gelu", "gelu_tanh", "relu"]), DTYPES, st.integers(0, 2**16))
def test_activation_blocks_are_bit_for_bit_the_whole_array(size, act, dtype, seed):
    """Sizes past several blocks: the blocked evaluation is the same arithmetic per element — except
    exact GELU, whose fused kernels (float32: fast_ffn._gelu32, float64: fast/gelu64.py) round
    differently: there, within the dtype's tolerance like every other op, and blocks still change
    nothing (the same kernel on one block of the whole array)."""
    z = (3 * _rng(seed).standard_normal(size)).astype(dtype)
    (af, cf), (ap, cp) = fast.activation_forward(z, act), plain.activation_forward(z, act)
    if act == "gelu":
        assert_agree(af, ap, dtype, "f(z)")
        assert_agree(cf["grad"], cp["grad"], dtype, "f'(z)")
        if dtype == np.float64:                          # and element by element, the rule of CONTRIBUTING.md
            assert_paths_close(af, ap, k=1)
            assert_paths_close(cf["grad"], cp["grad"], k=1)
        a1, g1 = np.empty_like(z), np.empty_like(z)
        if dtype == np.float32:
            fast_ffn._gelu32(z, a1, g1, *(np.empty_like(z) for _ in range(4)))
        else:
            _gelu64._gelu64(z, a1, g1, *(np.empty_like(z) for _ in range(3)))
        np.testing.assert_array_equal(af, a1)            # exact: elementwise, the same kernel on the same values
        np.testing.assert_array_equal(cf["grad"], g1)    # exact: as above
        return
    np.testing.assert_array_equal(af, ap)                # exact: elementwise, the same ufuncs per element (no sums)
    np.testing.assert_array_equal(cf["grad"], cp["grad"])   # exact: as above


def test_float32_gelu_against_math_erfc():
    """The fused float32 GELU against the exact values (math.erfc in float64) of the same float32
    inputs, on [−12, 12], N(0, 9) draws, the signed zeros and tiny values: relative error ≤ 1e-6 for
    z ≥ −3 (≤ 1.7e-5 below, where exp(−z²/2) carries z²'s rounding error times z²/2 — the plain
    op's 1 + erf returns 0 there), |f' − exact| ≤ 1.5e-7; and the coefficients are the interpolant
    they claim to be."""
    import math

    z = np.concatenate([np.linspace(-12, 12, 200_001), 3 * _rng(0).standard_normal(100_000),
                        [0.0, -0.0, 1e-30, -1e-30, 1e-6, -1e-6]]).astype(np.float32)
    (f, c) = fast.activation_forward(z, "gelu")
    z64 = z.astype(np.float64)
    phi = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in z64])
    exact_f = z64 * phi
    exact_g = phi + z64 * np.exp(-z64 * z64 / 2) / math.sqrt(2 * math.pi)
    err = np.abs(f - exact_f)
    near = z64 >= -3
    assert np.all(err[near] <= 1e-6 * np.abs(exact_f[near]) + 1e-45)
    assert np.all(err[~near] <= 1.7e-5 * np.abs(exact_f[~near]))
    assert np.max(np.abs(c["grad"] - exact_g)) <= 1.5e-7
    assert f[-6] == 0.0 and f[-5] == 0.0 and c["grad"][-6] == c["grad"][-5] == np.float32(0.5)


def test_float32_gelu_coefficients_are_the_interpolant_they_claim_to_be():
    """M, the fused kernel's polynomial: degree 7 in s = a/(a + K) through Φ(−a)·2^(−C a²) (C the
    float32 constant the kernel multiplies z² by) at the listed nodes, recomputed from math.erfc. The
    monomial basis is ill-conditioned, so the two polynomials are compared by their values on
    [0, s_max] (s_max: a = 13.2, where exp(−z²/2) underflows), which is what the kernel uses."""
    import math

    from numpy.polynomial import polynomial as P
    K, C, nodes = fast_ffn._GELU32_K, float(np.float32(fast_ffn._GELU32V_C)), fast_ffn._GELU32_NODES
    assert len(fast_ffn._GELU32_M) == len(nodes) == 8 and nodes[0] == 0.0
    mono = lagrange_monomials(nodes, [0.5 * math.erfc(a / math.sqrt(2)) * 2.0 ** (-C * a * a) for a in nodes], K)
    s = np.linspace(0, 13.2 / (13.2 + K), 10_001)
    assert_paths_close(P.polyval(s, fast_ffn._GELU32_M), P.polyval(s, mono), paths=("constants", "recomputed"), k=8)
    # a = 0 is a node: M(0) = Φ(0) = ½, so Φ(±0) and f'(±0) are ½ exactly
    assert np.float32(fast_ffn._GELU32_M[0]) == np.float32(0.5)   # exact: the interpolant's value at a node


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 8), st.integers(1, 16),
       st.sampled_from(["gelu", "gelu_tanh", "relu"]), DTYPES, st.integers(0, 2**16), st.booleans())
def test_ffn(B, n, d, d_ff, act, dtype, seed, free):
    r = _rng(seed)
    z = r.standard_normal((B, n, d)).astype(dtype)
    dy = r.standard_normal((B, n, d)).astype(dtype)
    p = {"W_1": r.standard_normal((d, d_ff)) / np.sqrt(d), "b_1": 0.1 * r.standard_normal(d_ff),
         "W_2": r.standard_normal((d_ff, d)) / np.sqrt(d_ff), "b_2": 0.1 * r.standard_normal(d)}
    p = {k: v.astype(dtype) for k, v in p.items()}
    (yf, cf), (yp, cp) = fast.ffn_forward(z, p, act), plain.ffn_forward(z, p, act)
    assert_agree(yf, yp, dtype, "y")
    dzf, gf = fast.ffn_backward(dy, cf, free)
    dzp, gp = plain.ffn_backward(dy, cp, free)
    assert_grads_agree({"z": dzf, **gf}, {"z": dzp, **gp}, dtype, "ffn")


# ----------------------------------------------------------------------------- the whole stack


@st.composite
def stacks(draw):
    h = draw(st.integers(1, 3))
    return dict(N=draw(st.integers(1, 3)), h=h, d=h * draw(st.integers(1, 5)), d_ff=draw(st.integers(1, 16)),
                B=draw(st.integers(1, 3)), n=draw(st.integers(1, 7)), norm=draw(st.sampled_from(["post", "pre"])),
                act=draw(st.sampled_from(["gelu", "gelu_tanh", "relu"])), ids=draw(st.booleans()),
                training=draw(st.booleans()), n_pad=draw(st.integers(0, 6)), dtype=draw(DTYPES),
                seed=draw(st.integers(0, 2**16)))


def _layernorm_amplification(cache) -> float:
    """κ ≥ 1: how much the LayerNorm backwards of a (float64 reference) run amplify rounding errors.

    dx = r·(g − mean g − x̂·mean(g x̂)) removes from g its component along x̂, leaving ε_LN·r² of it
    (‖x̂‖²/d = 1 − ε_LN·r²). For d_model = 2 every g − mean g lies along x̂: dx is that remainder alone,
    a difference of terms ≈ r·|g| whose exact value is 1 − x̂² = ε_LN·r² times smaller, and the rounding
    of x̂ comes back amplified by 1/(1 − x̂²). For d_model ≥ 3 (and 1, where x̂ = 0 exactly) a random g
    keeps a component across x̂ of its own size: no amplification (κ = 1)."""
    kappa = 1.0
    stack = [cache]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("kind") == "layernorm" and node["xhat"].shape[-1] == 2:
                rest = 1.0 - np.mean(np.asarray(node["xhat"], dtype=np.float64) ** 2, axis=-1)
                kappa = max(kappa, 1.0 / max(float(rest.min()), np.finfo(np.float64).tiny))
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return kappa


def _assert_as_accurate(fast32: dict, plain32: dict, ref64: dict, *, floor: float, k: int, kappa: float,
                        what: str) -> None:
    """float32: the fast path is as accurate as the plain path. Both are measured against the same stack
    run in float64 by the plain path (the float32 parameters and inputs cast exactly), norm-relative with
    ``floor`` (the backward's common floor, 0 for outputs):

        err(fast32) ≤ 2·err(plain32) + c·ε32·√k·κ,   c = PATH_C (CONTRIBUTING.md)

    2×: the fast path may round differently, not worse; the second term is the round-off any order of
    summing k terms may add (k the longest reduction: d_model, d_ff, n or B·n tokens for a weight's
    gradient) when the plain path happens to land closer, amplified by κ (:func:`_layernorm_amplification`)."""
    eps = float(np.finfo(np.float32).eps)
    for key in ref64:
        a, b, ref = fast32[key], plain32[key], ref64[key]
        assert a.dtype == b.dtype == np.float32, (what, key)
        if floor == 0.0 and not np.any(ref):
            # exact: a reference that is exactly zero is a structural zero (x − mean(x) for d_model = 1,
            # a dropped element): both float32 paths compute the same zero
            assert not np.any(a) and not np.any(b), (what, key)
            continue
        e_fast, e_plain = rel(a, ref, floor), rel(b, ref, floor)
        tol = 2 * e_plain + PATH_C * eps * np.sqrt(k) * kappa
        assert e_fast <= tol, (what, key, f"err(fast32) = {e_fast:.3g} > {tol:.3g} = 2·err(plain32) "
                               f"{e_plain:.3g} + {PATH_C:g}·ε32·√{k}·κ (κ = {kappa:.3g})")


def _run_stack(s, cfg, params, inputs, dH, mask, path, store):
    H, cache = tnp.encoder_forward(params, cfg, attention_mask=mask, training=s["training"],
                                   rng=_rng(s["seed"] + 1), fast=path, store_attention=store, **inputs)
    maps = [fast.attention_weights(lc["attn"]["attn"]) for lc in cache["layers"]] if path else cache["attentions"]
    grads, dhidden = tnp.encoder_backward(dH, cache, return_hidden_grads=True)
    outs = {"H": H, **{f"H^({i})": a for i, a in enumerate(cache["hidden_states"])},
            **{f"A^({i + 1})": a for i, a in enumerate(maps)}}
    return outs, {**grads, **{f"dH^({i})": a for i, a in enumerate(dhidden)}}, cache


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(stacks())
# float32 stacks whose fast and plain results differed by 1.2–1.3e-6 norm-relative (≈ 10 ε32), found by other
# Hypothesis versions' examples: kept so that every version tries them
@example(s={"B": 3, "N": 3, "act": "gelu", "d": 3, "d_ff": 11, "dtype": np.float32, "h": 3, "ids": True, "n": 2,
            "n_pad": 0, "norm": "post", "seed": 256, "training": True})
@example(s={"B": 1, "N": 2, "act": "gelu", "d": 3, "d_ff": 2, "dtype": np.float32, "h": 3, "ids": True, "n": 4,
            "n_pad": 0, "norm": "post", "seed": 63, "training": True})
# d_model = 1 with its one element dropped: H^(0) is exactly zero on both paths (Hypothesis 6.170's example)
@example(s={"B": 1, "N": 1, "act": "gelu", "d": 1, "d_ff": 1, "dtype": np.float64, "h": 1, "ids": True, "n": 1,
            "n_pad": 0, "norm": "post", "seed": 2, "training": True})
def test_encoder_stack_forward_and_every_gradient(s):
    """float64: fast and plain agree to ≤ 1e-12. float32: the fast path is as accurate as the plain path
    against the same stack in float64 (:func:`_assert_as_accurate`)."""
    cfg = tnp.EncoderConfig(n_layers=s["N"], d_model=s["d"], n_heads=s["h"], d_ff=s["d_ff"],
                            norm_position=s["norm"], final_layer_norm=s["norm"] == "pre", activation=s["act"],
                            vocab_size=31, max_len=8, type_vocab_size=2, dropout=0.1, layer_norm_eps=1e-5)
    dtype = s["dtype"]
    params = nontrivial_params(cfg, s["seed"], dtype)
    r = _rng(s["seed"])
    B, n = s["B"], s["n"]
    mask = np.ones((B, n), dtype=np.int64)
    mask[0, max(1, n - s["n_pad"]):] = 0                                    # right padding in sequence 0
    inputs = (dict(input_ids=r.integers(0, 31, (B, n)), token_type_ids=r.integers(0, 2, (B, n))) if s["ids"]
              else dict(inputs_embeds=r.standard_normal((B, n, s["d"])).astype(dtype)))
    dH = r.standard_normal((B, n, s["d"])).astype(dtype)
    runs = {(path, store): _run_stack(s, cfg, params, inputs, dH, mask, path, store)
            for path, store in ((True, True), (True, False), (False, True))}   # (True, False): A recomputed
    op, gp, cp = runs[False, True]
    if dtype == np.float32:
        ref = _run_stack(s, cfg, {k: v.astype(np.float64) for k, v in params.items()},
                         {k: (v.astype(np.float64) if k == "inputs_embeds" else v) for k, v in inputs.items()},
                         dH.astype(np.float64), mask, False, True)
        k = max(s["d"], s["d_ff"], n, B * n)
        kappa = _layernorm_amplification(ref[2])
        floor = max(float(np.linalg.norm(g)) for g in ref[1].values())
    for store in (True, False):
        of, gf, cf = runs[True, store]
        assert all(a is None for a in cf["attentions"]) or store
        if dtype == np.float32:
            _assert_as_accurate(of, op, ref[0], floor=0.0, k=k, kappa=kappa, what=f"outputs store={store}")
            if floor == 0.0:                # every reference gradient is exactly zero: see assert_grads_agree
                assert_grads_agree(gf, gp, dtype, f"stack store={store}")
            else:
                _assert_as_accurate(gf, gp, ref[1], floor=floor, k=k, kappa=kappa, what=f"stack store={store}")
            continue
        for key in op:
            assert_agree(of[key], op[key], dtype, f"{key} store={store}")
        # ∂L/∂H^(ℓ) belong to the same backward as the parameter gradients, so they share its error floor:
        # compared on their own, a stack whose ∂L/∂H^(ℓ) are zero in exact arithmetic (d_model = 2 behind a
        # LayerNorm) would be measured against its own rounding noise (found by the matrix's oldest sessions)
        assert_grads_agree(gf, gp, dtype, f"stack store={store}")


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_layer_api_runs_either_path_and_its_backward_follows_the_forward(norm):
    cfg = tnp.EncoderConfig(n_layers=1, d_model=8, n_heads=2, d_ff=16, norm_position=norm, dropout=0.0)
    p = sub_params(nontrivial_params(cfg, 0, np.float64), "layers.0.")
    x, dy = _rng(1).standard_normal((2, 5, 8)), _rng(2).standard_normal((2, 5, 8))
    (yf, cf), (yp, cp) = (tnp.encoder_layer_forward(x, p, cfg, fast=f) for f in (True, False))
    assert cf["fast"] is True and cp["fast"] is False
    assert "qkv" in cf["attn"] and {"q", "k", "v"} <= set(cp["attn"])
    assert_agree(yf, yp, np.float64)
    (dxf, gf), (dxp, gp) = tnp.encoder_layer_backward(dy, cf), tnp.encoder_layer_backward(dy, cp)
    assert_grads_agree({"x": dxf, **gf}, {"x": dxp, **gp}, np.float64, "layer")


def test_plain_path_caches_the_scores_and_the_fast_path_does_not():
    cfg = tnp.EncoderConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16, dropout=0.0)
    params = tnp.init_params(cfg, seed=0)
    x = _rng(0).standard_normal((1, 4, 8))
    _, cp = tnp.encoder_forward(params, cfg, inputs_embeds=x, fast=False)
    _, cf = tnp.encoder_forward(params, cfg, inputs_embeds=x)                 # fast is the default
    assert cf["fast"] is True and cp["fast"] is False
    for lc in cp["layers"]:
        a = lc["attn"]["attn"]
        S = a["Q"] @ a["K"].swapaxes(-1, -2) / np.sqrt(a["Q"].shape[-1])      # (1, h, n, n)
        np.testing.assert_allclose(a["scores"], S, rtol=1e-15)
        np.testing.assert_allclose(a["weights"], tnp.softmax(a["scores"]), rtol=1e-15)
    assert all("scores" not in lc["attn"]["attn"] for lc in cf["layers"])


def test_public_backwards_accept_the_fast_paths_caches():
    """mha_backward / attention_backward given a cache of the (default, fast) encoder layer."""
    cfg = tnp.EncoderConfig(n_layers=1, d_model=8, n_heads=2, d_ff=16, dropout=0.0)
    p = sub_params(nontrivial_params(cfg, 3, np.float64), "layers.0.")
    attn_p = sub_params(p, "attn.")
    x = _rng(3).standard_normal((2, 5, 8))
    dout = _rng(4).standard_normal((2, 5, 8))
    _, lc = tnp.encoder_layer_forward(x, p, cfg)
    _, pc = tnp.mha_forward(x, attn_p, 2)
    dx_fast, g_fast = tnp.mha_backward(dout, lc["attn"])
    dx_plain, g_plain = tnp.mha_backward(dout, pc)
    assert_grads_agree({"x": dx_fast, **g_fast}, {"x": dx_plain, **g_plain}, np.float64)
    dO = _rng(5).standard_normal(lc["attn"]["attn"]["Q"].shape)
    ga = dict(zip("QKV", tnp.attention_backward(dO, lc["attn"]["attn"])))
    gb = dict(zip("QKV", fast.attention_backward(dO, lc["attn"]["attn"])))
    assert_grads_agree(ga, gb, np.float64)


def test_store_attention_is_a_bool_of_the_fast_path():
    cfg = tnp.EncoderConfig(n_layers=1, d_model=4, n_heads=1, d_ff=8)
    params = tnp.init_params(cfg)
    x = np.zeros((1, 2, 4))
    with pytest.raises(TypeError, match="store_attention"):
        tnp.encoder_forward(params, cfg, inputs_embeds=x, store_attention=0)
    with pytest.raises(ValueError, match="store_attention=False needs the fast path"):
        tnp.encoder_forward(params, cfg, inputs_embeds=x, fast=False, store_attention=False)
    with pytest.raises(ValueError, match="store_attention=False needs the fast path"):
        tnp.encoder_layer_forward(x, sub_params(params, "layers.0."), cfg, fast=False, store_attention=False)


def test_recompute_keeps_no_attention_matrix():
    """store_attention=False: no (B, h, n, n) array in the cache (checked by size: nothing of n² or
    more entries), the attentions list holds None, and the rebuilt A is the stored path's (to round-off: two paths)."""
    from transformer_np.perf.memory import cache_nbytes
    cfg = tnp.EncoderConfig(n_layers=2, d_model=8, n_heads=2, d_ff=8, dropout=0.0)
    params = tnp.init_params(cfg, seed=0)
    x = _rng(0).standard_normal((1, 40, 8))                                   # n² = 1600 > any (n, d) array
    _, stored = tnp.encoder_forward(params, cfg, inputs_embeds=x)
    _, lean = tnp.encoder_forward(params, cfg, inputs_embeds=x, store_attention=False)
    assert lean["attentions"] == [None, None]
    biggest = max(a.size for lc in lean["layers"] for a in _arrays(lc))
    assert biggest < 40 * 40 <= max(a.size for lc in stored["layers"] for a in _arrays(lc))
    for ls, ll in zip(stored["layers"], lean["layers"]):   # two paths (k = n, the softmax's sum): round-off
        assert_paths_close(fast.attention_weights(ll["attn"]["attn"]), ls["attn"]["attn"]["weights"],
                           paths=("rebuilt A", "stored A"), k=40)
    # per layer: A (1, 2, 40, 40) float64 out, the row maxima and sums (1, 2, 40, 1) each in
    assert cache_nbytes(lean)["total"] == cache_nbytes(stored)["total"] - 2 * (2 * 40 * 40 * 8) + 2 * (2 * 2 * 40 * 8)


def _arrays(node):
    if isinstance(node, np.ndarray):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _arrays(v)
    elif isinstance(node, (list, tuple)):
        for v in node:
            yield from _arrays(v)


def test_fast_must_be_a_bool():
    cfg = tnp.EncoderConfig(n_layers=1, d_model=4, n_heads=1, d_ff=8)
    params = tnp.init_params(cfg)
    with pytest.raises(TypeError, match="fast"):
        tnp.encoder_forward(params, cfg, inputs_embeds=np.zeros((1, 2, 4)), fast=1)
    with pytest.raises(TypeError, match="fast"):
        tnp.encoder_layer_forward(np.zeros((1, 2, 4)), sub_params(params, "layers.0."), cfg, fast="no")


# ----------------------------------------------------------------------------- row blocks of scores
@pytest.mark.parametrize("mask_kind", ["none", "padding", "full"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_row_blocked_attention_equals_one_block(monkeypatch, mask_kind, dropout):
    """Blocks of query rows (forced small here) give the same O, A and gradients as one block."""
    r = _rng(0)
    B, h, n, dk = 2, 3, 11, 4
    Q, K, V, dO = (r.standard_normal((B, h, n, dk)) for _ in range(4))
    mask = attention_mask_case(mask_kind, B, n, n, np.float64, r)

    def run():
        O, c = fast.attention_forward(Q, K, V, mask, dropout, dropout > 0, _rng(1))
        return (O, c["weights"]) + fast.attention_backward(dO, c)

    whole = run()
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", n * 2)   # 2 rows of one head per block: 6 blocks a head
    assert len(_attention_blocks._head_blocks((B, h), n, n)) == B * h * 6   # the head-by-head loops (no dropout)
    assert len(_attention_blocks._row_blocks(B * h, n, n)) == n             # the dropout path: one row of every head
    blocked = run()
    for a, b in zip(whole, blocked):
        np.testing.assert_allclose(b, a, rtol=1e-13, atol=1e-14)


def test_row_blocked_attention_gradcheck(monkeypatch):
    monkeypatch.setattr(_attention_blocks, "_BLOCK_SCORES", 7 * 3)           # 3 query rows of one head per block
    assert len(_attention_blocks._head_blocks((2, 5), 7, 7)) == 2 * 5 * 3
    r = _rng(2)
    Q, K, V = (r.standard_normal((2, 5, 7, 3)) for _ in range(3))
    R = r.standard_normal((2, 5, 7, 3))
    loss = lambda q: float(np.sum(fast.attention_forward(q, K, V)[0] * R))   # noqa: E731
    _, c = fast.attention_forward(Q, K, V)
    dQ = fast.attention_backward(R, c)[0]
    num = np.zeros_like(Q)
    for i in np.ndindex(Q.shape):
        e = np.zeros_like(Q)
        e[i] = 1e-6
        num[i] = (loss(Q + e) - loss(Q - e)) / 2e-6
    assert rel_error(dQ, num) < 1e-7


@pytest.mark.parametrize("store", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_attention_long_rows_use_the_output_row_sums(store, dtype, p):
    """Rows of ≥ 2·d_v keys take ⟨dO, O⟩ for ⟨dA, A⟩ (the short rows of the Hypothesis cases mostly do
    not): same gradients as the plain path, with a padding mask, dropout and blocks of rows."""
    r = _rng(11)
    B, h, n, d_k = 2, 3, 40, 4
    Q, K, V = (r.standard_normal((B, h, n, d_k)).astype(dtype) for _ in range(3))
    dO = r.standard_normal((B, h, n, d_k)).astype(dtype)
    mask = attention_mask_case("padding", B, n, n, dtype, r)
    Op, cp = plain.attention_forward(Q, K, V, mask, p, p > 0, _rng(12))
    gp = dict(zip("QKV", plain.attention_backward(dO, cp)))
    Of, cf = fast.attention_forward(Q, K, V, mask, p, p > 0, _rng(12), store_attention=store)
    assert_agree(Of, Op, dtype, "O")
    assert_grads_agree(dict(zip("QKV", fast.attention_backward(dO, cf))), gp, dtype, "attention")


# ----------------------------------------------------------------------------- threads
@pytest.mark.parametrize("store", [True, False])
def test_results_do_not_depend_on_the_thread_count(store):
    """The elementwise passes split over threads compute every element with the same operations:
    1 and 3 threads give bit-identical outputs and gradients (float32 GELU, blocks of scores, masks)."""
    cfg = tnp.EncoderConfig(n_layers=2, d_model=16, n_heads=2, d_ff=64, dropout=0.0)
    params = {k: v.astype(np.float32) for k, v in nontrivial_params(cfg, 5, np.float64).items()}
    r = _rng(5)
    x = r.standard_normal((3, 37, 16)).astype(np.float32)
    mask = np.ones((3, 37), dtype=np.int64)
    mask[1, 30:] = 0
    dH = r.standard_normal((3, 37, 16)).astype(np.float32)
    runs = []
    try:
        for n in (1, 3):
            fast.set_num_threads(n)
            assert fast.get_num_threads() == n
            H, cache = tnp.encoder_forward(params, cfg, inputs_embeds=x, attention_mask=mask, store_attention=store)
            runs.append((H, tnp.encoder_backward(dH, cache)))
    finally:
        fast.set_num_threads(None)
    (H1, g1), (H3, g3) = runs
    # one process, the same BLAS calls with the same BLAS thread count; only the elementwise passes
    # (the same operations per element) move between threads: exact
    np.testing.assert_array_equal(H1, H3)
    for k in g1:   # exact: as above
        np.testing.assert_array_equal(g1[k], g3[k], err_msg=k)


def test_set_num_threads_checks_its_argument(monkeypatch):
    for bad in (0, -1):
        with pytest.raises(ValueError, match="positive int"):
            fast.set_num_threads(bad)
    for bad in (1.5, True, "2"):
        with pytest.raises(TypeError, match="positive int"):
            fast.set_num_threads(bad)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert fast.get_num_threads() == 1                       # follows OpenBLAS's setting by default


# ----------------------------------------------------------------------------- fewer passes (round 4)
# The fast attention skips the max subtraction where a bound proves exp cannot overflow or underflow
# (fast_attention._no_max_rows), folds 1/√d_k into Q where that is exact (d_k a power of 4), and defers the
# normalisation of the recomputing path to the (n, d_v) product. Here: the skip is really taken, the
# bound is sound, and the results agree with the plain path on long rows, padded rows, float32 near
# exp's overflow, huge logits and n = 1. Tolerance where the skip changes the rounding: the
# reduction rule c·eps·√k (k = n_k, the softmax's and A V's sum length) plus eps·max|s| (exp turns an
# absolute error of its argument into a relative one, and exp(s) vs exp(s − m) round s differently).
def _reduction_tol(dtype, k: int, max_logit: float = 0.0, c: float = 4.0) -> float:
    eps = float(np.finfo(dtype).eps)
    return c * eps * (np.sqrt(k) + max_logit)


def _bound_limits(dtype, n_k: int, vmax: float) -> tuple[float, float]:
    """The documented thresholds of fast_attention._no_max_rows, recomputed here from their definition."""
    fi = np.finfo(dtype)
    hi = np.log(float(fi.max)) - np.log(n_k) - np.log(max(1.0, vmax)) - 1.0
    lo = -np.log(float(fi.tiny)) - np.log(1.0 / float(fi.eps)) - np.log(n_k) - 1.0
    return hi, lo


def _against_plain(Q, K, V, dO, mask, dtype, rtol):
    """Fast (stored and recomputed A) against plain: O, A (rows summing to 1) and the gradients."""
    Op, cp = plain.attention_forward(Q, K, V, mask)
    gp = dict(zip("QKV", plain.attention_backward(dO, cp)))
    floor = max(float(np.linalg.norm(np.asarray(g, dtype=np.float64))) for g in gp.values())
    for store in (True, False):
        Of, cf = fast.attention_forward(Q, K, V, mask, store_attention=store)
        A = fast.attention_weights(cf)
        assert np.all(np.isfinite(Of)) and np.all(np.isfinite(A)), store
        assert Of.dtype == A.dtype == dtype
        np.testing.assert_allclose(A.sum(axis=-1, dtype=np.float64), 1.0, rtol=_reduction_tol(dtype, A.shape[-1]))
        assert rel(Of, Op) <= rtol, ("O", store, rel(Of, Op), rtol)
        assert rel(A, cp["weights"]) <= rtol, ("A", store, rel(A, cp["weights"]), rtol)
        gf = dict(zip("QKV", fast.attention_backward(dO, cf)))
        for k in "QKV":
            assert np.all(np.isfinite(gf[k]))
            assert rel(gf[k], gp[k], floor) <= rtol, (k, store, rel(gf[k], gp[k], floor), rtol)
    return cp["weights"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mask_kind", ["none", "padding", "full"])
def test_long_rows_skip_the_max_and_agree_with_plain(dtype, mask_kind):
    r = _rng(21)
    B, h, n, d_k = 2, 2, 256, 16                               # 2·2·256² scores: past _SKIP_MIN_SCORES
    Q, K, V, dO = (r.standard_normal((B, h, n, d_k)).astype(dtype) for _ in range(4))
    mask = attention_mask_case(mask_kind, B, n, n, dtype, r)
    safe = fast_attention._no_max_rows(Q, K, V, mask, np.sqrt(d_k))
    assert safe is not None and safe.all()                     # the skip is taken for every row
    _against_plain(Q, K, V, dO, mask, dtype, TOL[np.dtype(dtype)])


def test_few_rows_keep_the_plain_arithmetic_and_short_rows_skip_too():
    r = _rng(22)
    Q, K, V = (r.standard_normal((1, 1, 8, 4)) for _ in range(3))   # 64 scores: too few to pay for the bound
    assert fast_attention._no_max_rows(Q, K, V, None, 2.0) is None
    # rows of 64 < 2·d_v keys: bounded too (NumPy's max over short rows costs per row), and safe here
    Q, K, V, dO = (r.standard_normal((4, 4, 64, 64)) for _ in range(4))
    safe = fast_attention._no_max_rows(Q, K, V, None, 8.0)
    assert safe is not None and safe.all()
    _against_plain(Q, K, V, dO, None, np.float64, TOL[np.dtype(np.float64)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fully_padded_rows_keep_the_max_and_stay_uniform(dtype):
    """Batch 0 has every key masked (finfo.min): without the max subtraction each exp would be 0 and the
    row sum 0 (NaN). Those rows fail the bound and keep the plain path's result (uniform rows); batch 1
    (no padding) skips."""
    r = _rng(23)
    B, h, n, d_k = 2, 2, 192, 16
    Q, K, V, dO = (r.standard_normal((B, h, n, d_k)).astype(dtype) for _ in range(4))
    mask = np.zeros((B, 1, 1, n), dtype=dtype)
    mask[0] = np.finfo(dtype).min
    safe = fast_attention._no_max_rows(Q, K, V, mask, np.sqrt(d_k))
    assert not safe[0].any() and safe[1].all()
    with np.errstate(divide="ignore", invalid="ignore"):       # what skipping would have done: 0/0
        naive = np.exp(Q[0, 0] @ K[0, 0].T / np.sqrt(d_k) + mask[0, 0])
        assert np.all(naive.sum(axis=-1) == 0)
    A = _against_plain(Q, K, V, dO, mask, dtype, TOL[np.dtype(dtype)])
    np.testing.assert_allclose(A[0], 1.0 / n, rtol=_reduction_tol(dtype, n))


def test_float32_near_exp_overflow_and_underflow():
    """Rows whose scores reach ±b for b from 10 to 120 (q parallel or antiparallel to every key): the
    skip is taken exactly where the documented thresholds allow (b ≤ hi, b ≤ lo), and every row — the
    ones where exp(s) itself would overflow to inf (b > 88.7) or underflow to 0 (b > 103) — stays
    finite and agrees with the plain path."""
    dtype, n, d_k = np.float32, 256, 16
    u = np.zeros(d_k)
    u[0] = 1.0
    K = np.tile(u, (1, 2, n, 1)) * 4.0                         # ‖k_j‖ = 4 for every key, all along u
    K[..., 1] = np.linspace(-0.5, 0.5, n)                      # not all equal: A is not uniform
    b_target = np.linspace(10.0, 120.0, n)                     # per query row: b = ‖q‖ max‖k‖ / √d_k
    sign = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)          # even rows: max +b; odd rows: all near −b
    Q = np.zeros((1, 2, n, d_k))
    Q[..., 0] = sign * b_target * np.sqrt(d_k) / np.linalg.norm(K[0, 0], axis=-1).max()
    Q, K = Q.astype(dtype), K.astype(dtype)
    r = _rng(24)
    V = (0.5 * r.uniform(-1, 1, (1, 2, n, d_k))).astype(dtype)
    dO = r.standard_normal((1, 2, n, d_k)).astype(dtype)
    safe = fast_attention._no_max_rows(Q, K, V, None, np.sqrt(d_k))[0, 0, :, 0]
    hi, lo = _bound_limits(dtype, n, float(np.abs(V).max()))
    q64, k64 = Q.astype(np.float64), K.astype(np.float64)
    b = np.linalg.norm(q64[0, 0], axis=-1) * np.linalg.norm(k64[0, 0], axis=-1).max() / np.sqrt(d_k)
    clear = (b < min(hi, lo) - 1e-3) | (b > min(hi, lo) + 1e-3)   # away from the threshold's rounding
    np.testing.assert_array_equal(safe[clear], (b <= min(hi, lo))[clear])   # exact: booleans
    assert safe.any() and not safe.all()
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(q64[0, 0, -2] @ k64[0, 0].T / np.sqrt(d_k)).astype(dtype)).any()   # would overflow
    assert np.exp((q64[0, 0, -1] @ k64[0, 0].T / np.sqrt(d_k)).astype(dtype)).sum() == 0          # would underflow
    s_max = float(np.abs(q64 @ k64.swapaxes(-1, -2)).max() / np.sqrt(d_k))
    _against_plain(Q, K, V, dO, None, dtype, _reduction_tol(dtype, n, s_max))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_huge_logits_keep_the_max(dtype):
    r = _rng(25)
    Q, K, V, dO = (r.standard_normal((1, 2, 128, 16)) for _ in range(4))
    Q *= 1e3                                                    # |s| up to ~1e4: far past exp's range
    Q, K, V, dO = (a.astype(dtype) for a in (Q, K, V, dO))
    assert not fast_attention._no_max_rows(Q, K, V, None, 4.0).any()
    s_max = float(np.abs(Q.astype(np.float64) @ K.astype(np.float64).swapaxes(-1, -2)).max() / 4)
    _against_plain(Q, K, V, dO, None, dtype, _reduction_tol(dtype, 128, s_max))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("store", [True, False])
def test_one_key_gives_weight_one_exactly(dtype, store):
    r = _rng(26)
    Q, K, V = (r.standard_normal((2, 3, 1, 4)).astype(dtype) for _ in range(3))
    O, c = fast.attention_forward(Q, K, V, store_attention=store)
    # exact: a single key's softmax is exp(s − s)/exp(0) = 1/1, and 1·v = v
    np.testing.assert_array_equal(fast.attention_weights(c), np.ones((2, 3, 1, 1), dtype=dtype))
    np.testing.assert_array_equal(O, V)                  # exact: as above (1·v = v)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 2), st.integers(64, 200), st.sampled_from([4, 16]), st.floats(0.01, 40.0),
       st.sampled_from(["none", "padding", "full", "positive", "neg_inf"]), DTYPES, st.integers(0, 2**16))
def test_the_bound_is_sound(B, n, d_k, scale, mask_kind, dtype, seed):
    """Wherever a row is declared safe, its true largest value (in float64) lies in [−lo, hi], and the fast
    result is finite wherever the plain one is."""
    r = _rng(seed)
    Q = (scale * r.standard_normal((B, 2, n, d_k))).astype(dtype)
    K = (scale * r.standard_normal((B, 2, n, d_k))).astype(dtype)
    V = r.standard_normal((B, 2, n, d_k)).astype(dtype)
    if mask_kind == "positive":                                 # any additive mask: also positive entries
        mask = r.uniform(-5, 5, (B, 1, n, n)).astype(dtype)
    elif mask_kind == "neg_inf":
        mask = np.where(r.random((B, 1, 1, n)) < 0.5, -np.inf, 0.0).astype(dtype)
    else:
        mask = attention_mask_case(mask_kind, B, n, n, dtype, r)
    safe = fast_attention._no_max_rows(Q, K, V, mask, np.sqrt(d_k))
    if safe is None:
        return
    hi, lo = _bound_limits(dtype, n, float(np.abs(V).max()))
    S = Q.astype(np.float64) @ K.astype(np.float64).swapaxes(-1, -2) / np.sqrt(d_k)
    if mask is not None:
        S = S + mask.astype(np.float64)
    row_max = S.max(axis=-1, keepdims=True)
    ok = (row_max <= hi) & (row_max >= -lo)
    assert np.all(ok[np.broadcast_to(safe, ok.shape)])
    with np.errstate(all="ignore"):
        Op, _ = plain.attention_forward(Q, K, V, mask)
        for store in (True, False):
            Of, _ = fast.attention_forward(Q, K, V, mask, store_attention=store)
            assert np.all(np.isfinite(Of)[np.isfinite(Op)])


@pytest.mark.parametrize("d_k, folds", [(1, True), (4, True), (16, True), (64, True), (2, False), (32, False),
                                        (12, False)])
def test_scale_folds_into_q_only_when_exact(d_k, folds):
    """1/√d_k is folded into Q only when √d_k is a power of two; then the scores are the plain path's
    bit for bit (dividing by a power of two only changes the exponent)."""
    assert fast_attention._folds(np.sqrt(d_k)) is folds
    if folds:
        r = _rng(27)
        Q, K = r.standard_normal((2, 5, d_k)), r.standard_normal((2, 7, d_k))
        S = fast_attention._block_scores(Q, K.swapaxes(-1, -2), np.sqrt(d_k), slice(0, 5), np.empty((2, 5, 7)))
        # exact: (Q / 2^e) Kᵀ = (Q Kᵀ) / 2^e in binary floating point (no subnormals here)
        np.testing.assert_array_equal(S, (Q @ K.swapaxes(-1, -2)) / np.sqrt(d_k))
