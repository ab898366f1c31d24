"""The one complexity study: one timing, one fit, one measured crossover, whatever name a caller uses."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_np import EncoderConfig
from transformer_np.course import anatomy, complexity
from transformer_np.perf import memory


def _rows(true):
    rows = ([{"n": n, "d": 256} for n in complexity.N_SWEEP["ns"]]
            + [{"n": 256, "d": d} for d in complexity.D_SWEEP["ds"]])
    F = complexity._features([r["n"] for r in rows], [r["d"] for r in rows])
    for r, t in zip(rows, F @ true):
        r["seconds"] = float(t)
    return rows


def test_the_anatomy_names_are_the_complexity_study():
    """0.1 had a second, wall-clock, forward-only fit in anatomy; its names now resolve to the one study."""
    assert anatomy.time_layer is complexity.time_layer
    assert anatomy.fit_complexity is complexity.fit_complexity
    assert anatomy.measure_complexity is complexity.measure


def test_fit_complexity_takes_config_pairs_and_agrees_with_fit():
    true = np.array([2e-11, 1e-11, 3e-9])
    rows = _rows(true)
    cfg = {d: EncoderConfig(n_layers=1, d_model=d, n_heads=max(1, d // 64), d_ff=4 * d) for d in {r["d"] for r in rows}}
    pairs = [(cfg[r["d"]], r["n"]) for r in rows]
    out = complexity.fit_complexity(pairs, [r["seconds"] for r in rows])
    ref = complexity.fit({"rows": rows})
    np.testing.assert_allclose([out["alpha"], out["beta"], out["gamma"]], true, rtol=1e-6)
    assert out["alpha"] == ref["alpha"] and out["beta"] == ref["beta"]   # exact: fit() on the same rows, one process
    assert out["model_crossover"] == 6 * 256                                # 2d + d_ff
    assert out["measured_crossover"] == complexity.crossover_measured(ref, 256)


def test_fit_complexity_rejects_a_config_the_features_do_not_model():
    bad = EncoderConfig(n_layers=1, d_model=16, n_heads=2, d_ff=40)
    with pytest.raises(ValueError, match="d_ff = 4"):
        complexity.fit_complexity([(bad, 8)], [1e-3])


def test_predict_is_the_fitted_model():
    true = np.array([2e-11, 1e-11, 3e-9])
    coef = complexity.fit({"rows": _rows(true)})
    t = complexity.predict(coef, [512], [256])
    f = complexity._features([512], [256])[0]
    assert t[0] == pytest.approx(f @ true, rel=1e-6)


def test_time_layer_is_cpu_time_of_forward_and_backward():
    t = complexity.time_layer(EncoderConfig(n_layers=1, d_model=16, n_heads=2, d_ff=64), 1, 8, repeats=1)
    assert 0.0 < t < 5.0
    with pytest.raises(TypeError, match="config must be an EncoderConfig"):
        complexity.time_layer("bert", 1, 8)
    with pytest.raises(ValueError, match="n"):
        complexity.time_layer(EncoderConfig(n_layers=1, d_model=16, n_heads=2, d_ff=64), 1, 0)


def test_measure_small_sweep_has_the_stored_format():
    data = complexity.measure(repeats=1, n_sweep={"d": 64, "ns": (8, 16)}, d_sweep={"n": 8, "ds": (64,)})
    assert [(r["n"], r["d"]) for r in data["rows"]] == [(8, 64), (16, 64), (8, 64)]
    assert all(r["seconds"] > 0 for r in data["rows"])
    assert set(complexity.load_measurements()) >= {"rows", "mode", "clock"}


def test_one_cache_walker():
    """anatomy.layer_activation_floats walks caches with perf.memory's walker (no private copy)."""
    assert not hasattr(anatomy, "_arrays") and not hasattr(anatomy, "_owner")
    cache = {"a": np.zeros(3), "b": [np.zeros(2), {"W": np.zeros(4)}]}
    assert [p for p, _ in memory.cache_arrays(cache)] == ["a", "b.0", "b.1.W"]
    assert memory.is_param_ref("b.1.W") and not memory.is_param_ref("b.0")
    v = np.zeros(6)[2:]
    assert memory.owner(v) is v.base
