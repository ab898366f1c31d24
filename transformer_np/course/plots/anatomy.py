r"""Figures of the anatomy study (:mod:`transformer_np.course.anatomy`, notebooks 05a/05b): drawing only.

Two diagrams (the Post-LN / Pre-LN wiring, one layer's data flow with its shapes) and the plots of the
study's numbers. In both diagrams the residual (skip) path is drawn in red, on its own lane beside the
main path, and enters its ``+`` from the side: it never runs along a box edge.
"""

from __future__ import annotations

import numpy as np

from ...model.config import EncoderConfig
from ...model.flops import crossover_n, layer_flops
from ..anatomy import (
    cls_attention,
    cls_gradient_map,
    compare_norm_positions,
    demo_config,
    figure2_maps,
    layer_shapes,
    parameter_budget,
    pitfall_no_layernorm,
)
from ._style import colorbar, figure, name, save, styled

__all__ = [
    "draw_cls",
    "draw_complexity_model",
    "draw_dependency_maps",
    "draw_layer_dataflow",
    "draw_no_layernorm",
    "draw_norm_comparison",
    "draw_param_budget",
    "draw_wiring",
    "save_figures",
]

SKIP = "#c0392b"           # the residual path
LN_C, SUB_C, IO_C, ATT_C = "#f9e79f", "#dde8f5", "#e8e8e8", "#fadbd8"


# ----------------------------------------------------------------------------- diagram primitives
def _box(ax, x, y, text, color, w=1.7, h=0.46, edge="black", fontsize=9):
    from matplotlib.patches import FancyBboxPatch
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02", fc=color, ec=edge, lw=0.9,
                                zorder=3))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, zorder=4)


def _plus(ax, x, y, r=0.17):
    from matplotlib.patches import Circle
    ax.add_patch(Circle((x, y), r, fc="white", ec="black", lw=0.9, zorder=3))
    ax.text(x, y, "+", ha="center", va="center", fontsize=12, zorder=4)


def _arrow(ax, x0, y0, x1, y1, color="black", lw=1.0):
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=2,
                arrowprops={"arrowstyle": "-|>", "lw": lw, "color": color, "shrinkA": 0, "shrinkB": 0})


def _skip(ax, y_from, y_to, x_lane, x_trunk=0.0, r_plus=0.17, label="skip"):
    """A residual connection: a dot on the main path at y_from, out to the lane x_lane, up, and into the
    side of the ``+`` at (x_trunk, y_to)."""
    ax.plot([x_trunk], [y_from], "o", color=SKIP, ms=5, zorder=5)
    ax.plot([x_trunk, x_lane, x_lane], [y_from, y_from, y_to], color=SKIP, lw=1.8, zorder=1,
            solid_joinstyle="round")
    side = r_plus if x_lane > x_trunk else -r_plus
    _arrow(ax, x_lane, y_to, x_trunk + side, y_to, color=SKIP, lw=1.8)
    ax.text(x_lane + (0.08 if x_lane > x_trunk else -0.08), (y_from + y_to) / 2, label, color=SKIP,
            rotation=90, va="center", ha="left" if x_lane > x_trunk else "right", fontsize=8)


def _stack(ax, steps, skips, title, lane=1.25):
    """steps: bottom-up list of (label, colour) with "+" for an addition node; skips: (from step, to "+" step)."""
    ys = [0.6 + 0.78 * k for k in range(len(steps))]
    for k, ((label, color), y) in enumerate(zip(steps, ys)):
        if label == "+":
            _plus(ax, 0.0, y)
        else:
            _box(ax, 0.0, y, label, color)
        if k:
            lo = ys[k - 1] + (0.17 if steps[k - 1][0] == "+" else 0.23)
            hi = y - (0.17 if label == "+" else 0.23)
            _arrow(ax, 0.0, lo, 0.0, hi)
    for a, b in skips:                       # branch just above step a (between a and a + 1)
        y_from = (ys[a] + ys[a + 1]) / 2
        _skip(ax, y_from, ys[b], lane, label="skip (identity)")
    ax.set_xlim(-1.3, 2.0)
    ax.set_ylim(0.1, ys[-1] + 0.5)
    ax.set_aspect("equal")                   # the "+" nodes stay circles
    ax.set_title(title, fontsize=10)
    ax.axis("off")


