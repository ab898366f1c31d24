"""The fast path's softmax, attention and multi-head attention (see :mod:`transformer_np.ops.fast` for the
tricks and the tests that hold them; the plain kernels are in :mod:`transformer_np.ops.softmax` and
:mod:`transformer_np.ops.attention`)."""

from __future__ import annotations

import math

import numpy as np

from ._threads import _rows_parallel
from .attention import split_heads
from .cache import check_for_backward, reader
from .dropout import _dropout_forward as dropout_forward
from .fast_ffn import linear_backward, linear_forward

__all__ = ["softmax", "attention_forward", "attention_backward", "attention_weights", "mha_forward", "mha_backward"]


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
# Scores per block of query rows: about _BLOCK_SCORES entries. Each elementwise pass of the softmax
# (exp, sum, divide; scale, mask, max, subtract where they cannot be skipped) and of its backward then
# runs on a block that stays in cache instead of streaming the whole (…, n_q, n_k) array through
# memory — for n = 2048 that array is 128 MiB. Measured (round 3, long shape, 1 thread, attention
# fwd / bwd): unblocked 328 / 406 ms, 2**18: 211 / 263, 2**20: 219 / 226, 2**21: 208 / 297 ms;
# smaller blocks lose to the per-GEMM overhead (bert-base: 1.5 M scores, 2 blocks, within 2 ms of one).
# Re-measured in round 4 with the fewer-pass softmax (CPU time, 1 thread, loaded machine, 2**17–2**20):
# 2**20 best at n = 2048 (fwd 158 / 89 ms stored / recomputed, 2**18: 180 / 112); at n = 512 all within
# the noise forward, the backward 8.9 ms at 2**17–2**18 against 10.6 at 2**20: kept.
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


def _sub_rows(mask, sub: slice):
    """The rows ``sub`` of a block's mask (a mask broadcast over the rows is used whole)."""
    if mask is None or mask.ndim < 2 or mask.shape[-2] == 1:
        return mask
    return mask[..., sub, :]


def _draw_keep(shape, p: float, training: bool, rng) -> np.ndarray | None:
    """The dropout keep-mask of A, drawn exactly as :func:`transformer_np.ops.dropout.dropout_forward`
    draws it (same generator calls), kept as booleans: 1 byte per score instead of A's 4 or 8."""
    if not training or p == 0.0:
        return None
    return rng.random(shape) >= p


def _folds(sqrt_dk: float) -> bool:
    """True when √d_k is a power of two (d_k = 1, 4, 16, 64, 256, …). Dividing by it then only
    changes the exponent, so (Q/√d_k) Kᵀ is (Q Kᵀ)/√d_k bit for bit (barring subnormals): the
    scale costs one (n, d_k) pass on Q instead of one (n, n_k) pass on the scores. Other d_k keep
    the plain path's division of the scores (× 1/√d_k, or ÷ on Q, round differently)."""
    return math.frexp(sqrt_dk)[0] == 0.5


def _block_scores(Q, Kt, sqrt_dk: float, rows: slice, out) -> np.ndarray:
    """Q[rows] Kᵀ into ``out``, already ÷ √d_k when that is exact on Q (:func:`_folds`)."""
    q = Q[..., rows, :]                                      # (..., r, d_k)
    if _folds(sqrt_dk):
        q = q / sqrt_dk                                      # (r, d_k) pass; exact
    return np.matmul(q, Kt, out=out)                         # (..., r, n_k)


# The bound of _no_max_rows costs ~0.1–0.3 ms of NumPy calls (norms of Q and K, max |V|, the mask's
# row maxima); the max and subtract passes it saves cost ~0.4 ms at 2**15 scores (measured, wall clock,
# loaded machine: 0.08–0.33 ms against 0.4 ms at (2, 4, 64, 16), 8.8 ms at attn-512's 2 M scores).
_SKIP_MIN_SCORES = 1 << 15


