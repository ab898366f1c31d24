r"""Scaled dot-product attention and multi-head attention, vectorised over batch and heads.

Scaled dot-product attention (one head; every leading axis is a batch axis):
    S = Q Kᵀ / √d_k + M          (n_q, n_k)   M: additive mask (0 or very negative)
    A = softmax(S)  (row-wise)   (n_q, n_k)   rows sum to 1
    O = A V                      (n_q, d_v)
Backward, given dO (A_drop = A, or A after dropout in training):
    dV = A_dropᵀ dO                       (n_k, d_v)
    dA = dO Vᵀ  (then through the dropout mask)   (n_q, n_k)
    dS = A ⊙ (dA − rowsum(dA ⊙ A))        (n_q, n_k)   the softmax backward, row by row
    dQ = dS K / √d_k                      (n_q, d_k)
    dK = dSᵀ Q / √d_k                     (n_k, d_k)   (the mask is a constant)
The derivations: O = A V is a product, so dA = dO Vᵀ and dV = Aᵀ dO; the softmax rule is
in :mod:`transformer_np.ops.softmax`; S = Q Kᵀ/√d_k is a product again.

Multi-head attention (h heads, d_k = d_model / h), for X of shape (B, n, d_model):
    Q = X W_Q + b_Q,  K = X W_K + b_K,  V = X W_V + b_V          each (B, n, d_model)
    split heads: (B, n, d_model) → (B, n, h, d_k) → (B, h, n, d_k)   (reshape + transpose)
    O_h = Attention(Q_h, K_h, V_h)                                   (B, h, n, d_k)
    merge heads: (B, h, n, d_k) → (B, n, h, d_k) → (B, n, d_model)   (= Concat(head_1..head_h))
    MHA(X) = Concat(O_1, …, O_h) W_O + b_O                          (B, n, d_model)
Splitting by reshape is exactly the article's per-head W_Q[h]: head i owns columns
i·d_k … (i+1)·d_k − 1 of W_Q. Backward: the chain in reverse; X feeds three projections, so
dX = dQ W_Qᵀ + dK W_Kᵀ + dV W_Vᵀ.

This module is the plain path: the equations above, line by line. The encoder stack runs the
same maths through :mod:`transformer_np.fast` by default (scores by blocks of query rows,
in-place buffers, one fused [W_Q | W_K | W_V] projection); ``tests/ops/test_fast_path.py``
proves the two agree.

The public functions check their arguments once; the ``_``-prefixed kernels compute without
checks, for callers that have already checked.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import (
    all_finite,
    as_float_array,
    check_bool,
    check_cache,
    check_dout,
    check_float,
    check_int,
    check_rng,
    describe,
)
from ..errors import InputTypeError, InputValueError, NonFiniteError
from .cache import check_not_freed, engine_backward, release
from .dropout import _dropout_backward, _dropout_forward
from .linear import _linear_backward, _linear_forward
from .softmax import _softmax as softmax  # the unchecked kernel: S was built here

__all__ = ["attention_forward", "attention_backward", "mha_forward", "mha_backward",
           "MHA_PARAM_NAMES", "split_heads", "merge_heads"]

MHA_PARAM_NAMES = ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O")


# ----------------------------------------------------------------------------- the computation
def _attention_forward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: np.ndarray | None = None,
                       dropout_p: float = 0.0, training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    """S = Q Kᵀ/√d_k + M, A = softmax(S), O = A V (A after dropout in training)."""
    d_k = Q.shape[-1]
    M = 0.0 if mask is None else mask                        # additive: 0 = allowed, very negative = hidden
    S = Q @ K.swapaxes(-1, -2) / math.sqrt(d_k) + M          # (..., n_q, n_k)  (√ as a Python float keeps float32)
    A = softmax(S)                                           # (..., n_q, n_k)  rows sum to 1
    A_drop, drop_cache = _dropout_forward(A, dropout_p, training, rng)
    O = A_drop @ V                                           # (..., n_q, d_v)
    cache = {"kind": "attention", "Q": Q, "K": K, "V": V, "scale": 1.0 / math.sqrt(d_k),
             "scores": S, "weights": A, "A_drop": A_drop, "dropout": drop_cache}
    return O, cache


# ----------------------------------------------------------------------------- the heads' layout
def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(B, n, d_model) → (B, h, n, d_k): a view when possible, never a loop over heads."""
    B, n, d = x.shape
    return x.reshape(B, n, n_heads, d // n_heads).transpose(0, 2, 1, 3)   # (B, h, n, d_k)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, h, n, d_k) → (B, n, h·d_k): the concatenation of the heads along features."""
    B, h, n, dk = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, n, h * dk)     # (B, n, d_model)


