"""Figures of the worked trace (:mod:`transformer_np.course.trace`): attention heatmaps and input sensitivity."""

from __future__ import annotations

import numpy as np

from ..trace import run_trace
from ._style import colorbar, figure, save, styled

__all__ = ["plot_attention", "plot_jacobian_norms", "save_figures"]


@styled
def plot_attention(trace: dict, layer: int = 1):
    """Heatmaps of layer ``layer``'s attention weights: bidirectional (encoder) vs causal."""
    if layer not in (1, 2):
        raise ValueError(f"layer must be 1 or 2, got {layer!r}")
    tok = trace["tokens"]
    mats = {"bidirectional (encoder, no mask)": trace["layers"][layer - 1]["attention_weights"],
            "causal mask (a decoder)": trace["causal"]["layers"][layer - 1]["attention_weights"]}
    fig, axes = figure(1, 2, figsize=(8, 3.6))
    for ax, (title, A) in zip(axes, mats.items()):
        im = ax.imshow(A, vmin=0, vmax=1, cmap="Blues")
        for i in range(A.shape[0]):
            for j in range(A.shape[1]):
                ax.text(j, i, f"{A[i, j]:.2f}", ha="center", va="center",
                        color="white" if A[i, j] > 0.6 else "black")
        ax.set_xticks(range(len(tok)), tok)
        ax.set_yticks(range(len(tok)), tok)
        ax.set_xlabel("key $j$ (attended to)")
        ax.set_title(title)
    axes[0].set_ylabel("query $i$")
    colorbar(fig, im, axes, "attention weight", shrink=0.8)
    fig.suptitle(f"Layer {layer} attention weights, 'the cat sat'")
    return fig


@styled
def plot_jacobian_norms(trace: dict):
    """Bars of |∂H^(ℓ)_the/∂H^(0)_j| for ℓ = 1, 2 under full, causal and ±1-window attention."""
    tok = trace["tokens"]
    fig, axes = figure(1, 3, figsize=(10, 3.6), sharey=True)
    x = np.arange(len(tok))
    titles = {"full": "full attention (encoder)", "causal": "causal mask", "window": "+/-1 window mask"}
    for ax, (mask, title) in zip(axes, titles.items()):
        for off, k in ((-0.2, "H1"), (0.2, "H2")):
            ax.bar(x + off, trace["jacobian_norms"][mask][k], width=0.4,
                   label=rf"layer {k[1]}: $\|\partial H^{{({k[1]})}}_{{the}} / \partial H^{{(0)}}_j\|_F$")
        ax.set_xticks(x, tok)
        ax.set_xlabel("input token $j$")
        ax.set_title(title)
    axes[0].set_ylabel("Frobenius norm")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2)
    fig.suptitle("How much the output for 'the' depends on each input token")
    return fig


def save_figures(outdir: str = "figures") -> list[str]:
    """Write the trace's figures as PNGs into ``outdir``; returns their paths (deterministic)."""
    trace = run_trace()
    return [save(plot_attention(trace, 1), outdir, "trace_attention_layer1.png"),
            save(plot_attention(trace, 2), outdir, "trace_attention_layer2.png"),
            save(plot_jacobian_norms(trace), outdir, "trace_input_sensitivity.png")]