def _no_max_rows(Q, K, V, mask, sqrt_dk: float) -> np.ndarray | None:
    """(…, n_q, 1) booleans: True for the query rows whose exp(S/√d_k + M) is safe *without*
    subtracting the row maximum first — the max and subtract passes over the (n_q, n_k) scores are
    then skipped (the softmax is the same function whatever constant is subtracted from a row).

    Bound: |s_ij| = |q_i·k_j|/√d_k ≤ b_i = ‖q_i‖ max_j ‖k_j‖ / √d_k (Cauchy–Schwarz), and with the
    mask's row maximum μ_i = max_j M_ij (the mask is ≤ 0 in practice), every s_ij + M_ij ≤ μ_i + b_i
    while the row's largest value is ≥ μ_i − b_i (at the key of μ_i). A row is safe when

    * μ_i + b_i ≤ log(max) − log(n_k) − log(max(1, max|V|)) − 1: no exp, row sum or (deferred)
      Σ_j exp(s_ij) V_j can overflow (max: the dtype's largest number);
    * μ_i − b_i ≥ −(−log(tiny) − log(1/eps) − log(n_k) − 1): the row's largest exponential is a
      normal number and so is every term within eps/n_k of it, so subnormal rounding costs at most
      ~eps of the row sum (tiny: the smallest normal number). A row that could underflow whole —
      every key masked, μ_i ≈ the dtype's minimum — fails here and keeps the max subtraction (the
      plain path's uniform row).

    float32, n_k = 2048, |V| ≤ 1: rows with b_i ≤ ~63. Non-finite inputs fail both tests.

    None (no row skips, the plain path's arithmetic) where the two saved passes cannot pay for the
    bound's few NumPy calls: fewer than :data:`_SKIP_MIN_SCORES` scores in all, or rows shorter than
    2·d_v keys (the backward's D rule)."""
    n_k = K.shape[-2]
    if (n_k == 0 or Q.shape[-1] == 0 or n_k < 2 * V.shape[-1]
            or math.prod(Q.shape[:-1]) * n_k < _SKIP_MIN_SCORES):
        return None
    fi = np.finfo(Q.dtype)
    vmax = float(np.max(np.abs(V))) if V.size else 0.0
    hi = math.log(float(fi.max)) - math.log(n_k) - math.log(max(1.0, vmax)) - 1.0 if math.isfinite(vmax) else -1.0
    lo = -math.log(float(fi.tiny)) - math.log(1.0 / float(fi.eps)) - math.log(n_k) - 1.0
    if hi <= 0.0:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        q_norm = np.sqrt(np.einsum("...k,...k->...", Q, Q))[..., None]                  # (..., n_q, 1)
        k_norm = np.sqrt(np.einsum("...k,...k->...", K, K).max(axis=-1))[..., None, None]  # (..., 1, 1)
        b = q_norm * (k_norm / sqrt_dk)                                                  # (..., n_q, 1)
        mu = 0.0 if mask is None else np.max(mask, axis=-1, keepdims=True)               # (..., n_q|1, 1)
        return (mu + b <= hi) & (mu - b >= -lo)


def _exp_rows(S: np.ndarray, sqrt_dk: float, mask, skip_max: bool, m=None, ell=None,
              normalise: bool = True) -> None:
    """The forward softmax passes over rows S of a block, in place: S ← exp(S' − m) [/ ℓ], S' = S/√d_k + M
    (the ÷ √d_k only when not folded into Q), m the row max (0 when ``skip_max``: see
    :func:`_no_max_rows`), ℓ = Σ_j exp(S' − m). ``m`` / ``ell`` (…, r, 1) receive them when given."""
    if not _folds(sqrt_dk):
        S /= sqrt_dk                                         # ÷ √d_k like the plain path
    if mask is not None:
        S += mask
    if skip_max:
        if m is not None:
            m.fill(0)
    else:
        S -= np.max(S, axis=-1, keepdims=True, out=m)
    np.exp(S, out=S)
    ell = np.sum(S, axis=-1, keepdims=True, out=ell)
    if normalise:
        S /= ell


