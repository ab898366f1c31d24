"""Figures of the worked trace (:mod:`transformer_np.course.trace`): attention heatmaps and input sensitivity."""

from __future__ import annotations

import os

import numpy as np

from ..trace import run_trace

__all__ = ["plot_attention", "plot_jacobian_norms", "save_figures"]


def _pyplot():
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the trace figures need matplotlib: pip install 'transformer_np[plot]' "
                          "(or pip install matplotlib)") from e
    import matplotlib.pyplot as plt   # the backend is the caller's (headless machines fall back to Agg)
    return plt


def plot_attention(trace: dict, layer: int = 1):
    """Heatmaps of layer ``layer``'s attention weights: bidirectional (encoder) vs causal."""
    plt = _pyplot()
    if layer not in (1, 2):
        raise ValueError(f"layer must be 1 or 2, got {layer!r}")
    tok = trace["tokens"]
    mats = {"bidirectional (encoder, no mask)": trace["layers"][layer - 1]["attention_weights"],
            "causal mask (a decoder)": trace["causal"]["layers"][layer - 1]["attention_weights"]}
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6), dpi=100, layout="constrained")
    for ax, (title, A) in zip(axes, mats.items()):
        im = ax.imshow(A, vmin=0, vmax=1, cmap="Blues")
        for i in range(A.shape[0]):
            for j in range(A.shape[1]):
                ax.text(j, i, f"{A[i, j]:.2f}", ha="center", va="center",
                        color="white" if A[i, j] > 0.6 else "black")
        ax.set_xticks(range(len(tok)), tok)
        ax.set_yticks(range(len(tok)), tok)
        ax.set_xlabel("key j (attended to)")
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("query i")
    fig.colorbar(im, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(f"Layer {layer} attention weights, 'the cat sat'", fontsize=11)
    return fig


def plot_jacobian_norms(trace: dict):
    """Bars of |∂H^(ℓ)_the/∂H^(0)_j| for ℓ = 1, 2 under full, causal and ±1-window attention."""
    plt = _pyplot()
    tok = trace["tokens"]
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.6), dpi=100, sharey=True, layout="constrained")
    x = np.arange(len(tok))
    titles = {"full": "full attention (encoder)", "causal": "causal mask", "window": "+/-1 window mask"}
    for ax, (mask, title) in zip(axes, titles.items()):
        for off, k in ((-0.2, "H1"), (0.2, "H2")):
            ax.bar(x + off, trace["jacobian_norms"][mask][k], width=0.4,
                   label=rf"layer {k[1]}: $\|\partial H^{{({k[1]})}}_{{the}} / \partial H^{{(0)}}_j\|_F$")
        ax.set_xticks(x, tok)
        ax.set_xlabel("input token j")
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("Frobenius norm")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=9)
    fig.suptitle("How much the output for 'the' depends on each input token", fontsize=11)
    return fig


def save_figures(outdir: str = "figures") -> list[str]:
    """Write the trace's figures as PNGs into ``outdir``; returns their paths (deterministic)."""
    plt = _pyplot()
    trace = run_trace()
    os.makedirs(outdir, exist_ok=True)
    paths = []
    for name, fig in (("trace_attention_layer1.png", plot_attention(trace, 1)),
                      ("trace_attention_layer2.png", plot_attention(trace, 2)),
                      ("trace_input_sensitivity.png", plot_jacobian_norms(trace))):
        path = os.path.join(outdir, name)
        fig.savefig(path, metadata={"Software": None})
        plt.close(fig)
        paths.append(path)
    return paths
