"""Property-based tests (Hypothesis) over random shapes, dtypes and values.

Each property is one the seeds state or one a correct implementation must have:
permutation equivariance without positions, softmax rows summing to 1 and ignoring a
constant shift, LayerNorm's output moments, padding invariance for any amount of right
padding, gradients of every op and of the stack (both paths) at random shapes,
float32 ≈ float64, determinism.
Example counts are bounded so the file runs in well under a minute.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import transformer_np as tnp
from transformer_np.model import gradcheck as gc

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def model_shapes(draw):
    h = draw(st.integers(1, 3))
    d_k = draw(st.integers(1, 4))
    return dict(B=draw(st.integers(1, 3)), n=draw(st.integers(1, 7)), h=h, d=h * d_k,
                d_ff=draw(st.integers(1, 12)), N=draw(st.integers(1, 3)),
                norm=draw(st.sampled_from(["post", "pre"])),
                act=draw(st.sampled_from(["gelu", "gelu_tanh", "relu"])),
                seed=draw(st.integers(0, 2**16)))


def _cfg(s, **kw):
    return tnp.EncoderConfig(n_layers=s["N"], d_model=s["d"], n_heads=s["h"], d_ff=s["d_ff"],
                             norm_position=s["norm"], activation=s["act"], dropout=0.0, layer_norm_eps=1e-5, **kw)


@SETTINGS
@given(model_shapes(), st.data())
def test_permutation_equivariance_any_permutation(s, data):
    cfg = _cfg(s)
    params = gc.random_params(cfg, s["seed"])
    x = np.random.default_rng(s["seed"]).standard_normal((s["B"], s["n"], s["d"]))
    perm = np.array(data.draw(st.permutations(range(s["n"]))), dtype=int)
    H, _ = tnp.encoder_forward(params, cfg, inputs_embeds=x)
    Hp, _ = tnp.encoder_forward(params, cfg, inputs_embeds=x[:, perm])
    np.testing.assert_allclose(Hp, H[:, perm], rtol=1e-10, atol=1e-10)


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 9), st.floats(-1e6, 1e6), st.integers(0, 2**16),
       st.sampled_from([np.float32, np.float64]), st.floats(0.01, 100.0))
def test_softmax_rows_sum_to_one_and_shift_invariance(rows, cols, shift, seed, dtype, scale):
    x = (scale * np.random.default_rng(seed).standard_normal((rows, cols))).astype(dtype)
    s, _ = tnp.softmax_forward(x)
    assert s.dtype == dtype and np.all(np.isfinite(s)) and np.all(s >= 0)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(s.sum(-1), 1.0, atol=tol)
    shifted, _ = tnp.softmax_forward((x.astype(np.float64) + shift).astype(dtype))
    # adding a constant changes nothing (beyond the rounding of x + shift itself)
    rounding = np.abs(((x.astype(np.float64) + shift).astype(dtype).astype(np.float64) - shift) - x).max()
    np.testing.assert_allclose(shifted, s, atol=tol + 2 * float(rounding))


@SETTINGS
@given(st.integers(1, 5), st.integers(2, 16), st.integers(0, 2**16), st.floats(1e-3, 1e3),
       st.sampled_from([1e-12, 1e-5]))
def test_layernorm_moments(rows, d, seed, scale, eps):
    x = scale * np.random.default_rng(seed).standard_normal((rows, d)) + 7.0
    y, _ = tnp.layernorm_forward(x, np.ones(d), np.zeros(d), eps)
    var = x.var(-1)
    # Subtracting μ = 7 from values spread by σ loses log10(|μ|/σ) digits: the tolerance
    # is float64 round-off scaled by that condition number, not a fixed constant.
    cond = 1.0 + np.abs(x.mean(-1)) / np.sqrt(var)
    assert np.all(np.abs(y.mean(-1)) <= 1e-14 * d * cond)
    # biased variance of the output is σ²/(σ² + ε): 1 "up to eps"
    assert np.all(np.abs(y.var(-1) - var / (var + eps)) <= 1e-14 * d * cond)


@SETTINGS
@given(model_shapes(), st.integers(1, 6))
def test_padding_invariance_any_amount(s, n_pad):
    cfg = _cfg(s, vocab_size=11, max_len=16, type_vocab_size=2)
    params = gc.random_params(cfg, s["seed"])
    rng = np.random.default_rng(s["seed"])
    ids = rng.integers(0, 11, (s["B"], s["n"]))
    H, _ = tnp.encoder_forward(params, cfg, input_ids=ids)
    ids_p = np.concatenate([ids, rng.integers(0, 11, (s["B"], n_pad))], axis=1)   # padding ids are arbitrary
    am = np.concatenate([np.ones_like(ids), np.zeros((s["B"], n_pad), dtype=int)], axis=1)
    Hp, _ = tnp.encoder_forward(params, cfg, input_ids=ids_p, attention_mask=am)
    assert np.max(np.abs(Hp[:, : s["n"]] - H)) < 1e-10


@settings(max_examples=20, deadline=None, derandomize=True)
@given(model_shapes(), st.booleans())
def test_gradcheck_stack_at_random_shapes(s, fast):
    """The stack's gradients by finite differences, on the fast path and on the plain one."""
    if s["act"] == "relu":
        s = {**s, "act": "gelu"}  # ReLU's kink can fall inside the stencil at random inputs
    cfg = _cfg(s)
    params = gc.random_params(cfg, s["seed"])
    rng = np.random.default_rng(s["seed"])
    arrays = {**params, "inputs_embeds": rng.standard_normal((s["B"], s["n"], s["d"]))}
    am = np.ones((s["B"], s["n"]), dtype=int)
    am[0, s["n"] // 2 + 1:] = 0

    def run(a):
        p = {k: v for k, v in a.items() if k != "inputs_embeds"}
        return tnp.encoder_forward(p, cfg, inputs_embeds=a["inputs_embeds"], attention_mask=am, fast=fast)

    r = gc.check_op("stack", run, lambda R, c: tnp.encoder_backward(R, c), arrays, seed=s["seed"], max_coords=4)
    assert r.max_rel_error < 1e-7, r.per_tensor


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 3), st.integers(1, 4), st.integers(0, 2**16))
def test_gradcheck_ops_at_random_shapes(B, n, h, dk, seed):
    rng = np.random.default_rng(seed)
    d = h * dk
    x = rng.standard_normal((B, n, d))
    mha = {k: rng.standard_normal((d, d)) / np.sqrt(d) for k in ("W_Q", "W_K", "W_V", "W_O")}
    mha.update({k: 0.3 * rng.standard_normal(d) for k in ("b_Q", "b_K", "b_V", "b_O")})

    def mha_back(R, c):
        dx, g = tnp.mha_backward(R, c)
        return {"x": dx, **g}

    checks = [
        gc.check_op("mha", lambda a: tnp.mha_forward(a["x"], a, h), mha_back, {"x": x.copy(), **mha},
                    seed=seed, max_coords=4),
        gc.check_op("ln", lambda a: tnp.layernorm_forward(a["x"], a["g"], a["b"], 1e-5),
                    lambda R, c: dict(zip(("x", "g", "b"), tnp.layernorm_backward(R, c))),
                    {"x": x.copy(), "g": 1 + rng.standard_normal(d), "b": rng.standard_normal(d)}, seed=seed),
        gc.check_op("softmax", lambda a: tnp.softmax_forward(a["x"]),
                    lambda R, c: {"x": tnp.softmax_backward(R, c)}, {"x": x.copy()}, seed=seed),
        gc.check_op("gelu", lambda a: tnp.gelu_forward(a["x"]),
                    lambda R, c: {"x": tnp.gelu_backward(R, c)}, {"x": 3 * x.copy()}, seed=seed),
    ]
    for r in checks:
        assert r.max_rel_error < 1e-7, (r.name, r.per_tensor)


