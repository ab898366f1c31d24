r"""Scaled dot-product attention and multi-head attention, vectorised over batch and heads.

Scaled dot-product attention (one head; every leading axis is a batch axis):
    S = Q Kᵀ / √d_k + M          (n_q, n_k)   M: additive mask (0 or very negative)
    A = softmax(S)  (row-wise)   (n_q, n_k)   rows sum to 1
    O = A V                      (n_q, d_v)
Backward, given dO:
    dV = Aᵀ dO,   dA = dO Vᵀ,   dS = A ⊙ (dA − rowsum(dA ⊙ A)),
    dQ = dS K / √d_k,   dK = dSᵀ Q / √d_k          (the mask is a constant)

Multi-head attention (h heads, d_k = d_model / h), for X of shape (B, n, d_model):
    Q = X W_Q + b_Q,  K = X W_K + b_K,  V = X W_V + b_V          each (B, n, d_model)
    split heads: (B, n, d_model) → (B, n, h, d_k) → (B, h, n, d_k)   (reshape + transpose)
    O_h = Attention(Q_h, K_h, V_h)                                   (B, h, n, d_k)
    merge heads: (B, h, n, d_k) → (B, n, h, d_k) → (B, n, d_model)   (= Concat(head_1..head_h))
    MHA(X) = Concat(O_1, …, O_h) W_O + b_O                          (B, n, d_model)

Splitting by reshape is exactly the article's per-head W_Q[h]: head i owns columns
i·d_k … (i+1)·d_k − 1 of W_Q. The three projections are done as one matmul with the
column-concatenated [W_Q | W_K | W_V] (d_model, 3·d_model) — the same math, one pass
over X instead of three.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import as_float_array, check_cache, check_dout, check_float, check_int
from .dropout import dropout_forward
from .linear import linear_backward, linear_forward
from .softmax import softmax, softmax_backward

__all__ = ["attention_forward", "attention_backward", "mha_forward", "mha_backward",
           "MHA_PARAM_NAMES", "split_heads", "merge_heads"]

MHA_PARAM_NAMES = ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O")


# Scores per block of query rows: 2**20 entries (4 MiB in float32). Each elementwise pass of
# the softmax (scale, mask, max, exp, sum, divide) and of its backward then runs on a block
# that stays in cache instead of streaming the whole (…, n_q, n_k) array through memory — for
# n = 2048 that array is 128 MiB. Measured on the long shape (1 thread, attention fwd / bwd):
# unblocked 328 / 406 ms, 2**18: 211 / 263, 2**20: 219 / 226, 2**21: 208 / 297 ms; smaller
# blocks lose to the per-GEMM overhead (bert-base: 1.5 M scores, 2 blocks, within 2 ms of one).
_BLOCK_SCORES = 1 << 20


def _row_blocks(lead: int, n_q: int, n_k: int) -> list[slice]:
    """Slices of the query rows such that one block of scores, lead · rows · n_k entries,
    has about ``_BLOCK_SCORES`` of them (at least one row per block)."""
    rows = max(1, _BLOCK_SCORES // max(1, lead * n_k))
    return [slice(r, min(r + rows, n_q)) for r in range(0, max(n_q, 1), rows)]


def _mask_rows(mask: np.ndarray | None, rows: slice) -> np.ndarray | None:
    """The rows of an additive mask for one block (a mask broadcast over the rows is used whole)."""
    if mask is None or mask.ndim < 2 or mask.shape[-2] == 1:
        return mask
    return mask[..., rows, :]


def attention_forward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: np.ndarray | None = None,
                      dropout_p: float = 0.0, training: bool = False,
                      rng: np.random.Generator | None = None) -> tuple[np.ndarray, dict]:
    """softmax(Q Kᵀ/√d_k + mask) V over the last two axes.

    Q (..., n_q, d_k), K (..., n_k, d_k), V (..., n_k, d_v); ``mask`` additive,
    broadcastable to (..., n_q, n_k). Dropout (if any) acts on the attention weights.
    Returns ``(O, cache)``; ``cache["weights"]`` holds A (before dropout).

    S and A are computed by blocks of query rows (see ``_BLOCK_SCORES``): each row of A is
    the softmax of its own row of S, so the blocks are independent and the result is the
    same as for the whole matrix at once.
    """
    as_float_array(Q, "Q", finite=False)
    as_float_array(K, "K", dtype=Q.dtype, finite=False)
    as_float_array(V, "V", dtype=Q.dtype, finite=False)
    if Q.ndim < 2 or K.ndim != Q.ndim or V.ndim != Q.ndim:
        raise ValueError(f"Q, K, V must have the same rank >= 2, got shapes {Q.shape}, {K.shape}, {V.shape}")
    if K.shape[-1] != Q.shape[-1]:
        raise ValueError(f"K must have last dimension d_k = {Q.shape[-1]} like Q, got shape {K.shape}")
    if V.shape[-2] != K.shape[-2]:
        raise ValueError(f"V must have n_k = {K.shape[-2]} rows like K, got shape {V.shape}")
    lead = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2])
    score_shape = lead + (Q.shape[-2], K.shape[-2])           # (..., n_q, n_k)
    if mask is not None:
        as_float_array(mask, "mask", dtype=Q.dtype, finite=False)
        try:
            ok = np.broadcast_shapes(mask.shape, score_shape) == score_shape
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"mask must broadcast to the score shape {score_shape} without enlarging it, "
                             f"got shape {mask.shape}")
    scale = 1.0 / math.sqrt(Q.shape[-1])                     # a Python float: keeps float32 float32
    Kt = K.swapaxes(-1, -2)                                  # (..., d_k, n_k) view
    A = np.empty(score_shape, dtype=Q.dtype)                 # (..., n_q, n_k)
    for rows in _row_blocks(math.prod(lead), *score_shape[-2:]):
        S = np.matmul(Q[..., rows, :], Kt, out=A[..., rows, :])   # (..., r, n_k) scores, in A's rows
        S *= scale                                           # in place: no second (r, n_k) array
        if mask is not None:
            S += _mask_rows(mask, rows)
        softmax(S, out=S)                                    # A's rows = softmax of their scores
    sm_cache = {"kind": "softmax", "s": A}                   # A = softmax(S), assembled by row blocks
    A_drop, drop_cache = dropout_forward(A, dropout_p, training, rng)
    O = A_drop @ V                                           # (..., n_q, d_v)
    cache = {"kind": "attention", "Q": Q, "K": K, "V": V, "scale": scale,
             "weights": A, "A_drop": A_drop, "softmax": sm_cache, "dropout": drop_cache}
    return O, cache


def attention_backward(dO: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns ``(dQ, dK, dV)``; see the module docstring.

    By the same blocks of query rows as the forward: dS for rows r only needs dO, A and the
    dropout mask of rows r, so dQ[r] = dS_r K is written block by block and
    dK = Σ_r dS_rᵀ Q[r] is accumulated; no (…, n_q, n_k) temporary is ever whole.
    """
    check_cache(cache, "cache", "attention")
    Q, K, V, scale = cache["Q"], cache["K"], cache["V"], cache["scale"]
    check_dout(dO, "dO", Q.shape[:-1] + (V.shape[-1],))
    A, A_drop, drop_mask = cache["softmax"]["s"], cache["A_drop"], cache["dropout"]["mask"]
    dV = A_drop.swapaxes(-1, -2) @ dO                        # (..., n_k, d_v)
    Vt = V.swapaxes(-1, -2)                                  # (..., d_v, n_k) view
    dQ = np.empty(A.shape[:-1] + (Q.shape[-1],), dtype=Q.dtype)   # (..., n_q, d_k)
    dK = np.zeros(A.shape[:-2] + K.shape[-2:], dtype=Q.dtype)     # (..., n_k, d_k)
    for rows in _row_blocks(math.prod(A.shape[:-2]), *A.shape[-2:]):
        dA = dO[..., rows, :] @ Vt                           # (..., r, n_k) ∂L/∂A_drop for these rows
        if drop_mask is not None:
            dA *= drop_mask[..., rows, :]                    # dropout backward on the block
        dS = softmax_backward(dA, {"kind": "softmax", "s": A[..., rows, :]})   # (..., r, n_k)
        dS *= scale                                          # fold 1/√d_k once
        dQ[..., rows, :] = dS @ K                            # (..., r, d_k)
        dK += dS.swapaxes(-1, -2) @ Q[..., rows, :]          # (..., n_k, d_k)
    return dQ, dK, dV


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(B, n, d_model) → (B, h, n, d_k): a view when possible, never a loop over heads."""
    B, n, d = x.shape
    return x.reshape(B, n, n_heads, d // n_heads).transpose(0, 2, 1, 3)   # (B, h, n, d_k)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, h, n, d_k) → (B, n, h·d_k): the concatenation of the heads along features."""
    B, h, n, dk = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, n, h * dk)     # (B, n, d_model)


