"""PretrainedEncoder.encode on ``get_batch_threads()`` threads (whole batches, taken in turn): the same
embeddings, in the input order, as on one thread; a failing batch stops the others, its exception reaches
the caller and OpenBLAS's thread count is restored.

One thread and two differ by round-off only (OpenBLAS at one thread in each batch instead of two for the
whole): assert_paths_close with k = d_ff, the longest reduction of the stack.
"""

import os
import threading

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"

from helpers import assert_paths_close, spy_split_counts
from transformer_np import fast
from transformer_np.fast import threads as _threads
from transformer_np.io import pretrained as P

SENTENCES = ["a", "The quick brown fox jumps over the lazy dog near the river bank today.",
             "short one", "Attention is all you need, said the paper.", "x y z",
             "Mean pooling averages the token vectors of real tokens only, not the padding.",
             "ok", "Sentence embeddings compare meaning with a cosine.", "one more, of middling length"]


@pytest.fixture(scope="module")
def model(minilm):
    return minilm


@pytest.fixture
def thread_calls(monkeypatch):
    """The thread counts encode ran its batches on (a spy on pretrained._in_shards)."""
    return spy_split_counts(monkeypatch, P)


@pytest.mark.parametrize("count,batch_size,n,threads", [(3, 8, 2, []), (6, 3, 2, [2]), (9, 2, 2, [2]),
                                                         (7, 3, 2, [2]), (6, 3, 3, [2])],
                         ids=["1 batch", "2 batches", "5 batches", "7 sentences in 3s", "3 threads, 2 batches"])
def test_encode_on_threads_matches_one_thread_in_input_order(model, tpc, thread_calls, count, batch_size, n,
                                                             threads):
    sentences = SENTENCES[:count]
    fast.set_batch_threads(1)
    one = model.encode(sentences, batch_size=batch_size)
    assert thread_calls == []
    fast.set_batch_threads(n)
    two = model.encode(sentences, batch_size=batch_size)
    assert thread_calls == threads                            # threads only with several batches, at most one each
    assert two.shape == one.shape == (count, model.embedding_dim) and two.dtype == np.float32
    assert_paths_close(two, one, paths=(f"{n} threads", "1 thread"), k=model.config.d_ff)
    alone = np.stack([model.encode([s], batch_size=1)[0] for s in sentences])
    assert_paths_close(two, alone, paths=(f"{n} threads", "each sentence alone"), k=model.config.d_ff)
    # exact: integer indices of the nearest rows (the margin is large): each row is its own sentence's
    assert np.array_equal(np.argmax(two @ alone.T, axis=1), np.arange(count))


class BatchFailed(Exception):
    pass


def test_a_failing_batch_stops_the_others_and_reaches_the_caller(model, tpc, thread_calls, monkeypatch):
    run, calls, lock = model._run, [], threading.Lock()
    batches = 7                                               # 14 sentences in batches of 2

    def second_call_fails(*args, **kwargs):
        with lock:
            calls.append(threading.get_ident())
            nth = len(calls)
        if nth == 2:
            raise BatchFailed("batch 2")
        return run(*args, **kwargs)

    monkeypatch.setattr(model, "_run", second_call_fails)
    fast.set_batch_threads(2)
    with tpc.threadpool_limits(3, user_api="blas"):           # a count a missing restore could not leave by chance
        before = {i["filepath"]: i["num_threads"] for i in tpc.threadpool_info() if i["user_api"] == "blas"}
        with pytest.raises(BatchFailed, match="batch 2"):
            model.encode(SENTENCES[:7] * 2, batch_size=2)
        after = {i["filepath"]: i["num_threads"] for i in tpc.threadpool_info() if i["user_api"] == "blas"}
    assert thread_calls == [2]
    assert after == before
    assert _threads._BLAS_DEPTH == 0
    # once a batch has failed no thread takes a new one: the failure is immediate, the other thread
    # finishes at most the batch it was running (without the stop, all 7 batches would run)
    assert 2 <= len(calls) < batches
    monkeypatch.undo()
    again = model.encode(SENTENCES[:4], batch_size=2)         # the model still works on threads afterwards
    fast.set_batch_threads(1)
    assert_paths_close(again, model.encode(SENTENCES[:4], batch_size=2), paths=("2 threads", "1 thread"),
                       k=model.config.d_ff)