def _attention_backward(dO: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The module docstring's backward, line by line."""
    Q, K, V, A, A_drop = cache["Q"], cache["K"], cache["V"], cache["weights"], cache["A_drop"]
    d_k = Q.shape[-1]
    dV = A_drop.swapaxes(-1, -2) @ dO                        # (..., n_k, d_v)   dV = A_dropᵀ dO
    dA_drop = dO @ V.swapaxes(-1, -2)                        # (..., n_q, n_k)   ∂L/∂A_drop = dO Vᵀ
    dA = _dropout_backward(dA_drop, cache["dropout"])        # through the dropout mask (identity at eval)
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))     # dS = A ⊙ (dA − rowsum(dA ⊙ A))
    dQ = dS @ K / math.sqrt(d_k)                             # (..., n_q, d_k)
    dK = dS.swapaxes(-1, -2) @ Q / math.sqrt(d_k)            # (..., n_k, d_k)
    return dQ, dK, dV


def _mha_forward(x: np.ndarray, p: dict, n_heads: int, mask: np.ndarray | None = None,
                 dropout_p: float = 0.0, training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    c: dict = {"kind": "mha", "n_heads": n_heads}
    Q, c["q"] = _linear_forward(x, p["W_Q"], p["b_Q"])                   # (B, n, d)
    K, c["k"] = _linear_forward(x, p["W_K"], p["b_K"])                   # (B, n, d)
    V, c["v"] = _linear_forward(x, p["W_V"], p["b_V"])                   # (B, n, d)
    Q, K, V = (split_heads(t, n_heads) for t in (Q, K, V))               # each (B, h, n, d_k)
    O, c["attn"] = _attention_forward(Q, K, V, mask, dropout_p, training, rng)   # (B, h, n, d_k)
    out, c["o"] = _linear_forward(merge_heads(O), p["W_O"], p["b_O"])    # (B, n, d)
    return out, c


def _mha_backward(dout: np.ndarray, cache: dict) -> tuple[np.ndarray, dict]:
    h = cache["n_heads"]
    dctx, dW_O, db_O = _linear_backward(dout, cache["o"])                # (B, n, d)
    dQ, dK, dV = _attention_backward(split_heads(dctx, h), cache["attn"])   # each (B, h, n, d_k)
    dxq, dW_Q, db_Q = _linear_backward(merge_heads(dQ), cache["q"])      # (B, n, d)
    dxk, dW_K, db_K = _linear_backward(merge_heads(dK), cache["k"])
    dxv, dW_V, db_V = _linear_backward(merge_heads(dV), cache["v"])
    dx = dxq + dxk + dxv                                                 # x fed all three projections
    grads = {"W_Q": dW_Q, "b_Q": db_Q, "W_K": dW_K, "b_K": db_K, "W_V": dW_V, "b_V": db_V,
             "W_O": dW_O, "b_O": db_O}
    return dx, grads


# ----------------------------------------------------------------------------- checks
def check_attention_mask(mask, score_shape: tuple, dtype, name: str = "mask") -> None:
    """An additive mask of the scores' dtype that broadcasts to ``score_shape`` without enlarging it.

    −inf is allowed (a blocked position: exp(−inf) = 0); NaN and +inf are refused (NonFiniteError)."""
    as_float_array(mask, name, dtype=dtype, finite=False)
    if not all_finite(mask) and (np.isnan(mask).any() or np.isposinf(mask).any()):
        raise NonFiniteError(f"{name} must hold finite numbers or -inf (a blocked position), got "
                             f"{int(np.isnan(mask).sum())} NaN and {int(np.isposinf(mask).sum())} +inf entries")
    try:
        ok = np.broadcast_shapes(mask.shape, score_shape) == tuple(score_shape)
    except ValueError:
        ok = False
    if not ok:
        raise InputValueError(f"{name} must broadcast to the score shape {tuple(score_shape)} without "
                              f"enlarging it, got shape {mask.shape}")


def check_dropout_args(dropout_p, training, rng) -> None:
    check_float(dropout_p, "dropout_p", 0.0, 1.0, max_inclusive=False)
    check_bool(training, "training")
    if training and dropout_p > 0:
        check_rng(rng)


def _check_mha_params(p: dict, d: int, dtype) -> None:
    if not isinstance(p, dict):
        raise InputTypeError(f"p must be a dict of the multi-head attention parameters {MHA_PARAM_NAMES}, "
                             f"got {describe(p)}")
    for name in MHA_PARAM_NAMES:
        if name not in p:
            raise InputValueError(f"params is missing the multi-head attention parameter {name!r}")
        shape = (d, d) if name.startswith("W") else (d,)
        as_float_array(p[name], name, dtype=dtype)
        if p[name].shape != shape:
            raise InputValueError(f"{name} must have shape {shape} for d_model = {d}, got shape {p[name].shape}")


def check_mha_args(x, p, n_heads, mask, dropout_p, training, rng) -> None:
    """Everything :func:`mha_forward` needs, checked once (the encoder layer uses it too)."""
    as_float_array(x, "x", ndim=3)
    check_int(n_heads, "n_heads", minimum=1)
    B, n, d = x.shape
    if n == 0 or d == 0:
        raise InputValueError(f"x must have at least one position and d_model >= 1 (shape (B, n >= 1, d >= 1)), "
                              f"got shape {x.shape}")
    if d % n_heads:
        raise InputValueError(f"d_model = {d} must be divisible by n_heads = {n_heads}")
    check_dropout_args(dropout_p, training, rng)
    _check_mha_params(p, d, x.dtype)
    if mask is not None:
        check_attention_mask(mask, (B, n_heads, n, n), x.dtype)


# ----------------------------------------------------------------------------- the public API
def attention_forward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: np.ndarray | None = None,
                      dropout_p: float = 0.0, training: bool = False,
                      rng: np.random.Generator | None = None) -> tuple[np.ndarray, dict]:
    """softmax(Q Kᵀ/√d_k + mask) V over the last two axes.

    Args:
        Q: (..., n_q, d_k); K: (..., n_k, d_k); V: (..., n_k, d_v) — one float dtype, the same
            leading (batch, head) axes.
        mask: additive, broadcastable to the scores' shape (..., n_q, n_k) (see
            :mod:`transformer_np.ops.masks`); None = no mask.
        dropout_p, training, rng: dropout on the attention weights (training only; ``rng`` a
            ``numpy.random.Generator``, required when training with ``dropout_p > 0``).

    Returns:
        ``(O, cache)``: O (..., n_q, d_v). The cache documents every step: ``"scores"`` S =
        Q Kᵀ/√d_k + mask, ``"weights"`` A = softmax(S), ``"A_drop"`` (A after dropout; A itself
        at eval), and ``"Q"``, ``"K"``, ``"V"``, ``"scale"`` (1/√d_k), ``"dropout"``.
    """
    as_float_array(Q, "Q")
    as_float_array(K, "K", dtype=Q.dtype)
    as_float_array(V, "V", dtype=Q.dtype)
    if Q.ndim < 2 or K.ndim != Q.ndim or V.ndim != Q.ndim:
        raise InputValueError(f"Q, K, V must have the same rank >= 2, got shapes {Q.shape}, {K.shape}, {V.shape}")
    if K.shape[:-2] != Q.shape[:-2] or V.shape[:-2] != Q.shape[:-2]:
        raise InputValueError(f"Q, K, V must have the same leading (batch, head) axes, got shapes "
                              f"{Q.shape}, {K.shape}, {V.shape}")
    if K.shape[-1] != Q.shape[-1]:
        raise InputValueError(f"K must have last dimension d_k = {Q.shape[-1]} like Q, got shape {K.shape}")
    if V.shape[-2] != K.shape[-2]:
        raise InputValueError(f"V must have n_k = {K.shape[-2]} rows like K, got shape {V.shape}")
    if K.shape[-2] == 0 or Q.shape[-1] == 0:
        raise InputValueError(f"K must have at least one row (a softmax over zero keys is undefined) and d_k >= 1 "
                              f"(the scores divide by √d_k), got Q of shape {Q.shape} and K of shape {K.shape}")
    if mask is not None:
        check_attention_mask(mask, Q.shape[:-1] + (K.shape[-2],), Q.dtype)
    check_dropout_args(dropout_p, training, rng)
    return _attention_forward(Q, K, V, mask, dropout_p, training, rng)


