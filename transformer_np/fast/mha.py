"""The fast path's multi-head attention: the Q, K, V and output projections around the attention core of
:mod:`transformer_np.fast.attention` (see :mod:`transformer_np.fast` for the tricks and the tests
that hold them; the plain kernels are in :mod:`transformer_np.ops.attention`)."""

from __future__ import annotations

import numpy as np

from ..ops.attention import split_heads
from ..ops.cache import check_for_backward, reader
from .attention import _attention_backward, attention_forward
from .blocks import _with_column
from .ffn import linear_backward, linear_forward
from .threads import _rows_parallel

__all__ = ["mha_forward", "mha_backward"]


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _stacked(Ws: tuple, bs: tuple) -> np.ndarray | None:
    """The C-contiguous (d_in + 1, k·w) array S = [W_1 | … | W_k ; b_1 | … | b_k] of which the k weights
    ``Ws`` (each (d_in, w)) are consecutive column blocks of the first d_in rows and the k biases ``bs``
    (each (w,)) the same column blocks of the last row — each a view of S — else None.

    :func:`transformer_np.io.pretrained.load_pretrained` lays each layer's W_Q, W_K, W_V, b_Q, b_K, b_V out
    this way (and W_O, b_O): the input projection is then one product, X W + b = [X | 1] S for inference.
    Only views of the same memory pass: an entry replaced by another array, or a copy, does not, and
    editing a view in place edits S itself, so the product never reads stale weights."""
    base = Ws[0].base
    if not isinstance(base, np.ndarray) or base.ndim != 2 or not base.flags.c_contiguous:
        return None
    (d_in, w), k = Ws[0].shape, len(Ws)
    if base.shape != (d_in + 1, k * w) or base.dtype != Ws[0].dtype or len(bs) != k:
        return None
    start, step, row = _addr(base), w * base.itemsize, base.strides[0]
    for i, (W, b) in enumerate(zip(Ws, bs)):
        if (W.base is not base or W.shape != (d_in, w) or W.strides != base.strides or _addr(W) != start + i * step
                or not isinstance(b, np.ndarray) or b.base is not base or b.shape != (w,)
                or b.strides != base.strides[1:] or _addr(b) != start + d_in * row + i * step):
            return None
    return base


