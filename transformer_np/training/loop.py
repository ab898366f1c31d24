r"""Train a small encoder in NumPy (AdamW, warm-up, a synthetic task or masked language modelling), with checkpoints.

``python -m transformer_np train --task sort --layers 2 --norm post --lr 1e-3 --warmup 50 --steps 500 --out runs/a``

The loop, per step t = 0, 1, …, S − 1:
    batch_t   = task.make_batch(default_rng([seed, 2, t]))          data depends only on (seed, t)
    loss, ∇   = model_forward / model_backward (encoder + head + cross-entropy)
    ‖∇‖       = clip_grad_norm(∇, clip)            (logged; clipping only if --clip > 0)
    θ         ← AdamW step with lr(t) = lr · min(1, t / warmup) (then constant, linear or cosine decay)
Every ``eval_every`` steps the loss and accuracy on fixed held-out batches are logged and the
checkpoint is written. Everything random is a pure function of (seed, step) — data, dropout —
so the same seed gives a bit-identical run, and resuming from a checkpoint gives exactly the
run that was never interrupted.

Outputs in ``--out``: ``loss_curve.json`` (the history), ``loss_curve.png`` (if matplotlib is
installed), ``checkpoint.npz`` (params ``param/<name>``, optimiser state ``optim/<key>``, and
the run's config and history as JSON strings under ``config`` and ``history``; it loads with
``np.load(path, allow_pickle=False)``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._validate import check_choice, check_float, check_int, describe
from ..errors import NonFiniteError
from ..model.config import EncoderConfig
from .optim import AdamW, WarmupCosineSchedule, WarmupLinearSchedule, clip_grad_norm
from .tasks import TASKS, Task, accuracy, get_task, init_model, model_backward, model_forward, task_config
from .._compat import forward_moved as _forward_moved

__all__ = ["RunConfig", "TrainState", "build", "train_step", "evaluate", "train", "layer_grad_norms",
           "save_checkpoint", "load_checkpoint", "save_loss_curve"]

SCHEDULES = ("constant", "linear", "cosine")
CHECKPOINT = "checkpoint.npz"
CURVE_JSON = "loss_curve.json"
CURVE_PNG = "loss_curve.png"


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a training run (stored in the checkpoint as JSON).

    ``warmup``: linear warm-up steps (0 = none; lr(t) = lr · t / warmup, HF's convention, so
    the first step of a warmed-up run has lr 0). ``schedule``: what follows the warm-up —
    "constant" (the fixed lr of the warm-up experiment), "linear" or "cosine" decay to 0 at
    ``steps``. ``weight_decay`` 0 makes AdamW plain Adam. ``clip`` 0 = no clipping (the
    global norm is logged either way). ``grad_norm_steps``: record per-layer gradient norms
    for the first this-many steps.
    """

    task: str = "sort"
    layers: int = 2
    d_model: int = 32
    heads: int = 4
    norm: str = "post"
    lr: float = 1e-3
    warmup: int = 0
    steps: int = 200
    seed: int = 0
    batch_size: int = 16
    eval_every: int = 50
    eval_batches: int = 4
    schedule: str = "constant"
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    clip: float = 0.0
    dropout: float = 0.0
    seq_len: int | None = None
    dtype: str = "float32"
    grad_norm_steps: int = 50

    def __post_init__(self):
        check_choice(self.task, "task", TASKS)
        for name in ("layers", "d_model", "heads", "steps", "batch_size", "eval_every", "eval_batches"):
            check_int(getattr(self, name), name, minimum=1)
        for name in ("warmup", "seed", "grad_norm_steps"):
            check_int(getattr(self, name), name, minimum=0)
        check_choice(self.norm, "norm", ("pre", "post"))
        check_choice(self.schedule, "schedule", SCHEDULES)
        check_choice(self.dtype, "dtype", ("float32", "float64"))
        check_float(self.lr, "lr", 0.0, min_inclusive=False)
        check_float(self.weight_decay, "weight_decay", 0.0)
        check_float(self.clip, "clip", 0.0)
        check_float(self.dropout, "dropout", 0.0, 1.0, max_inclusive=False)
        if self.schedule != "constant" and self.warmup > self.steps:
            raise ValueError(f"warmup must be <= steps = {self.steps} for a decaying schedule, got {self.warmup}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown run config fields {unknown}")
        return cls(**{k: tuple(v) if k == "betas" else v for k, v in d.items()})


@dataclass
class TrainState:
    """What changes during training: params (updated in place), the optimiser, the step, the log."""

    cfg: RunConfig
    task: Task
    model_config: EncoderConfig
    params: dict
    opt: AdamW
    step: int = 0
    history: dict = field(default_factory=dict)
    eval_batches: list = field(default_factory=list)


