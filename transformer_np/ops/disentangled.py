r"""DeBERTa's disentangled attention (He et al. 2021, v2/v3 as Hugging Face's ``DebertaV2Model``).

A token is its content H_i and its position; the positions enter only through a table of *relative*
position embeddings R (2k, d) (k = ``att_span``), one row per clipped distance. With Q = H W_Q + b_Q,
K = H W_K + b_K per head (B, h, n, d_k), and the positions projected by the position keys/queries

    P_K = R W_PK + b_PK,   P_Q = R W_PQ + b_PQ       (1, h, 2k, d_k)   ``share_att_key``: W_PK = W_K, W_PQ = W_Q

the score of query i and key j is the sum of three terms, all divided by one scale s:

    S[i, j] = ( Q_i·K_j  +  Q_i·P_K[c(i, j)]  +  K_j·P_Q[p(j, i)] ) / s
                content→content   content→position "c2p"  position→content "p2c"

    c(i, j) = clip(δ(i, j) + k, 0, 2k − 1),      p(j, i) = clip(−δ(j, i) + k, 0, 2k − 1)

with δ(i, j) the (bucketed) relative position i − j (:func:`relative_position_ids`). ``pos_att_type``
says which of c2p / p2c are present and s = √(d_k · (1 + len(pos_att_type))). (Hugging Face takes this
square root in float32 whatever the model's dtype — ``scaled_size_sqrt`` — and so does
:func:`deberta_scale`, so that a float64 comparison is exact to float64's round-off.)

Computed as HF does it, with full products and gathers: C = Q P_Kᵀ (B, h, n, 2k) and
c2p[i, j] = C[i, c(i, j)]; D = K P_Qᵀ (B, h, n, 2k), G[j, i] = D[j, p(j, i)] and p2c = Gᵀ.

Log buckets (``position_buckets`` = b > 0, ``max_relative_positions`` = m; HF ``make_log_bucket_position``):
with r = i − j and h_b = b // 2,

    δ = r                                                             if |r| ≤ h_b
    δ = sign(r) · ( ⌈ ln(|r| / h_b) / ln((m − 1) / h_b) · (h_b − 1) ⌉ + h_b )   otherwise

(HF computes the logarithm in float32: so do we, and the integer buckets are HF's,
``tests/ops/test_disentangled.py``). δ is odd in r, so p(j, i) = c(i, j).

Backward. With A = dS / s (the gradient of the unscaled sum):

    content→content:  dQ += A K,        dK += Aᵀ Q
    c2p:   dC[i, r] = Σ_{j: c(i, j) = r} A[i, j]          (the gather's adjoint: a scatter-add along the row)
           dQ += dC P_K,                dP_K = Σ_batch dCᵀ Q
    p2c:   dG = Aᵀ,  dD[j, r] = Σ_{i: p(j, i) = r} dG[j, i]
           dK += dD P_Q,                dP_Q = Σ_batch dDᵀ K

Attention with DeBERTa's mask. HF does not add −∞ to hidden scores, it *replaces* them:
S' = where(keep, S, min_float), A = softmax(S'); a query row with no key kept (a padded query) has
every score equal and attends uniformly to all n keys. The replacement's gradient is
dS = where(keep, dS', 0): nothing flows back through a hidden score.

    O = Dropout(A) V,   dV = Dropout(A)ᵀ dO,   dA = Dropout'(dO Vᵀ),
    dS' = A ⊙ (dA − rowsum(dA ⊙ A)),   dS = keep ⊙ dS'
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, as_int_array, check_cache, check_dout, check_int
from ..errors import InputValueError
from .dropout import dropout_backward, dropout_forward
from .softmax import softmax_backward, softmax_forward

__all__ = ["log_bucket_position", "relative_position_ids", "deberta_scale", "position_indices",
           "disentangled_scores_forward", "disentangled_scores_backward", "replace_masked_attention_forward",
           "replace_masked_attention_backward", "disentangled_scores", "gather_last", "gather_last_backward"]


# ----------------------------------------------------------------------------- positions
def log_bucket_position(relative_pos, bucket_size: int, max_position: int) -> np.ndarray:
    """HF's ``make_log_bucket_position`` on signed distances r (integers, any shape) → int64, same shape."""
    r = as_int_array(relative_pos, "relative_pos")
    check_int(bucket_size, "bucket_size", minimum=2)
    check_int(max_position, "max_position", minimum=2)
    mid = bucket_size // 2
    if max_position - 1 <= mid:
        raise InputValueError(f"max_position − 1 must exceed bucket_size // 2 (the logarithm's base), got "
                              f"bucket_size = {bucket_size}, max_position = {max_position}")
    sign = np.sign(r)
    abs_pos = np.where((r < mid) & (r > -mid), mid - 1, np.abs(r))            # no log of 0 in the small range
    f32 = np.float32
    big = np.maximum(abs_pos, mid + 1)                                            # the log branch only (no log 0)
    ratio = big.astype(f32) / f32(mid)                                            # float32 as torch's long / int
    log_pos = np.ceil(np.log(ratio) / np.log(f32((max_position - 1) / mid)) * f32(mid - 1)) + f32(mid)
    return np.where(abs_pos <= mid, r, (log_pos * sign).astype(np.int64)).astype(np.int64)


