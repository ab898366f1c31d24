"""The warm-up experiment (notebook 04, scripts/run_training_stability.py) and the training figures."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from ..training.loop import RunConfig, train

__all__ = ["plot_loss_curve", "save_figures", "stability_grid", "run_stability_one", "run_stability",
           "stability_table", "plot_stability", "plot_layer_grad_norms", "STABILITY_JSON", "STABILITY_BASE"]

STABILITY_JSON = Path(__file__).resolve().parents[2] / "notebooks" / "data" / "training_stability.json"


def _figure(figsize):
    """A matplotlib Figure that does not touch pyplot's global state or backend (None if not installed)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("matplotlib is not installed: skipping the figure (pip install matplotlib)", file=sys.stderr)
        return None
    return Figure(figsize=figsize, dpi=100)


def _save(fig, path) -> str:
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})       # no version/timestamp: byte-stable PNGs
    return str(path)


def plot_loss_curve(history: dict, path: str | Path | None = None, title: str = ""):
    """Training loss per step (and eval loss) as a Figure; saved as PNG when ``path`` is given
    (then the path is returned). None, with a message, when matplotlib is missing."""
    fig = _figure((6, 3.6))
    if fig is None:
        return None
    ax = fig.add_subplot()
    ax.plot(history["step"], history["loss"], lw=0.8, label="train (per batch)")
    if history["eval"]["step"]:
        ax.plot(history["eval"]["step"], history["eval"]["loss"], "o-", ms=3, label="eval")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title(title, fontsize=9)
    ax.legend()
    return _save(fig, path) if path is not None else fig


