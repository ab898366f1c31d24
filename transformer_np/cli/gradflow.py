"""The ``gradflow`` command: how the gradient flows back through a deep Pre-LN / Post-LN stack.

Builds one random encoder stack of --depth layers, runs it forward and backward on a fixed linear read-out
of its output (L = sum(H_final * R), R standard normal from the seed), and prints for every layer l the norm
of the gradient reaching the residual stream H^(l), the same norm along the identity path alone (every
branch Jacobian dropped: for Pre-LN the top layer's norm at every depth, 0 without residuals), the norm of
the gradient of that layer's FFN output weight W_2, the RMS of H^(l) and the mean cosine between distinct
tokens' vectors (1 means they have collapsed to one direction). The last line gives the ratio at the probe
layer K. The header line comes first, then (on stderr) the progress of the forward and the two backward
passes. Compare --variant pre with post, no-residual and no-layernorm to see what the residuals and
LayerNorm each do.

Python API: :func:`transformer_np.course.gradflow.measure`; the figures come from ``transformer-np figures
--only gradflow``.
"""

from __future__ import annotations

import argparse
import json

from ..course.gradflow import DEFAULT_DIMS, INITS, LOSS, VARIANTS, measure, measure_estimate
from ..model.budget import check_memory
from ._progress import Progress


# ----------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variant", default="pre", choices=VARIANTS,
                        help="pre: Pre-LN (the default); post: Post-LN; no-residual: Post-LN with the skips removed; "
                             "no-layernorm: the skips without any LayerNorm")
    parser.add_argument("--depth", type=int, default=96, help="number of layers L (default 96)")
    parser.add_argument("--init", default="xavier", choices=INITS,
                        help="weight init: xavier = Glorot uniform (default), bert = N(0, 0.02²)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the weights; the inputs and the read-out R use seed + 1 (default 0)")
    parser.add_argument("--probe-layer", type=int, default=None, metavar="K",
                        help="K in 0..L: report ‖∂L/∂H^(K)‖ / ‖∂L/∂H^(L)‖ (default ⌊L/2⌋)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of a table (no progress on stderr)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--d-model", type=int, default=DEFAULT_DIMS["d_model"], metavar="D",
                        help=f"model width d_model, divisible by --heads (default {DEFAULT_DIMS['d_model']})")
    parser.add_argument("--heads", type=int, default=DEFAULT_DIMS["n_heads"], metavar="H",
                        help=f"attention heads per layer (default {DEFAULT_DIMS['n_heads']})")
    parser.add_argument("--d-ff", type=int, default=DEFAULT_DIMS["d_ff"], metavar="F",
                        help=f"hidden width of each feed-forward block (default {DEFAULT_DIMS['d_ff']})")
    parser.add_argument("--n", type=int, default=DEFAULT_DIMS["n"],
                        help=f"tokens per sequence (default {DEFAULT_DIMS['n']})")
    parser.add_argument("--batch", type=int, default=DEFAULT_DIMS["batch"], metavar="B",
                        help=f"sequences per batch (default {DEFAULT_DIMS['batch']})")


def _check_cli(args) -> None:
    for flag, val, lo in (("--depth", args.depth, 1), ("--seed", args.seed, 0), ("--d-model", args.d_model, 1),
                          ("--heads", args.heads, 1), ("--d-ff", args.d_ff, 1), ("--n", args.n, 1),
                          ("--batch", args.batch, 1)):
        if val < lo:
            raise ValueError(f"{flag} must be >= {lo}, got {val}")
    if args.d_model % args.heads:
        raise ValueError(f"--d-model must be divisible by --heads, got {args.d_model} and {args.heads}")
    if args.probe_layer is not None and not 0 <= args.probe_layer <= args.depth:
        raise ValueError(f"--probe-layer must lie in 0..{args.depth} (0..--depth), got {args.probe_layer}")


def _fmt(x) -> str:
    return "       n/a" if x is None else f"{x:10.3e}"


def run(args: argparse.Namespace) -> int:
    _check_cli(args)
    check_memory(measure_estimate(args.depth, args.d_model, args.heads, args.d_ff, args.n, args.batch),
                 f"gradflow --depth {args.depth} --d-model {args.d_model} --d-ff {args.d_ff} --n {args.n} "
                 f"--batch {args.batch}")
    if not args.json:   # the header at once: the measurement takes seconds (more on a busy machine)
        print(f"gradflow: variant={args.variant} depth={args.depth} init={args.init} seed={args.seed} "
              f"d_model={args.d_model} h={args.heads} d_ff={args.d_ff} n={args.n} batch={args.batch}")
        print(f"loss: {LOSS}", flush=True)
    bar = None if (args.json or args.quiet) else Progress("gradflow")
    try:
        r = measure(args.variant, args.depth, args.init, args.seed, args.probe_layer, d_model=args.d_model,
                    n_heads=args.heads, d_ff=args.d_ff, n=args.n, batch=args.batch, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(json.dumps(r, allow_nan=False))
        return 0
    L = r["depth"]
    print(f"{'ℓ':>4}  {'‖∂L/∂H^(ℓ)‖':>10}  {'identity':>10}  {'‖∂L/∂W_2‖':>10}  {'RMS H^(ℓ)':>10}  {'token cos':>10}")
    for i in range(L + 1):
        w2 = r["w2_grad_norm_by_layer"][i - 1] if i >= 1 else None
        print(f"{i:4d}  {_fmt(r['grad_norm_by_layer'][i])}  {_fmt(r['identity_grad_norm_by_layer'][i])}  "
              f"{_fmt(w2) if i else '         -'}  {_fmt(r['rms_by_layer'][i])}  {_fmt(r['token_cosine_by_layer'][i])}")
    K = r["probe_layer"]
    print(f"probe layer K = {K}: ‖∂L/∂H^(K)‖ / ‖∂L/∂H^(L)‖ = {_fmt(r['probe_full_ratio']).strip()} (full), "
          f"{_fmt(r['probe_identity_ratio']).strip()} (identity path only)")
    if not r["finite"]:
        print("note: some values overflowed to inf/NaN (shown as n/a)")
    return 0
