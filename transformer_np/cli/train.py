"""The ``train`` command: train a small encoder in NumPy (see :mod:`transformer_np.training.loop`)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from ..course.plots.stability import plot_loss_curve
from ..training.loop import CHECKPOINT, CURVE_JSON, CURVE_PNG, SCHEDULES, RunConfig, train
from ..training.tasks import TASKS


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
    parser.add_argument("--init", choices=("bert", "xavier"), default=d.init,
                        help="encoder weight init: bert = N(0, 0.02²), xavier = Glorot-uniform (default %(default)s)")
    parser.add_argument("--betas", type=float, nargs=2, metavar=("B1", "B2"), default=list(d.betas),
                        help="AdamW's (β₁, β₂) (default %(default)s)")
    parser.add_argument("--adam-eps", type=float, default=d.eps, help="AdamW's ε (default %(default)s)")
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
                    clip=args.clip, dropout=args.dropout, seq_len=args.seq_len, dtype=args.dtype,
                    init=args.init, betas=tuple(args.betas), eps=args.adam_eps)
    out = Path(args.out)
    if args.resume and not (out / CHECKPOINT).is_file():
        raise ValueError(f"--resume: no checkpoint at {out / CHECKPOINT}")
    t0 = time.perf_counter()
    state = train(cfg, out=out, resume=args.resume, progress=not args.quiet)
    h = state.history
    c = state.cfg
    title = (f"{c.task}, {c.layers}-layer {c.norm.capitalize()}-LN, {c.init} init, d={c.d_model}, lr {c.lr:g}, "
             f"warm-up {c.warmup}")
    png = plot_loss_curve(h, out / CURVE_PNG, title)
    msg = (f"{c.task}: {state.step} steps in {time.perf_counter() - t0:.1f}s; final train loss {h['loss'][-1]:.4f}")
    if h["eval"]["step"]:
        msg += f", eval loss {h['eval']['loss'][-1]:.4f}, eval accuracy {h['eval']['accuracy'][-1]:.3f}"
    if h["diverged_at"] is not None:
        msg += f"; DIVERGED at step {h['diverged_at']}"
    print(msg)
    print(f"wrote {out / CHECKPOINT}, {out / CURVE_JSON}" + (f", {png}" if png else ""))
    return 0
