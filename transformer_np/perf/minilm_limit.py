r"""The NumPy limit of MiniLM's ``encode``: the work NumPy cannot avoid for those sentences.

:meth:`PretrainedEncoder.encode` sorts the sentences by token count, cuts them into batches and pads
each batch to its own longest sentence, then runs the N encoder layers on each (b, T) batch. The
limit of one encode is, for every batch and every layer, the limit of one encoder layer of that
shape (:func:`transformer_np.perf.limit.limit_call` in ``"fwd"`` mode: the layer's matrix products,
one ``np.matmul`` call each, plus one ``np.exp`` pass over its b·h·T² scores), run back to back.
Tokenisation, the embedding lookup, LayerNorm, GELU, pooling and Python between calls are left
out, so it is a lower bound on NumPy's encode time: when it is slower than sentence-transformers'
whole encode, no rearrangement of NumPy calls reaches sentence-transformers' throughput on this
machine (``limit_fraction`` = limit / NumPy time, ``limit_torch_ratio`` = limit / their time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .limit import limit_call

__all__ = ["encode_batches", "minilm_limit_call"]


def encode_batches(lengths: Sequence[int], batch_size: int, chunk_batches: int) -> list[tuple[int, int]]:
    """The (b, T) shapes of the batches ``encode`` runs for sentences of ``lengths`` tokens: sorted
    longest first within chunks of ``chunk_batches`` batches, each batch padded to its longest."""
    lengths = np.asarray(lengths, dtype=np.int64)                      # (S,)
    shapes = []
    chunk = chunk_batches * batch_size
    for c0 in range(0, len(lengths), chunk):
        part = np.sort(lengths[c0:c0 + chunk])[::-1]                  # longest first
        for start in range(0, len(part), batch_size):
            batch = part[start:start + batch_size]
            shapes.append((len(batch), int(batch[0])))
    return shapes


def minilm_limit_call(encoder, sentences: Sequence[str], batch_size: int = 32,
                      threads: int = 1) -> Callable[[], None]:
    """One call that runs the limit of ``encoder.encode(sentences, batch_size=batch_size)`` in float32.

    ``encoder`` is a :class:`~transformer_np.io.pretrained.PretrainedEncoder`; the batch shapes come
    from its own tokeniser (:func:`encode_batches`). Operands are allocated here, once per distinct
    batch shape."""
    from ..io.pretrained import sort_chunk_batches

    lengths = encoder.tokenize(list(sentences))["attention_mask"].sum(axis=1)   # (S,) tokens per sentence
    cfg = encoder.config
    calls: dict[tuple[int, int], Callable[[], None]] = {}
    order = []
    for b, T in encode_batches(lengths, batch_size, sort_chunk_batches()):
        if (b, T) not in calls:
            calls[(b, T)] = limit_call((b, T, cfg.d_model, cfg.n_heads, cfg.d_ff), "float32", "fwd", threads)
        order.append(calls[(b, T)])
    layers = cfg.n_layers

    def call() -> None:
        for layer_limit in order:
            for _ in range(layers):
                layer_limit()

    return call