def relative_position_ids(n: int, position_buckets: int = -1, max_relative_positions: int = -1) -> np.ndarray:
    """δ (n, n): δ[i, j] = i − j, bucketed when both ``position_buckets`` and ``max_relative_positions`` > 0."""
    check_int(n, "n", minimum=0)
    pos = np.arange(n)
    rel = pos[:, None] - pos[None, :]                                             # (n, n) i − j
    if position_buckets > 0 and max_relative_positions > 0:
        rel = log_bucket_position(rel, position_buckets, max_relative_positions)
    return rel.astype(np.int64)


def position_indices(rel: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray]:
    """(c, p): the rows of the position table the c2p and the p2c terms read, each (n, n).

    c[i, j] = clip(δ[i, j] + k, 0, 2k − 1) (query i, key j); p[j, i] = clip(−δ[j, i] + k, 0, 2k − 1)
    (indexed key first, as HF gathers it)."""
    check_int(span, "span", minimum=1)
    rel = as_int_array(rel, "rel", ndim=2)
    return np.clip(rel + span, 0, 2 * span - 1), np.clip(-rel + span, 0, 2 * span - 1)


def deberta_scale(d_head: int, scale_factor: int) -> float:
    """s = √(d_k · scale_factor), the square root taken in float32 as HF's ``scaled_size_sqrt`` takes it."""
    check_int(d_head, "d_head", minimum=1)
    check_int(scale_factor, "scale_factor", minimum=1)
    return float(np.sqrt(np.float32(d_head) * np.float32(scale_factor), dtype=np.float32))


