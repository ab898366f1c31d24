"""Figures of the training-stability study (:mod:`transformer_np.course.stability`, notebook 04): drawing only.

The loss-curve figure is a grid — one panel per (initialisation, LayerNorm placement) — in which colour is the
warm-up condition and line style the seed, with chance level marked, so conditions and seeds read at a glance.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from ._style import figure, save, styled

__all__ = [
    "SEED_STYLES",
    "WARMUP_COLORS",
    "plot_layer_grad_norms",
    "plot_loss_curve",
    "plot_stability",
    "save_figures",
    "smooth",
]

WARMUP_COLORS = {0: "tab:red", 100: "tab:blue", 300: "tab:purple"}
SEED_STYLES = ("-", "--", ":", "-.")
INIT_NAMES = {"bert": r"BERT init $\mathcal{N}(0, 0.02^2)$", "xavier": "Xavier (Glorot) init"}
NORM_NAMES = {"post": "Post-LN", "pre": "Pre-LN"}
CHANCE = math.log(16)                       # the sort task's 16 symbols


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: skipping the figure (pip install 'transformer_np[plot]')",
              file=sys.stderr)
        return False
    return True


def _finish(fig, path):
    """Save to ``path`` (returning the path) or return the figure."""
    if path is None:
        return fig
    path = Path(path)
    return save(fig, str(path.parent), path.name)


def smooth(losses, window: int = 10) -> np.ndarray:
    """Trailing moving average over ``window`` steps (None/NaN entries stay NaN): the per-batch loss is noisy."""
    x = np.array([np.nan if v is None else v for v in losses], dtype=float)
    out = np.full_like(x, np.nan)
    for t in range(x.size):
        w = x[max(0, t - window + 1): t + 1]
        out[t] = np.mean(w) if np.all(np.isfinite(w)) else np.nan
    return out


@styled
def _loss_curve(history: dict, title: str):
    fig, ax = figure(figsize=(6.4, 3.9))
    ax.plot(history["step"], history["loss"], lw=0.8, label="training loss (per batch)")
    if history["eval"]["step"]:
        ax.plot(history["eval"]["step"], history["eval"]["loss"], "o-", ms=4, label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title(title, fontsize=10)
    ax.legend()
    return fig


def plot_loss_curve(history: dict, path: str | Path | None = None, title: str = ""):
    """Training loss per step (and held-out loss) as a Figure; saved as PNG when ``path`` is given (then the path
    is returned). None, with a message, when matplotlib is missing."""
    if not _have_matplotlib():
        return None
    return _finish(_loss_curve(history, title), path)


def _select(results: list[dict], layers: int, lr: float, warmups, steps: int | None = None) -> list[dict]:
    return [r for r in results if r["config"]["layers"] == layers and r["config"]["lr"] == lr
            and r["config"]["warmup"] in warmups and (steps is None or r["config"]["steps"] == steps)]


@styled
def _stability(results, layers, lr, warmups, window, steps):
    sel = _select(results, layers, lr, warmups, steps)
    inits = [i for i in ("bert", "xavier") if any(r["config"].get("init", "bert") == i for r in sel)]
    norms = [n for n in ("post", "pre") if any(r["config"]["norm"] == n for r in sel)]
    fig, axes = figure(len(inits), len(norms), figsize=(5.2 * len(norms), 3.3 * len(inits) + 0.8),
                       squeeze=False, sharex=True, sharey=True)
    seeds = sorted({r["config"]["seed"] for r in sel})
    for i, init in enumerate(inits):
        for j, norm in enumerate(norms):
            ax = axes[i, j]
            for r in sel:
                c = r["config"]
                if c.get("init", "bert") != init or c["norm"] != norm:
                    continue
                y = smooth(r["loss"], window)
                ax.plot(np.arange(y.size), y, SEED_STYLES[seeds.index(c["seed"]) % len(SEED_STYLES)],
                        color=WARMUP_COLORS.get(c["warmup"], "k"), lw=1.3)
                if r["diverged_at"] is not None:
                    ax.plot(r["diverged_at"], CHANCE, "x", color=WARMUP_COLORS.get(c["warmup"], "k"), ms=8)
            ax.axhline(CHANCE, color="gray", lw=0.8, ls=(0, (1, 2)))
            ax.set_title(f"{NORM_NAMES[norm]}, {INIT_NAMES[init]}", fontsize=10)
            ax.set_ylim(0, 3.2)
            if i == len(inits) - 1:
                ax.set_xlabel("step")
            if j == 0:
                ax.set_ylabel(f"training loss\n({window}-step average)")
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=WARMUP_COLORS.get(w, "k"), lw=2,
                      label="no warm-up" if w == 0 else f"warm-up {w} steps") for w in warmups]
    handles += [Line2D([], [], color="k", ls=SEED_STYLES[k % len(SEED_STYLES)], label=f"seed {s}")
                for k, s in enumerate(seeds)]
    handles.append(Line2D([], [], color="gray", lw=0.8, ls=(0, (1, 2)), label=f"chance ln 16 = {CHANCE:.2f}"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles))
    fig.suptitle(f"Sort task, {layers} layers, $d = 64$, Adam at a constant lr {lr:g} after the warm-up")
    return fig


def plot_stability(results: list[dict], path: str | Path | None = None, layers: int = 12, lr: float = 1e-3,
                   warmups=(0, 100), window: int = 10, steps: int | None = None):
    """Loss curves of the runs with the given depth, lr, warm-up lengths (and run length ``steps``, None = any):
    one panel per (init, norm), colour = warm-up, line style = seed. Returns the Figure (or the path when saved;
    None without matplotlib)."""
    if not _have_matplotlib():
        return None
    return _finish(_stability(results, layers, lr, warmups, window, steps), path)


@styled
def _layer_grad_norms(results, layers, lr, init, seed, steps, run_steps):
    sel = [r for r in _select(results, layers, lr, (0,), run_steps) if r["config"]["seed"] == seed
           and r["config"].get("init", "bert") == init]
    sel.sort(key=lambda r: r["config"]["norm"])              # post, pre
    fig, axes = figure(1, max(1, len(sel)), figsize=(4.6 * max(1, len(sel)), 3.8), sharey=True, squeeze=False)
    cmap = _viridis()
    for ax, r in zip(axes[0], sel):
        g = r["layer_grad_norms"]
        for k, t in enumerate(steps):
            if t < len(g) and all(x is not None for x in g[t]):
                ax.semilogy(np.arange(1, layers + 1), g[t], "o-", ms=3, color=cmap(k / max(1, len(steps) - 1)),
                            label=f"step {t}")
        ax.set_title(f"{NORM_NAMES[r['config']['norm']]}, no warm-up", fontsize=10)
        ax.set_xlabel(r"layer $\ell$")
    axes[0, 0].set_ylabel(r"$\|\partial L/\partial \theta_\ell\|$ (all weights of layer $\ell$)")
    if axes[0, -1].get_legend_handles_labels()[0]:
        axes[0, -1].legend()
    fig.suptitle(f"Per-layer gradient norm in the first steps: {layers} layers, {INIT_NAMES[init]}, lr {lr:g}, "
                 f"seed {seed}", fontsize=10)
    return fig


def _viridis():
    import matplotlib
    return matplotlib.colormaps["viridis"]


def plot_layer_grad_norms(results: list[dict], path: str | Path | None = None, layers: int = 12,
                          lr: float = 1e-3, seed: int = 0, steps=(0, 5, 10, 19), init: str = "xavier",
                          run_steps: int | None = 300):
    """‖∂L/∂θ_ℓ‖ against layer ℓ at a few early ``steps``, Post-LN and Pre-LN without
    warm-up (one panel each), from the runs of length ``run_steps``."""
    if not _have_matplotlib():
        return None
    return _finish(_layer_grad_norms(results, layers, lr, init, seed, steps, run_steps), path)


def save_figures(outdir: str | Path = "figures") -> list[str]:
    """figures/training_stability*.png and training_layer_grad_norms.png from the stored experiment
    (transformer_np/data/training_stability.json, shipped with the package) and figures/training_loss_curve.png
    from a short live run (deterministic)."""
    import json

    from ...training.loop import RunConfig, train
    from ..stability import STABILITY_JSON

    outdir = Path(outdir)
    written = []
    if STABILITY_JSON.is_file():                 # a source checkout: the stored experiment
        results = json.loads(STABILITY_JSON.read_text())["runs"]
        for p in (plot_stability(results, outdir / "training_stability.png", layers=12, lr=1e-3, steps=300),
                  plot_stability(results, outdir / "training_stability_lr1e-2.png", layers=12, lr=1e-2, steps=200),
                  plot_layer_grad_norms(results, outdir / "training_layer_grad_norms.png", layers=12, lr=1e-3)):
            if p:
                written.append(p)
    state = train(RunConfig(task="sort", layers=2, d_model=32, steps=150, warmup=20, lr=3e-3, seed=0,
                            eval_every=25))
    p = plot_loss_curve(state.history, outdir / "training_loss_curve.png",
                        "sort task, 2-layer Post-LN, d = 32, AdamW 3e-3, warm-up 20")
    if p:
        written.append(p)
    return written
