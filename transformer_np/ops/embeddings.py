r"""Embeddings: from token ids to H^(0).

    H^(0)_i = LN( E_tok[x_i] + E_pos[i] + E_type[t_i] )      (BERT)

* token embedding E_tok (vocab_size, d): a table lookup. Its backward is a scatter-add:
  row v of dE_tok is the sum of dH over every position holding token v (a token that
  occurs twice receives both gradients — hence ``np.add.at``, not fancy assignment,
  which would keep only the last write).
* learned positional embedding E_pos (max_len, d): the same lookup with ids 0 … n−1.
* sinusoidal positional encoding (Vaswani et al. 2017), no parameters:
      PE[i, 2k] = sin(i / 10000^{2k/d}),  PE[i, 2k+1] = cos(i / 10000^{2k/d})
* segment / token-type embedding E_type (type_vocab_size, d), as in BERT.
* embedding LayerNorm (BERT normalises the sum before the stack), then dropout.

Positional information enters here, once: the layers above are permutation-equivariant.
"""

from __future__ import annotations

import numpy as np

from .._memory import MemoryEstimate, check_memory
from .._validate import (
    all_finite,
    as_float_array,
    as_int_array,
    check_bool,
    check_cache,
    check_choice,
    check_dout,
    check_float_dtype,
    check_int,
    describe,
)
from ..errors import InputTypeError, InputValueError, NonFiniteError
from .layernorm import _layernorm_backward, _layernorm_forward, check_layernorm_args

__all__ = ["embedding_forward", "embedding_backward", "sinusoidal_positional_encoding",
           "embeddings_forward", "embeddings_backward"]


# ----------------------------------------------------------------------------- the computation
def _embedding_forward(ids: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, dict]:
    return table[ids], {"kind": "embedding", "ids": ids, "table_shape": table.shape, "dtype": table.dtype}


def _embedding_backward(dout: np.ndarray, cache: dict) -> np.ndarray:
    ids, (V, d) = cache["ids"], cache["table_shape"]
    dtable = np.zeros((V, d), dtype=cache["dtype"])          # (V, d)
    np.add.at(dtable, ids.reshape(-1), dout.reshape(-1, d))  # repeated ids accumulate
    return dtable


def _embeddings_forward(p: dict, input_ids: np.ndarray, token_type_ids: np.ndarray | None,
                        positional: str, eps: float, use_layer_norm: bool) -> tuple[np.ndarray, dict]:
    B, n = input_ids.shape
    x, c_word = _embedding_forward(input_ids, p["word"])                        # (B, n, d)
    caches = {"kind": "embeddings", "word": c_word, "positional": positional}
    if positional == "learned":
        pos_ids = np.broadcast_to(np.arange(n), (B, n))                          # (B, n)
        e, caches["position"] = _embedding_forward(pos_ids, p["position"])
        x = x + e
    elif positional == "sinusoidal":
        x = x + sinusoidal_positional_encoding(n, x.shape[-1], x.dtype)         # broadcasts over B
    if "token_type" in p:
        tt = np.zeros((B, n), dtype=np.int64) if token_type_ids is None else token_type_ids
        e, caches["token_type"] = _embedding_forward(tt, p["token_type"])
        x = x + e
    if use_layer_norm:
        x, caches["ln"] = _layernorm_forward(x, p["ln.gamma"], p["ln.beta"], eps)
    return x, caches


def _embeddings_backward(dx: np.ndarray, cache: dict) -> dict:
    grads = {}
    if "ln" in cache:
        dx, grads["ln.gamma"], grads["ln.beta"] = _layernorm_backward(dx, cache["ln"])
    grads["word"] = _embedding_backward(dx, cache["word"])
    if "position" in cache:
        grads["position"] = _embedding_backward(dx, cache["position"])
    if "token_type" in cache:
        grads["token_type"] = _embedding_backward(dx, cache["token_type"])
    return grads


# ----------------------------------------------------------------------------- the public API
def _check_ids(ids, table: np.ndarray, name: str) -> np.ndarray:
    ids = as_int_array(ids, name)
    V = table.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= V):
        bad = ids[(ids < 0) | (ids >= V)]
        raise InputValueError(f"{name} must lie in [0, {V - 1}] (the table has {V} rows), got {int(bad.flat[0])}")
    return ids


def nonfinite_row(table: np.ndarray, ids: np.ndarray) -> int | None:
    """The first row of ``table`` that ``ids`` looks up and that holds NaN/inf, or None."""
    used = np.unique(ids)
    bad = ~np.isfinite(table[used]).all(axis=-1)
    return int(used[np.argmax(bad)]) if bad.any() else None


def _refuse_row(table_name: str, row: int, ids_name: str) -> NonFiniteError:
    return NonFiniteError(f"{table_name} must contain only finite values in the rows {ids_name} looks up, got NaN/inf "
                          f"in row {row}")


def embedding_forward(ids: np.ndarray, table: np.ndarray, name: str = "ids") -> tuple[np.ndarray, dict]:
    """Lookup ``table[ids]``: ids (...) integer, table (V, d) → (..., d).

    A lookup table is checked on the rows it reads (the output), not in full: a NaN row that ``ids`` looks up is
    a NonFiniteError naming the table and the row."""
    as_float_array(table, "table", ndim=2, finite=False)
    ids = _check_ids(ids, table, name)
    out, cache = _embedding_forward(ids, table)
    if not all_finite(out):
        raise _refuse_row("table", nonfinite_row(table, ids), name)
    return out, cache


