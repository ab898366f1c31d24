"""The worked-example trace against an independent plain-NumPy recomputation.

The reference below re-derives the two Post-LN layers from the formulas (Q K^T/sqrt(d),
row softmax, x + sublayer, (x - mu)/sqrt(var + eps), exact erf-GELU) with none of the
library's ops. Only the seeded weights are taken from ``trace_params``; the set-up the
article fixes (identities, zero biases, gamma = 1, beta = 0, the H^(0) table) is checked
here, not assumed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import assert_paths_close
from transformer_np.cli import main
from transformer_np.course import trace as tr
from transformer_np.model.params import sub_params

H0 = np.array([[1.0, 0.0, 1.0, 0.0],      # the   (the article's table)
               [0.0, 1.0, 0.0, 1.0],      # cat
               [1.0, 1.0, 0.0, 0.0]])     # sat
_erf = np.vectorize(math.erf)


# ----------------------------------------------------------------------------- reference
def _ln(x, g, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _softmax_rows(S):
    E = np.exp(S - S.max(axis=-1, keepdims=True))
    return E / E.sum(axis=-1, keepdims=True)


def ref_layer(H, p, eps, hide=None):
    """One Post-LN single-head layer in plain NumPy; ``hide`` (n, n) bool = masked keys."""
    Q, K, V = H @ p["attn.W_Q"] + p["attn.b_Q"], H @ p["attn.W_K"] + p["attn.b_K"], H @ p["attn.W_V"] + p["attn.b_V"]
    S = Q @ K.T / np.sqrt(H.shape[1])
    if hide is not None:
        S = np.where(hide, -np.inf, S)
    A = _softmax_rows(S)
    O = A @ V @ p["attn.W_O"] + p["attn.b_O"]
    R = H + O
    Z = _ln(R, p["ln1.gamma"], p["ln1.beta"], eps)
    u = Z @ p["ffn.W_1"] + p["ffn.b_1"]
    F = (0.5 * u * (1.0 + _erf(u / math.sqrt(2.0)))) @ p["ffn.W_2"] + p["ffn.b_2"]
    out = _ln(Z + F, p["ln2.gamma"], p["ln2.beta"], eps)
    return {"scores": S, "attention_weights": A, "attention_output": O, "residual": R, "layer_norm": Z,
            "ffn_output": F, "H": out}


def ref_stack(params, eps, hide=None, H=H0):
    layers = []
    for l in range(2):
        p = {k[len(f"layers.{l}."):]: v for k, v in params.items() if k.startswith(f"layers.{l}.")}
        layers.append(ref_layer(H, p, eps, hide))
        H = layers[-1]["H"]
    return layers


@pytest.fixture(scope="module")
def trace():
    return tr.run_trace()


@pytest.fixture(scope="module")
def ref(trace):
    return ref_stack(trace["params"], 1e-12)


# ----------------------------------------------------------------------------- set-up
def test_setup_is_the_articles(trace):
    assert np.array_equal(trace["H0"], H0)                          # exact: the article's table, copied through
    assert trace["tokens"] == ["the", "cat", "sat"]
    cfg = trace["config"]
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_ff) == (2, 4, 1, 16)
    assert cfg.norm_position == "post" and cfg.activation == "gelu" and cfg.layer_norm_eps == 1e-12
    p = trace["params"]
    for w in ("W_Q", "W_K", "W_V", "W_O"):
        assert np.array_equal(p[f"layers.0.attn.{w}"], np.eye(4))   # exact: set to I, not computed
        assert not np.allclose(p[f"layers.1.attn.{w}"], np.eye(4))      # layer 2 has its own weights
    for k, v in p.items():
        leaf = k.rsplit(".", 1)[-1]
        if leaf == "beta" or leaf.startswith("b_"):
            assert not v.any(), k
        if leaf == "gamma":
            assert np.array_equal(v, np.ones(4)), k                 # exact: set to 1, not computed
    assert p["layers.0.ffn.W_1"].shape == (4, 16) and p["layers.0.ffn.W_2"].shape == (16, 4)
    assert not np.allclose(p["layers.0.ffn.W_1"], p["layers.1.ffn.W_1"])


def test_params_are_seeded():
    a, b, c = tr.trace_params(seed=0), tr.trace_params(seed=0), tr.trace_params(seed=1)
    assert all(np.array_equal(a[k], b[k]) for k in a)               # exact: the same call twice, one process
    assert not np.array_equal(a["layers.0.ffn.W_1"], c["layers.0.ffn.W_1"])   # exact: another seed, other draws


def test_walk_check_tolerates_round_off_only(trace, monkeypatch):
    """The walk is checked against encoder_forward to round-off (the two paths may differ in the last bits
    on another CPU, BLAS kernel or thread count), and a real difference still stops the trace."""
    H = trace["layers"][1]["H"]
    ok, err, tol = tr._paths_agree(np.nextafter(H, np.inf), H, 16)
    assert ok and 0 < err <= tol
    assert not tr._paths_agree(H * (1 + 1e-9), H, 16)[0]
    real = tr.walk_layer

    def off_by_a_millionth(x, p, config, mask=None):
        out = real(x, p, config, mask)
        return {**out, "H": out["H"] * (1 + 1e-6)}

    monkeypatch.setattr(tr, "walk_layer", off_by_a_millionth)
    with pytest.raises(RuntimeError, match="walk of layer 1 differs from encoder_forward beyond round-off"):
        tr.run_trace()


# ----------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("key", ["scores", "attention_weights", "attention_output", "residual", "layer_norm",
                                 "ffn_output", "H"])
@pytest.mark.parametrize("layer", [0, 1])
def test_walk_matches_plain_numpy(trace, ref, key, layer):
    np.testing.assert_allclose(trace["layers"][layer][key], ref[layer][key], rtol=1e-12, atol=1e-12)


def test_H1_H2_match_plain_numpy(trace, ref):
    np.testing.assert_allclose(trace["H1"], ref[0]["H"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(trace["H2"], ref[1]["H"], rtol=1e-12, atol=1e-12)


def test_the_row_by_hand(trace):
    # softmax(1, 0, 0.5) written out, and the weighted sum of the H^(0) rows
    e = [math.exp(1.0), 1.0, math.exp(0.5)]
    w = [x / sum(e) for x in e]
    np.testing.assert_allclose(trace["layers"][0]["attention_weights"][0], w, rtol=1e-14)
    o = [w[0] + w[2], w[1] + w[2], w[0], w[1]]
    np.testing.assert_allclose(trace["layers"][0]["attention_output"][0], o, rtol=1e-14)
    np.testing.assert_allclose(trace["layers"][0]["residual"].mean(axis=1), 1.0, rtol=1e-14)


def test_other_eps_follows_reference():
    t = tr.run_trace(eps=1e-5)
    r = ref_stack(t["params"], 1e-5)
    np.testing.assert_allclose(t["H2"], r[1]["H"], rtol=1e-12, atol=1e-12)
    assert not np.allclose(t["H2"], tr.run_trace()["H2"], rtol=0, atol=1e-9)   # eps is really used


def test_causal_walk(trace):
    hide = np.triu(np.ones((3, 3), bool), k=1)
    r = ref_stack(trace["params"], 1e-12, hide)
    for l in range(2):
        A = trace["causal"]["layers"][l]["attention_weights"]
        assert np.all(A[hide] == 0.0)
        np.testing.assert_allclose(A, r[l]["attention_weights"], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(trace["causal"]["layers"][l]["H"], r[l]["H"], rtol=1e-12, atol=1e-12)
    assert trace["layers"][0]["attention_weights"][0, 2] > 0.25       # bidirectional: the -> sat


# ----------------------------------------------------------------------------- Jacobians
def _fd_jacobian(params, hide, depth, h=1e-6):
    """Central differences of H^(depth)_the w.r.t. every H^(0) entry: (d, n, d)."""
    J = np.zeros((4, 3, 4))
    for j in range(3):
        for i in range(4):
            Hp, Hm = H0.copy(), H0.copy()
            Hp[j, i] += h
            Hm[j, i] -= h
            fp = ref_stack(params, 1e-12, hide, Hp)[depth - 1]["H"][0]
            fm = ref_stack(params, 1e-12, hide, Hm)[depth - 1]["H"][0]
            J[:, j, i] = (fp - fm) / (2 * h)
    return J


@pytest.mark.parametrize("mask", ["full", "causal", "window"])
def test_jacobian_matches_finite_differences(trace, mask):
    n = np.arange(3)
    hide = {"full": None, "causal": n[None, :] > n[:, None],
            "window": np.abs(n[:, None] - n[None, :]) > 1}[mask]
    for depth in (1, 2):
        J = trace["jacobian"][mask][f"H{depth}"]
        np.testing.assert_allclose(J, _fd_jacobian(trace["params"], hide, depth), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(trace["jacobian_norms"][mask][f"H{depth}"],
                                   np.sqrt((J ** 2).sum(axis=(0, 2))), rtol=1e-14)


def test_reach_and_composition(trace):
    nrm = trace["jacobian_norms"]
    assert np.all(nrm["full"]["H1"] > 0) and np.all(nrm["full"]["H2"] > 0)   # one layer already reaches all
    assert np.all(nrm["causal"]["H1"][1:] == 0) and np.all(nrm["causal"]["H2"][1:] == 0)
    assert nrm["window"]["H1"][2] == 0.0 and nrm["window"]["H2"][2] > 1e-3    # depth widens reach


def test_hidden_jacobian_bad_input(trace):
    _, cache = tr._walk_stack(trace["params"], trace["config"], H0)
    with pytest.raises(ValueError, match="layer"):
        tr.hidden_jacobian(cache, 3)
    with pytest.raises(ValueError, match="position"):
        tr.hidden_jacobian(cache, 1, position=3)


# ----------------------------------------------------------------------------- errata
def test_compare_figure_rounding_rule():
    assert tr.compare_figure(0.44, 0.444999, 2)["agrees"]
    assert tr.compare_figure(0.44, 0.435001, 2)["agrees"]
    assert not tr.compare_figure(0.44, 0.4451, 2)["agrees"]
    assert not tr.compare_figure([1.0, 0.5], [1.0, 0.56], 1)["agrees"]
    assert tr.compare_figure([[1.0]], [[1.04]], 1)["agrees"]
    with pytest.raises(ValueError, match="shape"):
        tr.compare_figure([1.0, 2.0], [1.0], 1)
    with pytest.raises(ValueError, match="decimals"):
        tr.compare_figure(1.0, 1.0, -1)


def _ref_figure(key, ref):
    l1 = ref[0]
    return {"sqrt_d": math.sqrt(4), "scores": l1["scores"], "attention_weights[the]": l1["attention_weights"][0],
            "attention_output[the]": l1["attention_output"][0], "residual[the]": l1["residual"][0],
            "mean(residual[the])": l1["residual"][0].mean()}[key]


def test_errata_are_exactly_the_disagreeing_figures(trace, ref):
    expected = set()
    for key, _, article, dec in tr.ARTICLE_FIGURES:
        diff = np.max(np.abs(np.asarray(article, float) - np.asarray(_ref_figure(key, ref), float)))
        if diff > 0.5 * 10.0 ** -dec + 1e-9:
            expected.add(key)
    assert "attention_weights[the]" in expected and "scores" not in expected
    assert {e["quantity"] for e in trace["errata"]} == expected
    for e in trace["errata"]:
        assert {"quantity", "article", "computed", "note"} <= set(e)
        np.testing.assert_allclose(e["computed"], _ref_figure(e["quantity"], ref), rtol=1e-12)
        assert isinstance(e["note"], str) and len(e["note"]) > 40
    assert len(trace["comparisons"]) == len(tr.ARTICLE_FIGURES)


def test_premise_consistency(trace):
    # the article's weighted sum and residual follow from its own (wrong) weights; its mean does not
    fig = {k: np.asarray(v, float) for k, _, v, _ in tr.ARTICLE_FIGURES}
    own_sum = fig["attention_weights[the]"] @ H0
    own_res = fig["attention_output[the]"] + H0[0]
    by_key = {e["quantity"]: e for e in trace["errata"]}
    assert by_key["attention_output[the]"]["consistent_with_article_premise"] == bool(
        np.allclose(own_sum, fig["attention_output[the]"], atol=0.005))
    assert by_key["residual[the]"]["consistent_with_article_premise"] == bool(
        np.allclose(own_res, fig["residual[the]"], atol=0.005))
    assert by_key["mean(residual[the])"]["consistent_with_article_premise"] == bool(
        abs(fig["residual[the]"].mean() - fig["mean(residual[the])"]) <= 0.005)
    assert by_key["attention_output[the]"]["consistent_with_article_premise"] is True
    assert by_key["mean(residual[the])"]["consistent_with_article_premise"] is False


def test_claims_hold(trace):
    assert len(trace["claims"]) >= 5
    assert all(c["holds"] for c in trace["claims"]), [c for c in trace["claims"] if not c["holds"]]


# ----------------------------------------------------------------------------- CLI and JSON
def test_cli_json_keys_and_values(capsys, ref):
    assert main(["trace", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    required = ["tokens", "scores", "attention_weights", "attention_output", "residual", "layer_norm",
                "ffn_output", "H1", "H2", "errata"]
    assert all(k in d for k in required)
    assert d["tokens"] == ["the", "cat", "sat"]
    for k in ["scores", "attention_weights", "attention_output", "residual", "layer_norm", "ffn_output"]:
        assert len(d[k]) == 3
        np.testing.assert_allclose(d[k], ref[0][k], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(d["H1"], ref[0]["H"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(d["H2"], ref[1]["H"], rtol=1e-12, atol=1e-12)
    assert all({"quantity", "article", "computed", "note"} <= set(e) for e in d["errata"])
    assert d["setup"]["layer_norm_eps"] == 1e-12


def test_cli_text_rounding(capsys, ref):
    assert main(["trace"]) == 0
    out = capsys.readouterr().out
    w = ref[0]["attention_weights"][0]
    assert f"{w[0]:.2f}" in out and "ERRATA" in out and "DIFFERS" in out
    assert main(["trace", "--full"]) == 0
    assert repr(float(w[0])) in capsys.readouterr().out
    assert main(["trace", "--precision", "5"]) == 0
    assert f"{w[2]:.5f}" in capsys.readouterr().out


def test_cli_bad_arguments(capsys):
    assert main(["trace", "--precision", "99"]) == 2
    assert "precision" in capsys.readouterr().err
    assert main(["trace", "--eps", "0"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["trace", "--precision", "2", "--full"])
    assert exc.value.code == 2


def test_python_dash_m_exit_code():
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(tr.__file__)))))
    p = subprocess.run([sys.executable, "-m", "transformer_np", "trace", "--json"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["errata"]) >= 1


def test_window_mask_and_walk_bad_input(trace):
    m = tr.window_mask(4, 1)
    assert (m == 0).sum() == 10 and m[0, 2] < -1e300
    with pytest.raises(ValueError, match="width"):
        tr.window_mask(3, -1)
    p = sub_params(trace["params"], "layers.0.")
    with pytest.raises(ValueError, match=r"\(B, n, d_model\)"):
        tr.walk_layer(H0, p, trace["config"])                       # (n, d): the batch axis is required
    with pytest.raises(ValueError, match=r"\(B, n, d_model\)"):
        tr.walk_layer(np.zeros((1, 3, 5)), p, trace["config"])
    with pytest.raises(TypeError, match="config"):
        tr.walk_layer(H0[None], p, {"n_heads": 1})


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("heads", [1, 2])
def test_walk_layer_shows_every_head_and_batch_item(norm, heads):
    """walk_layer on a batch of 2 with 2 heads, Post-LN and Pre-LN: every head's scores and weights, every
    batch item, and the output equal to encoder_layer_forward's (the walk is the layer)."""
    from transformer_np import encoder_layer_forward, init_params
    cfg = tr.trace_config().replace(n_layers=1, n_heads=heads, norm_position=norm, final_layer_norm=False)
    params = init_params(cfg, seed=3, init="xavier")
    p = sub_params(params, "layers.0.")
    x = np.random.default_rng(0).normal(size=(2, 3, 4))
    w = tr.walk_layer(x, p, cfg)
    out, cache = encoder_layer_forward(x, p, cfg)
    # two paths: the walk runs the plain ops, encoder_layer_forward the fast kernels (k = d_ff, the longest sum)
    assert_paths_close(w["H"], out, paths=("walk", "encoder_layer_forward"), k=16)
    assert w["scores"].shape == w["attention_weights"].shape == (2, heads, 3, 3)
    assert_paths_close(w["attention_weights"], cache["attn"]["attn"]["weights"],
                       paths=("walk", "encoder_layer_forward"), k=16)
    dk = 4 // heads
    for b in range(2):
        for i in range(heads):
            cols = slice(i * dk, (i + 1) * dk)
            a_in = x[b] if norm == "post" else w["layer_norm"][b]
            Q = a_in @ p["attn.W_Q"][:, cols] + p["attn.b_Q"][cols]
            K = a_in @ p["attn.W_K"][:, cols] + p["attn.b_K"][cols]
            np.testing.assert_allclose(w["scores"][b, i], Q @ K.T / np.sqrt(dk), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w["residual"], x + w["attention_output"], rtol=0, atol=0)  # exact: the same sum
    if norm == "pre":
        assert "layer_norm2" in w
        np.testing.assert_array_equal(w["ffn_residual"], w["H"])   # exact: Pre-LN's H is the residual sum itself
    else:
        assert "layer_norm2" not in w


# ----------------------------------------------------------------------------- figures
def test_save_figures_deterministic(tmp_path):
    pytest.importorskip("matplotlib", reason="pip install matplotlib")
    a = tr.save_figures(str(tmp_path / "a"))
    b = tr.save_figures(str(tmp_path / "b"))
    assert [os.path.basename(p) for p in a] == [os.path.basename(p) for p in b]
    assert all(os.path.basename(p).startswith("trace_") and p.endswith(".png") for p in a)
    for pa, pb in zip(a, b):
        data = open(pa, "rb").read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert data == open(pb, "rb").read()