# ----------------------------------------------------------------------------- Figure 1
@styled
def draw_wiring():
    """Figure 1 (lesson): Post-LN vs Pre-LN wiring of one layer; red = the residual (skip) path."""
    fig, axes = figure(1, 2, figsize=(8.4, 6.0))
    post = [(r"$H^{(\ell-1)}$", IO_C), ("MHA", SUB_C), ("+", None), ("LayerNorm", LN_C), ("FFN", SUB_C),
            ("+", None), ("LayerNorm", LN_C), (r"$H^{(\ell)}$", IO_C)]
    pre = [(r"$H^{(\ell-1)}$", IO_C), ("LayerNorm", LN_C), ("MHA", SUB_C), ("+", None), ("LayerNorm", LN_C),
           ("FFN", SUB_C), ("+", None), (r"$H^{(\ell)}$" + "\n(final LN after layer N)", IO_C)]
    _stack(axes[0], post, [(0, 2), (3, 5)],
           "Post-LN (original, BERT): $\\mathrm{LN}(x + F(x))$\nthe skip path goes through every LayerNorm")
    _stack(axes[1], pre, [(0, 3), (3, 6)],
           "Pre-LN (modern): $x + F(\\mathrm{LN}(x))$\nthe skip path never meets a LayerNorm")
    return fig


@styled
def draw_norm_comparison(res: dict):
    """Mean row norm ‖H_i^(ℓ)‖ per layer, Post-LN vs the Pre-LN residual stream (same weights)."""
    fig, ax = figure(figsize=(6.4, 3.9))
    L = np.arange(len(res["post_norms"]))
    ax.plot(L, res["post_norms"], "o-", color="tab:red", label=r"Post-LN $H^{(\ell)}$")
    ax.plot(L, res["pre_norms"], "s-", color="tab:blue", label="Pre-LN residual stream (before the final LN)")
    ax.axhline(res["sqrt_d"], color="gray", ls=":", label=r"$\sqrt{d}$ (a LayerNorm output's norm, $\gamma=1$, "
                                                           r"$\beta=0$)")
    ax.set_xlabel(r"layer $\ell$")
    ax.set_ylabel(r"mean $\|H^{(\ell)}_i\|$")
    ax.set_title(f"Same weights, same $H^{{(0)}}$: the outputs differ by {100 * res['rel_diff']:.0f} %")
    ax.legend()
    return fig


# ----------------------------------------------------------------------------- one layer's data flow
_DATAFLOW_LABELS = {
    "H^(ℓ−1)": r"input $H^{(\ell-1)}$",
    "Q, K, V per head": r"$Q, K, V = H W_Q, H W_K, H W_V$, split into heads",
    "scores QKᵀ/√d_k": r"scores $S = Q K^\top / \sqrt{d_k}$",
    "softmax A": r"weights $A = \mathrm{softmax}(S)$",
    "A V (per head)": r"$A V$ per head",
    "concat heads": "concatenate the heads",
    "· W_O → MHA": r"MHA output $= \mathrm{concat}\, W_O$",
    "residual + LN": r"$Z = \mathrm{LN}(H^{(\ell-1)} + \mathrm{MHA})$",
    "residual": r"$Z = H^{(\ell-1)} + \mathrm{MHA}$",
    "· W_1 + b_1 → GELU": r"$\mathrm{GELU}(Z W_1 + b_1)$",
    "· W_2 + b_2 → FFN": r"FFN output $= \mathrm{GELU}(\ldots)\, W_2 + b_2$",
}


def _dataflow_label(step: str, k: int, last: int, post: bool) -> str:
    if k == last:
        return r"$H^{(\ell)} = \mathrm{LN}(Z + \mathrm{FFN})$" if post else r"$H^{(\ell)} = Z + \mathrm{FFN}$"
    return _DATAFLOW_LABELS.get(step, step)