def embedding_backward(dout: np.ndarray, cache: dict) -> np.ndarray:
    """dTable: scatter-add of dout into the rows that were looked up."""
    check_cache(cache, "cache", "embedding")
    check_dout(dout, "dout", cache["ids"].shape + (cache["table_shape"][1],))
    return _embedding_backward(dout, cache)


def sinusoidal_positional_encoding(n: int, d_model: int, dtype=np.float64) -> np.ndarray:
    """The fixed (n, d_model) encoding of "Attention Is All You Need" (works for odd d_model).

    The memory it needs (the float64 table, the angles and the result in ``dtype``) is checked before anything
    is allocated: a size beyond the limit of :mod:`transformer_np.model.budget` is a ResourceLimitError."""
    check_int(n, "n", minimum=0)
    check_int(d_model, "d_model", minimum=1)
    dt = check_float_dtype(dtype)
    check_memory(MemoryEstimate({"positional encoding": n * d_model * (8 + 8 + dt.itemsize) + n * 8}),
                 f"sinusoidal_positional_encoding({n}, {d_model})")
    pos = np.arange(n, dtype=np.float64)[:, None]                    # (n, 1)
    k2 = np.arange(0, d_model, 2, dtype=np.float64)[None, :]         # (1, ceil(d/2))
    angle = pos / np.power(10000.0, k2 / d_model)                    # (n, ceil(d/2))
    pe = np.zeros((n, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return pe.astype(dt)


def embeddings_forward(p: dict, input_ids: np.ndarray, token_type_ids: np.ndarray | None,
                       positional: str, eps: float, use_layer_norm: bool = True) -> tuple[np.ndarray, dict]:
    """The BERT embedding block. ``p`` holds "word", optionally "position" and
    "token_type", and "ln.gamma"/"ln.beta" when ``use_layer_norm``. Returns (E, cache),
    E of shape (B, n, d) before dropout (dropout is applied by the encoder)."""
    if not isinstance(p, dict) or "word" not in p:
        raise InputTypeError(f"p must be a dict holding at least the token table 'word', got {describe(p)}")
    check_choice(positional, "positional", ("learned", "sinusoidal", "none"))
    check_bool(use_layer_norm, "use_layer_norm")
    word = as_float_array(p["word"], "p['word']", ndim=2, finite=False)
    ids = _check_ids(input_ids, word, "input_ids")
    if ids.ndim != 2:
        raise InputValueError(f"input_ids must have 2 dimensions (B, n), got shape {ids.shape}")
    tables = [("position", positional == "learned"), ("token_type", "token_type" in p)]
    for key, used in tables:
        if used:
            as_float_array(p.get(key), f"p[{key!r}]", ndim=2, dtype=word.dtype, finite=False)
            if p[key].shape[1] != word.shape[1]:
                raise InputValueError(f"p[{key!r}] must have width {word.shape[1]} like p['word'], "
                                      f"got shape {p[key].shape}")
    if positional == "learned" and ids.shape[1] > p["position"].shape[0]:
        raise InputValueError(f"input_ids has {ids.shape[1]} positions but p['position'] only "
                              f"{p['position'].shape[0]} rows")
    if token_type_ids is not None:
        if "token_type" not in p:
            raise InputValueError("token_type_ids given, but p has no 'token_type' table")
        token_type_ids = _check_ids(token_type_ids, p["token_type"], "token_type_ids")
        if token_type_ids.shape != ids.shape:
            raise InputValueError(f"token_type_ids must have input_ids' shape {ids.shape}, "
                                  f"got shape {token_type_ids.shape}")
    if use_layer_norm:
        check_layernorm_args(np.empty((0, word.shape[1]), word.dtype), p.get("ln.gamma"), p.get("ln.beta"), eps,
                             ("the embeddings", "p['ln.gamma']", "p['ln.beta']", "eps"))
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            out = _embeddings_forward(p, ids, token_type_ids, positional, float(eps), use_layer_norm)
        if all_finite(out[0]):
            return out
    except NonFiniteError:
        pass
    _raise_table_row(p, ids, token_type_ids, positional)
    raise NonFiniteError(f"the embedding block overflowed {word.dtype}: its output is not finite although every "
                         f"row it read was; rescale the tables or use float64")


def _raise_table_row(p: dict, ids: np.ndarray, token_type_ids, positional: str, label: str = "p[{key!r}]") -> None:
    """Raise NonFiniteError naming the first lookup table with a NaN/inf row among those the input reads
    (``label`` formats the table's name from ``key``)."""
    B, n = ids.shape
    reads = [("word", ids, "input_ids")]
    if positional == "learned":
        reads.append(("position", np.arange(n), "the positions"))
    if "token_type" in p:
        reads.append(("token_type", np.zeros(1, np.int64) if token_type_ids is None else token_type_ids,
                      "token_type_ids"))
    for key, used, what in reads:
        row = nonfinite_row(p[key], used)
        if row is not None:
            raise _refuse_row(label.format(key=key), row, what)


def embeddings_backward(dx: np.ndarray, cache: dict) -> dict:
    """Gradients of the embedding block, keyed like its params."""
    check_cache(cache, "cache", "embeddings")
    ids, d = cache["word"]["ids"], cache["word"]["table_shape"][1]
    check_dout(dx, "dx", ids.shape + (d,))
    return _embeddings_backward(dx, cache)
