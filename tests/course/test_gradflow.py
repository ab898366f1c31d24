"""Gradient flow: qualitative facts at small scale (no seed-specific numbers).

The Jacobians are assembled from the library's hand-written VJPs and checked against
finite differences; the facts tested are structural (Pre-LN's identity path is exactly I,
the ∏ D(sI + J) expansion sums to the full Jacobian, Post-LN renormalises every layer, a
residual stack without LayerNorm grows) and hold for every seed tried.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import assert_paths_close
from transformer_np import encoder_backward, encoder_forward
from transformer_np.cli import main
from transformer_np.course import gradflow as gf

TINY = {"d_model": 8, "n_heads": 2, "d_ff": 16, "n": 3}
SMALL = {"d_model": 16, "n_heads": 2, "d_ff": 32, "n": 4, "batch": 2}


@pytest.mark.parametrize("variant", gf.VARIANTS)
@pytest.mark.parametrize("init", gf.INITS)
def test_vjp_jacobian_matches_finite_differences(variant, init):
    v = gf.jacobian_view(variant, 3, init, seed=2, dims=TINY)
    fd = gf.finite_difference_jacobian(v["x0"], v["params"], v["config"], variant)
    err = np.max(np.abs(fd - v["full"])) / np.max(np.abs(v["full"]))
    assert err < 1e-6, f"{variant}/{init}: Jacobian from VJPs differs from finite differences by {err:.2e}"


@pytest.mark.parametrize("variant", gf.VARIANTS)
def test_product_and_expansion_reproduce_the_full_jacobian(variant):
    v = gf.jacobian_view(variant, 4, "xavier", seed=1, dims=TINY)
    scale = np.max(np.abs(v["full"]))
    # per-sublayer matrices D (sI + J_B), multiplied, = the whole stack's backward
    assert np.max(np.abs(v["product"] - v["full"])) <= 1e-10 * scale
    # Σ_m E_m over path lengths m = 0 … 2L is the product; E_0 is the identity path
    assert len(v["orders"]) == 2 * 4 + 1
    assert np.max(np.abs(sum(v["orders"]) - v["full"])) <= 1e-10 * scale
    assert np.max(np.abs(v["orders"][0] - v["identity"])) <= 1e-12


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_identity_path_of_pre_ln_is_exactly_identity(seed):
    for init in gf.INITS:
        v = gf.jacobian_view("pre", 5, init, seed=seed, dims=TINY)
        assert np.array_equal(v["identity"], np.eye(v["identity"].shape[0]))   # exact: v passed through as is
        # and the full Jacobian is not: the branches contribute
        assert not np.allclose(v["full"], np.eye(v["full"].shape[0]))


def test_identity_path_of_the_other_variants():
    n, d = TINY["n"], TINY["d_model"]
    ident = gf.jacobian_view("no-layernorm", 3, "xavier", dims=TINY)["identity"]
    assert np.array_equal(ident, np.eye(n * d))   # exact: the skip path passes v through as is
    assert not np.any(gf.jacobian_view("no-residual", 3, "xavier", dims=TINY)["identity"])
    post = gf.jacobian_view("post", 3, "xavier", dims=TINY)["identity"]
    # Post-LN's skip path runs through the LayerNorms: not I, each LN kills 2 directions per token
    assert not np.allclose(post, np.eye(n * d))
    sig = np.linalg.svd(post, compute_uv=False)
    assert np.sum(sig < 1e-8 * sig[0]) >= 2 * n


def test_post_ln_jacobian_is_rank_deficient_by_the_layernorm_null_space():
    n, d = TINY["n"], TINY["d_model"]
    sig = gf.jacobian_view("post", 2, "bert", dims=TINY)["sigma"]
    # the output of a LN is shift- and scale-free per token: 2n singular values are 0
    assert np.all(sig[n * (d - 2):] < 1e-10 * sig[0])
    assert sig[n * (d - 2) - 1] > 1e-3 * sig[0]


def test_stack_forward_and_backward_match_the_library_encoder():
    for variant in ("pre", "post"):
        params, config = gf.make_stack(variant, 3, "xavier", 0, 16, 2, 32)
        H0 = np.random.default_rng(0).standard_normal((2, 4, 16))
        Hf, cache = gf.stack_forward(H0, params, config, variant)
        H, ecache = encoder_forward(params, config, inputs_embeds=H0)
        # two paths for Pre-LN's final LayerNorm (the course's plain op, the stack's fast kernel): round-off
        assert_paths_close(Hf, H, paths=("gradflow stack", "encoder_forward"), k=32)   # k = d_ff
        for a, b in zip(cache["hidden"], ecache["hidden_states"]):
            assert np.array_equal(a, b)   # exact: the same encoder_layer_forward calls on the same arrays
        dH = np.random.default_rng(1).standard_normal(H.shape)
        _, dhidden = encoder_backward(dH, ecache, return_hidden_grads=True)
        dL = dH if cache["final_ln"] is None else gf.layernorm_backward(dH, cache["final_ln"])[0]
        mine, _ = gf.backprop_hidden(dL, cache["layers"], "full")
        for a, b in zip(mine, dhidden):
            assert np.allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_residual_without_layernorm_grows_with_depth_under_xavier(seed):
    r = gf.measure("no-layernorm", 8, "xavier", seed, **SMALL)
    rms = np.array(r["rms_by_layer"])
    assert np.all(np.diff(rms) > 0), "activation RMS should increase at every layer"
    assert rms[-1] > 5 * rms[0]
    # and with LayerNorm on the residual stream (Post-LN) the scale is pinned at 1
    post = np.array(gf.measure("post", 8, "xavier", seed, **SMALL)["rms_by_layer"][1:])
    assert np.allclose(post, 1.0, atol=1e-6)


def test_bert_init_keeps_residual_only_stack_near_identity():
    """The growth without LayerNorm depends on the branch scale: under BERT's N(0, 0.02²) the same
    residual-only stack barely moves at initialisation (ledger A14's qualification)."""
    bert = np.array(gf.measure("no-layernorm", 24, "bert", 0, **SMALL)["rms_by_layer"])
    xav = np.array(gf.measure("no-layernorm", 24, "xavier", 0, **SMALL)["rms_by_layer"])
    assert bert[-1] < 1.1 * bert[0] and xav[-1] > 100 * xav[0]


@pytest.mark.parametrize("seed", [0, 1])
def test_probe_ratios_structure(seed):
    pre = gf.measure("pre", 6, "xavier", seed, probe_layer=2, **SMALL)
    assert pre["probe_identity_ratio"] == 1.0
    assert pre["identity_grad_norm_by_layer"] == [pre["grad_norm_by_layer"][-1]] * 7
    post = gf.measure("post", 6, "xavier", seed, probe_layer=2, **SMALL)
    ident = np.array(post["identity_grad_norm_by_layer"])
    assert 0 < post["probe_identity_ratio"] < 1
    assert np.all(np.diff(ident) > 0), "Post-LN's identity path shrinks at every LayerNorm it crosses"
    nores = gf.measure("no-residual", 6, "xavier", seed, probe_layer=2, **SMALL)
    assert nores["probe_identity_ratio"] == 0.0
    assert nores["probe_full_ratio"] > 0
    assert nores["token_cosine_by_layer"][-1] > 0.99  # LN without skips collapses the tokens


def test_pre_ln_last_layer_w2_gradient_falls_with_depth_under_xavier():
    # Xiong et al. (2020): Pre-LN's last-layer gradient shrinks as the residual stream grows
    for seed in (0, 1):
        shallow = gf.measure("pre", 2, "xavier", seed, **SMALL)
        deep = gf.measure("pre", 24, "xavier", seed, **SMALL)
        assert deep["rms_by_layer"][-1] > 2 * shallow["rms_by_layer"][-1]
        assert deep["w2_grad_norm_by_layer"][-1] < shallow["w2_grad_norm_by_layer"][-1]


def test_measure_lengths_and_errors():
    r = gf.measure("post", 5, "bert", 0, 3, **SMALL)
    assert len(r["grad_norm_by_layer"]) == 6 and len(r["rms_by_layer"]) == 6
    assert len(r["token_cosine_by_layer"]) == 6 and len(r["w2_grad_norm_by_layer"]) == 5
    assert r["probe_full_ratio"] == pytest.approx(r["grad_norm_by_layer"][3] / r["grad_norm_by_layer"][5])
    with pytest.raises(ValueError, match="variant"):
        gf.measure("mid", 3)
    with pytest.raises(ValueError, match="probe_layer"):
        gf.measure("pre", 3, probe_layer=4, **SMALL)
    with pytest.raises(ValueError, match="init"):
        gf.measure("pre", 3, init="he")
    with pytest.raises(ValueError, match="depth"):
        gf.measure("pre", 0)


def test_cli_json(capsys):
    rc = main(["gradflow", "--variant", "post", "--depth", "4", "--init", "xavier", "--seed", "0",
               "--probe-layer", "2", "--json", "--d-model", "16", "--heads", "2", "--d-ff", "32",
               "--n", "4", "--batch", "2"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key, length in (("grad_norm_by_layer", 5), ("w2_grad_norm_by_layer", 4), ("rms_by_layer", 5),
                        ("token_cosine_by_layer", 5)):
        assert len(out[key]) == length
    assert out["probe_layer"] == 2
    g = out["grad_norm_by_layer"]
    assert out["probe_full_ratio"] == pytest.approx(g[2] / g[4])
    assert 0 < out["probe_identity_ratio"] < 1


def test_cli_table_and_errors(capsys):
    assert main(["gradflow", "--variant", "pre", "--depth", "3", "--d-model", "16", "--heads", "2",
                 "--d-ff", "32", "--n", "4", "--batch", "2"]) == 0
    text = capsys.readouterr().out
    assert "probe layer K = 1" in text and "identity path only" in text
    assert main(["gradflow", "--depth", "4", "--probe-layer", "5"]) == 2
    assert "--probe-layer must lie in 0..4" in capsys.readouterr().err
    assert main(["gradflow", "--depth", "0"]) == 2
    assert "--depth" in capsys.readouterr().err
    assert main(["gradflow", "--d-model", "10", "--heads", "4", "--depth", "2"]) == 2
    assert "divisible" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["gradflow", "--variant", "sandwich"])
    assert e.value.code == 2


def test_save_figures_is_deterministic(tmp_path):
    pytest.importorskip("matplotlib", reason="pip install matplotlib")
    data = gf.compute_all(depths=(2, 4), jac_depth=3, exp_depth=2)
    a = gf.save_figures(str(tmp_path / "a"), data)
    b = gf.save_figures(str(tmp_path / "b"), data)
    assert len(a) == 8 and all(p.endswith(".png") for p in a)
    for p, q in zip(a, b):
        assert open(p, "rb").read() == open(q, "rb").read()


# ----------------------------------------------------------------------------- issue 38: one BLAS thread, progress
def _without_threadpoolctl(monkeypatch):
    import os
    import sys

    from transformer_np.course import _blas

    monkeypatch.setitem(sys.modules, "threadpoolctl", None)        # import threadpoolctl raises ImportError
    monkeypatch.setattr(_blas, "_warned", False)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def test_without_threadpoolctl_the_one_thread_wrapper_warns_once_and_says_what_to_install(monkeypatch):
    """It silently did nothing: notebook 02 then ran on every OpenBLAS thread (148-174 s instead of 34)."""
    from transformer_np.course import complexity

    _without_threadpoolctl(monkeypatch)
    with pytest.warns(RuntimeWarning, match=r"threadpoolctl is not installed") as seen:
        gf.measure("pre", 2, **SMALL)
        gf.probe_table(depth=2, probe_layer=1, seeds=(0,), variants=("pre",), inits=("xavier",), **SMALL)
        complexity.time_layer(complexity._config(8), 1, 4, repeats=1)         # the other study that limits threads
    assert len(seen) == 1, [str(w.message) for w in seen]                       # once per process, not per call
    assert "pip install threadpoolctl" in str(seen[0].message) and "notebooks" in str(seen[0].message)
    assert seen[0].filename == __file__                                         # points at the caller's line


def test_without_threadpoolctl_no_warning_when_one_thread_is_set_already(monkeypatch, recwarn):
    _without_threadpoolctl(monkeypatch)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    gf.measure("pre", 2, **SMALL)
    assert not [w for w in recwarn if "threadpoolctl" in str(w.message)]


def test_the_notebooks_extra_installs_threadpoolctl():
    import re
    from pathlib import Path

    try:
        import tomllib
    except ModuleNotFoundError:                                               # Python 3.10
        import tomli as tomllib
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["notebooks"]
    assert "threadpoolctl" in {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0] for r in extra}, extra


def test_probe_table_tells_each_row_it_starts_and_the_notebook_line_shows_it():
    import io

    from transformer_np.course.progress import progress_line

    seen = []
    rows = gf.probe_table(depth=2, probe_layer=1, seeds=(0, 1), variants=("pre", "post"), inits=("xavier",),
                          progress=lambda *a: seen.append(a), **SMALL)
    assert seen == [(i, 4, f"{r['variant']}, {r['init']} init, seed {r['seed']}") for i, r in enumerate(rows, 1)]
    out = io.StringIO()
    step = progress_line("probe table", out)
    for i in range(1, 13):
        step(i, 12, "ignored")
    assert out.getvalue() == "probe table, 12 steps: .........10..\n"
    with pytest.raises(TypeError, match="progress must be a callable"):
        gf.probe_table(depth=2, progress=3)
