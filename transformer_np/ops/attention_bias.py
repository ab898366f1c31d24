r"""Attention with a learned additive bias on the scores (MPNet's relative positions), and its gradient.

    S = Q Kᵀ / √d_k + P + M      (B, h, n_q, n_k)   P: a learned bias, broadcast over the batch
    A = softmax(S)                                  M: the additive mask (a constant)
    O = A_drop V                                    A_drop = A, or A after dropout in training

The forward and dQ, dK, dV are scaled dot-product attention's (:mod:`transformer_np.ops.attention`):

    dV = A_dropᵀ dO,   dA = drop'(dO Vᵀ),   dS = A ⊙ (dA − rowsum(dA ⊙ A)),
    dQ = dS K / √d_k,  dK = dSᵀ Q / √d_k.

P enters S additively (∂S/∂P is the identity on every element it reaches), so its gradient is dS
itself, summed over the axes P was broadcast along (the batch for MPNet's (1, h, n, n) bias):

    dP = Σ_{broadcast axes} dS.

Multi-head, for X (B, n, d): Q, K, V = X W_Q + b_Q, … split into heads, O merged, then · W_O + b_O —
:func:`biased_mha_forward` / :func:`biased_mha_backward`, whose backward also returns dP.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import as_float_array, check_cache, check_dout
from ..errors import InputValueError
from .attention import merge_heads, split_heads
from .dropout import _dropout_backward, _dropout_forward
from .linear import _linear_backward, _linear_forward
from .softmax import _softmax as softmax

__all__ = ["biased_attention_forward", "biased_attention_backward", "biased_mha_forward", "biased_mha_backward"]


# ----------------------------------------------------------------------------- the computation
def _biased_attention_forward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, P: np.ndarray, mask=None,
                              dropout_p: float = 0.0, training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    """S = Q Kᵀ/√d_k + P + M, A = softmax(S), O = A_drop V."""
    S = Q @ K.swapaxes(-1, -2) / math.sqrt(Q.shape[-1])     # (B, h, n_q, n_k)
    S = S + P                                                # P broadcast over the batch
    if mask is not None:
        S = S + mask                                         # 0 = allowed, finfo.min = hidden
    A = softmax(S)                                           # (B, h, n_q, n_k) rows sum to 1
    A_drop, drop_cache = _dropout_forward(A, dropout_p, training, rng)
    O = A_drop @ V                                           # (B, h, n_q, d_v)
    return O, {"kind": "biased_attention", "Q": Q, "K": K, "V": V, "weights": A, "A_drop": A_drop,
               "dropout": drop_cache, "bias_shape": P.shape}


def _sum_to(x: np.ndarray, shape: tuple) -> np.ndarray:
    """Σ of x over the axes along which an array of ``shape`` was broadcast to x's shape."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape) if axes else x


def _biased_attention_backward(dO: np.ndarray, cache: dict) -> tuple[np.ndarray, ...]:
    """The module docstring's backward, line by line: (dQ, dK, dV, dP)."""
    Q, K, V, A, A_drop = cache["Q"], cache["K"], cache["V"], cache["weights"], cache["A_drop"]
    scale = 1.0 / math.sqrt(Q.shape[-1])
    dV = A_drop.swapaxes(-1, -2) @ dO                        # (B, h, n_k, d_v)  dV = A_dropᵀ dO
    dA = _dropout_backward(dO @ V.swapaxes(-1, -2), cache["dropout"])   # (B, h, n_q, n_k)
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))     # softmax backward, row by row
    dQ = dS @ K * scale                                      # (B, h, n_q, d_k)
    dK = dS.swapaxes(-1, -2) @ Q * scale                     # (B, h, n_k, d_k)
    dP = _sum_to(dS, cache["bias_shape"])                    # P's shape, e.g. (1, h, n_q, n_k)
    return dQ, dK, dV, dP


