"""Figure of the complexity study (:mod:`transformer_np.course.complexity`): measured layer time and the fitted
O(n²d + nd²) model. Drawing only."""

from __future__ import annotations

import numpy as np

from ...model.flops import crossover_n
from ..complexity import (
    BATCH,
    D_SWEEP,
    N_SWEEP,
    _config,
    _features,
    crossover_measured,
    fit,
    load_measurements,
    measure,
)
from ._style import figure, save, styled

__all__ = ["plot_complexity", "save_figures"]


@styled
def plot_complexity(data: dict):
    """Time against n (fixed d, left) and against d (fixed n, right): measured points, the fit and its two terms.
    ``data`` = :func:`~transformer_np.course.complexity.measure` or the stored measurements."""
    coef = fit(data)
    rows = data["rows"]
    fig, axes = figure(1, 2, figsize=(10.5, 4.4))
    d0, n0 = N_SWEEP["d"], D_SWEEP["n"]
    for ax, key, fixed, fixed_val, sweep in ((axes[0], "n", "d", d0, N_SWEEP["ns"]),
                                             (axes[1], "d", "n", n0, D_SWEEP["ds"])):
        pts = sorted((r[key], r["seconds"]) for r in rows if r[fixed] == fixed_val and r[key] in sweep)
        x = np.array([p[0] for p in pts], dtype=float)
        grid = np.linspace(x.min(), x.max(), 100)
        nn, dd = (grid, np.full_like(grid, fixed_val)) if key == "n" else (np.full_like(grid, fixed_val), grid)
        F = _features(nn.astype(int), dd.astype(int))
        ax.plot(x, [1e3 * p[1] for p in pts], "o", color="k", label="measured (forward + backward, float32)")
        ax.plot(grid, 1e3 * F @ np.array([coef["alpha"], coef["beta"], coef["gamma"]]), "-", color="C0",
                label=r"fit $\alpha F_{attn} + \beta F_{lin} + \gamma\, n\, d_{ff}$")
        ax.plot(grid, 1e3 * coef["alpha"] * F[:, 0], "--", color="C3",
                label=r"attention (products + softmax) $\alpha F_{attn} \propto n^2 d$")
        ax.plot(grid, 1e3 * coef["beta"] * F[:, 1], ":", color="C2", lw=2,
                label=r"projections + FFN $\beta F_{lin} \propto n d^2$")
        ax.set_xlabel(f"${key}$")
        ax.set_ylabel("ms per layer")
        ax.set_title(f"one layer, $B = {BATCH}$, ${fixed} = {fixed_val}$")
    n_meas, n_flop = crossover_measured(coef, d0), crossover_n(_config(d0))
    axes[0].axvline(min(n_meas, N_SWEEP["ns"][-1]), color="C3", lw=0.8)
    axes[0].text(0.02, 0.97, f"attention ≥ ½ of the time from $n \\approx {n_meas:.0f}$\n"
                             f"(FLOP crossover $2d + d_{{ff}} = {n_flop:.0f}$)",
                 transform=axes[0].transAxes, va="top", fontsize=9)
    axes[1].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Layer time vs the $O(n^2 d + n d^2)$ model: $1/\\alpha$ = {coef['attn_gflops']:.0f}, "
                 f"$1/\\beta$ = {coef['linear_gflops']:.0f} GFLOP/s (max fit error "
                 f"{100 * coef['max_rel_error']:.0f} %)", fontsize=10)
    return fig


def save_figures(outdir: str = "figures", timings: bool = False) -> list[str]:
    """``complexity.png`` from the stored measurements (deterministic) or, with ``timings=True``, a fresh one."""
    data = measure() if timings else load_measurements()
    return [save(plot_complexity(data), outdir, "complexity.png")]
