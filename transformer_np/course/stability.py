"""The warm-up experiment: which runs, how one is run and summarised (notebook 04, scripts/run_training_stability.py).

Drawn by :mod:`transformer_np.course.plots.stability`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from .._compat import forward_moved as _forward_moved
from ..training.loop import RunConfig, train

__all__ = ["stability_grid", "run_stability_one", "run_stability", "stability_table", "find_row", "CHANCE", "STALLED",
           "STABILITY_JSON", "STABILITY_BASE", "INITS", "NORMS"]

# package data: `figures` from an installed wheel draws the training-stability figures from it too
STABILITY_JSON = Path(__file__).resolve().parents[1] / "data" / "training_stability.json"


# ----------------------------------------------------------------------------- the warm-up experiment
# Post-LN vs Pre-LN, with and without warm-up (notebook 04, scripts/run_training_stability.py).
STABILITY_BASE = dict(task="sort", d_model=64, heads=4, batch_size=16, eval_every=50, eval_batches=4,
                      weight_decay=0.0, schedule="constant", grad_norm_steps=20)


INITS = ("bert", "xavier")
NORMS = ("post", "pre")


def _block(layers: int, lr: float, steps: int, seeds, warmups=(0, 100), norms=NORMS, inits=INITS) -> list[dict]:
    return [dict(STABILITY_BASE, layers=layers, lr=lr, init=init, norm=norm, warmup=warmup, seed=seed, steps=steps)
            for init in inits for norm in norms for warmup in warmups for seed in seeds]


def stability_grid(full: bool = True) -> list[dict]:
    """The runs of the warm-up experiment, as RunConfig keyword dicts (sort task, d = 64, h = 4, batch 16,
    Adam β = (0.9, 0.999), ε = 1e-8, constant lr after a linear warm-up, float32).

    full=True (the stored run: 79 runs, ~17,000 12-layer-step equivalents), every block for both
    initialisations ``init`` ∈ {bert: N(0, 0.02²), xavier: Glorot-uniform} and seeds {0, 1, 2}:
      A. N = 12, lr = 1e-3: {post, pre} × warm-up {0, 100}, 300 steps;
      B. N = 12, lr = 1e-2: {post, pre} × warm-up {0, 100}, 200 steps;
      C. N ∈ {2, 6}, lr = 1e-2, Post-LN: warm-up {0, 100}, 200 steps;
      D. N = 12, lr = 1e-2, Post-LN, a long warm-up (300 steps of 400);
      E. N = 12, lr = 1e-3, Post-LN, xavier, no warm-up, seed 0, 1,000 steps (does the stall end?).
    full=False (notebook 04's live check, a few seconds): the first 10 steps of block A's Xavier runs, seed 0
      ({post, pre} × warm-up {0, 100}) — the start of a stored run must come out the same here.
    """
    if not full:
        return [dict(kw, steps=10, eval_every=10) for kw in _block(12, 1e-3, 300, (0,), inits=("xavier",))]
    seeds = (0, 1, 2)
    runs = _block(12, 1e-3, 300, seeds)                                              # A
    runs += _block(12, 1e-2, 200, seeds)                                             # B
    for layers in (2, 6):                                                            # C
        runs += _block(layers, 1e-2, 200, seeds, norms=("post",))
    runs += _block(12, 1e-2, 400, seeds, warmups=(300,), norms=("post",))            # D
    runs += _block(12, 1e-3, 1000, (0,), warmups=(0,), norms=("post",), inits=("xavier",))   # E
    return runs


def _round(xs, digits=5):
    return [None if not math.isfinite(x) else round(x, digits) for x in xs]


def run_stability_one(kw: dict) -> dict:
    """Train one run of the grid and keep what the notebook plots (losses rounded to 5 decimals)."""
    t0 = time.perf_counter()
    state = train(RunConfig(**kw))
    h = state.history
    tail = [x for x in h["loss"][-20:] if math.isfinite(x)]
    return {"config": state.cfg.to_dict(), "loss": _round(h["loss"]), "eval_step": h["eval"]["step"],
            "eval_loss": _round(h["eval"]["loss"]), "eval_accuracy": _round(h["eval"]["accuracy"], 4),
            "layer_grad_norms": [_round(r, 7) for r in h["layer_grad_norms"]],
            "diverged_at": h["diverged_at"], "final_loss": round(float(np.mean(tail)), 4) if tail else None,
            "final_accuracy": round(h["eval"]["accuracy"][-1], 4) if h["eval"]["accuracy"] else None,
            "seconds": round(time.perf_counter() - t0, 1)}


def run_stability(runs: list[dict], workers: int = 1) -> list[dict]:
    """Run every configuration (in ``workers`` processes; results in the grid's order)."""
    if workers <= 1:
        return [run_stability_one(kw) for kw in runs]
    import multiprocessing as mp
    with mp.get_context("spawn").Pool(workers) as pool:
        return pool.map(run_stability_one, runs, chunksize=1)


CHANCE = math.log(16)        # the sort task's chance loss: 16 equally likely symbols
STALLED = 2.0                # a final loss above this (72 % of chance) counts as "stalled near chance"


def stability_table(results: list[dict]) -> list[dict]:
    """One row per condition (layers, lr, init, norm, warm-up, steps), seeds aggregated: final training loss
    (mean of the last 20 steps) and held-out accuracy per seed, their mean, min and max, and how many seeds
    stalled (final loss > :data:`STALLED`, or diverged). Runs stored before 0.2 have no ``init``: BERT's."""
    rows: dict = {}
    for r in results:
        c = r["config"]
        init = c.get("init", "bert")
        key = (c["layers"], c["lr"], init, c["norm"], c["warmup"], c["steps"])
        row = rows.setdefault(key, {"layers": c["layers"], "lr": c["lr"], "init": init, "norm": c["norm"],
                                    "warmup": c["warmup"], "steps": c["steps"], "seeds": [], "final_loss": [],
                                    "final_accuracy": []})
        row["seeds"].append(c["seed"])
        row["final_loss"].append(r["final_loss"])
        row["final_accuracy"].append(r["final_accuracy"])
    for row in rows.values():
        losses = [x for x in row["final_loss"] if x is not None]
        row["loss_mean"] = round(float(np.mean(losses)), 4) if losses else None
        row["loss_min"] = min(losses) if losses else None
        row["loss_max"] = max(losses) if losses else None
        row["stalled"] = sum(x is None or x > STALLED for x in row["final_loss"])
    return list(rows.values())


def find_row(table: list[dict], **conditions) -> dict:
    """The one row of :func:`stability_table` matching every ``conditions`` item (ValueError otherwise)."""
    hits = [r for r in table if all(r[k] == v for k, v in conditions.items())]
    if len(hits) != 1:
        raise ValueError(f"expected exactly one stability row for {conditions}, found {len(hits)}")
    return hits[0]


# Moved in 0.2: the figures to transformer_np.course.plots.stability.
__getattr__ = _forward_moved(__name__, {n: "transformer_np.course.plots.stability" for n in (
    "plot_loss_curve", "save_figures", "plot_stability", "plot_layer_grad_norms")})