def _biased_mha_forward(x: np.ndarray, p: dict, n_heads: int, P: np.ndarray, mask=None, dropout_p: float = 0.0,
                        training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    c: dict = {"kind": "biased_mha"}
    Q, c["q"] = _linear_forward(x, p["W_Q"], p["b_Q"])                   # (B, n, d)
    K, c["k"] = _linear_forward(x, p["W_K"], p["b_K"])
    V, c["v"] = _linear_forward(x, p["W_V"], p["b_V"])
    Q, K, V = (split_heads(t, n_heads) for t in (Q, K, V))               # each (B, h, n, d_k)
    O, c["attn"] = _biased_attention_forward(Q, K, V, P, mask, dropout_p, training, rng)   # (B, h, n, d_k)
    out, c["o"] = _linear_forward(merge_heads(O), p["W_O"], p["b_O"])    # (B, n, d)
    return out, c


def _biased_mha_backward(dout: np.ndarray, cache: dict) -> tuple[np.ndarray, dict, np.ndarray]:
    g: dict = {}
    dO, g["W_O"], g["b_O"] = _linear_backward(dout, cache["o"])          # (B, n, d)
    h = cache["attn"]["Q"].shape[1]
    dQ, dK, dV, dP = _biased_attention_backward(split_heads(dO, h), cache["attn"])
    dx, g["W_Q"], g["b_Q"] = _linear_backward(merge_heads(dQ), cache["q"])   # X feeds three projections:
    dx_k, g["W_K"], g["b_K"] = _linear_backward(merge_heads(dK), cache["k"])  # dX = dQ W_Qᵀ + dK W_Kᵀ + dV W_Vᵀ
    dx_v, g["W_V"], g["b_V"] = _linear_backward(merge_heads(dV), cache["v"])
    dx = dx + dx_k + dx_v                                                 # (B, n, d)
    return dx, {k: g[k] for k in ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O")}, dP


# ----------------------------------------------------------------------------- the public API
def _check_bias(P, shape: tuple, dtype) -> None:
    as_float_array(P, "P", ndim=4, dtype=dtype)
    try:
        np.broadcast_shapes(P.shape, shape)
    except ValueError:
        raise InputValueError(f"P must broadcast to the scores' shape {shape}, got shape {P.shape}") from None


def biased_attention_forward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, P: np.ndarray, mask=None,
                             dropout_p: float = 0.0, training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    """Attention with the additive bias P (broadcastable to (B, h, n_q, n_k)); Q, K, V (B, h, n, d_k)."""
    for name, t in (("Q", Q), ("K", K), ("V", V)):
        as_float_array(t, name, ndim=4, dtype=Q.dtype if name != "Q" else None)
    _check_bias(P, Q.shape[:-1] + (K.shape[-2],), Q.dtype)
    return _biased_attention_forward(Q, K, V, P, mask, dropout_p, training, rng)


def biased_attention_backward(dO: np.ndarray, cache: dict) -> tuple[np.ndarray, ...]:
    """``(dQ, dK, dV, dP)``; dP has the bias's shape (summed over its broadcast axes)."""
    check_cache(cache, "cache", "biased_attention")
    check_dout(dO, "dO", cache["Q"].shape[:-1] + (cache["V"].shape[-1],))
    return _biased_attention_backward(dO, cache)


def biased_mha_forward(x: np.ndarray, p: dict, n_heads: int, P: np.ndarray, mask=None, dropout_p: float = 0.0,
                       training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    """Multi-head self-attention of X (B, n, d) with the score bias P (1 or B, h, n, n)."""
    as_float_array(x, "x", ndim=3)
    B, n, _ = x.shape
    _check_bias(P, (B, n_heads, n, n), x.dtype)
    return _biased_mha_forward(x, p, n_heads, P, mask, dropout_p, training, rng)


def biased_mha_backward(dout: np.ndarray, cache: dict) -> tuple[np.ndarray, dict, np.ndarray]:
    """``(dx, grads, dP)``: grads keyed W_Q, b_Q, …, b_O; dP in the bias's shape."""
    check_cache(cache, "cache", "biased_mha")
    check_dout(dout, "dout", cache["o"]["x"].shape[:-1] + (cache["o"]["W"].shape[1],))
    return _biased_mha_backward(dout, cache)