def _check_mha_params(p: dict, d: int, dtype) -> None:
    for name in MHA_PARAM_NAMES:
        if name not in p:
            raise ValueError(f"params is missing the multi-head attention parameter {name!r}")
        shape = (d, d) if name.startswith("W") else (d,)
        as_float_array(p[name], name, dtype=dtype, finite=False)
        if p[name].shape != shape:
            raise ValueError(f"{name} must have shape {shape} for d_model = {d}, got shape {p[name].shape}")


def mha_forward(x: np.ndarray, p: dict, n_heads: int, mask: np.ndarray | None = None,
                dropout_p: float = 0.0, training: bool = False,
                rng: np.random.Generator | None = None) -> tuple[np.ndarray, dict]:
    """Multi-head self-attention MHA(X) for X (B, n, d_model).

    ``p`` holds W_Q, b_Q, W_K, b_K, W_V, b_V (projections, (d, d) and (d,)), W_O, b_O.
    ``mask`` is additive, broadcastable to (B, h, n, n): use :func:`padding_mask`.
    Returns ``(out, cache)``; ``cache["attn"]["weights"]`` is A of shape (B, h, n, n).
    """
    as_float_array(x, "x", ndim=3, finite=False)
    check_int(n_heads, "n_heads", minimum=1)
    B, n, d = x.shape
    if d % n_heads:
        raise ValueError(f"d_model = {d} must be divisible by n_heads = {n_heads}")
    check_float(dropout_p, "dropout_p", 0.0, 1.0, max_inclusive=False)
    _check_mha_params(p, d, x.dtype)
    W_qkv = np.concatenate([p["W_Q"], p["W_K"], p["W_V"]], axis=1)   # (d, 3d)
    b_qkv = np.concatenate([p["b_Q"], p["b_K"], p["b_V"]])           # (3d,)
    qkv, qkv_cache = linear_forward(x, W_qkv, b_qkv)                 # (B, n, 3d)
    dk = d // n_heads
    qkv = qkv.reshape(B, n, 3, n_heads, dk).transpose(2, 0, 3, 1, 4)  # (3, B, h, n, d_k) view
    O, attn_cache = attention_forward(qkv[0], qkv[1], qkv[2], mask, dropout_p, training, rng)
    ctx = merge_heads(O)                                             # (B, n, d)
    out, o_cache = linear_forward(ctx, p["W_O"], p["b_O"])           # (B, n, d)
    return out, {"kind": "mha", "n_heads": n_heads, "qkv": qkv_cache, "attn": attn_cache, "o": o_cache}


