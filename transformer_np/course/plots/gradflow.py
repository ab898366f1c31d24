r"""Figures of the gradient-flow study (:mod:`transformer_np.course.gradflow`): drawing only.

Colour = variant, line style = initialisation (solid Xavier, dashed BERT). The residual-only stack
("no LayerNorm") explodes with Xavier init (ratios up to ~1e22), so wherever it is plotted against the
others it gets its own panel and the other curves keep a readable scale.
"""

from __future__ import annotations

import numpy as np

from ..gradflow import INITS, SMALL_DIMS, VARIANTS, compute_all
from ._style import figure, name, save, styled

__all__ = [
    "COLORS",
    "SIGMA_RTOL",
    "STYLES",
    "plot_by_layer",
    "plot_expansion",
    "plot_identity_vs_full",
    "plot_last_w2_vs_depth",
    "plot_profile",
    "plot_ratio_vs_depth",
    "plot_spectra",
    "save_figures",
]

COLORS = {"pre": "tab:blue", "post": "tab:red", "no-residual": "tab:green", "no-layernorm": "tab:purple"}
STYLES = {"xavier": "-", "bert": "--"}
SHORT_INIT = {"xavier": "Xavier", "bert": "BERT"}
STABLE = ("pre", "post", "no-residual")          # drawn together; no-layernorm gets its own panel
#: singular values below SIGMA_RTOL · σ_max are float64 round-off of the Jacobian, not data: not drawn
SIGMA_RTOL = 1e-15


def _arr(xs):
    return np.array([np.nan if x is None else x for x in xs], dtype=float)


def _label(variant: str, init: str) -> str:
    return f"{name(variant)}, {SHORT_INIT[init]}"


def _deepest(results: dict, depth: int | None, probe: int | None = None):
    """Default the plotted depth to the deepest run and the probe to min(probe, depth)."""
    depth = max(L for (_, _, L) in results) if depth is None else depth
    return depth, (None if probe is None else min(probe, depth))


def _null_locator():
    from matplotlib.ticker import NullLocator
    return NullLocator()


def _figure_legend(fig, axes, ncols: int = 4) -> None:
    """One legend under the panels (never over the data)."""
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols)


def _split_axes(title_left: str, title_right: str, figsize=(11, 4.8)):
    fig, (a, b) = figure(1, 2, figsize=figsize)
    a.set_title(title_left)
    b.set_title(title_right)
    return fig, a, b


@styled
def plot_profile(results: dict, depth: int | None = None, probe: int = 50, key: str = "grad_norm_by_layer"):
    """‖∂L/∂H^(ℓ)‖ / ‖∂L/∂H^(L)‖ against ℓ at one depth (default the
    deepest), layer ``probe`` marked; the exploding no-layernorm stack on its own panel."""
    depth, probe = _deepest(results, depth, probe)
    fig, a, b = _split_axes("Pre-LN, Post-LN, no residual", "no LayerNorm (residual only): own scale")
    for ax, keep in ((a, STABLE), (b, ("no-layernorm",))):
        for (variant, init, L), r in results.items():
            if L != depth or variant not in keep:
                continue
            g = _arr(r[key])
            ax.plot(range(L + 1), g / g[-1], STYLES[init], color=COLORS[variant], label=_label(variant, init))
        ax.axvline(probe, color="k", lw=0.8, ls=":")
        ax.text(probe + 1, 0.5, f"layer {probe}", transform=ax.get_xaxis_transform(), fontsize=8,
                bbox={"fc": "white", "ec": "none", "pad": 1})
        ax.set_yscale("log")
        ax.set_xlabel(r"layer $\ell$ ($H^{(\ell)}$, 0 = input)")
    _figure_legend(fig, (a, b))
    a.set_ylabel(r"$\|\partial L/\partial H^{(\ell)}\| \,/\, \|\partial L/\partial H^{(L)}\|$")
    fig.suptitle(f"Gradient reaching each layer of a {depth}-layer stack at initialisation")
    return fig


def _against_depth(results: dict, value, ylabel: str, title: str):
    """``value(result)`` against depth L, log–log: the stable variants left, no-layernorm on its own axis right."""
    fig, a, b = _split_axes("Pre-LN, Post-LN, no residual", "no LayerNorm (residual only): own scale")
    for ax, variants in ((a, STABLE), (b, ("no-layernorm",))):
        for variant in variants:
            for init in INITS:
                Ls = sorted(L for (v, i, L) in results if v == variant and i == init)
                if Ls:
                    y = [value(results[(variant, init, L)]) for L in Ls]
                    ax.plot(Ls, _arr(y), STYLES[init], marker="o", ms=4, color=COLORS[variant],
                            label=_label(variant, init))
        ax.set_xscale("log")
        ax.set_yscale("log")
        depths = sorted({L for (_, _, L) in results})
        ax.set_xticks(depths, [str(L) for L in depths])
        ax.xaxis.set_minor_locator(_null_locator())
        ax.set_xlabel("depth $L$")
    _figure_legend(fig, (a, b))
    a.set_ylabel(ylabel)
    fig.suptitle(title)
    return fig


