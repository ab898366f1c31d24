"""How the attention's scores are cut into blocks and the blocks shared out over threads: the layout of
the blocks (:data:`_BLOCK_SCORES`), their split into parts (:data:`_SPLIT_MIN_FLOPS`), the per-block
views and buffers, and the elementwise passes over a block (:data:`_POOL_MIN`). The attention core that
runs them is :mod:`transformer_np.fast.attention`."""

from __future__ import annotations

import math

import numpy as np

from .threads import _chunks, _row_slices, _rows_parallel, get_batch_threads

# Scores per block, about _BLOCK_SCORES entries: each elementwise pass of the softmax (exp; scale, mask, max,
# subtract where they cannot be skipped; the 1/ℓ of a stored A) and of its backward then runs on a block that
# stays in cache instead of streaming the whole (…, n_q, n_k) array through memory (128 MiB at n = 2048).
# The loops without attention dropout take, per block, either rows of ONE (batch, head) slice — when a head
# has at least _BLOCK_SCORES scores — so that every product stays tall (at n = 2048 a block of 2**18 scores
# spread over 8 heads was 16 rows per product), or whole heads, as many as fit — so that short sequences
# do not pay a Python iteration per head (MiniLM: 384 heads of 16 × 16 scores); see _head_blocks. The
# dropout path (_forward_dropout) takes rows across every head (_row_blocks).
# The measurements behind 2**18: docs/bench_notes.md, "The engine's constants".
_BLOCK_SCORES = 1 << 18


