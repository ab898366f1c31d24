r"""The one complexity study: measured layer time against n and against d, with the seeds' O(n²d + nd²) model fitted.

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
The figure ``figures/complexity.png`` (:mod:`transformer_np.course.plots.complexity`) is drawn from the stored
file (the same bytes on every run) or, with ``timings=True``, from a fresh measurement.

This is the only timing and fit of the cost in the package: the anatomy study's wall-clock, forward-only,
unconstrained fit of 0.1 is gone, and its names (``time_layer``, ``fit_complexity``,
``measure_complexity``) resolve here.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from .._compat import forward_moved as _forward_moved
from .._validate import check_int, describe
from ..fast.threads import limit_blas_threads, one_blas_thread
from ..model.config import EncoderConfig
from ..model.flops import crossover_n, layer_flops

__all__ = ["time_layer", "measure", "fit", "fit_complexity", "save_measurements", "load_measurements",
           "attention_share", "crossover_measured", "predict", "DATA_FILE", "N_SWEEP", "D_SWEEP"]

DATA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "complexity_timings.json")
#: fixed d, varying n; fixed n, varying d (h = d/64 heads, d_ff = 4d, batch 1)
N_SWEEP = dict(d=256, ns=(64, 128, 256, 512, 768, 1024, 1536, 2048))
D_SWEEP = dict(n=256, ds=(64, 128, 256, 384, 512, 768, 1024))
BATCH = 1


def _config(d: int) -> EncoderConfig:
    return EncoderConfig(n_layers=1, d_model=d, n_heads=max(1, d // 64), d_ff=4 * d, dropout=0.0,
                         layer_norm_eps=1e-5)


def time_layer(config: EncoderConfig, batch: int, n: int, repeats: int = 3, seed: int = 0) -> float:
    """Best-of-``repeats`` CPU time (s) of one float32 encoder layer's forward + backward on (batch, n, d), with
    one BLAS thread (via threadpoolctl when installed); a first, untimed call warms up. Not deterministic:
    timings differ from run to run."""
    from ..model.params import init_params, sub_params
    from ..model.stack import encoder_layer_backward, encoder_layer_forward

    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config must be an EncoderConfig, got {describe(config)}")
    check_int(batch, "batch", minimum=1)
    check_int(n, "n", minimum=1)
    check_int(repeats, "repeats", minimum=1)
    cfg = config.replace(n_layers=1, vocab_size=None, type_vocab_size=0, dropout=0.0, max_len=max(n, 1))
    p = sub_params(init_params(cfg, seed=seed, dtype=np.float32), "layers.0.")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, n, cfg.d_model)).astype(np.float32)      # (B, n, d)
    dy = rng.standard_normal((batch, n, cfg.d_model)).astype(np.float32)
    best = np.inf
    with _one_blas_thread():             # CPU time of several BLAS threads would count their spinning too
        for _ in range(repeats + 1):                                         # first call is a warm-up
            t0 = time.process_time()
            _, cache = encoder_layer_forward(x, p, cfg)
            encoder_layer_backward(dy, cache)
            best = min(best, time.process_time() - t0)
    return best


def _one_blas_thread():
    return one_blas_thread()        # without threadpoolctl (warned once): timings include every BLAS thread's CPU


def measure(repeats: int = 3, one_thread: bool = True, n_sweep: dict = N_SWEEP, d_sweep: dict = D_SWEEP) -> dict:
    """Forward+backward seconds of one float32 layer over ``n_sweep`` (fixed d, varying n) and ``d_sweep``
    (fixed n, varying d); defaults :data:`N_SWEEP`, :data:`D_SWEEP` (the stored measurement)."""
    limiter = None
    if one_thread:
        try:
            limiter = limit_blas_threads(1)
        except ImportError:         # without threadpoolctl: BLAS's own threads, and the record says so (None)
            pass
    try:
        rows = [{"n": n, "d": n_sweep["d"], "seconds": time_layer(_config(n_sweep["d"]), BATCH, n, repeats)}
                for n in n_sweep["ns"]]
        rows += [{"n": d_sweep["n"], "d": d, "seconds": time_layer(_config(d), BATCH, d_sweep["n"], repeats)}
                 for d in d_sweep["ds"]]
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


def predict(coef: dict, n, d) -> np.ndarray:
    """Modelled seconds α·F_attn + β·F_lin + γ·B·n·d_ff at each (n, d) (d_ff = 4d, batch 1)."""
    return _features(n, d) @ np.array([coef["alpha"], coef["beta"], coef["gamma"]])


def fit_complexity(configs_n: list, times: list) -> dict:
    """:func:`fit` for (config, n) pairs and their measured seconds (the call form of 0.1's anatomy study).

    Returns :func:`fit`'s coefficients plus ``model_crossover`` (the FLOP model's n* = 2d + d_ff) and
    ``measured_crossover`` (:func:`crossover_measured`) at the first config's width d. The configs must
    have d_ff = 4d, as the fitted features assume."""
    for cfg, _ in configs_n:
        if not isinstance(cfg, EncoderConfig) or cfg.d_ff != 4 * cfg.d_model:
            raise ValueError(f"configs_n must hold (EncoderConfig with d_ff = 4·d_model, n) pairs, got {cfg!r}")
    rows = [{"n": int(n), "d": cfg.d_model, "seconds": float(t)} for (cfg, n), t in zip(configs_n, times)]
    coef = fit({"rows": rows})
    d0 = configs_n[0][0].d_model
    return {**coef, "model_crossover": crossover_n(_config(d0)), "measured_crossover": crossover_measured(coef, d0)}


# Until 0.2 the anatomy study had a second measurement; its name now means this one.
measure_complexity = measure

# Moved in 0.2: the figure to transformer_np.course.plots.complexity.
__getattr__ = _forward_moved(__name__, {"save_figures": "transformer_np.course.plots.complexity"})