def save_figures(outdir: str | Path = "figures") -> list[str]:
    """figures/training_stability*.png and training_layer_grad_norms.png from the stored full run
    (notebooks/data/training_stability.json, when present) and figures/training_loss_curve.png from
    a short live run (deterministic)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    stored = STABILITY_JSON
    if stored.is_file():                      # a source checkout: the stored full run of the experiment
        results = json.loads(stored.read_text())["runs"]
        for p in (plot_stability(results, outdir / "training_stability.png", layers=12, lr=1e-3),
                  plot_stability(results, outdir / "training_stability_lr1e-2.png", layers=12, lr=1e-2),
                  plot_layer_grad_norms(results, outdir / "training_layer_grad_norms.png", layers=12, lr=1e-2)):
            if p:
                written.append(p)
    state = train(RunConfig(task="sort", layers=2, d_model=32, steps=150, warmup=20, lr=3e-3, seed=0,
                            eval_every=25))
    p = plot_loss_curve(state.history, outdir / "training_loss_curve.png",
                        "sort task, 2-layer Post-LN, d=32, AdamW 3e-3, warm-up 20")
    if p:
        written.append(p)
    return written



# ----------------------------------------------------------------------------- the warm-up experiment
# Post-LN vs Pre-LN, with and without warm-up (notebook 04, scripts/run_training_stability.py).
STABILITY_BASE = dict(task="sort", d_model=64, heads=4, batch_size=16, eval_every=50, eval_batches=4,
                      weight_decay=0.0, schedule="constant", grad_norm_steps=20)


def stability_grid(full: bool = True) -> list[dict]:
    """The runs of the warm-up experiment, as RunConfig keyword dicts (sort task, d = 64, Adam, fixed lr).

    full=True (the stored run, ~5,500 12-layer-step equivalents):
      A. N = 12, lr = 1e-3: {post, pre} × {warm-up 0, 100} × seeds {0, 1}, 300 steps;
      B. N = 12, {post, pre} × {0, 100}: lr = 3e-3 seed 0, 150 steps; lr = 1e-2 seeds {0, 1}, 200 steps;
      C. N ∈ {2, 6}, lr = 1e-2, Post-LN: warm-up {0, 100} × seeds {0, 1}, 200 steps;
      D. N = 12, lr = 1e-2, Post-LN, a long warm-up (300 steps of 400), seed 0.
    full=False (the notebook's live check): N = 12, lr = 1e-2, {post, pre} × {0, 100}, seed 0, 60 steps,
      warm-up 30 — enough to see whether an unwarmed Post-LN stack stalls.
    """
    runs = []
    if not full:
        for norm in ("post", "pre"):
            for warmup in (0, 30):
                runs.append(dict(STABILITY_BASE, layers=12, lr=1e-2, norm=norm, warmup=warmup, seed=0, steps=60,
                                 eval_every=30))
        return runs
    for seed in (0, 1):
        for norm in ("post", "pre"):
            for warmup in (0, 100):
                runs.append(dict(STABILITY_BASE, layers=12, lr=1e-3, norm=norm, warmup=warmup, seed=seed, steps=300))
    for lr, seeds, steps in ((3e-3, (0,), 150), (1e-2, (0, 1), 200)):
        for seed in seeds:
            for norm in ("post", "pre"):
                for warmup in (0, 100):
                    runs.append(dict(STABILITY_BASE, layers=12, lr=lr, norm=norm, warmup=warmup, seed=seed,
                                     steps=steps))
    for layers in (2, 6):
        for seed in (0, 1):
            for warmup in (0, 100):
                runs.append(dict(STABILITY_BASE, layers=layers, lr=1e-2, norm="post", warmup=warmup, seed=seed,
                                 steps=200))
    runs.append(dict(STABILITY_BASE, layers=12, lr=1e-2, norm="post", warmup=300, seed=0, steps=400))
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


def stability_table(results: list[dict]) -> list[dict]:
    """One row per condition (layers, lr, norm, warm-up), seeds aggregated:
    final training loss (mean of the last 20 steps) and eval accuracy per seed."""
    rows: dict = {}
    for r in results:
        c = r["config"]
        key = (c["layers"], c["lr"], c["norm"], c["warmup"])
        row = rows.setdefault(key, {"layers": c["layers"], "lr": c["lr"], "norm": c["norm"], "warmup": c["warmup"],
                                    "steps": c["steps"], "seeds": [], "final_loss": [], "final_accuracy": []})
        row["seeds"].append(c["seed"])
        row["final_loss"].append(r["final_loss"])
        row["final_accuracy"].append(r["final_accuracy"])
    return list(rows.values())


_COLORS = {("post", False): "tab:red", ("post", True): "tab:orange", ("pre", False): "tab:blue",
           ("pre", True): "tab:cyan"}


def _label(c: dict) -> str:
    return f"{c['norm']}-LN, " + (f"warm-up {c['warmup']}" if c["warmup"] else "no warm-up")


def plot_stability(results: list[dict], path: str | Path | None = None, layers: int = 12, lr: float = 1e-3,
                   warmups=(0, 100)):
    """Loss curves (left) and per-layer gradient norms at step 0 (right) of the runs with the given
    depth, lr and warm-up lengths — Post-LN vs Pre-LN, with/without warm-up, every seed. Returns the
    Figure (or the path when saved; None without matplotlib)."""
    fig = _figure((11, 3.8))
    if fig is None:
        return None
    ax1, ax2 = fig.subplots(1, 2)
    sel = [r for r in results if r["config"]["layers"] == layers and r["config"]["lr"] == lr
           and r["config"]["warmup"] in warmups]
    seen, seen_norm = set(), set()
    for r in sel:
        c = r["config"]
        key = (c["norm"], c["warmup"] > 0)
        loss = np.array([np.nan if x is None else x for x in r["loss"]])
        ax1.plot(np.arange(loss.size), loss, color=_COLORS[key], lw=0.7, alpha=0.8,
                 label=None if key in seen else _label(c))
        seen.add(key)
        if c["norm"] not in seen_norm and r["layer_grad_norms"]:    # step 0 is the same with or without warm-up
            ax2.semilogy(np.arange(1, layers + 1), r["layer_grad_norms"][0], "o-", color=_COLORS[(c["norm"], False)],
                         ms=3, label=f"{c['norm']}-LN (seed {c['seed']})")
            seen_norm.add(c["norm"])
    ax1.set_xlabel("step")
    ax1.set_ylabel("training cross-entropy")
    ax1.set_title(f"sort task, {layers} layers, d = 64, Adam lr {lr:g}")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("layer ℓ")
    ax2.set_ylabel("‖∂L/∂θ_ℓ‖ at step 0")
    ax2.set_title("per-layer gradient norm at initialisation")
    ax2.legend(fontsize=8)
    return _save(fig, path) if path is not None else fig


def plot_layer_grad_norms(results: list[dict], path: str | Path | None = None, layers: int = 12,
                          lr: float = 1e-2, seed: int = 0, steps=(0, 5, 10, 19)):
    """‖∂L/∂θ_ℓ‖ against layer ℓ at a few early steps, one panel per (norm, warm-up) condition."""
    sel = [r for r in results if r["config"]["layers"] == layers and r["config"]["lr"] == lr
           and r["config"]["seed"] == seed and r["config"]["warmup"] in (0, 100)]
    fig = _figure((3.0 * max(1, len(sel)), 3.2))
    if fig is None:
        return None
    axes = np.atleast_1d(fig.subplots(1, max(1, len(sel)), sharey=True))
    for ax, r in zip(axes, sel):
        g = r["layer_grad_norms"]
        for t in steps:
            if t < len(g) and all(x is not None for x in g[t]):
                ax.semilogy(np.arange(1, layers + 1), g[t], "o-", ms=2, label=f"step {t}")
        ax.set_title(_label(r["config"]), fontsize=9)
        ax.set_xlabel("layer ℓ")
    axes[0].set_ylabel(f"‖∂L/∂θ_ℓ‖  (lr {lr:g})")
    axes[0].legend(fontsize=7)
    return _save(fig, path) if path is not None else fig
