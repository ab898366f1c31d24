r"""A training run's definition and its state at step 0: :class:`RunConfig`, :class:`TrainState`, the memory
estimate, and the fresh state that :func:`~transformer_np.training.loop.build` starts from and
:func:`~transformer_np.training.checkpoint.load_checkpoint` fills with a checkpoint's arrays.

The lower layer of the two: the loop (:mod:`transformer_np.training.loop`) and the checkpoint
(:mod:`transformer_np.training.checkpoint`) both import from here, and the loop imports the checkpoint, so
every import goes one way. The names keep resolving from :mod:`transformer_np.training.loop`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from .._validate import check_choice, check_float, check_int, describe
from ..errors import InputTypeError, InputValueError
from ..model.budget import MemoryEstimate, check_memory, estimate_encoder
from ..model.config import EncoderConfig
from ..model.params import INITS, init_params
from .optim import AdamW, WarmupCosineSchedule, WarmupLinearSchedule
from .tasks import TASKS, Task, get_task, head_param_shapes, init_model, task_config

__all__ = ["RunConfig", "TrainState", "estimate_run", "SCHEDULES"]

SCHEDULES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a training run (stored in the checkpoint as JSON).

    ``warmup``: linear warm-up steps (0 = none; lr(t) = lr · t / warmup, HF's convention, so
    the first step of a warmed-up run has lr 0). ``schedule``: what follows the warm-up —
    "constant" (the fixed lr of the warm-up experiment), "linear" or "cosine" decay to 0 at
    ``steps``. ``weight_decay`` 0 makes AdamW plain Adam. ``clip`` 0 = no clipping (the
    global norm is logged either way). ``grad_norm_steps``: record per-layer gradient norms
    for the first this-many steps. ``init``: the encoder's weight matrices ~ N(0, 0.02²)
    ("bert") or Glorot-uniform ("xavier"; embeddings and the task head stay N(0, 0.02²)), see
    :func:`~transformer_np.model.params.init_params`. ``betas``, ``eps``: AdamW's (β₁, β₂), ε.
    """

    task: str = "sort"
    init: str = "bert"
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
        check_choice(self.init, "init", INITS)
        check_choice(self.schedule, "schedule", SCHEDULES)
        check_choice(self.dtype, "dtype", ("float32", "float64"))
        check_float(self.lr, "lr", 0.0, min_inclusive=False)
        check_float(self.weight_decay, "weight_decay", 0.0)
        check_float(self.clip, "clip", 0.0)
        check_float(self.dropout, "dropout", 0.0, 1.0, max_inclusive=False)
        check_int(self.seq_len, "seq_len", minimum=2, allow_none=True)
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise InputTypeError(f"betas must be a pair (beta1, beta2), got {describe(self.betas)}")
        for i, b in enumerate(self.betas):
            check_float(b, f"betas[{i}]", 0.0, 1.0, max_inclusive=False)
        if self.schedule != "constant" and self.warmup > self.steps:
            raise ValueError(f"warmup must be <= steps = {self.steps} for a decaying schedule, got {self.warmup}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        """The inverse of :meth:`to_dict` (fields not given take their defaults); validated."""
        if not isinstance(d, dict):
            raise InputTypeError(f"a run config must be a dict, got {describe(d)}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known, key=str)
        if unknown:
            raise InputValueError(f"unknown run config fields {unknown}")
        return cls(**{k: tuple(v) if k == "betas" and isinstance(v, list) else v for k, v in d.items()})


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
    start_step: int = 0          # the step this process started from (> 0 after a resume)
    not_saved: str | None = None  # why the last checkpoint was not written (a parameter stopped being finite)


def _schedule(cfg: RunConfig):
    if cfg.schedule == "cosine":
        return WarmupCosineSchedule(cfg.lr, cfg.warmup, cfg.steps)
    return WarmupLinearSchedule(cfg.lr, cfg.warmup, cfg.steps if cfg.schedule == "linear" else None)


def _new_history() -> dict:
    return {"step": [], "loss": [], "lr": [], "grad_norm": [], "layer_grad_norms": [],
            "eval": {"step": [], "loss": [], "accuracy": []}, "diverged_at": None}


def estimate_run(cfg: RunConfig, task: Task | None = None, mc: EncoderConfig | None = None) -> MemoryEstimate:
    """The memory a training run needs (parameters, gradients, AdamW's moments, one batch's
    activations and attention maps, the head's logits), estimated from the sizes alone."""
    if not isinstance(cfg, RunConfig):
        raise TypeError(f"cfg must be a RunConfig, got {describe(cfg)}")
    if task is None or mc is None:
        task = get_task(cfg.task, seq_len=cfg.seq_len)
        mc = _model_config(cfg, task)
    dt = np.dtype(cfg.dtype)
    est = estimate_encoder(mc, dt, cfg.batch_size, task.seq_len, backward=True, optimizer_slots=2)
    n_head = 0
    for shape in head_param_shapes(task, mc).values():
        n_head += math.prod(shape)
    tokens = cfg.batch_size * task.seq_len
    extra = {"parameters": n_head * dt.itemsize, "gradients": n_head * dt.itemsize,
             "optimiser state": 2 * n_head * dt.itemsize,
             "activations": 3 * tokens * task.n_classes * dt.itemsize      # logits, probabilities, dlogits
             + 4 * tokens * 8 * (1 + cfg.eval_batches)}                    # int64 batches (ids, mask, labels)
    return est + MemoryEstimate(extra)


def _model_config(cfg: RunConfig, task: Task) -> EncoderConfig:
    return task_config(task, cfg.layers, cfg.d_model, cfg.heads, cfg.norm, dropout=cfg.dropout)


def _setup(cfg: RunConfig) -> tuple[Task, EncoderConfig]:
    """Task and encoder config of ``cfg``, after checking the run's memory estimate."""
    if not isinstance(cfg, RunConfig):
        raise TypeError(f"cfg must be a RunConfig, got {describe(cfg)}")
    task = get_task(cfg.task, seq_len=cfg.seq_len)
    mc = _model_config(cfg, task)
    check_memory(estimate_run(cfg, task, mc), "train")
    return task, mc


def _assemble(cfg: RunConfig, task: Task, mc: EncoderConfig, params: dict | None = None) -> TrainState:
    """The TrainState of ``cfg`` at step 0, with fresh parameters (seed) or the given ones."""
    if params is None:
        params = init_model(task, mc, seed=cfg.seed, dtype=np.dtype(cfg.dtype))
        if cfg.init != "bert":              # the encoder's matrices re-drawn; embeddings (drawn first) unchanged
            params.update(init_params(mc, seed=cfg.seed, dtype=np.dtype(cfg.dtype), init=cfg.init))
    opt = AdamW(params, lr=_schedule(cfg), betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    erng = np.random.default_rng([cfg.seed, 4])                         # held-out batches: fixed per seed
    evals = [task.make_batch(erng, cfg.batch_size) for _ in range(cfg.eval_batches)]
    return TrainState(cfg, task, mc, params, opt, 0, _new_history(), evals)
