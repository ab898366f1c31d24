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

from .._validate import as_float_array, as_int_array, check_cache, check_dout, check_int
from .layernorm import layernorm_backward, layernorm_forward

__all__ = ["embedding_forward", "embedding_backward", "sinusoidal_positional_encoding",
           "embeddings_forward", "embeddings_backward"]


def embedding_forward(ids: np.ndarray, table: np.ndarray, name: str = "ids") -> tuple[np.ndarray, dict]:
    """Lookup ``table[ids]``: ids (...) integer, table (V, d) → (..., d)."""
    as_float_array(table, "table", ndim=2, finite=False)
    ids = as_int_array(ids, name)
    V = table.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= V):
        bad = ids[(ids < 0) | (ids >= V)]
        raise ValueError(f"{name} must lie in [0, {V - 1}] (the table has {V} rows), got {int(bad.flat[0])}")
    return table[ids], {"kind": "embedding", "ids": ids, "table_shape": table.shape, "dtype": table.dtype}


def embedding_backward(dout: np.ndarray, cache: dict) -> np.ndarray:
    """dTable: scatter-add of dout into the rows that were looked up."""
    check_cache(cache, "cache", "embedding")
    ids, (V, d) = cache["ids"], cache["table_shape"]
    check_dout(dout, "dout", ids.shape + (d,))
    dtable = np.zeros((V, d), dtype=cache["dtype"])
    np.add.at(dtable, ids.reshape(-1), dout.reshape(-1, d))  # repeated ids accumulate
    return dtable


def sinusoidal_positional_encoding(n: int, d_model: int, dtype=np.float64) -> np.ndarray:
    """The fixed (n, d_model) encoding of "Attention Is All You Need" (works for odd d_model)."""
    check_int(n, "n", minimum=0)
    check_int(d_model, "d_model", minimum=1)
    pos = np.arange(n, dtype=np.float64)[:, None]                    # (n, 1)
    k2 = np.arange(0, d_model, 2, dtype=np.float64)[None, :]         # (1, ceil(d/2))
    angle = pos / np.power(10000.0, k2 / d_model)                    # (n, ceil(d/2))
    pe = np.zeros((n, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return pe.astype(dtype)


def embeddings_forward(p: dict, input_ids: np.ndarray, token_type_ids: np.ndarray | None,
                       positional: str, eps: float, use_layer_norm: bool = True) -> tuple[np.ndarray, dict]:
    """The BERT embedding block. ``p`` holds "word", optionally "position" and
    "token_type", and "ln.gamma"/"ln.beta" when ``use_layer_norm``. Returns (E, cache),
    E of shape (B, n, d) before dropout (dropout is applied by the encoder)."""
    B, n = input_ids.shape
    x, c_word = embedding_forward(input_ids, p["word"], "input_ids")          # (B, n, d)
    caches = {"kind": "embeddings", "word": c_word, "positional": positional}
    if positional == "learned":
        pos_ids = np.broadcast_to(np.arange(n), (B, n))
        e, caches["position"] = embedding_forward(pos_ids, p["position"], "position ids")
        x = x + e
    elif positional == "sinusoidal":
        x = x + sinusoidal_positional_encoding(n, x.shape[-1], x.dtype)        # broadcasts over B
    if "token_type" in p:
        tt = np.zeros((B, n), dtype=np.int64) if token_type_ids is None else token_type_ids
        e, caches["token_type"] = embedding_forward(tt, p["token_type"], "token_type_ids")
        x = x + e
    if use_layer_norm:
        x, caches["ln"] = layernorm_forward(x, p["ln.gamma"], p["ln.beta"], eps)
    return x, caches


def embeddings_backward(dx: np.ndarray, cache: dict) -> dict:
    """Gradients of the embedding block, keyed like its params."""
    check_cache(cache, "cache", "embeddings")
    grads = {}
    if "ln" in cache:
        dx, grads["ln.gamma"], grads["ln.beta"] = layernorm_backward(dx, cache["ln"])
    grads["word"] = embedding_backward(dx, cache["word"])
    if "position" in cache:
        grads["position"] = embedding_backward(dx, cache["position"])
    if "token_type" in cache:
        grads["token_type"] = embedding_backward(dx, cache["token_type"])
    return grads
