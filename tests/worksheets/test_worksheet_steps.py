"""Every worksheet step against the library's stack, plain NumPy (forward) and torch autograd (backward).

The step graph (transformer_np.worksheets.steps) computes each named intermediate on its own with
the library's ops; here it must agree with encoder_forward / encoder_backward on the same problem
(to 1e-12), with a plain-NumPy re-derivation of every forward quantity, and with torch autograd's
gradient of every intermediate (retain_grad), for Post-LN and Pre-LN, 1–2 layers and 1–2 heads.
"""

from __future__ import annotations

import numpy as np
import pytest
import sheet_helpers as sh

from transformer_np.model.encoder import encoder_backward, encoder_forward
from transformer_np.worksheets.band import Rounder
from transformer_np.worksheets.names import LIBRARY_PARAM, backward_names, forward_names
from transformer_np.worksheets.steps import DH_KEY, H0_KEY, evaluate

CONFIGS = [(norm, heads, layers) for norm in ("post", "pre") for heads in (1, 2) for layers in (1, 2)]


def _values(raw):
    ws, steps = sh.steps_of(raw)
    return ws, steps, evaluate(steps, {H0_KEY: ws.H0, DH_KEY: ws.dH})


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("norm,heads,layers", CONFIGS)
def test_steps_match_the_stack(norm, heads, layers, activation):
    raw = sh.problem(norm, heads, layers, backward=True, seed=heads + 2 * layers, activation=activation)
    ws, steps, v = _values(raw)
    cfg = ws.config()
    assert not cfg.use_final_layer_norm              # a worksheet's H^(N) is the residual stream itself (Pre-LN)
    P = ws.library_params()
    _, cache = encoder_forward(P, cfg, inputs_embeds=ws.H0[None])
    grads, dhidden = encoder_backward(ws.dH[None], cache, return_hidden_grads=True)
    for l in range(1, layers + 1):
        np.testing.assert_allclose(v[(l, "H")], cache["hidden_states"][l][0], rtol=0, atol=1e-12)
        for i, name in enumerate(sh_names("attention_weights", heads)):
            np.testing.assert_allclose(v[(l, name)], cache["attentions"][l - 1][0, i], rtol=0, atol=1e-12)
        for k, lib in LIBRARY_PARAM.items():
            np.testing.assert_allclose(v[(l, "d_" + k)], grads[f"layers.{l - 1}.{lib}"], rtol=0, atol=1e-12,
                                       err_msg=f"layer {l} d_{k}")
        np.testing.assert_allclose(v[(l, "d_H")], dhidden[l][0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(v[(1, "d_H0")], grads["inputs_embeds"][0], rtol=0, atol=1e-12)


def sh_names(base, heads):
    return [base] if heads == 1 else [f"{base}_head{i + 1}" for i in range(heads)]


@pytest.mark.parametrize("norm,heads,layers", CONFIGS)
def test_every_name_is_a_step_in_order(norm, heads, layers):
    ws, steps, _ = _values(sh.problem(norm, heads, layers, backward=True))
    got = [(s.layer, s.name) for s in steps]
    want = [(l, n) for l in range(1, layers + 1) for n in forward_names(norm, heads)]
    want += [(l, n) for l in range(layers, 0, -1) for n in backward_names(norm, heads, l)]
    assert got == want


def _ref_forward(H, p, norm, h, act, eps=1e-12):
    """One layer in plain NumPy, every named intermediate."""
    from math import erf, sqrt, tanh
    n, d = H.shape
    dk = d // h
    f = {"relu": lambda z: np.maximum(z, 0.0),
         "gelu": np.vectorize(lambda z: 0.5 * z * (1 + erf(z / sqrt(2)))),
         "gelu_tanh": np.vectorize(lambda z: 0.5 * z * (1 + tanh(sqrt(2 / np.pi) * (z + 0.044715 * z ** 3))))}[act]
    out = {}

    def ln(x, which, prefix):
        out[prefix + "_mean"] = x.mean(axis=1)
        out[prefix + "_var"] = x.var(axis=1)
        return sh.layer_norm(x, p[f"gamma{which}"], p[f"beta{which}"], eps)

    a_in = H if norm == "post" else ln(H, 1, "layer_norm")
    if norm == "pre":
        out["layer_norm"] = a_in
    Q, K, V = (a_in @ p[f"W_{c}"] + p[f"b_{c}"] for c in "QKV")
    out.update(Q=Q, K=K, V=V)
    ctx = []
    for i in range(h):
        cols = slice(i * dk, (i + 1) * dk)
        S = Q[:, cols] @ K[:, cols].T / np.sqrt(dk)
        A = sh.softmax_rows(S)
        sfx = "" if h == 1 else f"_head{i + 1}"
        out["scores" + sfx], out["attention_weights" + sfx] = S, A
        ctx.append(A @ V[:, cols])
    out["context"] = np.concatenate(ctx, axis=1)
    out["attention_output"] = out["context"] @ p["W_O"] + p["b_O"]
    out["residual"] = H + out["attention_output"]
    if norm == "post":
        out["layer_norm"] = f_in = ln(out["residual"], 1, "layer_norm")
        base = f_in
    else:
        out["layer_norm2"] = f_in = ln(out["residual"], 2, "layer_norm2")
        base = out["residual"]
    out["ffn_hidden"] = f_in @ p["W_1"] + p["b_1"]
    out["ffn_activation"] = f(out["ffn_hidden"])
    out["ffn_output"] = out["ffn_activation"] @ p["W_2"] + p["b_2"]
    out["residual2"] = base + out["ffn_output"]
    out["H"] = ln(out["residual2"], 2, "layer_norm2") if norm == "post" else out["residual2"]
    return out


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("norm,heads,layers", CONFIGS)
def test_forward_intermediates_match_plain_numpy(norm, heads, layers, activation):
    ws, steps, v = _values(sh.problem(norm, heads, layers, backward=True, seed=7, activation=activation))
    H = ws.H0
    for l in range(1, layers + 1):
        ref = _ref_forward(H, ws.params[l - 1], norm, heads, activation)
        assert set(ref) == set(forward_names(norm, heads))
        for name, val in ref.items():
            np.testing.assert_allclose(v[(l, name)], val, rtol=0, atol=1e-12, err_msg=f"layer {l} {name}")
        H = ref["H"]


@pytest.mark.parametrize("norm,heads,layers", CONFIGS)
def test_backward_intermediates_match_torch_autograd(norm, heads, layers):
    torch = pytest.importorskip("torch", reason="pip install 'transformer_np[torch]'")
    ws, steps, v = _values(sh.problem(norm, heads, layers, backward=True, seed=11, activation="gelu"))
    t = {}                                            # (layer, name) -> torch tensor that retains its grad
    P = [{k: torch.tensor(a, requires_grad=True) for k, a in p.items()} for p in ws.params]
    H0 = torch.tensor(ws.H0, requires_grad=True)
    H0.retain_grad()
    H, dk = H0, ws.d_k

    def keep(l, name, x):
        x.retain_grad()
        t[(l, name)] = x
        return x

    def ln(l, x, which, out):
        y = torch.nn.functional.layer_norm(x, (ws.d_model,), P[l - 1][f"gamma{which}"], P[l - 1][f"beta{which}"],
                                           ws.eps)
        return keep(l, out, y)

    for l in range(1, layers + 1):
        p = P[l - 1]
        a_in = H if norm == "post" else ln(l, H, 1, "layer_norm")
        Q, K, V = (keep(l, c, a_in @ p[f"W_{c}"] + p[f"b_{c}"]) for c in "QKV")
        ctx = []
        for i in range(heads):
            cols = slice(i * dk, (i + 1) * dk)
            sfx = "" if heads == 1 else f"_head{i + 1}"
            S = keep(l, "scores" + sfx, Q[:, cols] @ K[:, cols].T / dk ** 0.5)
            A = keep(l, "attention_weights" + sfx, torch.softmax(S, dim=-1))
            ctx.append(A @ V[:, cols])
        C = keep(l, "context", torch.cat(ctx, dim=1))
        O = keep(l, "attention_output", C @ p["W_O"] + p["b_O"])
        R = keep(l, "residual", H + O)
        if norm == "post":
            f_in = base = ln(l, R, 1, "layer_norm")
        else:
            f_in, base = ln(l, R, 2, "layer_norm2"), R
        Z1 = keep(l, "ffn_hidden", f_in @ p["W_1"] + p["b_1"])
        Z2 = keep(l, "ffn_activation", torch.nn.functional.gelu(Z1))
        F = keep(l, "ffn_output", Z2 @ p["W_2"] + p["b_2"])
        R2 = keep(l, "residual2", base + F)
        H = keep(l, "H", ln(l, R2, 2, "H") if norm == "post" else R2 * 1.0)
    (H * torch.tensor(ws.dH)).sum().backward()
    for l in range(1, layers + 1):
        for name in backward_names(norm, heads, l):
            base = name[2:]
            if base in LIBRARY_PARAM:
                ref = P[l - 1][base].grad
            elif base == "H0":
                ref = H0.grad
            else:
                ref = t[(l, base)].grad
            np.testing.assert_allclose(v[(l, name)], ref.numpy(), rtol=0, atol=1e-11, err_msg=f"layer {l} {name}")


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("norm,heads", [("post", 2), ("pre", 1)])
def test_hand_formulas_without_rounding_are_the_steps(norm, heads, activation):
    """Each step's hand-work formula (the band's model of the student's sub-steps) with no rounding gives
    the step's value — the library's ops — to 1e-10, on samples stacked along a leading axis."""
    ws, steps, v = _values(sh.problem(norm, heads, layers=2, backward=True, seed=3, d_ff=5, activation=activation))
    rd = Rounder(2, exact=True)
    for s in steps:
        got = s.hand(rd, *(np.stack([np.asarray(v[k])] * 2) for k in s.inputs))
        assert got.shape == (2,) + np.shape(v[s.key]), s.name
        np.testing.assert_allclose(got[1], v[s.key], rtol=0, atol=1e-10, err_msg=s.name)