@styled
def draw_layer_dataflow(shapes: list, config: EncoderConfig):
    """The article's "One encoder layer" figure, with the shape at each step (read off a real forward).

    The two residual connections run on two separate lanes on the left: from the layer input into the
    first addition, and from Z into the second."""
    fig, ax = figure(figsize=(7.6, 8.0))
    k_last = len(shapes) - 1
    ys = [0.5 + 0.78 * i for i in range(len(shapes))]
    post = config.norm_position == "post"
    add1 = next(i for i, (s, _) in enumerate(shapes) if s.startswith("residual"))
    for i, ((step, shape), y) in enumerate(zip(shapes, ys)):
        color = LN_C if i in (add1, k_last) else (ATT_C if step.startswith(("scores", "softmax")) else SUB_C)
        color = IO_C if i == 0 else color
        _box(ax, 0.0, y, _dataflow_label(step, i, k_last, post), color, w=3.3, h=0.5)
        ax.text(1.95, y, str(tuple(shape)), va="center", fontsize=9, family="monospace")
        if i:
            _arrow(ax, 0.0, ys[i - 1] + 0.25, 0.0, y - 0.25)
    for y_from, to, lane, label in (((ys[0] + ys[1]) / 2, add1, -2.05, "residual 1"),
                                    ((ys[add1] + ys[add1 + 1]) / 2, k_last, -2.45, "residual 2")):
        ax.plot([0.0], [y_from], "o", color=SKIP, ms=5, zorder=5)
        ax.plot([0.0, lane, lane], [y_from, y_from, ys[to]], color=SKIP, lw=1.8, zorder=1)
        _arrow(ax, lane, ys[to], -1.65, ys[to], color=SKIP, lw=1.8)
        ax.text(lane - 0.07, (y_from + ys[to]) / 2, label, color=SKIP, rotation=90, ha="right", va="center",
                fontsize=8)
    ax.text(1.95, ys[-1] + 0.5, "shape", fontsize=9, family="monospace", fontweight="bold")
    ax.set_xlim(-2.9, 3.6)
    ax.set_ylim(0.0, ys[-1] + 0.75)
    ax.set_aspect("equal")
    ax.axis("off")
    B, n = shapes[0][1][0], shapes[0][1][1]
    ax.set_title(f"One encoder layer ({'Post' if post else 'Pre'}-LN): $B = {B}$, $n = {n}$, $d = {config.d_model}$, "
                 f"$h = {config.n_heads}$, $d_k = {config.d_k}$, $d_{{ff}} = {config.d_ff}$", fontsize=10)
    return fig


