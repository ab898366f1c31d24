r"""Measured layer time against n and against d, with the seeds' O(n²d + nd²) model fitted.

The FLOP count of one encoder layer (:func:`transformer_np.model.flops.layer_flops`) has two kinds
of terms: the attention products QKᵀ and A·V, 4·B·n²·d, and the projections plus the FFN,
8·B·n·d² + 4·B·n·d·d_ff (= 24·B·n·d² for d_ff = 4d). The time model fitted here is

    t(n, d) ≈ α · F_attn(n, d) + β · F_lin(n, d) + γ · B·n·d_ff

with F_attn, F_lin those FLOP counts (forward+backward) and the last term the elementwise
work that grows like n·d (GELU over B·n·d_ff activations, LayerNorm, residuals), fitted by
non-negative least squares on relative error. The softmax's B·h·n² elementwise work cannot
be told apart from the n²d products in these sweeps (h = d/64, so h·n² ∝ n²d): it is part
of the α term, which is therefore "attention: products + softmax". 1/α and 1/β are the
effective GFLOP/s of each term. Attention "starts to dominate" where α·F_attn passes half of
the modelled time.

Measurements are slow and differ from run to run, so they are stored:
:func:`measure` times the layer (forward+backward, best of ``repeats``) as the *CPU time of
this process* with one BLAS thread: on a shared machine wall-clock time mostly measures the
other jobs, while CPU time of a single-threaded computation does not (much), and
:func:`save_measurements` writes ``transformer_np/data/complexity_timings.json``.
:func:`save_figures` draws ``figures/complexity.png`` from the stored file (the same bytes on
every run) or, with ``timings=True``, from a fresh measurement.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from ..model.config import EncoderConfig
from ..model.flops import layer_flops

__all__ = ["measure", "fit", "save_measurements", "load_measurements", "attention_share",
           "crossover_measured", "save_figures", "DATA_FILE"]

DATA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "complexity_timings.json")
#: fixed d, varying n; fixed n, varying d (h = d/64 heads, d_ff = 4d, batch 1)
N_SWEEP = dict(d=256, ns=(64, 128, 256, 512, 768, 1024, 1536, 2048))
D_SWEEP = dict(n=256, ds=(64, 128, 256, 384, 512, 768, 1024))
BATCH = 1


def _config(d: int) -> EncoderConfig:
    return EncoderConfig(n_layers=1, d_model=d, n_heads=max(1, d // 64), d_ff=4 * d, dropout=0.0,
                         layer_norm_eps=1e-5)


def _time_layer(n: int, d: int, repeats: int) -> float:
    from ..model.encoder import encoder_layer_backward, encoder_layer_forward
    from ..model.params import init_params, sub_params

    cfg = _config(d)
    p = sub_params(init_params(cfg, seed=0, dtype=np.float32), "layers.0.")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, n, d)).astype(np.float32)          # (B, n, d)
    dy = rng.standard_normal((BATCH, n, d)).astype(np.float32)
    best = np.inf
    for _ in range(repeats + 1):                                         # first call is a warm-up
        t0 = time.process_time()
        _, cache = encoder_layer_forward(x, p, cfg)
        encoder_layer_backward(dy, cache)
        best = min(best, time.process_time() - t0)
    return best


def measure(repeats: int = 3, one_thread: bool = True) -> dict:
    """Forward+backward seconds of one float32 layer over :data:`N_SWEEP` and :data:`D_SWEEP`."""
    limiter = None
    if one_thread:
        try:
            from threadpoolctl import threadpool_limits
            limiter = threadpool_limits(1, user_api="blas")
        except ImportError:
            pass
    try:
        rows = [{"n": n, "d": N_SWEEP["d"], "seconds": _time_layer(n, N_SWEEP["d"], repeats)}
                for n in N_SWEEP["ns"]]
        rows += [{"n": D_SWEEP["n"], "d": d, "seconds": _time_layer(D_SWEEP["n"], d, repeats)}
                 for d in D_SWEEP["ds"]]
    finally:
        if limiter is not None:
            limiter.restore_original_limits()
    return {"batch": BATCH, "mode": "fwd+bwd", "dtype": "float32", "blas_threads": 1 if limiter else None,
            "clock": "process CPU time, best of repeats",
            "date": time.strftime("%Y-%m-%d"), "rows": rows}


def _features(n, d) -> np.ndarray:
    """(rows, 3): F_attn, F_lin (FLOPs, fwd+bwd) and the elementwise count B·n·d_ff."""
    out = []
    for ni, di in zip(np.atleast_1d(n), np.atleast_1d(d)):
        cfg = EncoderConfig(n_layers=1, d_model=int(di), n_heads=1, d_ff=4 * int(di))   # FLOPs: h cancels
        fl = layer_flops(cfg, BATCH, int(ni), "fwd+bwd")
        out.append([fl["attention_scores"], fl["projections"] + fl["ffn"],
                    BATCH * ni * cfg.d_ff])
    return np.array(out, dtype=np.float64)


def fit(data: dict) -> dict:
    """Non-negative least squares of seconds on the three features, in relative error."""
    n = np.array([r["n"] for r in data["rows"]])
    d = np.array([r["d"] for r in data["rows"]])
    t = np.array([r["seconds"] for r in data["rows"]])
    X = _features(n, d) / t[:, None]                                     # relative-error weighting
    coef = _nnls(X, np.ones_like(t))
    pred = _features(n, d) @ coef
    return {"alpha": coef[0], "beta": coef[1], "gamma": coef[2],
            "attn_gflops": 1e-9 / coef[0] if coef[0] > 0 else float("inf"),
            "linear_gflops": 1e-9 / coef[1] if coef[1] > 0 else float("inf"),
            "max_rel_error": float(np.max(np.abs(pred - t) / t))}


def _nnls(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0, by trying every subset of active columns (3 of them)."""
    best, best_res = np.zeros(A.shape[1]), np.inf
    for mask in range(1, 2 ** A.shape[1]):
        cols = [j for j in range(A.shape[1]) if mask >> j & 1]
        c, *_ = np.linalg.lstsq(A[:, cols], b, rcond=None)
        if np.all(c >= 0):
            res = float(np.sum((A[:, cols] @ c - b) ** 2))
            if res < best_res:
                best, best_res = np.zeros(A.shape[1]), res
                best[cols] = c
    return best