def _exp_rows_again(S: np.ndarray, sqrt_dk: float, mask, m, ell, normalise: bool = True) -> None:
    """:func:`_exp_rows` with the forward's m and ℓ (the backward's recompute): the same operations on
    the same numbers, so the same result bit for bit (a row with m = 0 skips S − m: exact either way)."""
    if not _folds(sqrt_dk):
        S /= sqrt_dk
    if mask is not None:
        S += mask
    if m.any():
        S -= m
    np.exp(S, out=S)
    if normalise:
        S /= ell


def attention_forward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: np.ndarray | None = None,
                      dropout_p: float = 0.0, training: bool = False, rng=None,
                      store_attention: bool = True, out: np.ndarray | None = None,
                      for_backward: bool = True) -> tuple[np.ndarray, dict]:
    """softmax(Q Kᵀ/√d_k + mask) V, S and A by blocks of query rows, A built in place.

    ``for_backward=False`` (inference): the cache keeps only ``"weights"`` (A when ``store_attention``,
    else None), nothing a backward needs; :func:`attention_backward` refuses it.

    The cache keeps A as ``"weights"`` (and as ``"softmax"["s"]``), not the scores. Fewer passes
    over each block than the plain softmax: the ÷ √d_k goes onto Q where that is exact
    (:func:`_folds`); the max subtraction is skipped for blocks whose rows provably cannot overflow
    or underflow without it (:func:`_no_max_rows`); each block's rows of O = A V are computed while
    the block is in cache (without attention dropout).

    ``store_attention=False`` (the FlashAttention trade: memory for compute) keeps no (…, n_q, n_k)
    array: each block of exp(S − m) is used for its rows of O and dropped, and the normalisation is
    deferred to the (r, d_v) product — O[rows] = (exp(S − m) V) / ℓ, no divide pass over the block
    (for rows of ≥ 2·d_v keys; shorter rows keep the plain order, O = (exp(S − m)/ℓ) V);
    the cache holds the row maxima m (0 where skipped) and row sums ℓ (two (…, n_q, 1) arrays), from
    which the backward recomputes each block with the same arithmetic, so the recomputed A is bit for
    bit the stored path's. Extra memory: one block of scores (~2²⁰ entries).
    ``out`` (…, n_q, d_v), any strides BLAS accepts, receives O (:func:`mha_forward` passes the
    heads' view of its merged context, so merging the heads costs no copy).
    ``"weights"`` is then None; :func:`attention_weights` rebuilds A on request. With attention
    dropout in training the keep-mask is kept as booleans (n_q·n_k bytes).
    """
    if not for_backward and not (training and dropout_p != 0.0):
        return _inference_forward(Q, K, V, mask, store_attention, out)
    sqrt_dk = math.sqrt(Q.shape[-1])                         # a Python float: keeps float32 float32
    Kt = K.swapaxes(-1, -2)                                  # (..., d_k, n_k) view
    score_shape = Q.shape[:-1] + (K.shape[-2],)              # (..., n_q, n_k)
    blocks = _row_blocks(math.prod(score_shape[:-2]), *score_shape[-2:])
    safe = _no_max_rows(Q, K, V, mask, sqrt_dk)              # (..., n_q, 1) or None
    O = np.empty(score_shape[:-1] + (V.shape[-1],), dtype=Q.dtype) if out is None else out   # (..., n_q, d_v)

    def skip(rows: slice) -> bool:
        return safe is not None and bool(safe[..., rows, :].all())

    if store_attention:
        A = np.empty(score_shape, dtype=Q.dtype)
        dropout = training and dropout_p != 0.0
        for rows in blocks:
            S = _block_scores(Q, Kt, sqrt_dk, rows, A[..., rows, :])   # (..., r, n_k) scores, in A's rows
            m_rows, no_max = _mask_rows(mask, rows), skip(rows)
            _rows_parallel(lambda r, S=S, m_rows=m_rows, no_max=no_max:
                           _exp_rows(S[..., r, :], sqrt_dk, _sub_rows(m_rows, r), no_max), S.shape[-2])
            if not dropout:
                np.matmul(S, V, out=O[..., rows, :])          # (..., r, d_v) while the block is in cache
        A_drop, drop_cache = dropout_forward(A, dropout_p, training, rng)
        if dropout:
            np.matmul(A_drop, V, out=O)                      # (..., n_q, d_v)
        if not for_backward:
            return O, {"kind": "attention", "weights": A, "for_backward": False}
        return O, {"kind": "attention", "Q": Q, "K": K, "V": V, "O": O, "scale": 1.0 / sqrt_dk, "weights": A,
                   "A_drop": A_drop, "softmax": {"kind": "softmax", "s": A}, "dropout": drop_cache}
    keep = _draw_keep(score_shape, dropout_p, training, rng)
    drop_scale = 1.0 / (1.0 - float(dropout_p)) if keep is not None else None
    defer = score_shape[-1] >= 2 * V.shape[-1]              # rows of ≥ 2·d_v keys (the backward's D rule)
    m = np.empty(score_shape[:-1] + (1,), dtype=Q.dtype)                 # (..., n_q, 1) row maxima
    ell = np.empty_like(m)                                               # (..., n_q, 1) row sums
    buf = np.empty(score_shape[:-2] + (blocks[0].stop - blocks[0].start, score_shape[-1]), dtype=Q.dtype)
    for rows in blocks:
        P = _block_scores(Q, Kt, sqrt_dk, rows, buf[..., :rows.stop - rows.start, :])   # (..., r, n_k)
        m_r, l_r, m_rows, no_max = m[..., rows, :], ell[..., rows, :], _mask_rows(mask, rows), skip(rows)
        _rows_parallel(lambda r, P=P, m_r=m_r, l_r=l_r, m_rows=m_rows, no_max=no_max:
                       _exp_rows(P[..., r, :], sqrt_dk, _sub_rows(m_rows, r), no_max, m_r[..., r, :],
                                 l_r[..., r, :], normalise=not defer), P.shape[-2])   # exp(S − m) [/ ℓ]
        if keep is not None:
            _drop_block(P, keep[..., rows, :], drop_scale)
        O_r = np.matmul(P, V, out=O[..., rows, :])           # (..., r, d_v)
        if defer:
            O_r /= l_r                                       # deferred normalisation: (r, d_v), not (r, n_k)
    if not for_backward:
        return O, {"kind": "attention", "weights": None, "for_backward": False}
    return O, {"kind": "attention", "Q": Q, "K": K, "V": V, "O": O, "scale": 1.0 / sqrt_dk, "weights": None,
               "A_drop": None, "row_max": m, "row_sum": ell, "mask": mask, "keep": keep,
               "drop_scale": drop_scale, "dropout": {"kind": "dropout", "mask": None, "shape": score_shape}}