def mha_forward(x: np.ndarray, p: dict, n_heads: int, mask: np.ndarray | None = None,
                dropout_p: float = 0.0, training: bool = False, rng=None,
                store_attention: bool = True, for_backward: bool = True, *,
                weights_out: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """MHA(X) with Q, K, V in one (B·n, 3d) array, written by three products into its column blocks
    (no concatenated [W_Q | W_K | W_V] copy is made or cached); Q, K, V are views of it.
    ``store_attention=False``, ``weights_out`` (B, h, n, n): see
    :func:`~transformer_np.fast.attention.attention_forward`.
    ``for_backward=False`` (inference): the cache holds only the attention's ``"weights"``;
    :func:`mha_backward` refuses it.

    When the weights and biases are views of one array S = [W_Q | W_K | W_V ; b_Q | b_K | b_V] (:func:`_stacked`;
    the layout of :func:`~transformer_np.io.pretrained.load_pretrained`), the projection is one product:
    X [W_Q | W_K | W_V] (S's first d rows, bit for bit the three products' dot products) then + b, or for
    inference [X | 1] S, the bias inside the product instead of a pass over (B·n, 3d) (the same sum, the
    bias term added in another order); likewise [ctx | 1] [W_O ; b_O] for the output projection, the
    column of ones beside the heads' context, which the attention writes through a view. Measured at
    MiniLM's 704 rows (1 thread): the input projection 4.8 → 4.6 ms as one product, 4.51 → 4.41 ms with the
    bias inside."""
    B, n, d = x.shape
    x2 = x.reshape(-1, d)                                            # (M, d)
    qkv = np.empty((x2.shape[0], 3 * d), dtype=x.dtype)              # (M, 3d): [Q | K | V]
    S_qkv = _stacked((p["W_Q"], p["W_K"], p["W_V"]), (p["b_Q"], p["b_K"], p["b_V"]))   # (d + 1, 3d) or None
    if S_qkv is not None and not for_backward:
        np.matmul(_with_column(x2, 1), S_qkv, out=qkv)               # [X | 1] S = X W + b
    else:
        if S_qkv is not None:
            np.matmul(x2, S_qkv[:d], out=qkv)                        # one product
        else:
            for i, name in enumerate("QKV"):                         # X W_Q, X W_K, X W_V into their
                np.matmul(x2, p["W_" + name], out=qkv[:, i * d:(i + 1) * d])   # columns: no concatenated W
        b_qkv = S_qkv[d] if S_qkv is not None else np.concatenate([p["b_Q"], p["b_K"], p["b_V"]])   # (3d,)
        _rows_parallel(lambda r: qkv[r].__iadd__(b_qkv), qkv.shape[0])
    qkv_cache = {"kind": "qkv", "x": x, "W": (p["W_Q"], p["W_K"], p["W_V"])}   # references, no copy
    qkv = qkv.reshape(B, n, 3, n_heads, d // n_heads).transpose(2, 0, 3, 1, 4)   # (3, B, h, n, d_k) view
    S_o = None if for_backward else _stacked((p["W_O"],), (p["b_O"],))   # (d + 1, d) or None
    if S_o is not None:
        ctx1 = np.empty((B * n, d + 1), dtype=x.dtype)               # [ctx | 1]
        ctx1[:, d] = 1
        ctx = ctx1[:, :d].reshape(B, n, d)                           # a view (rows of d + 1)
    else:
        ctx = np.empty((B, n, d), dtype=x.dtype)                     # Concat(head_1 … head_h): (B, n, d)
    heads = ctx.reshape(B, n, n_heads, d // n_heads).transpose(0, 2, 1, 3)   # (B, h, n, d_k) view of ctx
    _, attn_cache = attention_forward(qkv[0], qkv[1], qkv[2], mask, dropout_p, training, rng, store_attention,
                                      out=heads, for_backward=for_backward,
                                      weights_out=weights_out)       # O written straight into ctx
    if S_o is not None:
        out = (ctx1 @ S_o).reshape(B, n, d)                          # [ctx | 1] [W_O ; b_O]
        return out, {"kind": "mha", "n_heads": n_heads, "attn": attn_cache, "for_backward": False}
    out, o_cache = linear_forward(ctx, p["W_O"], p["b_O"])           # (B, n, d)
    if not for_backward:
        return out, {"kind": "mha", "n_heads": n_heads, "attn": attn_cache, "for_backward": False}
    return out, {"kind": "mha", "n_heads": n_heads, "qkv": qkv_cache, "attn": attn_cache, "o": o_cache}


def mha_backward(dout: np.ndarray, cache: dict, free_cache: bool = False) -> tuple[np.ndarray, dict]:
    """Backward of :func:`mha_forward`; ``free_cache`` removes each entry as it is used (the
    context, then Q, K, V and A), so they are released before the input projection's backward."""
    check_for_backward(cache, "mha_forward")
    take = reader(cache, free_cache)
    dctx, dW_O, db_O = linear_backward(dout, take("o"))              # (B, n, d)
    B, n, d = dctx.shape
    h = cache["n_heads"]
    dQ, dK, dV = _attention_backward(split_heads(dctx, h), take("attn"), free_cache)   # each (B, h, n, d_k)
    # Write the three head gradients straight into the (B, n, 3, h, d_k) layout of qkv
    # (one copy, instead of np.stack followed by a transposing reshape: two).
    dqkv = np.empty((B, n, 3, h, d // h), dtype=dctx.dtype)          # (B, n, 3, h, d_k)
    dqkv_heads = dqkv.transpose(2, 0, 3, 1, 4)                       # (3, B, h, n, d_k) view
    dqkv_heads[0], dqkv_heads[1], dqkv_heads[2] = dQ, dK, dV
    del dctx, dQ, dK, dV                                             # copied into dqkv: release them
    dqkv = dqkv.reshape(B * n, 3 * d)                                # (M, 3d) view
    c = take("qkv")
    x2 = c["x"].reshape(-1, d)                                       # (M, d)
    dW_qkv = x2.T @ dqkv                                             # (d, 3d): one product
    db_qkv = dqkv.sum(axis=0)                                        # (3d,)
    dx = dqkv[:, :d] @ c["W"][0].T                                   # dX = Σ dQ W_Qᵀ + dK W_Kᵀ + dV W_Vᵀ
    for i in (1, 2):                                                 # (= dQKV [W_Q | W_K | W_V]ᵀ)
        dx += dqkv[:, i * d:(i + 1) * d] @ c["W"][i].T
    dx = dx.reshape(B, n, d)                                         # (B, n, d)
    grads = {"W_Q": dW_qkv[:, :d], "W_K": dW_qkv[:, d:2 * d], "W_V": dW_qkv[:, 2 * d:],
             "b_Q": db_qkv[:d], "b_K": db_qkv[d:2 * d], "b_V": db_qkv[2 * d:],
             "W_O": dW_O, "b_O": db_O}
    return dx, grads