@SETTINGS
@given(model_shapes())
def test_float32_agrees_with_float64(s):
    """Stated tolerance: 1e-4 absolute on LayerNorm-scaled outputs (float32 has ~7 digits)."""
    cfg = _cfg(s)
    p64 = gc.random_params(cfg, s["seed"])
    p32 = {k: v.astype(np.float32) for k, v in p64.items()}
    x = np.random.default_rng(s["seed"]).standard_normal((s["B"], s["n"], s["d"]))
    H64, _ = tnp.encoder_forward(p64, cfg, inputs_embeds=x)
    H32, _ = tnp.encoder_forward(p32, cfg, inputs_embeds=x.astype(np.float32))
    assert H32.dtype == np.float32
    assert np.max(np.abs(H32 - H64)) < 1e-4 * max(1.0, np.abs(H64).max())


@SETTINGS
@given(model_shapes(), st.integers(0, 2**16))
def test_forward_deterministic_given_seed(s, seed):
    cfg = _cfg(s).replace(dropout=0.2)
    params = gc.random_params(cfg, s["seed"])
    x = np.random.default_rng(s["seed"]).standard_normal((s["B"], s["n"], s["d"]))
    a, _ = tnp.encoder_forward(params, cfg, inputs_embeds=x, training=True, rng=np.random.default_rng(seed))
    b, _ = tnp.encoder_forward(params, cfg, inputs_embeds=x, training=True, rng=np.random.default_rng(seed))
    np.testing.assert_array_equal(a, b)   # exact: the same call with the same seed, one process
