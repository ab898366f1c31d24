"""Op-level parity with PyTorch: every building block, forward and backward.

Each op gets random inputs, random parameters (LayerNorm γ/β and biases too, never 1/0)
and a *random* upstream gradient R, so the backward is checked on a generic direction.
Criterion: the norm-relative error ‖ours − torch‖ / ‖torch‖ ≤ 1e-10 in float64 (outputs
and every gradient); ≤ 1e-5 for float32 outputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import nrel

pytestmark = pytest.mark.torch  # test lane (pyproject.toml markers)

torch = pytest.importorskip("torch", reason="parity tests need PyTorch: pip install torch==2.13.0 "
                                            "(or pip install -e '.[test]')")
F = torch.nn.functional

from transformer_np import (  # noqa: E402
    activation_backward,
    activation_forward,
    layernorm_backward,
    layernorm_forward,
    linear_backward,
    linear_forward,
    mha_backward,
    mha_forward,
    padding_mask,
    softmax_backward,
    softmax_forward,
)

TOL = {np.float64: 1e-10, np.float32: 1e-5}
TORCH_DTYPE = {np.float64: torch.float64, np.float32: torch.float32}




def leaf(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(a, requires_grad=True)


@pytest.fixture
def g():
    return np.random.default_rng(20240603)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_linear_vs_F_linear(g, dtype):
    x, W, b = g.normal(size=(2, 5, 6)), g.normal(size=(6, 4)), g.normal(size=4)   # ours: y = x W + b
    x, W, b = (a.astype(dtype) for a in (x, W, b))
    y, cache = linear_forward(x, W, b)
    xt, Wt, bt = leaf(x), leaf(W.T.copy()), leaf(b)                            # nn.Linear.weight = Wᵀ
    yt = F.linear(xt, Wt, bt)
    assert nrel(y, yt) <= TOL[dtype]
    if dtype is np.float64:
        R = g.normal(size=y.shape)
        dx, dW, db = linear_backward(R, cache)
        yt.backward(torch.tensor(R))
        assert nrel(dx, xt.grad) <= 1e-10
        assert nrel(dW, Wt.grad.T) <= 1e-10
        assert nrel(db, bt.grad) <= 1e-10


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_softmax_vs_torch(g, dtype):
    x = (3.0 * g.normal(size=(2, 3, 4, 7))).astype(dtype)
    s, cache = softmax_forward(x)
    xt = leaf(x)
    st = torch.softmax(xt, dim=-1)
    assert nrel(s, st) <= TOL[dtype]
    if dtype is np.float64:
        R = g.normal(size=s.shape)
        st.backward(torch.tensor(R))
        assert nrel(softmax_backward(R, cache), xt.grad) <= 1e-10


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_layernorm_vs_nn_LayerNorm(g, dtype, eps):
    d = 8
    x = (2.0 + 1.5 * g.normal(size=(3, 5, d))).astype(dtype)                   # nonzero mean on purpose
    gamma, beta = (1.0 + 0.3 * g.normal(size=d)).astype(dtype), (0.3 * g.normal(size=d)).astype(dtype)
    ln = torch.nn.LayerNorm(d, eps=eps, dtype=TORCH_DTYPE[dtype])
    with torch.no_grad():
        ln.weight.copy_(torch.tensor(gamma))
        ln.bias.copy_(torch.tensor(beta))
    y, cache = layernorm_forward(x, gamma, beta, eps)
    xt = leaf(x)
    yt = ln(xt)
    assert nrel(y, yt) <= TOL[dtype]
    if dtype is np.float64:
        R = g.normal(size=y.shape)
        dx, dgamma, dbeta = layernorm_backward(R, cache)
        yt.backward(torch.tensor(R))
        assert nrel(dx, xt.grad) <= 1e-10
        assert nrel(dgamma, ln.weight.grad) <= 1e-10
        assert nrel(dbeta, ln.bias.grad) <= 1e-10


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("ours, theirs", [("gelu", lambda t: F.gelu(t, approximate="none")),
                                          ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh")),
                                          ("relu", F.relu)], ids=["gelu-none", "gelu-tanh", "relu"])
def test_activation_vs_torch(g, dtype, ours, theirs):
    # Wide range (|z| up to ~12) so both tails of GELU are exercised.
    z = (4.0 * g.normal(size=(4, 50))).astype(dtype)
    a, cache = activation_forward(z, ours)
    zt = leaf(z)
    at = theirs(zt)
    assert nrel(a, at) <= TOL[dtype]
    if dtype is np.float64:
        R = g.normal(size=a.shape)
        at.backward(torch.tensor(R))
        assert nrel(activation_backward(R, cache), zt.grad) <= 1e-10


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_mha_vs_nn_MultiheadAttention_with_key_padding_mask(g, dtype):
    B, n, d, h = 3, 6, 8, 2
    mha = torch.nn.MultiheadAttention(d, h, dropout=0.0, bias=True, batch_first=True, dtype=TORCH_DTYPE[dtype])
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(torch.tensor(0.5 * g.normal(size=tuple(p.shape))))           # biases random too
    Wqkv = mha.in_proj_weight.detach().numpy()                                    # (3d, d) = [W_Qᵀ; W_Kᵀ; W_Vᵀ]
    bqkv = mha.in_proj_bias.detach().numpy()
    p = {"W_Q": Wqkv[:d].T.copy(), "W_K": Wqkv[d:2 * d].T.copy(), "W_V": Wqkv[2 * d:].T.copy(),
         "b_Q": bqkv[:d].copy(), "b_K": bqkv[d:2 * d].copy(), "b_V": bqkv[2 * d:].copy(),
         "W_O": mha.out_proj.weight.detach().numpy().T.copy(), "b_O": mha.out_proj.bias.detach().numpy().copy()}
    x = g.normal(size=(B, n, d)).astype(dtype)
    am = np.ones((B, n), dtype=np.int64)
    am[1, 4:] = 0
    am[2, 1:] = 0                                                                 # one real token only
    out, cache = mha_forward(x, p, h, padding_mask(am, dtype))
    xt = leaf(x)
    ot, wt = mha(xt, xt, xt, key_padding_mask=torch.tensor(am == 0), need_weights=True,
                 average_attn_weights=False)
    real = am.astype(bool)
    # Padded *queries* still attend (to the real keys) in both: compare them separately.
    assert nrel(out[real], ot[torch.tensor(real)]) <= TOL[dtype]
    assert nrel(out[~real], ot[torch.tensor(~real)]) <= TOL[dtype]
    assert nrel(cache["attn"]["weights"], wt) <= TOL[dtype]                       # A: (B, h, n, n)
    assert np.all(cache["attn"]["weights"][..., ~real[0]] == 0)                   # no weight on padding keys
    if dtype is np.float64:
        R = g.normal(size=out.shape)
        dx, grads = mha_backward(R, cache)
        ot.backward(torch.tensor(R))
        assert nrel(dx, xt.grad) <= 1e-10
        gw = mha.in_proj_weight.grad.numpy()
        gb = mha.in_proj_bias.grad.numpy()
        for s in "QV":                                                            # b_K: see below
            k = "QKV".index(s)
            assert nrel(grads["W_" + s], gw[k * d:(k + 1) * d].T) <= 1e-10
            assert nrel(grads["b_" + s], gb[k * d:(k + 1) * d]) <= 1e-10
        assert nrel(grads["W_K"], gw[d:2 * d].T) <= 1e-10
        # ∂L/∂b_K = 0 exactly: b_K adds q·b_K to every score of a row, and softmax is invariant
        # to a per-row shift. Both frameworks return round-off; compare against ∂L/∂W_K's scale.
        scale = np.linalg.norm(grads["W_K"])
        assert np.linalg.norm(grads["b_K"]) <= 1e-10 * scale
        assert np.linalg.norm(gb[d:2 * d]) <= 1e-10 * scale
        assert nrel(grads["W_O"], mha.out_proj.weight.grad.T) <= 1e-10
        assert nrel(grads["b_O"], mha.out_proj.bias.grad) <= 1e-10