@styled
def plot_ratio_vs_depth(results: dict):
    """‖∂L/∂H^(0)‖ / ‖∂L/∂H^(L)‖ against depth (log–log)."""
    return _against_depth(results, lambda r: r["input_to_output_ratio"],
                          r"$\|\partial L/\partial H^{(0)}\| \,/\, \|\partial L/\partial H^{(L)}\|$",
                          "Gradient at the input relative to the output, against depth")


@styled
def plot_last_w2_vs_depth(results: dict):
    """‖∂L/∂W_2‖ of the last layer against depth (Xiong et al. 2020's quantity)."""
    return _against_depth(results, lambda r: r["w2_grad_norm_by_layer"][-1],
                          r"$\|\partial L/\partial W_2\|$ of the last layer",
                          r"Last layer's FFN output weights: $\|\partial L/\partial W_2\|$ against depth")


@styled
def plot_by_layer(results: dict, key: str, ylabel: str, title: str, depth: int | None = None, log: bool = True,
                  split: bool | None = None, left_log: bool | None = None, note: str | None = None):
    """One per-layer quantity (``key`` of :func:`~transformer_np.course.gradflow.measure`) against ℓ at one depth
    (default the deepest). ``split`` (default: on for log scales) puts no-layernorm on its own panel, drawn on a
    log scale when ``log``; ``left_log`` (default ``log``) is the other panel's scale; ``note`` is written on it."""
    depth, _ = _deepest(results, depth)
    split = log if split is None else split
    left_log = log if left_log is None else left_log
    if split:
        fig, a, b = _split_axes("Pre-LN, Post-LN, no residual", "no LayerNorm (residual only): own scale")
        panels = ((a, STABLE, left_log), (b, ("no-layernorm",), log))
    else:
        fig, a = figure(figsize=(6.8, 4.6))
        panels = ((a, VARIANTS, log),)
    for ax, keep, ax_log in panels:
        for (variant, init, L), r in results.items():
            if L == depth and variant in keep:
                ax.plot(range(len(r[key])), _arr(r[key]), STYLES[init], color=COLORS[variant],
                        label=_label(variant, init))
        if ax_log:
            ax.set_yscale("log")
        ax.set_xlabel(r"layer $\ell$")
    if note:
        a.text(0.98, 0.2, note, transform=a.transAxes, ha="right", va="center", fontsize=8,
               bbox={"fc": "white", "ec": "0.7", "pad": 3})
    _figure_legend(fig, [p[0] for p in panels], ncols=4 if split else 2)
    a.set_ylabel(ylabel)
    fig.suptitle(f"{title}, $L = {depth}$")
    return fig


@styled
def plot_identity_vs_full(results: dict, depth: int | None = None, probe: int = 50, init: str = "xavier"):
    """Full gradient vs the identity path alone, Pre-LN and Post-LN, at one depth (default the deepest)."""
    depth, probe = _deepest(results, depth, probe)
    fig, ax = figure(figsize=(6.8, 4.2))
    for variant in ("pre", "post"):
        r = results.get((variant, init, depth))
        if r is None:
            continue
        g, gi = _arr(r["grad_norm_by_layer"]), _arr(r["identity_grad_norm_by_layer"])
        ax.plot(range(depth + 1), g / g[-1], "-", color=COLORS[variant], label=f"{name(variant)}: full gradient")
        ax.plot(range(depth + 1), gi / gi[-1], ":", lw=2, color=COLORS[variant],
                label=f"{name(variant)}: identity path only")
    ax.axvline(probe, color="k", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel(r"layer $\ell$")
    ax.set_ylabel(r"$\|\partial L/\partial H^{(\ell)}\|$ / its value at $\ell = L$")
    ax.set_title(f"Identity path vs full gradient, $L = {depth}$, {SHORT_INIT[init]} init")
    ax.legend()
    return fig


def _structural_count(variant: str) -> int:
    """How many singular values can be non-zero: a LayerNorm's Jacobian kills 2 directions per token."""
    n, d = SMALL_DIMS["n"], SMALL_DIMS["d_model"]
    return n * (d - 2) if variant in ("post", "no-residual") else n * d


def _resolved(s: np.ndarray) -> np.ndarray:
    """Singular values at or above SIGMA_RTOL · σ_max; the rest (round-off) become NaN (not drawn)."""
    s = np.asarray(s, dtype=float)
    return np.where(s >= SIGMA_RTOL * s[0], s, np.nan)


@styled
def plot_spectra(spectra: dict):
    """σ_max, median and σ_min of ∂H^(ℓ)/∂H^(0) against ℓ, one panel per (init, variant);
    ``spectra[(variant, init)]`` = :func:`~transformer_np.course.gradflow.singular_values_by_depth`. For stacks
    ending in a LayerNorm only the n(d−2) structurally non-zero values count. Values below
    ``SIGMA_RTOL`` · σ_max are float64 round-off, not data, and are not drawn."""
    inits = [i for i in INITS if any(k[1] == i for k in spectra)]
    variants = [v for v in VARIANTS if any(k[0] == v for k in spectra)]
    fig, axes = figure(len(inits), len(variants), figsize=(3.0 * len(variants), 2.7 * len(inits) + 0.6),
                       squeeze=False, sharex=True)
    for r, init in enumerate(inits):
        for c, variant in enumerate(variants):
            ax = axes[r, c]
            sig = spectra.get((variant, init))
            if sig is None:
                ax.set_visible(False)
                continue
            k = _structural_count(variant)
            Ls = np.arange(1, len(sig) + 1)
            res = [_resolved(s) for s in sig]
            ax.plot(Ls, [s[0] for s in res], "-", color=COLORS[variant], label=r"$\sigma_{max}$")
            ax.plot(Ls, [np.nanmedian(s[:k]) if np.isfinite(s[:k]).any() else np.nan for s in res], "--",
                    color=COLORS[variant], label="median")
            ax.plot(Ls, [s[k - 1] for s in res], ":", lw=1.8, color=COLORS[variant], label=r"$\sigma_{min}$")
            vals = np.array([x for s in res for x in (s[0], s[k - 1])], dtype=float)
            vals = vals[np.isfinite(vals)]
            if vals.size and vals.max() / vals.min() > 20:
                ax.set_yscale("log")             # narrow ranges stay linear: readable tick labels
            ax.set_title(f"{name(variant)}, {SHORT_INIT[init]}", fontsize=9)
            if r == len(inits) - 1:
                ax.set_xlabel(r"depth $\ell$")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3)
    fig.supylabel(r"singular values of $\partial H^{(\ell)}/\partial H^{(0)}$")
    fig.suptitle(r"Spectrum of the stack's Jacobian (small stack $d = 16$, $n = 4$); values below "
                 r"$10^{-15}\,\sigma_{max}$ (float64 round-off) are not drawn", fontsize=10)
    return fig


