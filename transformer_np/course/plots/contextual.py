"""Figures of the contextual-embedding study (:mod:`transformer_np.course.contextual`, notebook 03): drawing only.

Every function takes the :func:`~transformer_np.course.contextual.contextual_report` dict and returns a Figure.
"""

from __future__ import annotations

import numpy as np

from ..contextual import separation
from ._style import colorbar, figure, save, styled

__all__ = ["plot_bank_by_layer", "plot_heads", "plot_pooling", "plot_probes", "save_figures"]


def _layer_ticks(labels) -> list[str]:
    """'E_tok', 'H^(3)' → mathtext."""
    out = []
    for lab in labels:
        if lab == "E_tok":
            out.append(r"$E_{tok}$")
        elif lab.startswith("H^("):
            out.append(f"$H^{{({lab[3:-1]})}}$")
        else:
            out.append(lab)
    return out


@styled
def plot_bank_by_layer(report: dict):
    """Mean cosine of the "bank" vectors within a sense and across senses, per depth."""
    fig, ax = figure(figsize=(6.8, 3.9))
    x = np.arange(len(report["layers"]))
    ax.plot(x, report["bank_similarity"]["within"], "o-", label="same sense (river–river, money–money)")
    ax.plot(x, report["bank_similarity"]["across"], "s-", label="different sense (river–money)")
    ax.set_xticks(x, _layer_ticks(report["layers"]))
    ax.set_xlabel("depth")
    ax.set_ylabel('mean cosine of the "bank" vectors')
    ax.set_title('"bank": one static vector, separated by the context')
    ax.legend()
    return fig


@styled
def plot_pooling(report: dict):
    """Cosine matrices of the 8 "bank" sentences: the [CLS] vector vs mean pooling of H^(N)."""
    fig, axes = figure(1, 2, figsize=(9.4, 4.4))
    senses = report["senses"]
    ticks = [f"{s}{i}" for i, s in enumerate(senses)]
    for ax, key, title in zip(axes, ("cls_cosine", "mean_cosine"),
                              (r"[CLS] vector of $H^{(N)}$", r"mean pooling of $H^{(N)}$")):
        C = report[key]
        im = ax.imshow(C, vmin=0, vmax=1, cmap="viridis")
        ax.set_title(f"{title}\nwithin − across sense = {separation(C, senses):.3f}", fontsize=10)
        ax.set_xticks(range(len(C)), ticks, rotation=45)
        ax.set_yticks(range(len(C)), ticks)
    colorbar(fig, im, list(axes), "cosine similarity", shrink=0.85)
    return fig


def _head_title(report: dict, name: str, layer: int, head: int) -> str:
    """What the head does, with the numbers that back it (no overstatement)."""
    A = report["attentions"][layer][head]
    title = f"layer {layer + 1}, head {head}: {name}"
    mean = {"previous token": lambda: A.diagonal(-1).mean(), "next token": lambda: A.diagonal(1).mean(),
            "[SEP] sink": lambda: A[:, -1].mean()}
    if name in mean:
        title += f" (mean weight {mean[name]():.2f})"
    if "→" in name:                                          # e.g. "'bank' → 'river'"
        q, k = (part.strip().strip("'") for part in name.split("→"))
        tok = report["attention_tokens"]
        row = report["attentions"][layer][head][tok.index(q)]
        top = int(np.argmax(row))
        title = (f"layer {layer + 1}, head {head}: '{q}' → '{k}' {row[tok.index(k)]:.2f}\n"
                 f"(largest in the upper layers; '{q}' → '{tok[top]}' {row[top]:.2f})")
    return title


@styled
def plot_heads(report: dict):
    """The attention maps of the heads chosen by :func:`~transformer_np.course.contextual.notable_heads`."""
    heads = report["heads"]
    ncols = min(len(heads), 2)
    nrows = -(-len(heads) // ncols)
    fig, axes = figure(nrows, ncols, figsize=(5.0 * ncols + 1.0, 5.0 * nrows), squeeze=False)
    tok = report["attention_tokens"]
    flat = list(axes.ravel())
    for ax, (name, (layer, head)) in zip(flat, heads.items()):
        im = ax.imshow(report["attentions"][layer][head], vmin=0, vmax=1, cmap="Blues")
        ax.set_title(_head_title(report, name, layer, head), fontsize=10)
        ax.set_xticks(range(len(tok)), tok, rotation=90)
        ax.set_yticks(range(len(tok)), tok)
    for ax in flat[len(heads):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("key (attended to)")
    for ax in axes[:, 0]:
        ax.set_ylabel("query")
    colorbar(fig, im, flat, "attention weight", shrink=0.6)
    fig.suptitle(f'all-MiniLM-L6-v2 on "{" ".join(tok[1:-1])}":\nfour heads chosen by a rule')
    return fig


@styled
def plot_probes(report: dict):
    """Left: noun/verb probe accuracy across words; right: within-word separation of two usages."""
    fig, axes = figure(1, 2, figsize=(10.5, 4.0))
    x = np.arange(len(report["layers"]))
    ticks = _layer_ticks(report["layers"])
    axes[0].plot(x, report["pos_probe"]["accuracy"], "o-", color="C2")
    axes[0].axhline(0.5, color="gray", lw=0.8, ls="--", label="chance")
    axes[0].set_title("noun vs verb, one nearest-centroid probe across 8 words\n(leave-one-out accuracy)",
                      fontsize=10)
    axes[0].set_ylim(-0.05, 1.05)
    axes[0].set_ylabel("accuracy")
    axes[0].legend()
    axes[1].plot(x, report["pos_probe"]["gap"], "o-", color="C2", label="noun vs verb use (syntax)")
    axes[1].plot(x, report["sense_probe"]["gap"], "s-", color="C3", label="two senses (semantics)")
    axes[1].set_title("same word, two usages: within − across cosine", fontsize=10)
    axes[1].set_ylabel("cosine gap")
    axes[1].legend()
    for ax in axes:
        ax.set_xticks(x, ticks)
        ax.set_xlabel("depth")
    return fig


def save_figures(outdir: str = "figures", model=None) -> list[str]:
    """Write figures/contextual_*.png (deterministic: float64, no randomness, fixed sizes)."""
    from ...io.pretrained import MODEL_NAME, load_pretrained
    from ..contextual import contextual_report

    report = contextual_report(model or load_pretrained(MODEL_NAME))
    return [save(plot_bank_by_layer(report), outdir, "contextual_bank_by_layer.png"),
            save(plot_pooling(report), outdir, "contextual_cls_vs_mean.png"),
            save(plot_heads(report), outdir, "contextual_attention_heads.png"),
            save(plot_probes(report), outdir, "contextual_syntax_semantics.png")]
