"""PretrainedEncoder.encode's batching (sorted by token count, each batch padded to its own
longest sentence, input order restored): every sentence gets the embedding it gets alone."""

import itertools
import os

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"

from transformer_np.io import pretrained as P

SENTENCES = ["a", "The quick brown fox jumps over the lazy dog near the river bank today.",
             "short one", "Attention is all you need, said the paper.", "x y z",
             "Mean pooling averages the token vectors of real tokens only, not the padding.",
             "ok", "Sentence embeddings compare meaning with a cosine."]


@pytest.fixture(scope="module")
def model(minilm):
    return minilm


@pytest.mark.parametrize("batch_size,sort_chunk", [(3, 64), (2, 1), (8, 64)])
def test_encode_matches_one_sentence_at_a_time(model, monkeypatch, batch_size, sort_chunk):
    monkeypatch.setattr(P, "_SORT_CHUNK", sort_chunk)          # (2, 1): four chunks of two sentences
    alone = np.stack([model.encode([s], batch_size=1)[0] for s in SENTENCES])
    chunks = []                                                # the sentences of each tokenised chunk
    tokenize = P.PretrainedEncoder.tokenize
    monkeypatch.setattr(P.PretrainedEncoder, "tokenize",
                        lambda self, s, *a, **kw: chunks.append(len(s)) or tokenize(self, s, *a, **kw))
    together = model.encode(SENTENCES, batch_size=batch_size)
    step = sort_chunk * batch_size                             # the patched _SORT_CHUNK took effect
    assert chunks == [min(step, len(SENTENCES) - c0) for c0 in range(0, len(SENTENCES), step)]
    assert together.shape == alone.shape and together.dtype == np.float32
    np.testing.assert_allclose(together, alone, atol=2e-6, rtol=0)
    # and the rows are in the input order: each is closest to its own sentence's embedding
    # exact: integer indices of the nearest rows (the margin is large)
    assert np.array_equal(np.argmax(together @ alone.T, axis=1), np.arange(len(SENTENCES)))


@pytest.mark.parametrize("threads", [1, 2])
def test_batches_are_padded_to_their_own_longest_sentence(model, monkeypatch, threads):
    monkeypatch.setattr(P, "get_batch_threads", lambda: threads)          # 2: batches run on two threads
    widths = []
    run = P.PretrainedEncoder._run                     # the stack on one checked batch, for inference

    def spy(self, ids, mask, tt, dt, store_attention):
        assert store_attention is False                # encode keeps no attention matrix
        widths.append((ids.shape[1], int(mask.sum(axis=1).max()), int(mask.sum(axis=1).min())))
        return run(self, ids, mask, tt, dt, store_attention)

    monkeypatch.setattr(P.PretrainedEncoder, "_run", spy)
    model.encode(SENTENCES, batch_size=3)
    assert len(widths) == 3                                             # 8 sentences in batches of 3
    assert all(T == longest for T, longest, _ in widths)               # no column of pure padding
    if threads == 1:                                                    # one thread runs them in turn
        assert [w[1] for w in widths] == sorted((w[1] for w in widths), reverse=True)   # longest first
    # sorted across batches, whichever thread ran which: each batch's shortest sentence is at least as
    # long as the next batch's longest
    by_length = sorted(widths, key=lambda w: -w[1])
    assert all(a[2] >= b[1] for a, b in itertools.pairwise(by_length))
