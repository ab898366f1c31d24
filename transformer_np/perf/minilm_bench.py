"""The MiniLM throughput of the bench: sentences/s of our ``encode`` against sentence-transformers'.

:func:`minilm_throughput` (the ``"minilm"`` block of ``bench --json``) times both encodes of the same
generated sentences (:func:`_sentences`) in settled, interleaved rounds (:func:`_minilm_rounds`, by
:func:`transformer_np.perf.timing.interleaved`), with the NumPy limit of the encode
(:mod:`transformer_np.perf.minilm_limit`) as a third side."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable

import numpy as np

from .._optional import require
from .machine import _blas_threads, _import_torch, _limit_blas_threads, library_thread_defaults
from .timing import SETTLE_S, _check_settle, interleaved

__all__ = ["minilm_throughput"]


def minilm_throughput(n_sentences: int = 1000, rounds: int = 3, threads: int | None = None,
                      clock: str = "wall", settle: float = SETTLE_S) -> dict:
    """Sentences/s of :meth:`PretrainedEncoder.encode` (float32) vs sentence-transformers on the
    same ``n_sentences`` generated sentences, in alternating settled blocks (:func:`interleaved`; a
    block's untimed calls encode the first 64 sentences), median of per-round ratios."""
    _check_settle(settle)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = _import_torch()
    SentenceTransformer = require("sentence_transformers", "the MiniLM throughput needs sentence-transformers: "
                                  "pip install sentence-transformers").SentenceTransformer
    from ..io.pretrained import MODEL_NAME, load_pretrained, model_folder

    ours = load_pretrained(MODEL_NAME)
    st = SentenceTransformer(str(model_folder(MODEL_NAME)), device="cpu")
    limiter = None
    if threads is not None:
        torch.set_num_threads(threads)
        if threads != _blas_threads()[0]:
            limiter = _limit_blas_threads(threads)
    try:
        from .minilm_limit import minilm_limit_call

        limit_threads = _blas_threads()[0]           # the limit's exp pass is spread over the run's threads
        with library_thread_defaults() as counts:    # the library's defaults, as encode runs for a user
            doc = _minilm_rounds(ours, st, n_sentences, rounds, clock, settle,
                                 limit=lambda s: minilm_limit_call(ours, s, 32, limit_threads))
        return {**doc, **counts}
    finally:
        if limiter is not None:
            limiter.restore_original_limits()


def _minilm_rounds(ours, st, n_sentences: int, rounds: int, clock: str = "wall", settle: float = SETTLE_S,
                  limit: Callable[[list[str]], Callable[[], None]] | None = None) -> dict:
    """Interleaved, settled rounds of ``ours.encode`` and ``st.encode`` (and of ``limit(sentences)()``, the
    NumPy limit of that encode, when ``limit`` is given: keys ``limit_s``, ``limit_fraction`` and
    ``limit_torch_ratio``, the limit over sentence-transformers' time)."""
    sentences = _sentences(n_sentences)
    short = sentences[:64]
    t = interleaved(lambda: ours.encode(sentences, batch_size=32),
                    lambda: st.encode(sentences, batch_size=32, normalize_embeddings=True), rounds, clock=clock,
                    c=None if limit is None else limit(sentences), settle=settle,
                    warm=(lambda: ours.encode(short, batch_size=32),
                          lambda: st.encode(short, batch_size=32, normalize_embeddings=True))
                    + (() if limit is None else (limit(short),)))
    agree = float(np.abs(ours.encode(sentences[:64]) - st.encode(sentences[:64], normalize_embeddings=True)).max())
    doc = {"sentences": n_sentences, "numpy_per_s": round(n_sentences / (t["a_ms"] / 1e3), 1),
           "sentence_transformers_per_s": round(n_sentences / (t["b_ms"] / 1e3), 1),
           "throughput_ratio": round(1.0 / t["ratio"], 3), "rounds": rounds, "clock": clock, "settle_s": settle,
           "max_abs_diff_embeddings": agree}
    if limit is not None:
        doc.update(limit_s=round(t["c_ms"] / 1e3, 4), limit_fraction=round(statistics.median(t["c_over_a"]), 3),
                   limit_torch_ratio=round(t["c_ms"] / t["b_ms"], 3))
    return doc


def _sentences(count: int, seed: int = 0) -> list[str]:
    """Deterministic English-like sentences of 4–30 words (lengths vary, as real text does)."""
    words = ("the a river bank money boat reached paid cat sat on mat model attention layer token "
             "sentence encoder students read quickly slowly under over every small large green old new "
             "network learns weights from data and then predicts next word in context").split()
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=int(rng.integers(4, 31)))).capitalize() + "."
            for _ in range(count)]