def mha_backward(dout: np.ndarray, cache: dict, free_cache: bool = False) -> tuple[np.ndarray, dict]:
    """Returns ``(dx, grads)`` with grads keyed W_Q, b_Q, …, b_O (same shapes as the params).

    ``free_cache=True`` removes each op's entry from ``cache`` as it is used (the context,
    then Q, K, V and A), so they are released before the input projection's backward.
    """
    check_cache(cache, "cache", "mha")
    take = cache.pop if free_cache else cache.__getitem__
    dctx, dW_O, db_O = linear_backward(dout, take("o"))              # (B, n, d)
    B, n, d = dctx.shape
    h = cache["n_heads"]
    dO = split_heads(dctx, h)                                        # (B, h, n, d_k)
    dQ, dK, dV = attention_backward(dO, take("attn"))                # each (B, h, n, d_k)
    # Write the three head gradients straight into the (B, n, 3, h, d_k) layout of qkv
    # (one copy, instead of np.stack followed by a transposing reshape: two).
    dqkv = np.empty((B, n, 3, h, d // h), dtype=dctx.dtype)          # (B, n, 3, h, d_k)
    dqkv_heads = dqkv.transpose(2, 0, 3, 1, 4)                       # (3, B, h, n, d_k) view
    dqkv_heads[0], dqkv_heads[1], dqkv_heads[2] = dQ, dK, dV
    del dctx, dO, dQ, dK, dV                                         # copied into dqkv: release them
    dqkv = dqkv.reshape(B, n, 3 * d)                                 # (B, n, 3d) view
    dx, dW_qkv, db_qkv = linear_backward(dqkv, take("qkv"))
    grads = {"W_Q": dW_qkv[:, :d], "W_K": dW_qkv[:, d:2 * d], "W_V": dW_qkv[:, 2 * d:],
             "b_Q": db_qkv[:d], "b_K": db_qkv[d:2 * d], "b_V": db_qkv[2 * d:],
             "W_O": dW_O, "b_O": db_O}
    return dx, grads
