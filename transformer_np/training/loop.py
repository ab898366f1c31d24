r"""Train a small encoder in NumPy (AdamW, warm-up, a synthetic task or masked language modelling), with checkpoints.

``python -m transformer_np train --task sort --layers 2 --norm post --lr 1e-3 --warmup 50 --steps 500 --out runs/a``

The loop, per step t = 0, 1, …, S − 1:
    batch_t   = task.make_batch(default_rng([seed, 2, t]))          data depends only on (seed, t)
    loss, ∇   = model_forward / model_backward (encoder + head + cross-entropy)
    ‖∇‖       = clip_grad_norm(∇, clip)            (logged; clipping only if --clip > 0)
    θ         ← AdamW step with lr(t) = lr · min(1, t / warmup) (then constant, linear or cosine decay)
Every ``eval_every`` steps the loss and accuracy on fixed held-out batches are logged and the
checkpoint is written. Everything random is a pure function of (seed, step) — data, dropout —
so on the same machine and BLAS thread count the same seed gives a bit-identical run, and resuming
from a checkpoint gives exactly the run that was never interrupted (another CPU or thread count
changes the order of the BLAS sums, hence the last bits).

Outputs in ``--out``: ``loss_curve.json`` (the history), ``loss_curve.png`` (if matplotlib is
installed), ``checkpoint.npz`` (params ``param/<name>``, optimiser state ``optim/<key>``, and
the run's config and history as JSON strings under ``config`` and ``history``; it loads with
``np.load(path, allow_pickle=False)``). Checkpoints are written atomically and checked in full
before a resume uses them: see :mod:`transformer_np.training.checkpoint`.

Before anything is allocated, the memory of the run (parameters, gradients, AdamW's two moments,
the activations of a batch, the attention maps) is estimated and checked against the limit of
:mod:`transformer_np.model.budget` (``--layers 100000`` is refused at once, with the estimate).

The run's config, its state and that estimate (:class:`~transformer_np.training.state.RunConfig`,
:class:`~transformer_np.training.state.TrainState`, :func:`~transformer_np.training.state.estimate_run`) are
defined in :mod:`transformer_np.training.state`, below both this module and the checkpoint; they keep
resolving from here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from .._compat import forward_moved as _forward_moved
from .._files import write_atomic
from .._validate import all_finite
from ..errors import InputValueError, NonFiniteError
from .checkpoint import CHECKPOINT, load_checkpoint, remove_stale_temporaries, save_checkpoint
from .optim import clip_grad_norm
from .state import SCHEDULES as SCHEDULES  # re-exported: it was defined here before the split (cli.train reads it)
from .state import RunConfig, TrainState, _assemble, _schedule, _setup, estimate_run
from .tasks import accuracy, model_backward, model_forward

__all__ = ["RunConfig", "TrainState", "build", "train_step", "evaluate", "train", "layer_grad_norms",
           "estimate_run", "save_checkpoint", "load_checkpoint", "save_loss_curve", "OUTPUTS", "existing_outputs",
           "check_fresh_out", "check_output_paths", "nonfinite_parameter"]

CURVE_JSON = "loss_curve.json"
CURVE_PNG = "loss_curve.png"


def build(cfg: RunConfig) -> TrainState:
    """A fresh run: task, encoder config, initial params (seed), AdamW with the schedule.

    Raises ResourceLimitError (before allocating) when the run would not fit the memory limit."""
    task, mc = _setup(cfg)
    return _assemble(cfg, task, mc)


def layer_grad_norms(grads: dict, n_layers: int) -> list[float]:
    """‖∂L/∂θ_ℓ‖₂ over all parameters of layer ℓ (names ``layers.ℓ.*``), ℓ = 0 … N − 1."""
    sq = [0.0] * n_layers
    for name, g in grads.items():
        if name.startswith("layers."):
            sq[int(name.split(".")[1])] += float(np.sum(np.square(g, dtype=np.float64)))
    return [math.sqrt(s) for s in sq]


def _finite_or_none(fn):
    """Run ``fn()``; None when the core refuses non-finite values (a diverged run), warnings muted."""
    try:
        with np.errstate(all="ignore"):   # a diverging run overflows; the caller records it
            return fn()
    except NonFiniteError:
        return None


def _loss_and_grads(state: TrainState, batch: dict, drng) -> tuple[float, dict | None]:
    out = _finite_or_none(lambda: model_forward(state.params, state.model_config, state.task, batch,
                                                training=True, rng=drng))
    if out is None or not math.isfinite(out[0]):
        return float("nan") if out is None else float(out[0]), None
    grads = _finite_or_none(lambda: model_backward(out[1]))
    if grads is not None and not all(np.all(np.isfinite(g)) for g in grads.values()):
        return out[0], None               # finite loss, overflowing gradients: diverged as well
    return out[0], grads


def train_step(state: TrainState) -> float:
    """One optimisation step on batch ``state.step``; returns the training loss (before the update)."""
    cfg, t = state.cfg, state.step
    batch = state.task.make_batch(np.random.default_rng([cfg.seed, 2, t]), cfg.batch_size)
    drng = np.random.default_rng([cfg.seed, 3, t]) if cfg.dropout > 0 else None
    h = state.history
    loss, grads = _loss_and_grads(state, batch, drng)
    if grads is None:                     # diverged: log the step, do not update
        h["step"].append(t)
        h["loss"].append(float(loss))
        h["lr"].append(state.opt.lr)
        h["grad_norm"].append(float("nan"))
        h["diverged_at"] = t
        state.step = t + 1
        return float("nan")
    if t < cfg.grad_norm_steps:
        h["layer_grad_norms"].append(layer_grad_norms(grads, cfg.layers))
    if cfg.clip > 0:
        norm = clip_grad_norm(grads, cfg.clip)
    else:
        norm = math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads.values()))
    with np.errstate(over="ignore", invalid="ignore"):    # an update that overflows: the next step diverges
        lr = state.opt.step(grads)
    h["step"].append(t)
    h["loss"].append(float(loss))
    h["lr"].append(float(lr))
    h["grad_norm"].append(norm)
    state.step = t + 1
    return float(loss)


def evaluate(state: TrainState) -> tuple[float, float]:
    """Mean loss and accuracy over the fixed held-out batches (no dropout)."""
    losses, accs = [], []
    for batch in state.eval_batches:
        out = _finite_or_none(lambda b=batch: model_forward(state.params, state.model_config, state.task, b))
        if out is None:
            return float("nan"), float("nan")
        losses.append(out[0])
        accs.append(accuracy(out[1]["logits"], batch["labels"]))
    return float(np.mean(losses)), float(np.mean(accs))


class _Progress:
    """A plain-text progress bar on stderr: [#####.....] step/total, the training loss as an exponential moving
    average (weight 0.05 per step: about the last 20 steps' batches, labelled ``loss (avg)``), lr."""

    def __init__(self, total: int, enabled: bool, stream=None):
        self.total, self.enabled = total, enabled
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every = 1 if self.tty else max(1, total // 10)
        self.running = None

    def update(self, step: int, loss: float, lr: float, extra: str = "") -> None:
        if math.isfinite(loss):
            self.running = loss if self.running is None else 0.95 * self.running + 0.05 * loss
        if not self.enabled or (step % self.every and step != self.total and not extra):
            return
        filled = int(30 * step / self.total)
        run = f"{self.running:.4f}" if self.running is not None else "nan"
        line = f"[{'#' * filled}{'.' * (30 - filled)}] {step}/{self.total} loss (avg) {run} lr {lr:.2e}{extra}"
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        self.stream.flush()

    def close(self):
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


OUTPUTS = (CHECKPOINT, CURVE_JSON, CURVE_PNG)     # what a run writes into --out


def existing_outputs(out: str | Path) -> list[Path]:
    """The files of an earlier run in ``out`` (checkpoint, loss curve, plot), in that order."""
    return [Path(out) / n for n in OUTPUTS if os.path.lexists(Path(out) / n)]


def check_fresh_out(out: str | Path, resume: bool, overwrite: bool) -> None:
    """Refuse a new run into a folder holding an earlier run's results, unless it resumes or overwrites them."""
    found = existing_outputs(out) if not (resume or overwrite) else []
    if found:
        raise InputValueError(f"out: {found[0]} already exists (an earlier run's results are in {out}); pass "
                              f"--resume to continue that run, --overwrite to replace it, or choose another --out")


def check_output_paths(out: str | Path) -> None:
    """Refuse, before the first step, an ``out`` where a run's files could not be written as promised: ``out``
    that is not a folder, a folder at any output name, a symbolic link at ``loss_curve.json`` (written
    atomically and never through a link). The checkpoint and the plot are renamed over whatever link is there."""
    out = Path(out)
    if os.path.lexists(out) and not out.is_dir():
        raise InputValueError(f"out: {out} exists and is not a folder")
    for name in OUTPUTS:
        p = out / name
        if p.is_symlink() and name == CURVE_JSON:
            raise InputValueError(f"{p}: is a symbolic link; refusing to write through it (remove it or choose "
                                  f"another --out); nothing was run")
        if p.is_dir() and not p.is_symlink():
            raise InputValueError(f"{p}: is a folder, where the run writes a file; nothing was run")


def _clear_earlier_run(out: Path) -> None:
    """--overwrite: the earlier run's files are removed before the new run writes anything, so the folder never
    holds one run's checkpoint beside another's loss curve."""
    for p in existing_outputs(out):
        p.unlink()


def nonfinite_parameter(state: TrainState) -> str | None:
    """The name of the first parameter (or optimiser entry ``optim/<key>``) holding NaN/inf, or None."""
    for name, a in state.params.items():
        if not all_finite(a):
            return name
    for key, a in state.opt.state_dict().items():
        if np.asarray(a).dtype.kind == "f" and not all_finite(np.asarray(a)):
            return "optim/" + key
    return None


def train(cfg: RunConfig | None = None, out: str | Path | None = None, resume: bool = False,
          progress: bool = False, state: TrainState | None = None, overwrite: bool = False) -> TrainState:
    """Run (or continue) training to ``cfg.steps`` total steps.

    ``out``: directory for the checkpoint and loss curve (None = keep everything in memory).
    ``resume``: continue from ``out/checkpoint.npz``. When ``cfg`` is given it must equal the
    checkpoint's config except ``steps`` and ``eval_every`` (the new total and evaluation period;
    the learning-rate schedule follows the new total) — anything else is a CheckpointError naming
    the field; a decaying schedule (linear, cosine) keeps its ``steps``, because a new total would
    restart its decay. ``state.start_step`` is the step the run continued from, so ``state.step −
    state.start_step`` steps ran here. Stale temporary files of an interrupted save are removed.
    Stops early (``history["diverged_at"]``) when the loss becomes non-finite.

    A new run (no ``resume``) refuses an ``out`` that holds an earlier run's checkpoint, loss curve or
    plot unless ``overwrite`` (InputValueError naming the file); with ``overwrite`` those files are removed
    once the new run is built and checked, before its first step, so ``out`` only ever holds one run. Every
    output path is checked before the first step (:func:`check_output_paths`). Every file is written atomically
    (a temporary sibling renamed over the target). A checkpoint is never written with a non-finite
    parameter: when the run diverges that far, the previous checkpoint is kept and
    ``state.not_saved`` says which parameter stopped being finite.
    """
    outdir = Path(out) if out is not None else None
    if outdir is not None and state is None:
        check_fresh_out(outdir, resume, overwrite)
    if state is None:
        if resume:
            if outdir is None:
                raise ValueError("resume=True needs out, the directory holding checkpoint.npz")
            remove_stale_temporaries(outdir / CHECKPOINT)
            state = load_checkpoint(outdir / CHECKPOINT, expect=cfg)
            if cfg is not None and (cfg.steps, cfg.eval_every) != (state.cfg.steps, state.cfg.eval_every):
                state.cfg = dataclasses.replace(state.cfg, steps=cfg.steps, eval_every=cfg.eval_every)
                state.opt.schedule = _schedule(state.cfg)
        else:
            state = build(cfg if cfg is not None else RunConfig())
    cfg = state.cfg
    if outdir is not None:
        check_output_paths(outdir)                     # every output path, before the first step
        if overwrite and not resume:
            _clear_earlier_run(outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(outdir / CHECKPOINT)
    bar = _Progress(cfg.steps, progress)
    h = state.history
    while state.step < cfg.steps and h["diverged_at"] is None:
        loss = train_step(state)
        extra = " (loss is not finite: stopped)" if h["diverged_at"] is not None else ""
        if state.step % cfg.eval_every == 0 or state.step == cfg.steps or extra:
            el, ea = evaluate(state)
            for k, v in (("step", state.step), ("loss", el), ("accuracy", ea)):
                h["eval"][k].append(v)
            extra = extra or f" | eval loss {el:.4f} acc {ea:.3f}"
            if outdir is not None:
                bad = nonfinite_parameter(state)
                if bad is None:
                    save_checkpoint(outdir / CHECKPOINT, state)
                    state.not_saved = None
                else:
                    state.not_saved = (f"parameter {bad!r} is not finite at step {state.step}, so no checkpoint "
                                       f"was written for it")
        bar.update(state.step, loss, h["lr"][-1], extra)
    bar.close()
    if outdir is not None:
        save_loss_curve(outdir / CURVE_JSON, state)
    return state


# ----------------------------------------------------------------------------- loss curve
def save_loss_curve(path: str | Path, state: TrainState) -> None:
    """The config and history as JSON, written atomically (a reader sees the old file or the new one)."""
    write_atomic(path, json.dumps({"config": state.cfg.to_dict(), **state.history}, indent=1))


# Moved in 0.2 (study code to transformer_np.course, the command line to transformer_np.cli);
# the old names keep resolving.
__getattr__ = _forward_moved(__name__, {
    "STABILITY_JSON": "transformer_np.course.stability",
    "_figure": "transformer_np.course.stability",
    "_save": "transformer_np.course.stability",
    "plot_loss_curve": "transformer_np.course.stability",
    "save_figures": "transformer_np.course.stability",
    "STABILITY_BASE": "transformer_np.course.stability",
    "stability_grid": "transformer_np.course.stability",
    "_round": "transformer_np.course.stability",
    "run_stability_one": "transformer_np.course.stability",
    "run_stability": "transformer_np.course.stability",
    "stability_table": "transformer_np.course.stability",
    "_COLORS": "transformer_np.course.stability",
    "_label": "transformer_np.course.stability",
    "plot_stability": "transformer_np.course.stability",
    "plot_layer_grad_norms": "transformer_np.course.stability",
    "add_arguments": "transformer_np.cli.train",
    "run": "transformer_np.cli.train",
})