def _block_layout(lead: tuple, n_q: int, n_k: int) -> tuple[int, int, int]:
    """(axis, count, rows) of the blocks of scores of an array with the leading axes ``lead``.

    A head (one index into ``lead``) of ≥ :data:`_BLOCK_SCORES` scores: blocks of ``rows`` query rows of
    one head (axis = len(lead), count = 1). Smaller heads: all their rows, and as many heads as fit —
    ``count`` consecutive entries of the leading axis ``axis`` with every axis after it whole (every
    head in one block: axis 0, count = lead[0])."""
    if not lead or n_q * n_k >= _BLOCK_SCORES:
        return len(lead), 1, max(1, min(n_q, _BLOCK_SCORES // max(1, n_k)))
    fit = max(1, _BLOCK_SCORES // max(1, n_q * n_k))         # heads per block
    axis, inner = len(lead), 1                               # axes axis… whole: inner heads
    while axis > 0 and inner * lead[axis - 1] <= fit:
        axis, inner = axis - 1, inner * lead[axis - 1]
    if axis == 0:
        return 0, max(1, lead[0]), max(n_q, 1)          # lead[0] = 0 (an empty batch): no block, not a 0 step
    return axis - 1, max(1, fit // inner), max(n_q, 1)


def _head_blocks(lead: tuple, n_q: int, n_k: int) -> list[tuple[tuple, slice]]:
    """(ix, rows) of every block (:func:`_block_layout`): ``X[ix][..., rows, :]`` is the block's part of
    an array with the leading axes ``lead``, a view — rows of one head, or consecutive whole heads."""
    axis, count, r = _block_layout(lead, n_q, n_k)
    row_slices = [slice(r0, min(r0 + r, n_q)) for r0 in range(0, n_q, r)]
    if axis == len(lead):
        return [(outer, rows) for outer in np.ndindex(*lead) for rows in row_slices]
    return [(outer + (slice(c0, min(c0 + count, lead[axis])),), rows)
            for outer in np.ndindex(*lead[:axis]) for c0 in range(0, lead[axis], count) for rows in row_slices]


def _row_blocks(lead: int, n_q: int, n_k: int) -> list[slice]:
    """Slices of the query rows such that one block of scores across every head, lead · rows · n_k
    entries, has about :data:`_BLOCK_SCORES` of them (at least one row per block): the dropout path's."""
    return _row_slices(n_q, lead * n_k, _BLOCK_SCORES) or [slice(0, 0)]   # n_q = 0: one empty block


# The blocks of heads go to get_batch_threads() threads (OpenBLAS at one thread in each: _threads._in_shards)
# when there are at least two heads' worth and the attention's products reach _SPLIT_MIN_FLOPS (a split costs
# ~0.1 ms). Training layers gain most: their projections and FFN keep OpenBLAS's threads, while the scores'
# products and passes, single-threaded between OpenBLAS calls otherwise, get both cores (the inference layer
# splits its whole batch instead, and its shards do not split again).
_SPLIT_MIN_FLOPS = 1 << 24


def _shard_blocks(lead: tuple, n_q: int, n_k: int, d: int) -> list[list]:
    """The blocks (:func:`_head_blocks`) in consecutive parts, one per thread; the blocks of one head stay
    together (the backward accumulates dK and dV over a head's row blocks, in order). One part: no split."""
    blocks = _head_blocks(lead, n_q, n_k)
    threads = get_batch_threads()
    if threads < 2 or len(blocks) < 2 or 4 * math.prod(lead) * n_q * n_k * d < _SPLIT_MIN_FLOPS:
        return [blocks]
    groups: list[list] = []
    for block in blocks:
        if groups and groups[-1][0][0] == block[0]:
            groups[-1].append(block)                         # another row block of the same head(s)
        else:
            groups.append([block])
    if len(groups) < 2:
        return [blocks]
    return [[b for g in groups[part] for b in g] for part in _chunks(len(groups), threads)]


def _block_buffer(lead: tuple, n_q: int, n_k: int, dtype) -> np.ndarray:
    """Scratch for one block's (…, r, n_k) scores, of the largest block's shape (cut with :func:`_fit`)."""
    axis, count, r = _block_layout(lead, n_q, n_k)
    heads = () if axis == len(lead) else (count,) + lead[axis + 1:]
    return np.empty(heads + (r, n_k), dtype=dtype)


def _fit(buf: np.ndarray, shape: tuple) -> np.ndarray:
    """The leading part of ``buf`` of the shape ``shape`` (a smaller block: fewer heads or rows)."""
    return buf[tuple(slice(0, k) for k in shape)]


def _per_head(a: np.ndarray | None, lead: tuple, core: int):
    """``a`` broadcast to ``lead`` + its last ``core`` axes (a view), so that ``a[ix]`` is a block's heads;
    a mask of fewer than two axes is used whole (None stays None)."""
    if a is None or a.ndim < core:
        return None if a is None else _Whole(a)
    return np.broadcast_to(a, lead + a.shape[a.ndim - core:])


class _Whole:
    """An array every block uses whole: ``_Whole(a)[ix]`` is ``a``."""

    def __init__(self, a):
        self.a = a

    def __getitem__(self, ix):
        return self.a


# Elements below which a block's elementwise pass runs inline rather than on the thread pool: handing rows to
# the pool and waiting costs about one float32 exp pass over 2**15 elements (docs/bench_notes.md, "_POOL_MIN").
_POOL_MIN = 1 << 15


def _block_pass(fn, block: np.ndarray) -> None:
    """fn(slice of rows) over a (…, r, n_k) block: on the thread pool (:func:`_rows_parallel`) when the
    block has ≥ :data:`_POOL_MIN` elements, else inline over all rows (the same operations per element)."""
    if block.size < _POOL_MIN:
        fn(slice(0, block.shape[-2]))
    else:
        _rows_parallel(fn, block.shape[-2])


def _with_column(X: np.ndarray, value) -> np.ndarray:
    """[X | c] along the last axis, (…, m, k + 1): c = ``value`` (a scalar or a (…, m, 1) array)."""
    out = np.empty(X.shape[:-1] + (X.shape[-1] + 1,), dtype=X.dtype)
    out[..., :-1] = X
    out[..., -1:] = value
    return out


def _block_rows(a, rows: slice):
    """The query rows ``rows`` of a block's (g, n, …) array (an array broadcast over the rows: whole)."""
    if a is None or a.ndim < 2 or a.shape[-2] == 1:
        return a
    return a[..., rows, :]
