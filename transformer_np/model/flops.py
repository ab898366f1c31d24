r"""FLOP counts of one encoder layer as a function of the config: where O(n²d + nd²) comes from.

Counting convention: one multiply-add = 2 FLOPs, so a matmul (m, k) @ (k, p) costs 2·m·k·p.
Only the matrix products are counted; the elementwise work (softmax, LayerNorm, GELU,
residual adds, bias adds, dropout) is O(B·h·n² + B·n·d_ff), one power of d (or d_k)
lower than the terms below, and is left out.

Forward pass of one layer, batch B, sequence length n, width d, h heads (d_k = d/h), FFN width d_ff:

    projections   Q, K, V = X W_Q, X W_K, X W_V; out = Concat W_O    4 · 2·B·n·d·d        = 8 B n d²
    attention     S = Q_h K_hᵀ  (per head: (n, d_k) @ (d_k, n))    h · 2·B·n·n·d_k     = 2 B n² d
                  O = A_h V_h   (per head: (n, n) @ (n, d_k))      h · 2·B·n·n·d_k     = 2 B n² d
                  → "attention_scores" = 4 B n² d  (Σ_h d_k = d: splitting into heads costs nothing extra)
    ffn           Z W_1 (n, d)@(d, d_ff), then (n, d_ff)@(d_ff, d)  2 · 2·B·n·d·d_ff    = 4 B n d d_ff

    total = 4 B n² d + 8 B n d² + 4 B n d d_ff   (= 4 B n² d + 24 B n d² for d_ff = 4d)

Backward: every product Y = X W needs dX = dY Wᵀ and dW = Xᵀ dY, two products of the
forward's size (for the attention products both operands are activations, and both get
a gradient: again two products). So "fwd+bwd" is exactly 3× "fwd", term by term.

Crossover: the n at which the quadratic term equals the linear ones. Dividing
4 B n² d = 8 B n d² + 4 B n d d_ff by 4 B n d:

    n* = 2 d + d_ff      (attention products vs projections + FFN)   = 6d for d_ff = 4d
    n* = 2 d             (vs the four projections alone)
    n* = d_ff            (vs the FFN alone)                         = 4d

B and the mode cancel. For BERT-base (d = 768, d_ff = 3072): n* = 4608 — so at BERT's
n ≤ 512 the nd² terms are ≥ 9× the n²d term; the quadratic term only dominates for
sequences several times longer than d, not as soon as n > d.
"""

from __future__ import annotations

from .._validate import check_choice, check_int, describe
from .config import EncoderConfig

__all__ = ["layer_flops", "stack_flops", "crossover_n", "MODES", "CROSSOVER_AGAINST"]

MODES = ("fwd", "fwd+bwd")
CROSSOVER_AGAINST = ("projections+ffn", "projections", "ffn")
_MODE_FACTOR = {"fwd": 1, "fwd+bwd": 3}


def _check_config(config) -> None:
    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config must be an EncoderConfig, got {describe(config)}")


def layer_flops(config: EncoderConfig, batch: int, n: int, mode: str = "fwd") -> dict:
    """FLOPs of one encoder layer (see the module docstring for the derivation).

    Args:
        config: an :class:`EncoderConfig` (uses d_model, d_ff; h cancels out).
        batch: B ≥ 1 sequences.
        n: sequence length ≥ 1.
        mode: "fwd" or "fwd+bwd" (= 3 × fwd).

    Returns:
        dict of ints: ``attention_scores`` (QKᵀ and A·V, 4·B·n²·d), ``projections``
        (W_Q, W_K, W_V, W_O, 8·B·n·d²), ``ffn`` (W_1 and W_2, 4·B·n·d·d_ff) and ``total``
        (their sum), each multiplied by 3 for "fwd+bwd".
    """
    _check_config(config)
    check_int(batch, "batch", minimum=1)
    check_int(n, "n", minimum=1)
    check_choice(mode, "mode", MODES)
    d, f, k = config.d_model, config.d_ff, _MODE_FACTOR[mode]
    out = {
        "attention_scores": k * 4 * batch * n * n * d,      # QKᵀ + A V, all heads
        "projections": k * 8 * batch * n * d * d,           # Q, K, V, O
        "ffn": k * 4 * batch * n * d * f,                   # W_1, W_2
    }
    out["total"] = out["attention_scores"] + out["projections"] + out["ffn"]
    return out


def stack_flops(config: EncoderConfig, batch: int, n: int, mode: str = "fwd") -> dict:
    """N × :func:`layer_flops` (the article's O(N(n²d + nd²))); embeddings and heads excluded."""
    per_layer = layer_flops(config, batch, n, mode)
    return {key: config.n_layers * v for key, v in per_layer.items()}


def crossover_n(config: EncoderConfig, against: str = "projections+ffn") -> float:
    """Sequence length n* at which the attention products cost as much as ``against``.

    n* = 2d + d_ff ("projections+ffn"), 2d ("projections") or d_ff ("ffn"); independent of
    the batch size and of fwd vs fwd+bwd. For n > n* the n²d term dominates.
    """
    _check_config(config)
    check_choice(against, "against", CROSSOVER_AGAINST)
    d, f = config.d_model, config.d_ff
    # 4 n² d = (8 n d²)·[proj] + (4 n d f)·[ffn]   ⇒   n = 2d·[proj] + f·[ffn]
    return float({"projections+ffn": 2 * d + f, "projections": 2 * d, "ffn": f}[against])