# Scores per block of the inference forward: one head's rows (see _inference_forward). Measured (CPU time,
# 1 thread, loaded machine, float32, B·h = 8, d_k = 16, medians of 5–9, A stored / not): n = 512: 2**15
# 6.5 / 4.8, 2**16 6.4 / 4.5, 2**17 5.9 / 4.2, 2**18 5.7 / 4.3 ms (2**18 is a whole head); n = 2048: 2**16
# 135 / 82, 2**17 122 / 71, 2**18 115 / 66, 2**19 126 / 70, 2**20 119 / 74 ms. 2**18 scores: 1 MiB in
# float32, within the 2 MiB L2 of this machine's cores.
_INFER_BLOCK_SCORES = 1 << 18


def _exp_only(S: np.ndarray, sqrt_dk: float, mask, skip_max: bool) -> None:
    """S ← exp(S' − m) in place, S' = S/√d_k + M (the ÷ √d_k only when not folded into Q), m the row max
    or nothing when ``skip_max`` (:func:`_no_max_rows`): no row sum (the inference forward gets it from
    its A V product)."""
    if not _folds(sqrt_dk):
        S /= sqrt_dk
    if mask is not None:
        S += mask
    if not skip_max:
        S -= np.max(S, axis=-1, keepdims=True)
    np.exp(S, out=S)


