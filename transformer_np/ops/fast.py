r"""The fast path: the same ops as the plain modules, rearranged for speed and memory.

The encoder stack runs these kernels by default (``encoder_forward(..., fast=True)``); the plain
modules (:mod:`~transformer_np.ops.attention`, :mod:`~transformer_np.ops.layernorm`,
:mod:`~transformer_np.ops.feedforward`, :mod:`~transformer_np.ops.softmax`, …) hold the textbook
versions, and ``tests/ops/test_fast_path.py`` proves the two agree (≤ 1e-12 relative in float64,
≤ 1e-6 in float32, with masks and dropout, forward and every gradient). Read the plain module
first: every function here has the same name, arguments and result as its plain kernel
(:mod:`transformer_np.ops.plain` lists them), and none checks its arguments — the public entry
points have done that once.

The tricks, each measured on this machine (see ``docs/bench_notes.md``):

* **Scores by blocks of query rows** (:func:`attention_forward`): S, A and their backward are
  computed for ~2²⁰ scores at a time, so each elementwise pass of the softmax stays in the CPU
  cache instead of streaming the whole (…, n_q, n_k) array (128 MiB at n = 2048) through memory.
  Each row of A is the softmax of its own row of S, so the blocks are independent. Only A is
  kept (S is overwritten by A in place): the plain cache's ``"scores"`` is not stored.
* **In-place buffers**: the softmax (:func:`softmax` with ``out=``), the 1/√d_k scale and the mask
  are applied in the buffer that becomes A; LayerNorm reuses x − μ as x̂ and g as dx.
* **One fused projection** (:func:`mha_forward`): Q, K, V = X [W_Q | W_K | W_V] + [b_Q | b_K | b_V],
  one (d, 3d) matmul instead of three, and the head gradients written straight into the
  (B, n, 3, h, d_k) layout of its backward (one copy instead of a stack + a transposing reshape).
* **Flattened matmuls** (:func:`linear_forward`): (B·n, d_in) @ (d_in, d_out) is one BLAS call;
  ``np.matmul`` on a (B, n, d_in) array calls BLAS per batch entry (~20% slower here).
* **Blocked activations** (:func:`activation_forward`): exact GELU is ~80 elementwise passes
  (erf is a rational function plus exps); on blocks of 16 Ki elements their temporaries stay in
  L2 (~2.7× faster), with the same per-element arithmetic, so bit for bit the same result.
* **Cache freeing** (``free_cache=True`` in :func:`mha_backward`, :func:`ffn_backward`): each
  entry is removed as it is read (:func:`transformer_np.ops.cache.reader`), so the largest arrays
  (A, f(U), f'(U)) are released mid-backward.

Not a fast-path trick: the float32 coefficient set of :func:`transformer_np.ops.erf.erf` is chosen
by the dtype for both paths (it is also the more accurate one in float32: ≤ 1.5 ulp against
3.1 ulp for Cody's float64 rationals evaluated in float32).
"""

from __future__ import annotations

import math

import numpy as np

from .activations import _FUNCS as _ACTIVATION_FUNCS, _activation_backward as activation_backward
from .attention import merge_heads, split_heads
from .cache import reader
from .dropout import _dropout_backward as dropout_backward, _dropout_forward as dropout_forward
from .layernorm import check_variance
from .residual import _residual_backward as residual_backward, _residual_forward as residual_forward

__all__ = ["linear_forward", "linear_backward", "softmax", "attention_forward", "attention_backward",
           "mha_forward", "mha_backward", "layernorm_forward", "layernorm_backward", "activation_forward",
           "activation_backward", "ffn_forward", "ffn_backward", "dropout_forward", "dropout_backward",
           "residual_forward", "residual_backward"]


