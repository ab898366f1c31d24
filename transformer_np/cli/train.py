"""The ``train`` command: train a small encoder in NumPy (see :mod:`transformer_np.training.loop`).

The progress bar on stderr shows ``loss (avg)``, the training loss averaged over about the last 20 steps
(an exponential moving average), and at each evaluation the eval loss and accuracy on fixed held-out batches;
the summary gives the training loss of the last step's batch alone and the last evaluation's numbers."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from ..course.plots.stability import plot_loss_curve
from ..errors import InputValueError
from ..textout import terminal
from ..training.checkpoint import read_checkpoint_config
from ..training.loop import CHECKPOINT, CURVE_JSON, CURVE_PNG, SCHEDULES, RunConfig, train
from ..training.tasks import TASKS

# ----------------------------------------------------------------------------- CLI
# RunConfig's fields (and the names its checks use) as the flags that set them: errors name the flag
PARAMETER_FLAGS = {
    "task": "--task", "layers": "--layers", "d_model": "--d-model", "heads": "--heads", "n_heads": "--heads",
    "norm": "--norm", "init": "--init", "betas": "--betas", "betas[0]": "--betas B1", "betas[1]": "--betas B2",
    "eps": "--adam-eps", "lr": "--lr", "warmup": "--warmup", "schedule": "--schedule", "steps": "--steps",
    "seed": "--seed", "batch_size": "--batch-size", "eval_every": "--eval-every", "weight_decay": "--weight-decay",
    "clip": "--clip", "dropout": "--dropout", "seq_len": "--seq-len", "dtype": "--dtype", "out": "--out",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Run settings default to None ("not given"): a new run fills them from RunConfig's defaults, a
    # resumed run from its checkpoint — so `--resume --steps 400` needs no other flag, and a flag
    # that contradicts the checkpoint (e.g. another --layers) is an error instead of being ignored.
    d = RunConfig()
    parser.add_argument("--task", choices=TASKS, default=None,
                        help="sort: sort the tokens; cls: balanced brackets? ([CLS] head); tag: count each token "
                             f"(1/2/≥3); mlm: masked LM on the shipped character corpus (default {d.task})")
    parser.add_argument("--layers", type=int, default=None, help=f"N, encoder layers (default {d.layers})")
    parser.add_argument("--d-model", type=int, default=None, help=f"d_model (default {d.d_model})")
    parser.add_argument("--heads", type=int, default=None, help=f"h, attention heads (default {d.heads})")
    parser.add_argument("--norm", choices=("pre", "post"), default=None,
                        help=f"LayerNorm placement (default {d.norm})")
    parser.add_argument("--init", choices=("bert", "xavier"), default=None,
                        help=f"encoder weight init: bert = N(0, 0.02²), xavier = Glorot-uniform (default {d.init})")
    parser.add_argument("--betas", type=float, nargs=2, metavar=("B1", "B2"), default=None,
                        help=f"AdamW's (β₁, β₂) (default {' '.join(str(b) for b in d.betas)})")
    parser.add_argument("--adam-eps", dest="eps", type=float, default=None, help=f"AdamW's ε (default {d.eps:g})")
    parser.add_argument("--lr", type=float, default=None, help=f"peak learning rate of AdamW (default {d.lr})")
    parser.add_argument("--warmup", type=int, default=None,
                        help=f"linear warm-up steps, 0 = none (default {d.warmup})")
    parser.add_argument("--schedule", choices=SCHEDULES, default=None,
                        help="after warm-up: keep lr, or decay it linearly / by a cosine to 0 at --steps "
                             f"(default {d.schedule})")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"total optimisation steps (with --resume: the new total) (default {d.steps})")
    parser.add_argument("--seed", type=int, default=None,
                        help=f"seeds init, data and dropout: same seed => bit-identical run on the same machine "
                             f"and thread count (default {d.seed})")
    parser.add_argument("--batch-size", type=int, default=None, help=f"sequences per step (default {d.batch_size})")
    parser.add_argument("--eval-every", type=int, default=None,
                        help=f"evaluate and checkpoint every this many steps (default {d.eval_every})")
    parser.add_argument("--weight-decay", type=float, default=None,
                        help=f"AdamW's decoupled weight decay; 0 = Adam (default {d.weight_decay})")
    parser.add_argument("--clip", type=float, default=None,
                        help=f"clip the global gradient norm to this, 0 = off (default {d.clip})")
    parser.add_argument("--dropout", type=float, default=None, help=f"dropout probability (default {d.dropout})")
    parser.add_argument("--seq-len", type=int, default=None, help="sequence length incl. [CLS] (default: per task)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default=None, help=f"(default {d.dtype})")
    parser.add_argument("--out", default="runs/train", help="output directory (default %(default)s)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run saved in --out from its last complete checkpoint (its settings are "
                             "used; --steps is the new total; other settings must match the checkpoint's)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start a new run in --out even if it holds an earlier run's checkpoint, loss curve or "
                             "plot, replacing them (without this flag, or --resume, such an --out is refused so that "
                             "no earlier result is lost)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _given(args: argparse.Namespace) -> dict:
    """The RunConfig fields set on the command line (flags left at None were not given)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunConfig)
             if getattr(args, f.name, None) is not None}
    if "betas" in given:
        given["betas"] = tuple(given["betas"])
    return given


