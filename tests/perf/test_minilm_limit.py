"""The MiniLM encode limit runs the batch shapes encode really runs."""

from __future__ import annotations

import numpy as np

from transformer_np.perf import minilm_limit
from transformer_np.perf.minilm_limit import encode_batches


def test_encode_batches_sorts_within_chunks_and_pads_to_each_batch_longest():
    lengths = [3, 9, 4, 7, 7, 2, 5]
    # chunk of 2 batches of 2 = 4 sentences: [3, 9, 4, 7] -> 9 7 | 4 3; then [7, 2, 5] -> 7 5 | 2
    assert encode_batches(lengths, batch_size=2, chunk_batches=2) == [(2, 9), (2, 4), (2, 7), (1, 2)]
    assert encode_batches([], batch_size=4, chunk_batches=2) == []


def test_the_limit_call_covers_the_batches_and_layers_encode_runs(monkeypatch, minilm):
    from transformer_np.perf.bench import _sentences

    enc = minilm
    sentences = _sentences(70)
    from transformer_np.io import pretrained

    seen, threaded = [], []
    real_run = enc._run                                   # the stack on one checked (b, T) batch
    monkeypatch.setattr(enc, "_run", lambda ids, *a, **kw: threaded.append(ids.shape) or real_run(ids, *a, **kw))
    monkeypatch.setattr(pretrained, "get_batch_threads", lambda: 2)
    enc.encode(sentences, batch_size=16)                  # two threads take the batches in turn: any order
    monkeypatch.setattr(enc, "_run", lambda ids, *a, **kw: seen.append(ids.shape) or real_run(ids, *a, **kw))
    monkeypatch.setattr(pretrained, "get_batch_threads", lambda: 1)
    enc.encode(sentences, batch_size=16)                  # one thread: the batches in encode's order
    assert sorted(threaded) == sorted(seen)               # the same batches either way
    made, ran = [], []
    real_limit = minilm_limit.limit_call

    def recording_limit(dims, dtype, mode, threads=1, seed=0):
        made.append((dims, dtype, mode))
        inner = real_limit(dims, dtype, mode, threads, seed)
        return lambda: ran.append(dims[:2]) or inner()

    monkeypatch.setattr(minilm_limit, "limit_call", recording_limit)
    minilm_limit.minilm_limit_call(enc, sentences, batch_size=16)()
    cfg = enc.config
    assert ran == [tuple(s) for s in seen for _ in range(cfg.n_layers)]      # every batch, every layer, in order
    assert {m[0][2:] for m in made} == {(cfg.d_model, cfg.n_heads, cfg.d_ff)}
    assert {m[1:] for m in made} == {("float32", "fwd")}
    assert len(made) == len(set(seen))                                        # one operand set per distinct shape
    assert np.all(np.diff([s[1] for s in seen[:4]]) <= 0)                     # longest first within the chunk
