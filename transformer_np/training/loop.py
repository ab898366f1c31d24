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

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._validate import check_choice, check_float, check_int, describe
from ..model.config import EncoderConfig
from .optim import AdamW, WarmupCosineSchedule, WarmupLinearSchedule, clip_grad_norm
from .tasks import TASKS, Task, accuracy, get_task, init_model, model_backward, model_forward, task_config

__all__ = ["RunConfig", "TrainState", "build", "train_step", "evaluate", "train", "layer_grad_norms",
           "save_checkpoint", "load_checkpoint", "save_loss_curve", "plot_loss_curve", "save_figures",
           "stability_grid", "run_stability", "run_stability_one", "stability_table", "plot_stability",
           "plot_layer_grad_norms",
           "add_arguments", "run"]

SCHEDULES = ("constant", "linear", "cosine")
CHECKPOINT = "checkpoint.npz"
CURVE_JSON = "loss_curve.json"
CURVE_PNG = "loss_curve.png"
STABILITY_JSON = Path(__file__).resolve().parents[2] / "notebooks" / "data" / "training_stability.json"


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
    except ValueError as e:
        if "finite" not in str(e):
            raise
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


def _figure(figsize):
    """A matplotlib Figure that does not touch pyplot's global state or backend (None if not installed)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("matplotlib is not installed: skipping the figure (pip install matplotlib)", file=sys.stderr)
        return None
    return Figure(figsize=figsize, dpi=100)


def _save(fig, path) -> str:
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})       # no version/timestamp: byte-stable PNGs
    return str(path)


def plot_loss_curve(history: dict, path: str | Path | None = None, title: str = ""):
    """Training loss per step (and eval loss) as a Figure; saved as PNG when ``path`` is given
    (then the path is returned). None, with a message, when matplotlib is missing."""
    fig = _figure((6, 3.6))
    if fig is None:
        return None
    ax = fig.add_subplot()
    ax.plot(history["step"], history["loss"], lw=0.8, label="train (per batch)")
    if history["eval"]["step"]:
        ax.plot(history["eval"]["step"], history["eval"]["loss"], "o-", ms=3, label="eval")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title(title, fontsize=9)
    ax.legend()
    return _save(fig, path) if path is not None else fig


def save_figures(outdir: str | Path = "figures") -> list[str]:
    """figures/training_stability*.png and training_layer_grad_norms.png from the stored full run
    (notebooks/data/training_stability.json, when present) and figures/training_loss_curve.png from
    a short live run (deterministic)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    stored = STABILITY_JSON
    if stored.is_file():                      # a source checkout: the stored full run of the experiment
        results = json.loads(stored.read_text())["runs"]
        for p in (plot_stability(results, outdir / "training_stability.png", layers=12, lr=1e-3),
                  plot_stability(results, outdir / "training_stability_lr1e-2.png", layers=12, lr=1e-2),
                  plot_layer_grad_norms(results, outdir / "training_layer_grad_norms.png", layers=12, lr=1e-2)):
            if p:
                written.append(p)
    state = train(RunConfig(task="sort", layers=2, d_model=32, steps=150, warmup=20, lr=3e-3, seed=0,
                            eval_every=25))
    p = plot_loss_curve(state.history, outdir / "training_loss_curve.png",
                        "sort task, 2-layer Post-LN, d=32, AdamW 3e-3, warm-up 20")
    if p:
        written.append(p)
    return written