def attention_backward(dO: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns ``(dQ, dK, dV)``; see the module docstring.

    Takes the cache of :func:`attention_forward`, or one of the speed engine's: with the same entries (Q, K, V,
    the weights A, A_drop and the dropout mask) it is read here; without A (``store_attention=False``) it
    goes to the engine's own backward (:func:`transformer_np.ops.cache.engine_backward`)."""
    check_cache(cache, "cache", "attention")
    check_dout(dO, "dO", cache["Q"].shape[:-1] + (cache["V"].shape[-1],))
    if cache.get("weights") is None:                     # the engine's store_attention=False: A recomputed
        return engine_backward("attention_backward")(dO, cache)
    return _attention_backward(dO, cache)


def mha_forward(x: np.ndarray, p: dict, n_heads: int, mask: np.ndarray | None = None,
                dropout_p: float = 0.0, training: bool = False,
                rng: np.random.Generator | None = None) -> tuple[np.ndarray, dict]:
    """Multi-head self-attention MHA(X) for X (B, n, d_model).

    ``p`` holds W_Q, b_Q, W_K, b_K, W_V, b_V (projections, (d, d) and (d,)), W_O, b_O.
    ``mask`` is additive, broadcastable to (B, h, n, n): use :func:`padding_mask`.
    Returns ``(out, cache)``; ``cache["attn"]`` is the attention cache (``"scores"`` S and
    ``"weights"`` A of shape (B, h, n, n), …) and ``cache["q"]``, ``["k"]``, ``["v"]``, ``["o"]``
    the caches of the four projections.
    """
    check_mha_args(x, p, n_heads, mask, dropout_p, training, rng)
    return _mha_forward(x, p, n_heads, mask, dropout_p, training, rng)


def mha_backward(dout: np.ndarray, cache: dict, free_cache: bool = False) -> tuple[np.ndarray, dict]:
    """Returns ``(dx, grads)`` with grads keyed W_Q, b_Q, …, b_O (same shapes as the params).

    Takes the cache of :func:`mha_forward`; the speed engine's (fused Q, K, V layout) goes to the engine's own
    backward (:func:`transformer_np.ops.cache.engine_backward`). ``free_cache=True`` frees the cache (the
    engine's as it goes, sublayer by sublayer); it cannot be backpropagated again
    (:class:`~transformer_np.errors.StaleCacheError`).
    """
    check_cache(cache, "cache", "mha")
    check_bool(free_cache, "free_cache")
    check_not_freed(cache)
    o = cache["o"]
    check_dout(dout, "dout", o["x"].shape[:-1] + (o["W"].shape[1],))
    if "qkv" in cache:                                   # the engine's fused layout
        return engine_backward("mha_backward")(dout, cache, free_cache)
    out = _mha_backward(dout, cache)
    if free_cache:
        release(cache)
    return out