def _inference_forward(Q, K, V, mask, store_attention: bool, out) -> tuple[np.ndarray, dict]:
    """:func:`attention_forward` for inference (``for_backward=False``, no attention dropout).

    Head by head ((batch, head) slice of the leading axes) and, within a head, by blocks of query rows:
    S = (Q/√d_k) Kᵀ (1/√d_k on Q once, where exact), + M, − m where the bound of :func:`_no_max_rows`
    does not allow skipping it, P = exp(S) in place, and one product P [V | 1]: the unnormalised
    context and the row sums ℓ = P·1 from one GEMM (no sum pass over P). O = (P V)/ℓ on the
    (n_q, d_v) result. With ``store_attention`` A = P ⊙ (1/ℓ) is made in P's place (one pass: the
    weights the API returns); without, P lives in one reused block buffer. One head's rows per
    block (not every head's) keep each GEMM tall: at n = 2048 a block of 2¹⁸ scores over 8 heads
    is 16 rows per product. The cache is ``{"weights": A or None}``: nothing for a backward."""
    sqrt_dk = math.sqrt(Q.shape[-1])
    n_q, n_k, d_v = Q.shape[-2], K.shape[-2], V.shape[-1]
    lead, dtype = Q.shape[:-2], Q.dtype
    O = np.empty(lead + (n_q, d_v), dtype=dtype) if out is None else out   # (..., n_q, d_v)
    safe = _no_max_rows(Q, K, V, mask, sqrt_dk)              # (..., n_q, 1) or None
    Qs = Q / sqrt_dk if _folds(sqrt_dk) else Q               # one (n_q, d_k) pass; exact (:func:`_folds`)
    Kt = np.broadcast_to(K.swapaxes(-1, -2), lead + (K.shape[-1], n_k))   # (..., d_k, n_k) view
    V1 = np.empty(lead + (n_k, d_v + 1), dtype=dtype)        # (..., n_k, d_v + 1): [V | 1]
    V1[..., :d_v] = V
    V1[..., d_v] = 1
    O1 = np.empty(lead + (n_q, d_v + 1), dtype=dtype)        # (..., n_q, d_v + 1): [P V | ℓ]
    A = np.empty(lead + (n_q, n_k), dtype=dtype) if store_attention else None   # (..., n_q, n_k)
    rows_per = max(1, min(n_q, _INFER_BLOCK_SCORES // max(1, n_k)))
    buf = None if store_attention else np.empty((rows_per, n_k), dtype=dtype)
    masks = None if mask is None else np.broadcast_to(mask, lead + mask.shape[-2:])
    for idx in np.ndindex(*lead):
        q, kt, v1, o1 = Qs[idx], Kt[idx], V1[idx], O1[idx]   # (n_q, d_k), (d_k, n_k), (n_k, d_v + 1), …
        m_h = None if masks is None else masks[idx]          # (n_q | 1, n_k)
        for r0 in range(0, n_q, rows_per):
            rows = slice(r0, min(r0 + rows_per, n_q))
            P = np.matmul(q[rows], kt, out=A[idx][rows] if A is not None else buf[:rows.stop - r0])   # (r, n_k)
            m_rows = _mask_rows(m_h, rows)
            no_max = safe is not None and bool(safe[idx][rows].all())
            _rows_parallel(lambda r, P=P, m_rows=m_rows, no_max=no_max:
                           _exp_only(P[r], sqrt_dk, _sub_rows(m_rows, r), no_max), P.shape[0])
            o1_r = np.matmul(P, v1, out=o1[rows])            # (r, d_v + 1): [P V | ℓ]
            if A is not None:
                inv = 1.0 / o1_r[:, d_v:]                    # (r, 1)
                _rows_parallel(lambda r, P=P, inv=inv: P[r].__imul__(inv[r]), P.shape[0])
    np.divide(O1[..., :d_v], O1[..., d_v:], out=O)           # deferred normalisation on (n_q, d_v)
    return O, {"kind": "attention", "weights": A, "for_backward": False}


def _exp_block(Q, Kt, sqrt_dk, mask, rows, buf, m, ell, normalise: bool = True) -> np.ndarray:
    """The forward's block of rows ``rows`` of exp(S − m) [/ ℓ], recomputed into ``buf`` from its m and ℓ."""
    S = _block_scores(Q, Kt, sqrt_dk, rows, buf[..., :rows.stop - rows.start, :])   # (..., r, n_k) scores
    m_r, l_r, m_rows = m[..., rows, :], ell[..., rows, :], _mask_rows(mask, rows)
    _rows_parallel(lambda sub: _exp_rows_again(S[..., sub, :], sqrt_dk, _sub_rows(m_rows, sub), m_r[..., sub, :],
                                               l_r[..., sub, :], normalise), S.shape[-2])
    return S


def _drop_block(P: np.ndarray, keep: np.ndarray, scale: float) -> None:
    """P ⊙ mask for one block, mask = keep · 1/(1 − p) in P's dtype (as dropout_forward builds it)."""
    P *= keep
    P *= P.dtype.type(scale)


def attention_weights(cache: dict) -> np.ndarray:
    """A = softmax(Q Kᵀ/√d_k + M) of an attention cache, stored or not (``store_attention=False``
    rebuilds it by row blocks from the cached row maxima and sums: the stored path's A, bit for bit)."""
    if cache["weights"] is not None:
        return cache["weights"]
    Q, K = cache["Q"], cache["K"]
    sqrt_dk = math.sqrt(Q.shape[-1])
    A = np.empty(Q.shape[:-1] + (K.shape[-2],), dtype=Q.dtype)           # (..., n_q, n_k)
    for rows in _row_blocks(math.prod(A.shape[:-2]), *A.shape[-2:]):
        _exp_block(Q, K.swapaxes(-1, -2), sqrt_dk, cache["mask"], rows, A[..., rows, :], cache["row_max"],
                   cache["row_sum"])                         # written into A's rows
    return A


def attention_backward(dO: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) by the forward's blocks of query rows: dS for rows r needs only dO, A and the
    dropout mask of rows r, so dQ[r] = dS_r K is written block by block and dK = Σ_r dS_rᵀ Q[r]
    is accumulated; no (…, n_q, n_k) temporary is ever whole. Without a stored A (``store_attention
    =False``) each block of P = exp(S − m) is recomputed first and left unnormalised: with
    A = P/ℓ (ℓ per row), dV = Σ_r P_rᵀ (dO[r]/ℓ_r), ℓ dS = P ⊙ (dA − D), dQ[r] = ((ℓ dS)_r K)/ℓ_r and
    dK = Σ_r (ℓ dS)_rᵀ (Q[r]/ℓ_r) — every 1/ℓ on an (r, d) array, none on the block.
    (Writing the results straight into :func:`mha_backward`'s fused gradient layout instead was
    measured: no lower peak — the row-block temporaries are alive then too — and ~15% slower at
    n = 2048, the products writing strided rows.)"""
    check_for_backward(cache, "attention_forward")
    Q, K, V = cache["Q"], cache["K"], cache["V"]
    A = cache["weights"]
    Vt = V.swapaxes(-1, -2)                                  # (..., d_v, n_k) view
    lead = Q.shape[:-2] if A is None else A.shape[:-2]
    n_q, n_k = Q.shape[-2], K.shape[-2]
    dQ = np.empty(lead + (n_q, Q.shape[-1]), dtype=Q.dtype)  # (..., n_q, d_k)
    dK = np.empty(lead + K.shape[-2:], dtype=Q.dtype)        # (..., n_k, d_k)
    dV = np.empty(lead + V.shape[-2:], dtype=Q.dtype)        # (..., n_k, d_v)
    blocks = _row_blocks(math.prod(lead), n_q, n_k)
    # ⟨dA_i, A_i⟩ of every row i without a (…, n_q, n_k) product: Σ_j dA_ij A_ij = Σ_j (dO Vᵀ ⊙ M)_ij A_ij
    # = Σ_j (dO Vᵀ)_ij A_drop,ij = Σ_k dO_ik O_ik — a (…, n_q, d_v) product (FlashAttention's D). It
    # replaces two passes over each (r, n_k) block by one over (n_q, d_v): it pays for rows of at least
    # 2·d_v keys; shorter rows keep the plain path's ⟨dA, A⟩ (and its exact rounding).
    D = np.einsum("...k,...k->...", dO, cache["O"])[..., None] if n_k >= 2 * V.shape[-1] else None
    if A is not None:
        drop_mask = cache["dropout"]["mask"]
        np.matmul(cache["A_drop"].swapaxes(-1, -2), dO, out=dV)   # (..., n_k, d_v)
    else:
        keep, scale = cache["keep"], cache["drop_scale"]
        block_shape = lead + (blocks[0].stop - blocks[0].start, n_k)       # (..., r, n_k)
        buf, dA_buf = np.empty(block_shape, dtype=Q.dtype), np.empty(block_shape, dtype=Q.dtype)
        Kt, sqrt_dk = K.swapaxes(-1, -2), math.sqrt(Q.shape[-1])
        inv_ell = None if D is None else 1.0 / cache["row_sum"]          # (..., n_q, 1)
    for i, rows in enumerate(blocks):
        inv = None
        if A is not None:
            dA = dO[..., rows, :] @ Vt                       # (..., r, n_k) ∂L/∂A_drop for these rows
            A_rows, scratch = A[..., rows, :], None
            if drop_mask is not None:
                dA *= drop_mask[..., rows, :]                # dropout backward on the block
        else:
            inv = None if inv_ell is None else inv_ell[..., rows, :]        # (..., r, 1)
            A_rows = _exp_block(Q, Kt, sqrt_dk, cache["mask"], rows, buf, cache["row_max"], cache["row_sum"],
                                normalise=inv is None)       # the forward's P[rows] (A[rows] if normalised)
            A_used = A_rows if keep is None else A_rows * keep[..., rows, :] * A_rows.dtype.type(scale)
            dO_r = dO[..., rows, :] if inv is None else dO[..., rows, :] * inv   # (..., r, d_v)
            _accumulate(dV, A_used.swapaxes(-1, -2), dO_r, first=i == 0,
                        scratch=dA_buf)                      # Σ_r A_drop[r]ᵀ dO[r], before dA fills dA_buf
            del A_used, dO_r
            dA = np.matmul(dO[..., rows, :], Vt, out=dA_buf[..., :rows.stop - rows.start, :])   # (..., r, n_k)
            if keep is not None:
                dA *= keep[..., rows, :]
                dA *= dA.dtype.type(scale)
            scratch = buf                                    # A[rows] is not read after dS: its buffer is free
        D_r = None if D is None else D[..., rows, :]

        def ds(sub: slice, dA=dA, A_rows=A_rows, D_r=D_r) -> None:   # dS = A ⊙ (dA − ⟨dA, A⟩), in dA
            d, a = dA[..., sub, :], A_rows[..., sub, :]
            if D_r is None:
                _softmax_backward_inplace(d, a)
            else:
                d -= D_r[..., sub, :]
                d *= a

        _rows_parallel(ds, dA.shape[-2])
        dS = dA                                              # dS, or ℓ dS when A_rows is P (inv given)
        dQ_r = np.matmul(dS, K, out=dQ[..., rows, :])        # (..., r, d_k)
        if inv is not None:
            dQ_r *= inv
        _accumulate(dK, dS.swapaxes(-1, -2), Q[..., rows, :] if inv is None else Q[..., rows, :] * inv,
                    first=i == 0, scratch=scratch)           # (..., n_k, d_k)
    sqrt_dk = math.sqrt(Q.shape[-1])
    dQ /= sqrt_dk                                            # the 1/√d_k of S, on the (n, d_k) results:
    dK /= sqrt_dk                                            # fewer entries than the (n, n_k) dS
    return dQ, dK, dV


def _accumulate(acc: np.ndarray, a: np.ndarray, b: np.ndarray, first: bool, scratch=None) -> None:
    """acc = a @ b on the first block, acc += a @ b after (no zero-filled start); the product goes
    through ``scratch``'s memory when it is large enough (no new temporary per block)."""
    if first:
        np.matmul(a, b, out=acc)
    elif scratch is not None and scratch.size >= acc.size:
        acc += np.matmul(a, b, out=scratch.reshape(-1)[:acc.size].reshape(acc.shape))
    else:
        acc += a @ b


def mha_forward(x: np.ndarray, p: dict, n_heads: int, mask: np.ndarray | None = None,
                dropout_p: float = 0.0, training: bool = False, rng=None,
                store_attention: bool = True, for_backward: bool = True) -> tuple[np.ndarray, dict]:
    """MHA(X) with Q, K, V in one (B·n, 3d) array, written by three products into its column blocks
    (no concatenated [W_Q | W_K | W_V] copy is made or cached); Q, K, V are views of it.
    ``store_attention=False``: see :func:`attention_forward`. ``for_backward=False`` (inference): the
    cache holds only the attention's ``"weights"``; :func:`mha_backward` refuses it."""
    B, n, d = x.shape
    x2 = x.reshape(-1, d)                                            # (M, d)
    qkv = np.empty((x2.shape[0], 3 * d), dtype=x.dtype)              # (M, 3d): [Q | K | V]
    for i, name in enumerate("QKV"):                                 # X W_Q, X W_K, X W_V into their
        np.matmul(x2, p["W_" + name], out=qkv[:, i * d:(i + 1) * d])   # columns: no concatenated (d, 3d) W
    b_qkv = np.concatenate([p["b_Q"], p["b_K"], p["b_V"]])           # (3d,)
    _rows_parallel(lambda r: qkv[r].__iadd__(b_qkv), qkv.shape[0])
    qkv_cache = {"kind": "qkv", "x": x, "W": (p["W_Q"], p["W_K"], p["W_V"])}   # references, no copy
    qkv = qkv.reshape(B, n, 3, n_heads, d // n_heads).transpose(2, 0, 3, 1, 4)   # (3, B, h, n, d_k) view
    ctx = np.empty((B, n, d), dtype=x.dtype)                         # Concat(head_1 … head_h): (B, n, d)
    heads = ctx.reshape(B, n, n_heads, d // n_heads).transpose(0, 2, 1, 3)   # (B, h, n, d_k) view of ctx
    _, attn_cache = attention_forward(qkv[0], qkv[1], qkv[2], mask, dropout_p, training, rng, store_attention,
                                      out=heads, for_backward=for_backward)   # O written straight into ctx
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
    dQ, dK, dV = attention_backward(split_heads(dctx, h), take("attn"))   # each (B, h, n, d_k)
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