# ----------------------------------------------------------------------------- Figure 2
@styled
def draw_dependency_maps(res: dict, floor_rel: float = 1e-4):
    """D_ij = ‖∂H_i^(ℓ) / ∂H_j^(0)‖_F per layer, full vs windowed attention, on one
    logarithmic colour scale (with its colorbar) from ``floor_rel``·max to max; exact zeros are white with a ×."""
    from matplotlib.colors import LogNorm

    full, win = res["full"], res["windowed"]
    N = full.shape[0]
    vmax = float(max(full.max(), win.max()))
    norm = LogNorm(vmin=vmax * floor_rel, vmax=vmax, clip=True)
    fig, axes = figure(2, N, figsize=(2.2 * N + 1.4, 5.0))
    rows = ((full, "full attention", res["reach_full"]), (win, f"window $\\pm{res['window']}$", res["reach_windowed"]))
    cmap = _cmap("viridis")
    for r, (maps, label, rch) in enumerate(rows):
        for ell in range(N):
            ax = axes[r, ell]
            M = np.ma.masked_equal(maps[ell], 0.0)
            im = ax.imshow(M, cmap=cmap, norm=norm, interpolation="nearest")
            yy, xx = np.nonzero(maps[ell] == 0)
            ax.scatter(xx, yy, marker="x", s=10, color="0.55", lw=0.7)
            ax.set_title(f"$\\ell = {ell + 1}$: reach {rch[ell]}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
            if ell == 0:
                ax.set_ylabel(f"{label}\noutput $i$")
            if r == 1:
                ax.set_xlabel("input $j$")
    colorbar(fig, im, axes, r"$\|\partial H^{(\ell)}_i / \partial H^{(0)}_j\|_F$ (log scale)", shrink=0.85)
    fig.suptitle("Reach is immediate with full attention; with a window it grows by one per layer "
                 "(× = exactly 0)", fontsize=10)
    return fig


def _cmap(name_: str):
    import matplotlib

    return matplotlib.colormaps[name_].with_extremes(bad="white")


# ----------------------------------------------------------------------------- Figure 3
def _cls_labels(att: dict) -> list[str]:
    n = att["weights"].shape[1]
    labels = ["[CLS]"] + [f"w{j}" for j in range(1, n)]
    labels = [lab if m else "[PAD]" for lab, m in zip(labels, att["attention_mask"])]
    real = [j for j, m in enumerate(att["attention_mask"]) if m]
    labels[real[-1]] = "[SEP]"
    return labels


@styled
def draw_cls(att: dict, grad: dict):
    """Attention from position 0 per layer (left) and the classifier's gradient per layer and position (right)."""
    fig, axes = figure(1, 2, figsize=(10.0, 3.8))
    labels = _cls_labels(att)
    n = len(labels)
    W = att["weights"]
    im = axes[0].imshow(W, cmap="Blues", vmin=0, interpolation="nearest", aspect="auto")
    axes[0].set_yticks(range(W.shape[0]), [f"layer {i + 1}" for i in range(W.shape[0])])
    axes[0].set_xticks(range(n), labels, rotation=45)
    axes[0].set_title("attention from position 0 ([CLS]), mean over heads")
    colorbar(fig, im, axes[0], "attention weight")
    G = grad["grad_norms"]
    im = axes[1].imshow(G, cmap="Reds", vmin=0, interpolation="nearest", aspect="auto")
    axes[1].set_yticks(range(G.shape[0]), [f"$H^{{({i})}}$" for i in range(G.shape[0])])
    axes[1].set_xticks(range(n), labels, rotation=45)
    axes[1].set_title(r"$\|\partial\,\mathrm{logit}/\partial H^{(\ell)}_j\|$: the head reads position 0")
    colorbar(fig, im, axes[1], "gradient norm")
    return fig


# ----------------------------------------------------------------------------- pitfalls, budget, cost
@styled
def draw_no_layernorm(res: dict):
    """Mean ‖H_i^(ℓ)‖ per layer: residual-only (no LN), Pre-LN residual stream, Post-LN."""
    fig, ax = figure(figsize=(6.4, 3.9))
    L = np.arange(len(res["no_ln"]))
    ax.semilogy(L, res["no_ln"], "o-", ms=3, color="tab:purple", label="residual only (no LayerNorm)")
    ax.semilogy(L, res["pre_ln"], "s-", ms=3, color="tab:blue", label="Pre-LN residual stream")
    ax.semilogy(L, res["post_ln"], "^-", ms=3, color="tab:red", label=r"Post-LN (pinned at $\sqrt{d}$)")
    ax.set_xlabel(r"layer $\ell$")
    ax.set_ylabel(r"mean $\|H^{(\ell)}_i\|$")
    ax.set_title("Pitfall: residuals alone do not bound the activation scale")
    ax.legend()
    return fig


BUDGET_PARTS = ("ffn_weights", "attn_weights", "ffn_biases", "attn_biases", "layernorm")


@styled
def draw_param_budget(budgets: dict):
    """Per-layer parameters by part, one group of bars per model, on a log axis so that the biases and the
    LayerNorms (13d together) are visible next to the weights (12d²)."""
    fig, ax = figure(figsize=(7.6, 4.0))
    models = list(budgets)
    h = 0.8 / len(models)
    colors = dict(zip(BUDGET_PARTS, ("tab:green", "tab:blue", "tab:olive", "tab:cyan", "tab:orange")))
    for m, model in enumerate(models):
        b = budgets[model]
        ys = np.arange(len(BUDGET_PARTS)) + (m - (len(models) - 1) / 2) * h
        vals = [b[p] for p in BUDGET_PARTS]
        ax.barh(ys, vals, height=h * 0.9, color=[colors[p] for p in BUDGET_PARTS], alpha=1.0 if m == 0 else 0.55,
                edgecolor="black", lw=0.5)
        for y, v in zip(ys, vals):
            ax.text(v * 1.15, y, f"{v:,}  ({model})", va="center", fontsize=8)
    ax.set_yticks(range(len(BUDGET_PARTS)), [name(p) for p in BUDGET_PARTS])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(1e3, 6e7)
    ax.set_xlabel("parameters per layer (log scale)")
    tot = "; ".join(f"{m}: {budgets[m]['per_layer']:,} = {budgets[m]['per_layer_over_12d2']:.4f}$\\cdot 12d^2$"
                    for m in models)
    ax.set_title(f"Per layer: $8d^2$ FFN + $4d^2$ attention + $13d$ biases and LayerNorms\n{tot}", fontsize=9)
    return fig


@styled
def draw_complexity_model(configs: dict):
    """FLOP model per layer (batch 1) against n for each config, with the crossover n* = 2d + d_ff marked."""
    fig, ax = figure(figsize=(6.8, 4.2))
    ns = np.unique(np.logspace(4, 15, 60, base=2).astype(int))
    for i, (label, cfg) in enumerate(configs.items()):
        f = [layer_flops(cfg, 1, int(n)) for n in ns]
        att = np.array([x["attention_scores"] for x in f], dtype=float)
        lin = np.array([x["projections"] + x["ffn"] for x in f], dtype=float)
        color = f"C{i}"
        ax.loglog(ns, att, "-", color=color, label=f"{label}: attention $4n^2d$")
        ax.loglog(ns, lin, "--", color=color, label=f"{label}: projections + FFN $8nd^2 + 4nd\\,d_{{ff}}$")
        n_star = crossover_n(cfg)
        ax.axvline(n_star, color=color, ls=":", lw=0.8)
        ax.text(n_star, 0.05 + 0.08 * i, f" $n^* = {n_star:.0f}$", color=color, fontsize=9,
                transform=ax.get_xaxis_transform())                  # x in data, y in axes fraction
    ax.set_xlabel("sequence length $n$")
    ax.set_ylabel("forward FLOPs per layer")
    ax.set_title(r"$O(n^2 d + n d^2)$: the quadratic term takes over at $n^* = 2d + d_{ff}$")
    ax.legend(fontsize=8, loc="upper left")
    return fig


def save_figures(outdir: str = "figures") -> list[str]:
    """Draw every figure of notebooks 05a/05b into ``outdir`` (PNG, fixed seeds and sizes, the same bytes on
    every run). The measured-timing figure is :mod:`transformer_np.course.plots.complexity`'s."""
    cfg = demo_config("post", 1, 8, n_heads=2)
    budgets = {"BERT-base": parameter_budget(EncoderConfig.bert_base()),
               "BERT-large": parameter_budget(EncoderConfig.bert_large())}
    return [save(draw_wiring(), outdir, "anatomy_wiring_post_vs_pre.png"),
            save(draw_norm_comparison(compare_norm_positions()), outdir, "anatomy_post_vs_pre_norms.png"),
            save(draw_layer_dataflow(layer_shapes(cfg, 2, 5), cfg), outdir, "anatomy_layer_dataflow.png"),
            save(draw_dependency_maps(figure2_maps()), outdir, "anatomy_dependency_maps.png"),
            save(draw_cls(cls_attention(), cls_gradient_map()), outdir, "anatomy_cls_summary.png"),
            save(draw_no_layernorm(pitfall_no_layernorm()), outdir, "anatomy_pitfall_no_layernorm.png"),
            save(draw_param_budget(budgets), outdir, "anatomy_parameter_budget.png"),
            save(draw_complexity_model({"BERT-base": EncoderConfig.bert_base(),
                                        "BERT-large": EncoderConfig.bert_large()}),
                 outdir, "anatomy_complexity_flops.png")]
