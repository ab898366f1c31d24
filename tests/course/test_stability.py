"""The warm-up experiment: the init/betas/eps settings of a run, the grid, the table, the stored data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from transformer_np.cli import main
from transformer_np.course import stability
from transformer_np.model.params import init_params
from transformer_np.training.loop import RunConfig, build


def test_init_changes_only_the_encoder_matrices():
    bert = build(RunConfig(layers=2, d_model=16, heads=2, seed=3))
    xav = build(RunConfig(layers=2, d_model=16, heads=2, seed=3, init="xavier"))
    ref = init_params(xav.model_config, seed=3, dtype=np.float32, init="xavier")
    for name, a in xav.params.items():
        if name.startswith("layers.") and name.endswith(("W_Q", "W_K", "W_V", "W_O", "W_1", "W_2")):
            np.testing.assert_array_equal(a, ref[name])                 # exact: the same init_params draws
            limit = np.sqrt(6.0 / sum(a.shape))
            assert np.abs(a).max() <= limit and not np.array_equal(a, bert.params[name])   # exact: other draws
        else:                                                           # embeddings, biases, LN, head: unchanged
            np.testing.assert_array_equal(a, bert.params[name])         # exact: the same draws, unchanged


def test_betas_and_eps_reach_adamw_and_bad_values_are_refused():
    st = build(RunConfig(layers=1, d_model=8, heads=2, betas=(0.9, 0.98), eps=1e-9))
    assert st.opt.betas == (0.9, 0.98) and st.opt.eps == 1e-9
    with pytest.raises(ValueError, match="init"):
        RunConfig(init="glorot")
    with pytest.raises(ValueError, match="betas"):
        build(RunConfig(layers=1, d_model=8, heads=2, betas=(0.9, 1.5)))


def test_cli_flags(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--layers", "1", "--d-model", "8", "--heads", "2", "--steps", "2", "--eval-every", "2",
                 "--init", "xavier", "--betas", "0.9", "0.98", "--adam-eps", "1e-9", "--quiet", "--out", str(out)]) == 0
    cfg = json.loads((out / "loss_curve.json").read_text())["config"]
    assert cfg["init"] == "xavier" and cfg["betas"] == [0.9, 0.98] and cfg["eps"] == 1e-9
    with pytest.raises(SystemExit) as e:
        main(["train", "--init", "glorot", "--out", str(out)])
    assert e.value.code == 2 and "--init" in capsys.readouterr().err


def test_grid_covers_both_inits_both_norms_with_and_without_warmup_three_seeds():
    grid = stability.stability_grid(full=True)
    main_block = [g for g in grid if g["layers"] == 12 and g["lr"] == 1e-3 and g["steps"] == 300]
    cells = {(g["init"], g["norm"], g["warmup"]) for g in main_block}
    assert cells == {(i, n, w) for i in ("bert", "xavier") for n in ("post", "pre") for w in (0, 100)}
    for cell in cells:
        assert sorted(g["seed"] for g in main_block if (g["init"], g["norm"], g["warmup"]) == cell) == [0, 1, 2]
    for g in grid:
        RunConfig(**g)                                                  # every entry is a valid run
    assert len({json.dumps(g, sort_keys=True) for g in grid}) == len(grid)


def test_table_aggregates_seeds_and_counts_stalls():
    runs = [{"config": {"layers": 12, "lr": 1e-3, "init": "xavier", "norm": "post", "warmup": 0, "steps": 300,
                        "seed": s}, "final_loss": x, "final_accuracy": 0.1} for s, x in enumerate((2.5, 2.4, 0.9))]
    runs.append({"config": {"layers": 12, "lr": 1e-3, "norm": "post", "warmup": 0, "steps": 300, "seed": 0},
                 "final_loss": 0.3, "final_accuracy": 0.9})                # stored before 0.2: no init = BERT
    table = stability.stability_table(runs)
    x = stability.find_row(table, init="xavier")
    assert x["seeds"] == [0, 1, 2] and x["loss_mean"] == pytest.approx(1.9333, abs=1e-4)
    assert (x["loss_min"], x["loss_max"], x["stalled"]) == (0.9, 2.5, 2)
    assert stability.find_row(table, init="bert")["stalled"] == 0
    with pytest.raises(ValueError, match="exactly one"):
        stability.find_row(table, layers=12)


def test_the_stored_experiment_is_the_grid():
    """transformer_np/data/training_stability.json holds one run per grid entry, in the grid's order."""
    stored = json.loads(stability.STABILITY_JSON.read_text())
    grid = stability.stability_grid(full=True)
    assert len(stored["runs"]) == len(grid)
    for kw, r in zip(grid, stored["runs"]):
        assert {k: r["config"][k] for k in kw} == kw
    assert stored["table"] == json.loads(json.dumps(stability.stability_table(stored["runs"])))


def test_the_stored_runs_start_as_this_code_trains():
    """The first steps of a stored Xavier run come out the same here (training is a pure function of its config;
    later steps are chaotic, so only the start is compared)."""
    stored = json.loads(stability.STABILITY_JSON.read_text())["runs"]
    ref = next(r for r in stored if r["config"]["init"] == "xavier" and r["config"]["norm"] == "post"
               and r["config"]["layers"] == 12 and r["config"]["lr"] == 1e-3 and r["config"]["warmup"] == 0
               and r["config"]["seed"] == 0 and r["config"]["steps"] == 300)
    live = stability.run_stability_one(dict(ref["config"], steps=4, eval_every=4))
    np.testing.assert_allclose(live["loss"], ref["loss"][:4], atol=1e-3)
