"""The fast path's thread pool for elementwise passes (see :mod:`transformer_np.ops.fast`).

NumPy releases the GIL inside a ufunc's inner loop, so the elementwise passes of disjoint parts of an
array (GELU blocks, rows of a softmax block) run in parallel on Python threads, as the BLAS calls run
on OpenBLAS's. Every element is computed by the same operations whichever thread runs it.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import InputTypeError, InputValueError

__all__ = ["get_num_threads", "set_num_threads"]


# ----------------------------------------------------------------------------- threads
# NumPy releases the GIL inside a ufunc's inner loop, so the elementwise passes of disjoint parts of an
# array (GELU blocks, rows of a softmax block) can run in parallel on Python threads, as the BLAS calls run
# on OpenBLAS's. By default they do not: one thread. Measured on the 2-core VM (quiet, 2026-12-02 03:20 UTC,
# OpenBLAS 0.3.31 SkylakeX with 2 threads, settled calls, median of 7): a second Python thread for the
# elementwise passes made every benchmark layer slower — attn-512 fwd 9.1 -> 11.5 ms, long fwd 134 -> 222,
# minilm fwd 16.5 -> 20.0, bert-base fwd+bwd 309 -> 330 — because OpenBLAS's idle worker keeps spinning on
# the other core for ~0.1 s after each product, and the two threads then share one core with it.
# set_num_threads(n) opts in (results are the same whatever the count).
_THREADS: int | None = None
_POOL: tuple[int, ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()
_DEFAULT_THREADS = 1


def _default_threads() -> int:
    return _DEFAULT_THREADS


def get_num_threads() -> int:
    """Threads the fast path uses for its elementwise passes (see :func:`set_num_threads`)."""
    return _default_threads() if _THREADS is None else _THREADS


def set_num_threads(n: int | None) -> None:
    """Use ``n`` threads for the fast path's elementwise passes (None: the default, 1 — with OpenBLAS's
    workers spinning between products, a second elementwise thread was measured slower on every
    benchmark layer; see the module's comment). The results do not depend on it: every element is
    computed by the same operations whichever thread runs it. The matrix products use OpenBLAS's own
    threads either way (``OPENBLAS_NUM_THREADS``, or threadpoolctl)."""
    global _THREADS
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
        raise InputTypeError(f"n must be a positive int or None, got {type(n).__name__} {n!r}")
    if n is not None and n < 1:
        raise InputValueError(f"n must be a positive int or None, got {n}")
    _THREADS = n


def _parallel(fn, count: int) -> None:
    """fn(0), …, fn(count − 1), spread over :func:`get_num_threads` threads (inline when 1)."""
    global _POOL
    workers = min(get_num_threads(), count)
    if workers <= 1:
        for i in range(count):
            fn(i)
        return
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] < workers:
            _POOL = (workers, ThreadPoolExecutor(workers, thread_name_prefix="transformer_np"))
        pool = _POOL[1]
    err = np.geterr()                                        # np.errstate is per thread: carry the caller's

    def run(i: int) -> None:
        with np.errstate(**err):
            fn(i)

    for f in [pool.submit(run, i) for i in range(count)]:
        f.result()                                           # re-raises a worker's exception here


def _chunks(n: int, parts: int) -> list[slice]:
    """``parts`` (at most n) nearly equal consecutive slices of range(n)."""
    parts = max(1, min(parts, n))
    bounds = [n * i // parts for i in range(parts + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(parts)]


def _rows_parallel(fn, rows: int) -> None:
    """fn(chunk) over consecutive row chunks, one per thread."""
    chunks = _chunks(rows, get_num_threads())
    _parallel(lambda i: fn(chunks[i]), len(chunks))