def _schedule(cfg: RunConfig):
    if cfg.schedule == "cosine":
        return WarmupCosineSchedule(cfg.lr, cfg.warmup, cfg.steps)
    return WarmupLinearSchedule(cfg.lr, cfg.warmup, cfg.steps if cfg.schedule == "linear" else None)


def _new_history() -> dict:
    return {"step": [], "loss": [], "lr": [], "grad_norm": [], "layer_grad_norms": [],
            "eval": {"step": [], "loss": [], "accuracy": []}, "diverged_at": None}


def build(cfg: RunConfig) -> TrainState:
    """A fresh run: task, encoder config, initial params (seed), AdamW with the schedule."""
    if not isinstance(cfg, RunConfig):
        raise TypeError(f"cfg must be a RunConfig, got {describe(cfg)}")
    task = get_task(cfg.task, seq_len=cfg.seq_len)
    mc = task_config(task, cfg.layers, cfg.d_model, cfg.heads, cfg.norm, dropout=cfg.dropout)
    params = init_model(task, mc, seed=cfg.seed, dtype=np.dtype(cfg.dtype))
    opt = AdamW(params, lr=_schedule(cfg), betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    erng = np.random.default_rng([cfg.seed, 4])                         # held-out batches: fixed per seed
    evals = [task.make_batch(erng, cfg.batch_size) for _ in range(cfg.eval_batches)]
    return TrainState(cfg, task, mc, params, opt, 0, _new_history(), evals)


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
        out = _finite_or_none(lambda: model_forward(state.params, state.model_config, state.task, batch))
        if out is None:
            return float("nan"), float("nan")
        losses.append(out[0])
        accs.append(accuracy(out[1]["logits"], batch["labels"]))
    return float(np.mean(losses)), float(np.mean(accs))


class _Progress:
    """A plain-text progress bar on stderr: [#####.....] step/total, running loss (EMA), lr."""

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
        line = f"[{'#' * filled}{'.' * (30 - filled)}] {step}/{self.total} loss {run} lr {lr:.2e}{extra}"
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        self.stream.flush()

    def close(self):
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def train(cfg: RunConfig | None = None, out: str | Path | None = None, resume: bool = False,
          progress: bool = False, state: TrainState | None = None) -> TrainState:
    """Run (or continue) training to ``cfg.steps`` total steps.

    ``out``: directory for the checkpoint and loss curve (None = keep everything in memory).
    ``resume``: continue from ``out/checkpoint.npz``; its config is used, except ``steps``
    (and ``eval_every``), taken from ``cfg`` when given, so a run can be extended.
    Stops early (``history["diverged_at"]``) when the loss becomes non-finite.
    """
    outdir = Path(out) if out is not None else None
    if state is None:
        if resume:
            if outdir is None:
                raise ValueError("resume=True needs out, the directory holding checkpoint.npz")
            state = load_checkpoint(outdir / CHECKPOINT)
            if cfg is not None:
                state.cfg = dataclasses.replace(state.cfg, steps=cfg.steps, eval_every=cfg.eval_every)
        else:
            state = build(cfg if cfg is not None else RunConfig())
    cfg = state.cfg
    if outdir is not None:
        outdir.mkdir(parents=True, exist_ok=True)
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
                save_checkpoint(outdir / CHECKPOINT, state)
        bar.update(state.step, loss, h["lr"][-1], extra)
    bar.close()
    if outdir is not None:
        save_loss_curve(outdir / CURVE_JSON, state)
    return state


# ----------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: str | Path, state: TrainState) -> None:
    """Params, optimiser state, step, config and history in one ``.npz`` (no pickles)."""
    arrays = {"param/" + k: v for k, v in state.params.items()}
    arrays.update({"optim/" + k: v for k, v in state.opt.state_dict().items()})
    arrays["step"] = np.array(state.step, dtype=np.int64)
    arrays["config"] = np.array(json.dumps(state.cfg.to_dict()))
    arrays["history"] = np.array(json.dumps(state.history))
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)                                                   # never leave a half-written file


def load_checkpoint(path: str | Path) -> TrainState:
    """Rebuild a :class:`TrainState` from :func:`save_checkpoint`'s file, exactly."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint not found: {path}")
    with np.load(path, allow_pickle=False) as z:
        cfg = RunConfig.from_dict(json.loads(str(z["config"])))
        state = build(cfg)
        for k in list(state.params):
            key = "param/" + k
            if key not in z:
                raise ValueError(f"checkpoint {path} lacks parameter {k!r}")
            state.params[k][...] = z[key]                               # in place: the optimiser holds these
        state.opt.load_state_dict({k[len("optim/"):]: z[k] for k in z.files if k.startswith("optim/")})
        state.step = int(z["step"])
        state.history = json.loads(str(z["history"]))
    return state


# ----------------------------------------------------------------------------- loss curve
def save_loss_curve(path: str | Path, state: TrainState) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"config": state.cfg.to_dict(), **state.history}, f, indent=1)


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