# ----------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = RunConfig()
    parser.add_argument("--task", choices=TASKS, default=d.task,
                        help="sort: sort the tokens; cls: balanced brackets? ([CLS] head); tag: count each token "
                             "(1/2/≥3); mlm: masked LM on the shipped character corpus (default %(default)s)")
    parser.add_argument("--layers", type=int, default=d.layers, help="N, encoder layers (default %(default)s)")
    parser.add_argument("--d-model", type=int, default=d.d_model, help="d_model (default %(default)s)")
    parser.add_argument("--heads", type=int, default=d.heads, help="h, attention heads (default %(default)s)")
    parser.add_argument("--norm", choices=("pre", "post"), default=d.norm,
                        help="LayerNorm placement (default %(default)s)")
    parser.add_argument("--lr", type=float, default=d.lr, help="peak learning rate of AdamW (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=d.warmup,
                        help="linear warm-up steps, 0 = none (default %(default)s)")
    parser.add_argument("--schedule", choices=SCHEDULES, default=d.schedule,
                        help="after warm-up: keep lr, or decay it linearly / by a cosine to 0 at --steps "
                             "(default %(default)s)")
    parser.add_argument("--steps", type=int, default=d.steps,
                        help="total optimisation steps (with --resume: the new total) (default %(default)s)")
    parser.add_argument("--seed", type=int, default=d.seed,
                        help="seeds init, data and dropout: same seed => bit-identical run (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per step (default %(default)s)")
    parser.add_argument("--eval-every", type=int, default=d.eval_every,
                        help="evaluate and checkpoint every this many steps (default %(default)s)")
    parser.add_argument("--weight-decay", type=float, default=d.weight_decay,
                        help="AdamW's decoupled weight decay; 0 = Adam (default %(default)s)")
    parser.add_argument("--clip", type=float, default=d.clip,
                        help="clip the global gradient norm to this, 0 = off (default %(default)s)")
    parser.add_argument("--dropout", type=float, default=d.dropout, help="dropout probability (default %(default)s)")
    parser.add_argument("--seq-len", type=int, default=None, help="sequence length incl. [CLS] (default: per task)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default=d.dtype, help="(default %(default)s)")
    parser.add_argument("--out", default="runs/train", help="output directory (default %(default)s)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run saved in --out (its settings are used; --steps is the new total)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    cfg = RunConfig(task=args.task, layers=args.layers, d_model=args.d_model, heads=args.heads, norm=args.norm,
                    lr=args.lr, warmup=args.warmup, steps=args.steps, seed=args.seed, batch_size=args.batch_size,
                    eval_every=args.eval_every, schedule=args.schedule, weight_decay=args.weight_decay,
                    clip=args.clip, dropout=args.dropout, seq_len=args.seq_len, dtype=args.dtype)
    out = Path(args.out)
    if args.resume and not (out / CHECKPOINT).is_file():
        raise ValueError(f"--resume: no checkpoint at {out / CHECKPOINT}")
    t0 = time.perf_counter()
    state = train(cfg, out=out, resume=args.resume, progress=not args.quiet)
    h = state.history
    c = state.cfg
    title = f"{c.task}, {c.layers}-layer {c.norm.capitalize()}-LN, d={c.d_model}, lr {c.lr:g}, warm-up {c.warmup}"
    png = plot_loss_curve(h, out / CURVE_PNG, title)
    msg = (f"{c.task}: {state.step} steps in {time.perf_counter() - t0:.1f}s; final train loss {h['loss'][-1]:.4f}")
    if h["eval"]["step"]:
        msg += f", eval loss {h['eval']['loss'][-1]:.4f}, eval accuracy {h['eval']['accuracy'][-1]:.3f}"
    if h["diverged_at"] is not None:
        msg += f"; DIVERGED at step {h['diverged_at']}"
    print(msg)
    print(f"wrote {out / CHECKPOINT}, {out / CURVE_JSON}" + (f", {png}" if png else ""))
    return 0


# ----------------------------------------------------------------------------- the warm-up experiment
# Post-LN vs Pre-LN, with and without warm-up (notebook 04, scripts/run_training_stability.py).
STABILITY_BASE = dict(task="sort", d_model=64, heads=4, batch_size=16, eval_every=50, eval_batches=4,
                      weight_decay=0.0, schedule="constant", grad_norm_steps=20)


def stability_grid(full: bool = True) -> list[dict]:
    """The runs of the warm-up experiment, as RunConfig keyword dicts (sort task, d = 64, Adam, fixed lr).

    full=True (the stored run, ~5,500 12-layer-step equivalents):
      A. N = 12, lr = 1e-3: {post, pre} × {warm-up 0, 100} × seeds {0, 1}, 300 steps;
      B. N = 12, {post, pre} × {0, 100}: lr = 3e-3 seed 0, 150 steps; lr = 1e-2 seeds {0, 1}, 200 steps;
      C. N ∈ {2, 6}, lr = 1e-2, Post-LN: warm-up {0, 100} × seeds {0, 1}, 200 steps;
      D. N = 12, lr = 1e-2, Post-LN, a long warm-up (300 steps of 400), seed 0.
    full=False (the notebook's live check): N = 12, lr = 1e-2, {post, pre} × {0, 100}, seed 0, 60 steps,
      warm-up 30 — enough to see whether an unwarmed Post-LN stack stalls.
    """
    runs = []
    if not full:
        for norm in ("post", "pre"):
            for warmup in (0, 30):
                runs.append(dict(STABILITY_BASE, layers=12, lr=1e-2, norm=norm, warmup=warmup, seed=0, steps=60,
                                 eval_every=30))
        return runs
    for seed in (0, 1):
        for norm in ("post", "pre"):
            for warmup in (0, 100):
                runs.append(dict(STABILITY_BASE, layers=12, lr=1e-3, norm=norm, warmup=warmup, seed=seed, steps=300))
    for lr, seeds, steps in ((3e-3, (0,), 150), (1e-2, (0, 1), 200)):
        for seed in seeds:
            for norm in ("post", "pre"):
                for warmup in (0, 100):
                    runs.append(dict(STABILITY_BASE, layers=12, lr=lr, norm=norm, warmup=warmup, seed=seed,
                                     steps=steps))
    for layers in (2, 6):
        for seed in (0, 1):
            for warmup in (0, 100):
                runs.append(dict(STABILITY_BASE, layers=layers, lr=1e-2, norm="post", warmup=warmup, seed=seed,
                                 steps=200))
    runs.append(dict(STABILITY_BASE, layers=12, lr=1e-2, norm="post", warmup=300, seed=0, steps=400))
    return runs


def _round(xs, digits=5):
    return [None if not math.isfinite(x) else round(x, digits) for x in xs]


def run_stability_one(kw: dict) -> dict:
    """Train one run of the grid and keep what the notebook plots (losses rounded to 5 decimals)."""
    t0 = time.perf_counter()
    state = train(RunConfig(**kw))
    h = state.history
    tail = [x for x in h["loss"][-20:] if math.isfinite(x)]
    return {"config": state.cfg.to_dict(), "loss": _round(h["loss"]), "eval_step": h["eval"]["step"],
            "eval_loss": _round(h["eval"]["loss"]), "eval_accuracy": _round(h["eval"]["accuracy"], 4),
            "layer_grad_norms": [_round(r, 7) for r in h["layer_grad_norms"]],
            "diverged_at": h["diverged_at"], "final_loss": round(float(np.mean(tail)), 4) if tail else None,
            "final_accuracy": round(h["eval"]["accuracy"][-1], 4) if h["eval"]["accuracy"] else None,
            "seconds": round(time.perf_counter() - t0, 1)}


def run_stability(runs: list[dict], workers: int = 1) -> list[dict]:
    """Run every configuration (in ``workers`` processes; results in the grid's order)."""
    if workers <= 1:
        return [run_stability_one(kw) for kw in runs]
    import multiprocessing as mp
    with mp.get_context("spawn").Pool(workers) as pool:
        return pool.map(run_stability_one, runs, chunksize=1)


def stability_table(results: list[dict]) -> list[dict]:
    """One row per condition (layers, lr, norm, warm-up), seeds aggregated:
    final training loss (mean of the last 20 steps) and eval accuracy per seed."""
    rows: dict = {}
    for r in results:
        c = r["config"]
        key = (c["layers"], c["lr"], c["norm"], c["warmup"])
        row = rows.setdefault(key, {"layers": c["layers"], "lr": c["lr"], "norm": c["norm"], "warmup": c["warmup"],
                                    "steps": c["steps"], "seeds": [], "final_loss": [], "final_accuracy": []})
        row["seeds"].append(c["seed"])
        row["final_loss"].append(r["final_loss"])
        row["final_accuracy"].append(r["final_accuracy"])
    return list(rows.values())


_COLORS = {("post", False): "tab:red", ("post", True): "tab:orange", ("pre", False): "tab:blue",
           ("pre", True): "tab:cyan"}


def _label(c: dict) -> str:
    return f"{c['norm']}-LN, " + (f"warm-up {c['warmup']}" if c["warmup"] else "no warm-up")


def plot_stability(results: list[dict], path: str | Path | None = None, layers: int = 12, lr: float = 1e-3,
                   warmups=(0, 100)):
    """Loss curves (left) and per-layer gradient norms at step 0 (right) of the runs with the given
    depth, lr and warm-up lengths — Post-LN vs Pre-LN, with/without warm-up, every seed. Returns the
    Figure (or the path when saved; None without matplotlib)."""
    fig = _figure((11, 3.8))
    if fig is None:
        return None
    ax1, ax2 = fig.subplots(1, 2)
    sel = [r for r in results if r["config"]["layers"] == layers and r["config"]["lr"] == lr
           and r["config"]["warmup"] in warmups]
    seen, seen_norm = set(), set()
    for r in sel:
        c = r["config"]
        key = (c["norm"], c["warmup"] > 0)
        loss = np.array([np.nan if x is None else x for x in r["loss"]])
        ax1.plot(np.arange(loss.size), loss, color=_COLORS[key], lw=0.7, alpha=0.8,
                 label=None if key in seen else _label(c))
        seen.add(key)
        if c["norm"] not in seen_norm and r["layer_grad_norms"]:    # step 0 is the same with or without warm-up
            ax2.semilogy(np.arange(1, layers + 1), r["layer_grad_norms"][0], "o-", color=_COLORS[(c["norm"], False)],
                         ms=3, label=f"{c['norm']}-LN (seed {c['seed']})")
            seen_norm.add(c["norm"])
    ax1.set_xlabel("step")
    ax1.set_ylabel("training cross-entropy")
    ax1.set_title(f"sort task, {layers} layers, d = 64, Adam lr {lr:g}")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("layer ℓ")
    ax2.set_ylabel("‖∂L/∂θ_ℓ‖ at step 0")
    ax2.set_title("per-layer gradient norm at initialisation")
    ax2.legend(fontsize=8)
    return _save(fig, path) if path is not None else fig


def plot_layer_grad_norms(results: list[dict], path: str | Path | None = None, layers: int = 12,
                          lr: float = 1e-2, seed: int = 0, steps=(0, 5, 10, 19)):
    """‖∂L/∂θ_ℓ‖ against layer ℓ at a few early steps, one panel per (norm, warm-up) condition."""
    sel = [r for r in results if r["config"]["layers"] == layers and r["config"]["lr"] == lr
           and r["config"]["seed"] == seed and r["config"]["warmup"] in (0, 100)]
    fig = _figure((3.0 * max(1, len(sel)), 3.2))
    if fig is None:
        return None
    axes = np.atleast_1d(fig.subplots(1, max(1, len(sel)), sharey=True))
    for ax, r in zip(axes, sel):
        g = r["layer_grad_norms"]
        for t in steps:
            if t < len(g) and all(x is not None for x in g[t]):
                ax.semilogy(np.arange(1, layers + 1), g[t], "o-", ms=2, label=f"step {t}")
        ax.set_title(_label(r["config"]), fontsize=9)
        ax.set_xlabel("layer ℓ")
    axes[0].set_ylabel(f"‖∂L/∂θ_ℓ‖  (lr {lr:g})")
    axes[0].legend(fontsize=7)
    return _save(fig, path) if path is not None else fig
