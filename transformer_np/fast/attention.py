"""The fast path's softmax and attention core, forward and backward (see :mod:`transformer_np.fast` for
the tricks and the tests that hold them; the plain kernels are in :mod:`transformer_np.ops.softmax` and
:mod:`transformer_np.ops.attention`). How the scores are cut into blocks and the blocks shared out over
threads is in :mod:`transformer_np.fast.blocks`; the multi-head wrapper (the projections) in
:mod:`transformer_np.fast.mha`."""

from __future__ import annotations

import math

import numpy as np

from ..errors import InputTypeError, InputValueError
from ..ops.cache import check_for_backward
from ..ops.kernels import dropout_forward
from .blocks import (
    _block_buffer,
    _block_pass,
    _block_rows,
    _fit,
    _head_blocks,
    _per_head,
    _row_blocks,
    _shard_blocks,
    _with_column,
)
from .ffn import _ones
from .threads import _in_shards, _rows_parallel

__all__ = ["softmax", "attention_forward", "attention_backward", "attention_weights"]


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


# The bound of _no_max_rows (norms of Q and K, max |V|, the mask's row maxima) pays for the max and subtract
# passes it saves from about 2**15 scores (the measurements: docs/bench_notes.md, "_SKIP_MIN_SCORES").
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
    bound's few NumPy calls: fewer than :data:`_SKIP_MIN_SCORES` scores in all. Short rows are no
    exception: NumPy's max over a short last axis costs per row, not per element (MiniLM's 22-key
    rows, 186 k scores: 0.42 ms for the max pass against 0.02 ms for a sum by a product)."""
    n_k = K.shape[-2]
    if (n_k == 0 or Q.shape[-1] == 0
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
    """The forward softmax passes over rows S of a block, in place: S ← exp(S' − m) [/ ℓ] (:func:`_exp_only`,
    then ℓ = Σ_j exp(S' − m) and the division). ``m`` / ``ell`` (…, r, 1) receive them when given."""
    _exp_only(S, sqrt_dk, mask, skip_max, m)
    ell = np.sum(S, axis=-1, keepdims=True, out=ell)
    if normalise:
        S /= ell


def attention_forward(Q: np.ndarray, K: np.ndarray, V: np.ndarray, mask: np.ndarray | None = None,
                      dropout_p: float = 0.0, training: bool = False, rng=None,
                      store_attention: bool = True, out: np.ndarray | None = None,
                      for_backward: bool = True, *, weights_out: np.ndarray | None = None
                      ) -> tuple[np.ndarray, dict]:
    """softmax(Q Kᵀ/√d_k + mask) V, S and A by blocks of query rows, A built in place.

    Without attention dropout (inference, or ``dropout_p = 0``) the work goes by blocks of heads
    (:func:`_forward_heads`; a block is rows of one head, or several whole heads: :func:`_head_blocks`):
    S = (Q/√d_k) Kᵀ, + M, − m where it cannot be skipped, P = exp(S) in place, then for rows of
    ≥ :data:`_ONES_MIN`·d_v keys one product P [V | 1] gives the unnormalised context and the row sums
    ℓ together (no sum pass over P); O = (P V)/ℓ is normalised on the (n_q, d_v) result, and a stored
    A is P ⊙ (1/ℓ), made in P's place (shorter rows: ℓ by a sum pass). With attention dropout in
    training the blocks span every head (:func:`_forward_dropout`) and A (or P) is normalised before
    the dropout.

    ``for_backward=False`` (inference): the cache keeps only ``"weights"`` (A when ``store_attention``,
    else None), nothing a backward needs; :func:`attention_backward` refuses it.

    The cache keeps A as ``"weights"`` (and as ``"softmax"["s"]``), not the scores. Fewer passes
    over each block than the plain softmax: the ÷ √d_k goes onto Q where that is exact
    (:func:`_folds`); the max subtraction is skipped for rows that provably cannot overflow
    or underflow without it (:func:`_no_max_rows`); each block's rows of O are computed while
    the block is in cache.

    ``store_attention=False`` (the FlashAttention trade: memory for compute) keeps no (…, n_q, n_k)
    array: each block of P = exp(S − m) is used for its rows of O and dropped; the cache holds the row
    maxima m (0 where skipped) and row sums ℓ (two (…, n_q, 1) arrays), from which the backward and
    :func:`attention_weights` recompute each block with the forward's operations. Extra memory: one
    block of scores (~2¹⁸ entries). ``out`` (…, n_q, d_v), any strides BLAS accepts, receives O
    (:func:`~transformer_np.fast.mha.mha_forward` passes the heads' view of its merged context, so merging
    the heads costs no copy). ``"weights"`` is then None; :func:`attention_weights` rebuilds A on request. With
    attention dropout in training the keep-mask is kept as booleans (n_q·n_k bytes).

    ``weights_out`` (keyword only; with ``store_attention``), a C-contiguous (…, n_q, n_k) array of Q's
    dtype, receives A, which is then that array (the sharded inference layer passes each shard its part
    of the batch's A).
    """
    _check_weights_out(weights_out, Q.shape[:-1] + (K.shape[-2],), Q.dtype, store_attention)
    if training and dropout_p != 0.0:
        return _forward_dropout(Q, K, V, mask, dropout_p, rng, store_attention, out, for_backward, weights_out)
    O, A, m, ell = _forward_heads(Q, K, V, mask, store_attention, out, stats=for_backward and not store_attention,
                                  weights_out=weights_out, optimistic=not for_backward)
    if not for_backward:
        return O, {"kind": "attention", "weights": A, "for_backward": False}
    score_shape = Q.shape[:-1] + (K.shape[-2],)              # (..., n_q, n_k)
    cache = {"kind": "attention", "Q": Q, "K": K, "V": V, "O": O, "scale": 1.0 / math.sqrt(Q.shape[-1]),
             "weights": A, "A_drop": A, "dropout": {"kind": "dropout", "mask": None, "shape": score_shape}}
    if A is not None:
        cache["softmax"] = {"kind": "softmax", "s": A}
    else:
        cache.update({"row_max": m, "row_sum": ell, "mask": mask, "keep": None, "drop_scale": None})
    return O, cache


def _check_weights_out(weights_out, shape: tuple, dtype, store_attention: bool) -> None:
    """Refuse a ``weights_out`` that cannot receive A (named, with what was expected and received)."""
    if weights_out is None:
        return
    if not store_attention:
        raise InputValueError("weights_out receives the attention weights: it needs store_attention=True")
    if not isinstance(weights_out, np.ndarray) or weights_out.dtype != dtype:
        got = weights_out.dtype if isinstance(weights_out, np.ndarray) else type(weights_out).__name__
        raise InputTypeError(f"weights_out must be a numpy array of dtype {dtype}, got {got}")
    if weights_out.shape != shape or not weights_out.flags.c_contiguous or not weights_out.flags.writeable:
        raise InputValueError(f"weights_out must be a writeable C-contiguous array of shape {shape}, got shape "
                              f"{weights_out.shape} (C-contiguous: {weights_out.flags.c_contiguous}, "
                              f"writeable: {weights_out.flags.writeable})")


def _exp_only(S: np.ndarray, sqrt_dk: float, mask, skip_max: bool, m=None, ell=None) -> None:
    """S ← exp(S' − m) in place, S' = S/√d_k + M (the ÷ √d_k only when not folded into Q), m the row max,
    or 0 when ``skip_max`` (:func:`_no_max_rows`); ``m`` (…, r, 1) receives it when given, ``ell`` the row
    sums ℓ (when given: the loops with ℓ from the P [V | 1] product pass none)."""
    if not _folds(sqrt_dk):
        S /= sqrt_dk
    if mask is not None:
        S += mask
    if skip_max:
        if m is not None:
            m.fill(0)
    else:
        S -= np.max(S, axis=-1, keepdims=True, out=m)
    np.exp(S, out=S)
    if ell is not None:
        _row_sums(S, ell)


def _row_sums(S: np.ndarray, ell: np.ndarray) -> None:
    """ell (…, r, 1) ← Σ_j S[…, r, j]: one matrix-vector product S·1 when both are C-contiguous (one BLAS
    call, instead of NumPy's per-row reduction, which costs per row on short rows), else ``np.sum``."""
    n = S.shape[-1]
    if S.flags.c_contiguous and ell.flags.c_contiguous and S.size:
        np.matmul(S.reshape(-1, n), _ones(n, S.dtype), out=ell.reshape(-1))   # (rows,)
    else:
        np.sum(S, axis=-1, keepdims=True, out=ell)


# The row sums come from the A V product with a column of ones appended to V (P [V | 1] = [P V | ℓ]) for
# rows of ≥ _ONES_MIN·d_v keys; then the normalisation of O is deferred to the (n_q, d_v) result, and the
# backward takes dA − D from one product [dO | −D] [V | 1]ᵀ. The extra column and the (n, d_v + 1) copies
# cost in proportion to d_v, the passes they save in proportion to n_k: BERT-base's rows have only 2·d_v keys,
# so there the sum pass and the subtraction of D stay (the measurements: docs/bench_notes.md, "_ONES_MIN").
_ONES_MIN = 8


def _optimistic(optimistic: bool, stats: bool, ones: bool) -> bool:
    """Whether :func:`_forward_heads` exponentiates without the row maxima and checks the row sums after
    (:func:`_sums_safe`) instead of bounding the scores first (:func:`_no_max_rows`): for inference
    (``optimistic``), rows of fewer than :data:`_ONES_MIN`·d_v keys (no [V | 1] product), no row statistics."""
    return optimistic and not stats and not ones


def _sums_safe(ell: np.ndarray, n_k: int) -> bool:
    """True when the row sums ℓ = Σ_j exp(s_ij) of a block, taken *without* subtracting the row maxima,
    show that doing so changed nothing but round-off: every ℓ is finite (no exp overflowed; then every
    term is ≤ ℓ and A = P/ℓ ≤ 1) and ℓ ≥ tiny·n_k²·e/eps (the row's largest term, ≥ ℓ/n_k, is then
    ≥ tiny·n_k·e/eps: a term small enough to round to a subnormal (< tiny) is below eps/(e·n_k) of it,
    so the subnormals' rounding costs at most ~eps of the row sum — the condition :func:`_no_max_rows`
    proves beforehand; it also keeps 1/ℓ finite). A NaN, an infinite sum or a row whose every key is
    masked (ℓ = 0) fails, and the caller recomputes the block with the maxima subtracted (the plain
    path's arithmetic, e.g. its uniform row for a fully masked one)."""
    fi = np.finfo(ell.dtype)
    lo = float(fi.tiny) * n_k * n_k * math.e / float(fi.eps)
    return bool(np.all((ell >= lo) & (ell <= fi.max)))


def _forward_heads(Q, K, V, mask, store: bool, out, stats: bool, weights_out=None, optimistic: bool = False):
    """The forward without attention dropout, by blocks of heads: (O, A or None, m or None, ℓ or None).

    Per block (:func:`_head_blocks`): P = exp((Q/√d_k) Kᵀ + M − m) in place (:func:`_exp_only`). Rows of
    ≥ :data:`_ONES_MIN`·d_v keys: O1 = P [V | 1] = [P V | ℓ], the row sums from the product's extra
    column; A = P ⊙ (1/ℓ) in P's place when ``store``; O = (P V)/ℓ at the end, on (n_q, d_v). Shorter
    rows: ℓ by a sum pass, A = P ⊙ (1/ℓ) then O = A V when ``store``; else O = (P V)/ℓ (rows of
    ≥ 2·d_v keys) or (P/ℓ) V. ``stats``: return the row maxima m (0 where skipped) and sums ℓ,
    (…, n_q, 1) each, for the recomputing backward.

    ``optimistic`` (inference; rows without the [V | 1] product, no ``stats``: :func:`_optimistic`): no bound
    beforehand; each block is exponentiated without its row maxima and kept when its row sums pass
    :func:`_sums_safe`, else recomputed with them (one more Q Kᵀ block product). On short rows the bound
    and the max pass cost per row, not per score (MiniLM, 22 keys: ~0.55 ms for the bound and ~0.46 ms for
    the max over 186 k scores, of ~2.2 ms for the whole attention); the check costs one pass over ℓ."""
    sqrt_dk = math.sqrt(Q.shape[-1])
    n_q, n_k, d_v = Q.shape[-2], K.shape[-2], V.shape[-1]
    lead, dtype = Q.shape[:-2], Q.dtype
    O = np.empty(lead + (n_q, d_v), dtype=dtype) if out is None else out   # (..., n_q, d_v)
    ones = n_k >= _ONES_MIN * d_v
    optimistic = _optimistic(optimistic, stats, ones)
    safe = None if optimistic else _no_max_rows(Q, K, V, mask, sqrt_dk)   # (..., n_q, 1) or None
    # ÷ √d_k, exact where it folds (:func:`_folds`): on Q, one (n_q, d_k) pass into a new array — or, optimistic
    # (short rows), on each contiguous block of scores in place (s_scale): MiniLM's Q is a strided view of the
    # (M, 3d) projections, dearer to copy than its scores are to scale (docs/bench_notes.md, "÷ √d_k …")
    s_scale = optimistic and _folds(sqrt_dk)
    Qs = Q / sqrt_dk if _folds(sqrt_dk) and not s_scale else Q
    Kt = _per_head(K.swapaxes(-1, -2), lead, 2)              # (..., d_k, n_k) view
    if ones:
        Vx = _with_column(_per_head(V, lead, 2), 1)          # (..., n_k, d_v + 1): [V | 1]
        O1 = np.empty(lead + (n_q, d_v + 1), dtype=dtype)    # (..., n_q, d_v + 1): [P V | ℓ]
    else:
        Vx, O1 = _per_head(V, lead, 2), O
        ell = np.empty(lead + (n_q, 1), dtype=dtype)         # (..., n_q, 1)
    defer = not store and not optimistic and n_k >= 2 * d_v  # O = (P V)/ℓ (ones: always); optimistic: A V,
                                                             # |A| ≤ 1, so O overflows only where the plain O does
    A = (np.empty(lead + (n_q, n_k), dtype=dtype) if weights_out is None else weights_out) if store else None
    m = np.empty(lead + (n_q, 1), dtype=dtype) if stats else None     # (..., n_q, 1)
    masks = _per_head(mask, lead, 2)
    parts = _shard_blocks(lead, n_q, n_k, Q.shape[-1])

    def part(i: int) -> None:
        buf = None if store else _block_buffer(lead, n_q, n_k, dtype)     # (…, r, n_k): this thread's
        for ix, rows in parts[i]:
            q = Qs[ix][..., rows, :]                         # (…, r, d_k)
            P = np.matmul(q, Kt[ix], out=A[ix][..., rows, :] if store else _fit(buf, q.shape[:-1] + (n_k,)))
            m_rows = None if masks is None else _block_rows(masks[ix], rows)
            no_max = safe is not None and bool(safe[ix][..., rows, :].all())
            m_r = None if m is None else m[ix][..., rows, :]
            l_r = None if ones else ell[ix][..., rows, :]

            def exp_rows(r: slice, P=P, m_rows=m_rows, no_max=no_max, m_r=m_r, l_r=l_r, norm=True) -> None:
                if s_scale:
                    P[..., r, :] *= 1.0 / sqrt_dk            # (Q Kᵀ)/√d_k = (Q/√d_k) Kᵀ bit for bit (:func:`_folds`)
                _exp_only(P[..., r, :], sqrt_dk, _block_rows(m_rows, r), no_max, _block_rows(m_r, r),
                          _block_rows(l_r, r))
                if norm and not ones and not defer:
                    P[..., r, :] *= 1.0 / l_r[..., r, :]     # A = P/ℓ: stored, or short rows' plain order

            if optimistic:
                with np.errstate(over="ignore", invalid="ignore"):   # a refused attempt warns of nothing
                    _block_pass(lambda r, f=exp_rows: f(r, no_max=True, norm=False), P)   # exp(S') and ℓ
                if not _sums_safe(l_r, n_k):                 # an exp over- or underflowed: the maxima after all
                    np.matmul(q, Kt[ix], out=P)
                    _block_pass(lambda r, f=exp_rows: f(r, norm=False), P)
                _block_pass(lambda r, P=P, l_r=l_r: P[..., r, :].__imul__(1.0 / l_r[..., r, :]), P)   # A = P/ℓ
            else:
                _block_pass(exp_rows, P)
            o_r = np.matmul(P, Vx[ix], out=O1[ix][..., rows, :])   # (…, r, d_v [+ 1]): P V [| ℓ]
            if ones and store:
                inv = 1.0 / o_r[..., d_v:]                   # (…, r, 1)
                _block_pass(lambda r, P=P, inv=inv: P[..., r, :].__imul__(inv[..., r, :]), P)
            elif defer and not ones:
                o_r /= l_r                                   # deferred normalisation on (r, d_v)

    _in_shards(part, len(parts))
    if ones:
        np.divide(O1[..., :d_v], O1[..., d_v:], out=O)       # deferred normalisation on (n_q, d_v)
        ell = O1[..., d_v:].copy() if stats else None
    return O, A, m, (ell if stats else None)


def _forward_dropout(Q, K, V, mask, dropout_p, rng, store_attention, out, for_backward, weights_out=None):
    """:func:`attention_forward` with attention dropout in training: blocks of rows across every head
    (:func:`_row_blocks`), the softmax normalised before the dropout (the row sums are of the undropped
    P, so they cannot come from the product with the dropped block)."""
    sqrt_dk = math.sqrt(Q.shape[-1])                         # a Python float: keeps float32 float32
    Kt = K.swapaxes(-1, -2)                                  # (..., d_k, n_k) view
    score_shape = Q.shape[:-1] + (K.shape[-2],)              # (..., n_q, n_k)
    blocks = _row_blocks(math.prod(score_shape[:-2]), *score_shape[-2:])
    safe = _no_max_rows(Q, K, V, mask, sqrt_dk)              # (..., n_q, 1) or None
    O = np.empty(score_shape[:-1] + (V.shape[-1],), dtype=Q.dtype) if out is None else out   # (..., n_q, d_v)

    def skip(rows: slice) -> bool:
        return safe is not None and bool(safe[..., rows, :].all())

    if store_attention:
        A = np.empty(score_shape, dtype=Q.dtype) if weights_out is None else weights_out   # (..., n_q, n_k)
        for rows in blocks:
            S = _block_scores(Q, Kt, sqrt_dk, rows, A[..., rows, :])   # (..., r, n_k) scores, in A's rows
            m_rows, no_max = _block_rows(mask, rows), skip(rows)
            _rows_parallel(lambda r, S=S, m_rows=m_rows, no_max=no_max:
                           _exp_rows(S[..., r, :], sqrt_dk, _block_rows(m_rows, r), no_max), S.shape[-2])
        A_drop, drop_cache = dropout_forward(A, dropout_p, True, rng)
        np.matmul(A_drop, V, out=O)                          # (..., n_q, d_v)
        if not for_backward:
            return O, {"kind": "attention", "weights": A, "for_backward": False}
        return O, {"kind": "attention", "Q": Q, "K": K, "V": V, "O": O, "scale": 1.0 / sqrt_dk, "weights": A,
                   "A_drop": A_drop, "softmax": {"kind": "softmax", "s": A}, "dropout": drop_cache}
    keep = _draw_keep(score_shape, dropout_p, True, rng)
    drop_scale = 1.0 / (1.0 - float(dropout_p))
    m = np.empty(score_shape[:-1] + (1,), dtype=Q.dtype)                 # (..., n_q, 1) row maxima
    ell = np.empty_like(m)                                               # (..., n_q, 1) row sums
    buf = np.empty(score_shape[:-2] + (blocks[0].stop - blocks[0].start, score_shape[-1]), dtype=Q.dtype)
    for rows in blocks:
        P = _block_scores(Q, Kt, sqrt_dk, rows, buf[..., :rows.stop - rows.start, :])   # (..., r, n_k)
        m_r, l_r, m_rows, no_max = m[..., rows, :], ell[..., rows, :], _block_rows(mask, rows), skip(rows)
        _rows_parallel(lambda r, P=P, m_r=m_r, l_r=l_r, m_rows=m_rows, no_max=no_max:
                       _exp_rows(P[..., r, :], sqrt_dk, _block_rows(m_rows, r), no_max, m_r[..., r, :],
                                 l_r[..., r, :], normalise=False), P.shape[-2])   # exp(S − m)
        _drop_block(P, keep[..., rows, :], drop_scale)
        O_r = np.matmul(P, V, out=O[..., rows, :])           # (..., r, d_v)
        O_r /= l_r                                           # deferred normalisation: (r, d_v), not (r, n_k)
    if not for_backward:
        return O, {"kind": "attention", "weights": None, "for_backward": False}
    return O, {"kind": "attention", "Q": Q, "K": K, "V": V, "O": O, "scale": 1.0 / sqrt_dk, "weights": None,
               "A_drop": None, "row_max": m, "row_sum": ell, "mask": mask, "keep": keep,
               "drop_scale": drop_scale, "dropout": {"kind": "dropout", "mask": None, "shape": score_shape}}


def _recompute(Q, Kt, sqrt_dk: float, mask, m, ix, rows: slice, out) -> np.ndarray:
    """P = exp(S − m) of one block (``ix``, ``rows``), recomputed into ``out`` (g, r, n_k) from the forward's
    row maxima m (0 where the forward skipped the subtraction: then S − m is skipped too, exact). ``mask``:
    the block's heads' (g, n_q | 1, n_k) mask, or an array used whole, or None."""
    q = Q[ix][..., rows, :]                                  # (g, r, d_k), already ÷ √d_k if folded
    P = np.matmul(q, Kt[ix], out=_fit(out, q.shape[:-1] + out.shape[-1:]))   # (…, r, n_k) scores
    m_rows, m_r = _block_rows(mask, rows), m[ix][..., rows, :]
    sub = bool(m_r.any())

    def exp_rows(r: slice) -> None:
        S = P[..., r, :]
        if not _folds(sqrt_dk):
            S /= sqrt_dk
        if m_rows is not None:
            S += _block_rows(m_rows, r)
        if sub:
            S -= m_r[..., r, :]
        np.exp(S, out=S)

    _block_pass(exp_rows, P)
    return P


def _drop_block(P: np.ndarray, keep: np.ndarray, scale: float) -> None:
    """P ⊙ mask for one block, mask = keep · 1/(1 − p) in P's dtype (as dropout_forward builds it)."""
    P *= keep
    P *= P.dtype.type(scale)


def attention_weights(cache: dict) -> np.ndarray:
    """A = softmax(Q Kᵀ/√d_k + M) of an attention cache, stored or not (``store_attention=False``
    rebuilds it block by block from the cached row maxima and sums: A = exp(S − m) ⊙ (1/ℓ))."""
    if cache["weights"] is not None:
        return cache["weights"]
    Q, K = cache["Q"], cache["K"]
    sqrt_dk = math.sqrt(Q.shape[-1])
    lead, n_q, n_k = Q.shape[:-2], Q.shape[-2], K.shape[-2]
    Qs = Q / sqrt_dk if _folds(sqrt_dk) else Q
    Kt, masks = _per_head(K.swapaxes(-1, -2), lead, 2), _per_head(cache["mask"], lead, 2)
    inv = 1.0 / cache["row_sum"]                             # (..., n_q, 1)
    A = np.empty(lead + (n_q, n_k), dtype=Q.dtype)           # (..., n_q, n_k)
    for ix, rows in _head_blocks(lead, n_q, n_k):
        P = _recompute(Qs, Kt, sqrt_dk, None if masks is None else masks[ix], cache["row_max"], ix, rows,
                       A[ix][..., rows, :])
        P *= inv[ix][..., rows, :]
    return A


def attention_backward(dO: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dQ, dK, dV) by the forward's blocks (:func:`_head_blocks`: rows of one head, or whole heads): dS
    for rows r needs only dO, A and the dropout mask of rows r, so dQ[r] = dS_r K is written block by
    block and dK = Σ_r dS_rᵀ Q[r] is accumulated per head; no (…, n_q, n_k) temporary is ever whole.

    D_i = ⟨dA_i, A_i⟩ = ⟨dO_i, O_i⟩ (FlashAttention's D: an (n_q, d_v) product instead of an (n, n) one),
    (rows of ≥ 2·d_v keys; shorter rows keep the plain path's ⟨dA, A⟩). Without dropout, for rows of
    ≥ :data:`_ONES_MIN`·d_v keys, dA − D comes out of one product, [dO | −D] [V | 1]ᵀ, so dS = A ⊙ (dA − D)
    is one pass over the block.

    Without a stored A (``store_attention=False``) each block of P = exp(S − m) is recomputed first
    (:func:`_recompute`) and left unnormalised: with A = P/ℓ (ℓ per row), dV = Σ_r P_rᵀ (dO[r]/ℓ_r),
    ℓ dS = P ⊙ (dA − D), dQ[r] = ((ℓ dS)_r K)/ℓ_r and dK = Σ_r (ℓ dS)_rᵀ (Q[r]/ℓ_r) — every 1/ℓ on an
    (r, d) array, none on the block. (Writing the results straight into
    :func:`~transformer_np.fast.mha.mha_backward`'s fused gradient layout instead was measured in round 4: no
    lower peak, ~15% slower at n = 2048.)"""
    check_for_backward(cache, "attention_forward")
    return _attention_backward(dO, cache, False)


def _attention_backward(dO: np.ndarray, cache: dict, free_cache: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`attention_backward`; ``free_cache`` (:func:`~transformer_np.fast.mha.mha_backward`'s, the cache
    already taken from the MHA cache) drops O from the cache once D = ⟨dO, O⟩ is formed: O is the merged heads' context
    (B, n, d), which nothing else reads after the output projection's backward."""
    Q, K, V, O = cache["Q"], cache["K"], cache["V"], cache["O"]
    A = cache["weights"]
    lead, n_q, n_k, d_v = Q.shape[:-2], Q.shape[-2], K.shape[-2], V.shape[-1]
    dtype = Q.dtype
    sqrt_dk = math.sqrt(Q.shape[-1])
    dQ = np.empty(lead + (n_q, Q.shape[-1]), dtype=dtype)    # (..., n_q, d_k)
    dK = np.empty(lead + K.shape[-2:], dtype=dtype)          # (..., n_k, d_k)
    dV = np.empty(lead + V.shape[-2:], dtype=dtype)          # (..., n_k, d_v)
    Kh, Vh = _per_head(K, lead, 2), _per_head(V, lead, 2)
    drop_mask = cache["dropout"]["mask"] if A is not None else None      # stored path: (..., n_q, n_k) or None
    keep = None if A is not None else cache["keep"]                      # recomputed path: booleans or None
    dropout = drop_mask is not None or keep is not None
    use_D = n_k >= 2 * d_v
    D = np.einsum("...k,...k->...", dO, O)[..., None] if use_D else None   # (..., n_q, 1)
    if free_cache:
        del cache["O"], O                                    # the context's last read was D
    fold = use_D and not dropout and n_k >= _ONES_MIN * d_v  # dA − D from one product (see _ONES_MIN)
    if fold:
        G_left, G_right = _with_column(dO, -D), _with_column(Vh, 1)      # [dO | −D], [V | 1]: (…, n, d_v + 1)
    else:
        G_left, G_right = dO, Vh
    if A is not None:
        np.matmul(cache["A_drop"].swapaxes(-1, -2), dO, out=dV)   # (..., n_k, d_v)
    else:
        Qs = Q / sqrt_dk if _folds(sqrt_dk) else Q
        Kt, masks = _per_head(K.swapaxes(-1, -2), lead, 2), _per_head(cache["mask"], lead, 2)
        inv_ell = 1.0 / cache["row_sum"]                     # (..., n_q, 1)
        scale = None if keep is None else dtype.type(cache["drop_scale"])
    parts = _shard_blocks(lead, n_q, n_k, Q.shape[-1])

    def block(ix, rows: slice, gbuf: np.ndarray, pbuf: np.ndarray | None) -> None:
        first = rows.start == 0
        inv = None
        dO_r = dO[ix][..., rows, :]                          # (g, r, d_v)
        if A is not None:
            A_rows = A[ix][..., rows, :]                     # (g, r, n_k)
        else:
            A_rows = _recompute(Qs, Kt, sqrt_dk, None if masks is None else masks[ix], cache["row_max"], ix,
                                rows, pbuf)                  # P[rows] = exp(S − m)
            inv = inv_ell[ix][..., rows, :]                  # (g, r, 1)
            if not use_D:
                A_rows *= inv                                # short rows: A itself (the plain ⟨dA, A⟩ below)
            P_used = A_rows if keep is None else A_rows * keep[ix][..., rows, :] * scale
            _accumulate(dV[ix], P_used.swapaxes(-1, -2), dO_r * inv if use_D else dO_r, first,
                        scratch=gbuf)                        # Σ_r A_drop[r]ᵀ dO[r] (P/ℓ: dO/ℓ)
            del P_used
        g_l = G_left[ix][..., rows, :]                       # (g, r, d_v [+ 1])
        G = np.matmul(g_l, G_right[ix].swapaxes(-1, -2), out=_fit(gbuf, g_l.shape[:-1] + (n_k,)))   # dA (− D)
        if drop_mask is not None:
            G *= drop_mask[ix][..., rows, :]                 # dropout backward on the block
        elif keep is not None:
            G *= keep[ix][..., rows, :]
            G *= scale
        D_r = D[ix][..., rows, :] if (use_D and not fold) else None

        def ds(sub: slice, G=G, A_rows=A_rows, D_r=D_r) -> None:   # dS = A ⊙ (dA − ⟨dA, A⟩), in G
            g, a = G[..., sub, :], A_rows[..., sub, :]
            if not use_D:
                _softmax_backward_inplace(g, a)
                return
            if D_r is not None:
                g -= D_r[..., sub, :]
            g *= a

        _block_pass(ds, G)
        dQ_r = np.matmul(G, Kh[ix], out=dQ[ix][..., rows, :])   # (g, r, d_k)
        if inv is not None and use_D:
            dQ_r *= inv
        Q_r = Q[ix][..., rows, :]
        _accumulate(dK[ix], G.swapaxes(-1, -2), Q_r * inv if (inv is not None and use_D) else Q_r, first,
                    scratch=A_rows if A is None else None)   # (g, n_k, d_k)

    # each part's dA (then dS) of one block, and P of one block when A is recomputed: made here, on the
    # calling thread, so that they come from its heap's free space (freed cache arrays) rather than
    # from fresh pages of each pool thread's own heap
    bufs = [(_block_buffer(lead, n_q, n_k, dtype), None if A is not None else _block_buffer(lead, n_q, n_k, dtype))
            for _ in parts]

    def part(i: int) -> None:
        gbuf, pbuf = bufs[i]
        for ix, rows in parts[i]:
            block(ix, rows, gbuf, pbuf)

    _in_shards(part, len(parts))
    dQ /= sqrt_dk                                            # the 1/√d_k of S, on the (n, d_k) results:
    dK /= sqrt_dk                                            # fewer entries than the (n, n_k) dS
    return dQ, dK, dV


def _accumulate(acc: np.ndarray, a: np.ndarray, b: np.ndarray, first: bool, scratch=None) -> None:
    """acc = a @ b on the first block, acc += a @ b after (no zero-filled start); the product goes
    through ``scratch``'s memory when it is large enough (no new temporary per block)."""
    if first:
        np.matmul(a, b, out=acc)
    elif scratch is not None and scratch.size >= acc.size and scratch.flags.c_contiguous:
        acc += np.matmul(a, b, out=scratch.reshape(-1)[:acc.size].reshape(acc.shape))
    else:
        acc += a @ b