def _plot_atomically(history: dict, path: Path, title: str) -> Path | None:
    """The loss-curve PNG, drawn into a temporary sibling and renamed over ``path`` in one step; None without
    matplotlib (then an older plot at ``path``, which would describe another run, is removed)."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        png = plot_loss_curve(history, tmp, title)
        if png is None:
            if path.is_file() and not path.is_symlink():
                path.unlink()
            return None
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _saved_step(out: Path) -> str:
    try:
        with np.load(out / CHECKPOINT, allow_pickle=False) as z:
            return str(int(z["step"]))
    except (OSError, ValueError, KeyError):
        return "?"


def _interrupted(out: Path) -> str:
    """The one line Ctrl-C prints: what the interrupted run left in ``out`` and how to continue it (a checkpoint
    is written atomically at every evaluation, so the last one is whole)."""
    lead = "\n" if sys.stderr.isatty() else ""          # the bar redraws in place: end its line first
    if (out / CHECKPOINT).is_file():
        command = f"transformer-np train --out {shlex.quote(str(out))} --resume"
        return lead + terminal(f"transformer-np train: interrupted; the checkpoint of step {_saved_step(out)} is "
                               f"kept in {out / CHECKPOINT}: continue with {command}")
    return lead + terminal("transformer-np train: interrupted before the first checkpoint (written every "
                           "--eval-every steps): nothing was kept; run the command again to start over")


def run(args: argparse.Namespace) -> int:
    given = _given(args)
    out = Path(args.out)
    if args.resume and args.overwrite:
        raise InputValueError("--resume and --overwrite contradict each other: continue the run in --out, or "
                              "replace it")
    if args.resume:
        if not os.path.lexists(out / CHECKPOINT):      # anything else at the name is the loader's to refuse
            raise InputValueError(f"--resume: no checkpoint at {out / CHECKPOINT}")
        cfg = dataclasses.replace(read_checkpoint_config(out / CHECKPOINT), **given)
    else:
        cfg = RunConfig(**given)
    t0 = time.perf_counter()
    try:
        state = train(cfg, out=out, resume=args.resume, progress=not args.quiet, overwrite=args.overwrite)
    except KeyboardInterrupt:
        print(_interrupted(out), file=sys.stderr)
        return 130
    seconds = time.perf_counter() - t0
    h = state.history
    c = state.cfg
    title = (f"{c.task}, {c.layers}-layer {c.norm.capitalize()}-LN, {c.init} init, d={c.d_model}, lr {c.lr:g}, "
             f"warm-up {c.warmup}")
    png = _plot_atomically(h, out / CURVE_PNG, title)
    ran = state.step - state.start_step
    if state.start_step:
        msg = f"{c.task}: resumed at step {state.start_step}, ran {ran} steps to step {state.step} in {seconds:.1f}s"
        if ran == 0 and h["diverged_at"] is None:
            msg += (f" (the checkpoint is already at --steps {c.steps}; pass a larger --steps to continue)"
                    if c.schedule == "constant" else f" (the checkpoint is already at --steps {c.steps}, where its "
                    f"{c.schedule} schedule ends)")
    else:
        msg = f"{c.task}: {ran} steps in {seconds:.1f}s"
    if h["loss"]:
        msg += f"; train loss {h['loss'][-1]:.4f} at the last step (its batch alone" + \
            ("" if args.quiet else "; the progress bar's loss (avg) averages about the last 20 steps") + ")"
    if h["eval"]["step"]:
        msg += f", eval loss {h['eval']['loss'][-1]:.4f}, eval accuracy {h['eval']['accuracy'][-1]:.3f}"
    if h["diverged_at"] is not None:
        msg += f"; DIVERGED at step {h['diverged_at']}"
    if state.not_saved:
        kept = f"the checkpoint of step {_saved_step(out)} is kept" if (out / CHECKPOINT).is_file() else \
            "there is no earlier checkpoint"
        msg += f"; {state.not_saved} ({kept})"
    print(terminal(msg))
    wrote = ([out / CHECKPOINT] if ran and not state.not_saved else []) + [out / CURVE_JSON] + ([png] if png else [])
    print("wrote " + ", ".join(terminal(w) for w in wrote))
    return 0