# ----------------------------------------------------------------------------- linear
def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """y = x W + b as one (M, d_in) @ (d_in, d_out) product, M = every leading position."""
    y = (x.reshape(-1, W.shape[0]) @ W).reshape(x.shape[:-1] + (W.shape[1],))   # (M, d_out) → (..., d_out)
    if b is not None:
        y += b
    return y, {"kind": "linear", "x": x, "W": W, "has_bias": b is not None}


def linear_backward(dy: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    x, W = cache["x"], cache["W"]
    x2 = x.reshape(-1, x.shape[-1])                         # (M, d_in)
    dy2 = dy.reshape(-1, dy.shape[-1])                      # (M, d_out)
    dx = (dy2 @ W.T).reshape(x.shape)                       # (M, d_in) → (..., d_in)
    dW = x2.T @ dy2                                         # (d_in, d_out); x2.T is a view BLAS reads as is
    db = dy2.sum(axis=0) if cache["has_bias"] else None     # (d_out,)
    return dx, dW, db


# ----------------------------------------------------------------------------- softmax
def softmax(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis with one new array (or none: ``out=x`` works in place)."""
    e = np.subtract(x, x.max(axis=-1, keepdims=True), out=out)   # the one new array (or out)
    np.exp(e, out=e)                                        # in place: no second temporary
    e /= e.sum(axis=-1, keepdims=True)
    return e


def _softmax_backward_inplace(ds: np.ndarray, s: np.ndarray) -> np.ndarray:
    """s ⊙ (ds − ⟨ds, s⟩), overwriting ds (the caller's own temporary)."""
    ds -= (ds * s).sum(axis=-1, keepdims=True)
    ds *= s
    return ds


# ----------------------------------------------------------------------------- attention
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
                      dropout_p: float = 0.0, training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    """softmax(Q Kᵀ/√d_k + mask) V, S and A by blocks of query rows, A built in place.

    The cache keeps A as ``"weights"`` (and as ``"softmax"["s"]``), not the scores."""
    sqrt_dk = math.sqrt(Q.shape[-1])                         # a Python float: keeps float32 float32
    Kt = K.swapaxes(-1, -2)                                  # (..., d_k, n_k) view
    score_shape = Q.shape[:-1] + (K.shape[-2],)              # (..., n_q, n_k)
    A = np.empty(score_shape, dtype=Q.dtype)
    for rows in _row_blocks(math.prod(score_shape[:-2]), *score_shape[-2:]):
        S = np.matmul(Q[..., rows, :], Kt, out=A[..., rows, :])   # (..., r, n_k) scores, in A's rows
        S /= sqrt_dk                                         # in place; ÷ √d_k like the plain path (× 1/√d_k
                                                             # rounds differently, and a stack amplifies it)
        if mask is not None:
            S += _mask_rows(mask, rows)
        softmax(S, out=S)                                    # A's rows = softmax of their scores
    A_drop, drop_cache = dropout_forward(A, dropout_p, training, rng)
    O = A_drop @ V                                           # (..., n_q, d_v)
    cache = {"kind": "attention", "Q": Q, "K": K, "V": V, "scale": 1.0 / sqrt_dk,
             "weights": A, "A_drop": A_drop, "softmax": {"kind": "softmax", "s": A}, "dropout": drop_cache}
    return O, cache


def attention_backward(dO: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) by the forward's blocks of query rows: dS for rows r needs only dO, A and the
    dropout mask of rows r, so dQ[r] = dS_r K is written block by block and dK = Σ_r dS_rᵀ Q[r]
    is accumulated; no (…, n_q, n_k) temporary is ever whole."""
    Q, K, V = cache["Q"], cache["K"], cache["V"]
    A, A_drop, drop_mask = cache["weights"], cache["A_drop"], cache["dropout"]["mask"]
    dV = A_drop.swapaxes(-1, -2) @ dO                        # (..., n_k, d_v)
    Vt = V.swapaxes(-1, -2)                                  # (..., d_v, n_k) view
    dQ = np.empty(A.shape[:-1] + (Q.shape[-1],), dtype=Q.dtype)   # (..., n_q, d_k)
    dK = np.zeros(A.shape[:-2] + K.shape[-2:], dtype=Q.dtype)     # (..., n_k, d_k)
    for rows in _row_blocks(math.prod(A.shape[:-2]), *A.shape[-2:]):
        dA = dO[..., rows, :] @ Vt                           # (..., r, n_k) ∂L/∂A_drop for these rows
        if drop_mask is not None:
            dA *= drop_mask[..., rows, :]                    # dropout backward on the block
        dS = _softmax_backward_inplace(dA, A[..., rows, :])  # (..., r, n_k)
        dQ[..., rows, :] = dS @ K                            # (..., r, d_k)
        dK += dS.swapaxes(-1, -2) @ Q[..., rows, :]          # (..., n_k, d_k)
    sqrt_dk = math.sqrt(Q.shape[-1])
    dQ /= sqrt_dk                                            # the 1/√d_k of S, on the (n, d_k) results:
    dK /= sqrt_dk                                            # fewer entries than the (n, n_k) dS
    return dQ, dK, dV


def mha_forward(x: np.ndarray, p: dict, n_heads: int, mask: np.ndarray | None = None,
                dropout_p: float = 0.0, training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    """MHA(X) with Q, K, V from one fused (d, 3d) projection; Q, K, V are views of its output."""
    B, n, d = x.shape
    W_qkv = np.concatenate([p["W_Q"], p["W_K"], p["W_V"]], axis=1)   # (d, 3d)
    b_qkv = np.concatenate([p["b_Q"], p["b_K"], p["b_V"]])           # (3d,)
    qkv, qkv_cache = linear_forward(x, W_qkv, b_qkv)                 # (B, n, 3d)
    qkv = qkv.reshape(B, n, 3, n_heads, d // n_heads).transpose(2, 0, 3, 1, 4)   # (3, B, h, n, d_k) view
    O, attn_cache = attention_forward(qkv[0], qkv[1], qkv[2], mask, dropout_p, training, rng)
    out, o_cache = linear_forward(merge_heads(O), p["W_O"], p["b_O"])   # (B, n, d)
    return out, {"kind": "mha", "n_heads": n_heads, "qkv": qkv_cache, "attn": attn_cache, "o": o_cache}


def mha_backward(dout: np.ndarray, cache: dict, free_cache: bool = False) -> tuple[np.ndarray, dict]:
    """Backward of :func:`mha_forward`; ``free_cache`` removes each entry as it is used (the
    context, then Q, K, V and A), so they are released before the input projection's backward."""
    take = reader(cache, free_cache)
    dctx, dW_O, db_O = linear_backward(dout, take("o"))              # (B, n, d)
    B, n, d = dctx.shape
    h = cache["n_heads"]
    dQ, dK, dV = attention_backward(split_heads(dctx, h), take("attn"))   # each (B, h, n, d_k)
    # Write the three head gradients straight into the (B, n, 3, h, d_k) layout of qkv
    # (one copy, instead of np.stack followed by a transposing reshape: two).
    dqkv = np.empty((B, n, 3, h, d // h), dtype=dctx.dtype)          # (B, n, 3, h, d_k)
    dqkv_heads = dqkv.transpose(2, 0, 3, 1, 4)                       # (3, B, h, n, d_k) view
    dqkv_heads[0], dqkv_heads[1], dqkv_heads[2] = dQ, dK, dV
    del dctx, dQ, dK, dV                                             # copied into dqkv: release them
    dqkv = dqkv.reshape(B, n, 3 * d)                                 # (B, n, 3d) view
    dx, dW_qkv, db_qkv = linear_backward(dqkv, take("qkv"))
    grads = {"W_Q": dW_qkv[:, :d], "W_K": dW_qkv[:, d:2 * d], "W_V": dW_qkv[:, 2 * d:],
             "b_Q": db_qkv[:d], "b_K": db_qkv[d:2 * d], "b_V": db_qkv[2 * d:],
             "W_O": dW_O, "b_O": db_O}
    return dx, grads


# ----------------------------------------------------------------------------- layernorm
def layernorm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> tuple[np.ndarray, dict]:
    """LayerNorm with x − μ turned into x̂ in place and y built in the γ-product's buffer."""
    mu = x.mean(axis=-1, keepdims=True)                     # (..., 1)
    xc = x - mu                                             # (..., d)
    var = np.mean(xc * xc, axis=-1, keepdims=True)          # (..., 1)
    check_variance(var, xc)
    rstd = 1.0 / np.sqrt(var + eps)                         # (..., 1)
    xhat = xc
    xhat *= rstd                                            # (..., d) in place: xc is not needed again
    y = xhat * gamma
    y += beta
    return y, {"kind": "layernorm", "xhat": xhat, "rstd": rstd, "gamma": gamma}


def layernorm_backward(dy: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xhat, rstd, gamma = cache["xhat"], cache["rstd"], cache["gamma"]
    d = xhat.shape[-1]
    lead = tuple(range(xhat.ndim - 1))
    dgamma = (dy * xhat).sum(axis=lead)                     # (d,)
    dbeta = dy.sum(axis=lead)                               # (d,)
    g = dy * gamma                                          # (..., d)
    mean_g = g.sum(axis=-1, keepdims=True) / d              # (..., 1)
    mean_gx = (g * xhat).sum(axis=-1, keepdims=True) / d    # (..., 1)
    dx = g                                                  # reuse g's buffer (g is ours)
    dx -= mean_g
    dx -= xhat * mean_gx
    dx *= rstd                                              # dx = r (g − mean(g) − x̂ mean(g x̂))
    return dx, dgamma, dbeta


# ----------------------------------------------------------------------------- activation and FFN
_BLOCK = 16384   # elements per block: ~64 KB in float32, so f's ~10 live temporaries fit in L2


def activation_forward(z: np.ndarray, activation: str = "gelu") -> tuple[np.ndarray, dict]:
    """(f(z), f'(z)) evaluated on consecutive blocks of the flattened z (same cache as the plain op)."""
    f = _ACTIVATION_FUNCS[activation]
    out, grad = np.empty_like(z), np.empty_like(z)
    z_flat, out_flat, grad_flat = z.reshape(-1), out.reshape(-1), grad.reshape(-1)   # (size,)
    for start in range(0, z_flat.size, _BLOCK):
        block = slice(start, start + _BLOCK)
        out_flat[block], grad_flat[block] = f(z_flat[block])
    return out, {"kind": "activation", "activation": activation, "grad": grad}


def ffn_forward(z: np.ndarray, p: dict, activation: str = "gelu") -> tuple[np.ndarray, dict]:
    hidden, c1 = linear_forward(z, p["W_1"], p["b_1"])       # (..., d_ff)
    act, ca = activation_forward(hidden, activation)         # (..., d_ff)
    out, c2 = linear_forward(act, p["W_2"], p["b_2"])        # (..., d_model)
    return out, {"kind": "ffn", "lin1": c1, "act": ca, "lin2": c2}


def ffn_backward(dout: np.ndarray, cache: dict, free_cache: bool = False) -> tuple[np.ndarray, dict]:
    """Backward of :func:`ffn_forward`; ``free_cache`` releases f(z) and f'(z) (each (..., d_ff),
    the largest arrays of the layer) as soon as they are used."""
    take = reader(cache, free_cache)
    dact, dW_2, db_2 = linear_backward(dout, take("lin2"))   # (..., d_ff)
    dhidden = activation_backward(dact, take("act"))         # (..., d_ff)
    del dact                                                 # release it before the next product
    dz, dW_1, db_1 = linear_backward(dhidden, take("lin1"))  # (..., d_model)
    return dz, {"W_1": dW_1, "b_1": db_1, "W_2": dW_2, "b_2": db_2}