# ----------------------------------------------------------------------------- gather and its adjoint
def gather_last(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """y[..., i, j] = x[..., i, idx[i, j]]: x (..., n, R), idx (n, m) → (..., n, m)."""
    full = np.broadcast_to(idx, x.shape[:-1] + idx.shape[-1:])                  # (..., n, m)
    return np.take_along_axis(x, full, axis=-1)


def gather_last_backward(dy: np.ndarray, idx: np.ndarray, R: int) -> np.ndarray:
    """dx[..., i, r] = Σ_{j: idx[i, j] = r} dy[..., i, j] (the scatter-add): dy (..., n, m) → (..., n, R)."""
    lead, (n, m) = dy.shape[:-2], dy.shape[-2:]
    rows = int(np.prod(lead, dtype=np.int64)) * n
    flat = np.arange(rows).reshape(rows, 1) * R + np.broadcast_to(idx, lead + (n, m)).reshape(rows, m)
    dx = np.bincount(flat.reshape(-1), weights=dy.reshape(-1).astype(np.float64), minlength=rows * R)
    return dx.reshape(lead + (n, R)).astype(dy.dtype, copy=False)                 # (..., n, R)


# ----------------------------------------------------------------------------- the scores
def disentangled_scores_forward(Q: np.ndarray, K: np.ndarray, scale: float, c_idx: np.ndarray | None = None,
                                PK: np.ndarray | None = None, p_idx: np.ndarray | None = None,
                                PQ: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """S (B, h, n, n) = (Q Kᵀ + c2p + p2c) / scale; ``(S, cache)``.

    Q, K (B, h, n, d_k); the c2p term when ``PK`` (1, h, 2k, d_k) is given (with ``c_idx`` (n, n)), the p2c
    term when ``PQ`` (1, h, 2k, d_k) is given (with ``p_idx`` (n, n)) — :func:`position_indices`."""
    Q = as_float_array(Q, "Q", ndim=4)
    K = as_float_array(K, "K", ndim=4)
    if K.shape != Q.shape:
        raise InputValueError(f"K must have Q's shape {Q.shape}, got {K.shape}")
    n = Q.shape[2]
    for name, P, idx in (("PK", PK, c_idx), ("PQ", PQ, p_idx)):
        if P is None:
            continue
        P = as_float_array(P, name, ndim=4)
        if P.shape[0] != 1 or P.shape[1] != Q.shape[1] or P.shape[3] != Q.shape[3]:
            raise InputValueError(f"{name} must have shape (1, h, 2k, d_k) = (1, {Q.shape[1]}, 2k, {Q.shape[3]}), "
                                  f"got {P.shape}")
        idx = as_int_array(idx, name + " index", ndim=2)
        if idx.shape != (n, n) or idx.min(initial=0) < 0 or idx.max(initial=0) >= P.shape[2]:
            raise InputValueError(f"the index of {name} must be (n, n) = ({n}, {n}) with entries in [0, "
                                  f"{P.shape[2]}), got shape {idx.shape}")
    return disentangled_scores(Q, K, scale, c_idx, PK, p_idx, PQ)


def disentangled_scores(Q, K, scale, c_idx=None, PK=None, p_idx=None, PQ=None) -> tuple[np.ndarray, dict]:
    """:func:`disentangled_scores_forward` without the argument checks (the model's inner loop)."""
    S = Q @ K.swapaxes(-1, -2)                                   # (B, h, n, n)  content → content
    if PK is not None:
        C = Q @ PK.swapaxes(-1, -2)                              # (B, h, n, 2k)
        S = S + gather_last(C, c_idx)                            # c2p[i, j] = C[i, c(i, j)]
    if PQ is not None:
        D = K @ PQ.swapaxes(-1, -2)                              # (B, h, n, 2k)
        S = S + gather_last(D, p_idx).swapaxes(-1, -2)           # p2c[i, j] = D[j, p(j, i)]
    S = S / scale                                                # (B, h, n, n)
    cache = {"kind": "disentangled_scores", "Q": Q, "K": K, "PK": PK, "PQ": PQ, "c_idx": c_idx, "p_idx": p_idx,
             "scale": scale}
    return S, cache


def disentangled_scores_backward(dS: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray | None,
                                                                       np.ndarray | None]:
    """``(dQ, dK, dPK, dPQ)`` (dPK / dPQ None when the term is absent): the module docstring's backward."""
    check_cache(cache, "cache", "disentangled_scores")
    Q, K, PK, PQ = cache["Q"], cache["K"], cache["PK"], cache["PQ"]
    dS = check_dout(dS, "dS", Q.shape[:-1] + (K.shape[-2],))                    # (B, h, n, n)
    A = dS / cache["scale"]                                      # (B, h, n, n) gradient of the unscaled sum
    dQ = A @ K                                                   # (B, h, n, d_k)
    dK = A.swapaxes(-1, -2) @ Q                                  # (B, h, n, d_k)
    dPK = dPQ = None
    if PK is not None:
        dC = gather_last_backward(A, cache["c_idx"], PK.shape[2])   # (B, h, n, 2k)
        dQ = dQ + dC @ PK
        dPK = (dC.swapaxes(-1, -2) @ Q).sum(axis=0, keepdims=True)  # (1, h, 2k, d_k)
    if PQ is not None:
        dD = gather_last_backward(A.swapaxes(-1, -2), cache["p_idx"], PQ.shape[2])   # (B, h, n, 2k)
        dK = dK + dD @ PQ
        dPQ = (dD.swapaxes(-1, -2) @ K).sum(axis=0, keepdims=True)  # (1, h, 2k, d_k)
    return dQ, dK, dPK, dPQ


# ----------------------------------------------------------------------------- attention with a replacing mask
def replace_masked_attention_forward(S: np.ndarray, V: np.ndarray, keep: np.ndarray | None = None,
                                     dropout_p: float = 0.0, training: bool = False,
                                     rng=None) -> tuple[np.ndarray, dict]:
    """O = Dropout(softmax(where(keep, S, min_float))) V; ``keep`` bool broadcastable to S (B, h, n, n) or None."""
    S = as_float_array(S, "S", ndim=4)
    V = as_float_array(V, "V", ndim=4)
    if V.shape[:-1] != S.shape[:-1] or S.shape[-1] != S.shape[-2]:
        raise InputValueError(f"S must be (B, h, n, n) and V (B, h, n, d_v) with the same B, h, n, got {S.shape} and "
                              f"{V.shape}")
    if keep is not None:
        keep = np.asarray(keep, dtype=bool)
        if np.broadcast_shapes(keep.shape, S.shape) != S.shape:
            raise InputValueError(f"keep must broadcast to S's shape {S.shape}, got shape {keep.shape}")
        S = np.where(keep, S, np.finfo(S.dtype).min)             # HF's masked_fill: hidden scores replaced
    A, c_soft = softmax_forward(S)                               # (B, h, n, n) rows sum to 1
    A_drop, c_drop = dropout_forward(A, dropout_p, training, rng)
    O = A_drop @ V                                               # (B, h, n, d_k)
    return O, {"kind": "replace_masked_attention", "keep": keep, "softmax": c_soft, "dropout": c_drop,
               "A_drop": A_drop, "V": V, "weights": A}


def replace_masked_attention_backward(dO: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(dS, dV)``; dS is 0 wherever the mask hid the score."""
    check_cache(cache, "cache", "replace_masked_attention")
    dO = check_dout(dO, "dO", cache["V"].shape)                                   # (B, h, n, d_v)
    dV = cache["A_drop"].swapaxes(-1, -2) @ dO                   # (B, h, n, d_k)
    dA = dropout_backward(dO @ cache["V"].swapaxes(-1, -2), cache["dropout"])   # (B, h, n, n)
    dS = softmax_backward(dA, cache["softmax"])
    if cache["keep"] is not None:
        dS = np.where(cache["keep"], dS, 0.0).astype(dS.dtype, copy=False)
    return dS, dV