def attention_share(coef: dict, n, d) -> np.ndarray:
    """Modelled fraction of the layer time spent in attention (its products + softmax)."""
    F = _features(n, d)
    attn = coef["alpha"] * F[:, 0]
    total = F @ np.array([coef["alpha"], coef["beta"], coef["gamma"]])
    return attn / total


def crossover_measured(coef: dict, d: int, n_max: int = 10 ** 6) -> int:
    """The smallest n at which the modelled attention share reaches 1/2 at width d (bisection)."""
    lo, hi = 1, n_max                       # share(lo) < 1/2 <= share(hi), assumed
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if attention_share(coef, [mid], [d])[0] < 0.5 else (lo, mid)
    return hi


def save_measurements(data: dict, path: str = DATA_FILE) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    return path


def load_measurements(path: str = DATA_FILE) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def save_figures(outdir: str = "figures", timings: bool = False) -> list[str]:
    """``complexity.png``: time vs n (fixed d) and vs d (fixed n), measured points and the fit.

    Drawn from the stored measurements (deterministic) unless ``timings=True``.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("the complexity figure needs matplotlib: pip install matplotlib") from e
    from ..model.flops import crossover_n

    data = measure() if timings else load_measurements()
    coef = fit(data)
    rows = data["rows"]
    os.makedirs(outdir, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    d0, n0 = N_SWEEP["d"], D_SWEEP["n"]
    for ax, key, fixed, fixed_val in ((axes[0], "n", "d", d0), (axes[1], "d", "n", n0)):
        pts = sorted((r[key], r["seconds"]) for r in rows if r[fixed] == fixed_val and
                     (r[key] in (N_SWEEP["ns"] if key == "n" else D_SWEEP["ds"])))
        x = np.array([p[0] for p in pts], dtype=float)
        grid = np.linspace(x.min(), x.max(), 100)
        nn, dd = (grid, np.full_like(grid, fixed_val)) if key == "n" else (np.full_like(grid, fixed_val), grid)
        F = _features(nn.astype(int), dd.astype(int))
        ax.plot(x, [1e3 * p[1] for p in pts], "o", color="k", label="measured (fwd+bwd, float32)")
        ax.plot(grid, 1e3 * F @ np.array([coef["alpha"], coef["beta"], coef["gamma"]]), "-", color="C0",
                label="fit α·n²d + β·nd² + γ·n·d_ff")
        ax.plot(grid, 1e3 * coef["alpha"] * F[:, 0], "--", color="C3", label="attention (products + softmax) α·n²d")
        ax.plot(grid, 1e3 * coef["beta"] * F[:, 1], ":", color="C2", label="projections + FFN β·nd²")
        ax.set_xlabel(key)
        ax.set_ylabel("ms per layer")
        ax.set_title(f"one layer, B = {BATCH}, {fixed} = {fixed_val}")
    cfg = _config(d0)
    n_meas, n_flop = crossover_measured(coef, d0), crossover_n(cfg)
    axes[0].axvline(min(n_meas, N_SWEEP["ns"][-1]), color="C3", lw=0.8)
    axes[0].text(0.02, 0.97, f"attention ≥ ½ of the time from n ≈ {n_meas:.0f}\n"
                             f"(FLOP crossover 2d + d_ff = {n_flop:.0f})",
                 transform=axes[0].transAxes, va="top", fontsize=8)
    axes[1].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Layer time vs the O(n²d + nd²) model: 1/α = {coef['attn_gflops']:.0f}, "
                 f"1/β = {coef['linear_gflops']:.0f} GFLOP/s (max fit error {100 * coef['max_rel_error']:.0f}%)",
                 fontsize=9)
    fig.tight_layout()
    path = os.path.join(outdir, "complexity.png")
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
    return [path]
