"""Issue 16, bounded cost: a tiny input asking for a huge size is refused before anything is allocated,
with the estimate and the limit in one line — within seconds and a few hundred MB (measured in a
fresh interpreter that reports its own time and peak RSS)."""

from __future__ import annotations

import time

import pytest

import transformer_np as tnp
from transformer_np.errors import InputValueError, ResourceLimitError
from transformer_np.model import budget


def _assert_quick_and_small(rep, error="ResourceLimitError"):
    assert rep["error"] == error, rep
    assert rep["seconds"] < 5, rep
    assert rep["max_rss_mb"] < 300, rep


@pytest.mark.parametrize("call", [
    "init_params(EncoderConfig(n_layers=10**7, d_model=4, n_heads=2, d_ff=8))",
    "init_params(EncoderConfig(n_layers=1, d_model=10**9, n_heads=1, d_ff=4))",
    "init_params(EncoderConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16, vocab_size=10**12))",
])
def test_init_params_refuses_up_front(probe, call):
    rep = probe(f"""
        from transformer_np import EncoderConfig, init_params
        {call}
    """)
    _assert_quick_and_small(rep)
    assert "init_params would need an estimated" in rep["message"] and "nothing was allocated" in rep["message"]
    assert "more than the limit of 7.45 GiB (TRANSFORMER_NP_MAX_BYTES=8G)" in rep["message"]


@pytest.mark.parametrize("argv", [
    ["train", "--layers", "100000"],
    ["train", "--batch-size", "1000000000"],
    ["train", "--seq-len", "1000000"],
    ["train", "--d-model", "100000"],
    ["gradflow", "--depth", "100000"],
    ["gradflow", "--n", "1000000"],
    ["gradflow", "--batch", "1000000000"],
    ["gradflow", "--d-model", "100000"],
])
def test_cli_refuses_huge_sizes_in_one_line(probe, tmp_path, argv):
    argv = argv + (["--out", str(tmp_path / "out"), "--quiet"] if argv[0] == "train" else [])
    rep = probe(f"""
        import contextlib, io
        from transformer_np.cli import main
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            out["exit"] = main({argv!r})
        out["message"] = err.getvalue()
    """)
    assert rep["error"] is None and rep["exit"] == 2, rep
    lines = rep["message"].strip().splitlines()
    assert len(lines) == 1 and "would need an estimated" in lines[0] and "Traceback" not in rep["message"], rep
    assert rep["seconds"] < 5 and rep["max_rss_mb"] < 300, rep
    assert not (tmp_path / "out" / "checkpoint.npz").exists()


def test_gradflow_api_refuses_before_building_the_stack(probe):
    rep = probe("""
        from transformer_np.course.gradflow import measure
        measure("pre", 100000)
    """)
    _assert_quick_and_small(rep)
    assert rep["message"].startswith("gradflow would need")


@pytest.mark.parametrize("tol", ["nan", "-1", "inf"])
def test_gradcheck_tol_is_checked(refused_cli, tol):
    line = refused_cli("gradcheck", f"--tol={tol}")
    assert "--tol must be a finite number >= 0" in line


def test_count_parameters_of_any_depth_is_instant():
    one = tnp.EncoderConfig(n_layers=1, d_model=8, n_heads=2, d_ff=32)
    t0 = time.perf_counter()
    n = tnp.count_parameters(one.replace(n_layers=10**9))               # used to build a 16e9-entry table
    assert time.perf_counter() - t0 < 0.1
    assert n == 10**9 * tnp.count_parameters(one)


def test_count_parameters_equals_the_sum_of_init_params():
    for cfg in [tnp.EncoderConfig.bert_base(n_layers=2), tnp.EncoderConfig(3, 8, 2, 16, norm_position="pre"),
                tnp.EncoderConfig(2, 8, 2, 12, share_layers=True, vocab_size=11, type_vocab_size=3,
                                  positional="sinusoidal")]:
        params = tnp.init_params(cfg)
        assert tnp.count_parameters(cfg) == sum(a.size for a in params.values())
        assert budget.encoder_param_entries(cfg) == len(params)
        no_emb = sum(a.size for k, a in params.items() if not k.startswith("embeddings."))
        assert tnp.count_parameters(cfg, embeddings=False) == no_emb


def test_the_limit_can_be_raised_and_lowered(monkeypatch):
    cfg = tnp.EncoderConfig(n_layers=2, d_model=64, n_heads=2, d_ff=256)
    need = budget.estimate_encoder(cfg, "float64").total
    monkeypatch.setenv("TRANSFORMER_NP_MAX_BYTES", str(need - 1))
    with pytest.raises(ResourceLimitError, match=rf"TRANSFORMER_NP_MAX_BYTES={need - 1}"):
        tnp.init_params(cfg)
    monkeypatch.setenv("TRANSFORMER_NP_MAX_BYTES", str(need))
    assert len(tnp.init_params(cfg)) == 32                               # 16 per layer, no embeddings
    monkeypatch.delenv("TRANSFORMER_NP_MAX_BYTES")
    limit, source = budget.memory_limit()
    assert limit > 0 and ("available memory" in source or "default" in source)
    assert budget.memory_limit(12345) == (12345, "max_bytes")


@pytest.mark.parametrize("text, value", [("8G", 8 * 10**9), ("16GiB", 16 * 2**30), ("123", 123), ("2k", 2000),
                                         (" 1_000_000 ", 10**6), ("3MB", 3 * 10**6)])
def test_limit_syntax(monkeypatch, text, value):
    monkeypatch.setenv("TRANSFORMER_NP_MAX_BYTES", text)
    assert budget.memory_limit()[0] == value


@pytest.mark.parametrize("text", ["lots", "-5", "0", "1.5G", "8X", "G"])
def test_bad_limit_is_an_error_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv("TRANSFORMER_NP_MAX_BYTES", text)
    with pytest.raises(InputValueError, match="TRANSFORMER_NP_MAX_BYTES"):
        tnp.init_params(tnp.EncoderConfig(1, 4, 2, 8))