@styled
def plot_expansion(views: dict):
    """Spectral norm of the order-m term E_m of ∏ D(sI + J) against m; ``views[label]`` =
    :func:`~transformer_np.course.gradflow.jacobian_view`."""
    fig, ax = figure(figsize=(6.8, 4.2))
    for v in views.values():
        norms = np.array(v["order_norms"])
        ax.plot(range(len(norms)), np.where(norms > 0, norms, np.nan), marker=".", color=COLORS[v["variant"]],
                ls=STYLES[v["init"]], label=_label(v["variant"], v["init"]))
    ax.set_yscale("log")
    ax.set_ylim(bottom=1e-12)
    ax.set_xlabel("$m$ = number of branch Jacobians in the path")
    ax.set_ylabel(r"$\|E_m\|_2$")
    ax.set_title(r"Expansion of $\prod\,(I + J)$ by path length (12-layer small stack)")
    ax.legend()
    return fig


def save_figures(outdir: str = "figures", data: dict | None = None, progress=None) -> list[str]:
    """Write the gradflow figures (PNG, deterministic) into ``outdir``; returns the paths.
    ``data`` = :func:`~transformer_np.course.gradflow.compute_all` (computed when not given, with
    ``progress(i, total, label)`` called as each of its stacks starts), then ``progress`` as each figure is drawn."""
    data = compute_all(progress=progress) if data is None else data
    res = data["results"]
    figs = {
        "gradflow_profile_L96.png": lambda: plot_profile(res),
        "gradflow_ratio_vs_depth.png": lambda: plot_ratio_vs_depth(res),
        "gradflow_last_w2_vs_depth.png": lambda: plot_last_w2_vs_depth(res),
        "gradflow_rms_L96.png": lambda: plot_by_layer(
            res, "rms_by_layer", r"RMS of $H^{(\ell)}$", "Activation scale", left_log=False,
            note="Post-LN and no residual: exactly 1 at every layer\n(a LayerNorm output, γ = 1, β = 0);"
                 " their lines coincide"),
        "gradflow_token_cosine_L96.png": lambda: plot_by_layer(res, "token_cosine_by_layer",
                                                               "mean cosine between tokens",
                                                               "Token similarity", log=False,
                                                               note="BERT init: Pre-LN, Post-LN and no LayerNorm\n"
                                                                    "stay near 0; their dashed lines coincide"),
        "gradflow_identity_vs_full.png": lambda: plot_identity_vs_full(res),
        "gradflow_jacobian_spectra.png": lambda: plot_spectra(data["spectra"]),
        "gradflow_expansion.png": lambda: plot_expansion(data["views"]),
    }
    paths = []
    for j, (filename, make) in enumerate(figs.items(), 1):
        if progress is not None:
            progress(j, len(figs), f"drawing {filename}")
        paths.append(save(make(), outdir, filename))
    return paths
