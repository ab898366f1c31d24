"""The fast path's thread pool for elementwise passes (see :mod:`transformer_np.ops.fast`).

NumPy releases the GIL inside a ufunc's inner loop, so the elementwise passes of disjoint parts of an
array (GELU blocks, rows of a softmax block) run in parallel on Python threads, as the BLAS calls run
on OpenBLAS's. Every element is computed by the same operations whichever thread runs it.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import InputTypeError, InputValueError

__all__ = ["get_num_threads", "set_num_threads"]


# ----------------------------------------------------------------------------- threads
# NumPy releases the GIL inside a ufunc's inner loop, so the elementwise passes of disjoint parts of an
# array (GELU blocks, rows of a softmax block) run in parallel on Python threads, as the BLAS calls run
# on OpenBLAS's. The count follows OpenBLAS's own default (OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS,
# else the CPUs this process may run on), so `OPENBLAS_NUM_THREADS=1` makes the whole layer serial;
# set_num_threads() overrides it (the bench sets both to its --threads).
_THREADS: int | None = None
_POOL: tuple[int, ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()


def _default_threads() -> int:
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        try:
            n = int(os.environ.get(var, "").split(",")[0])
        except ValueError:
            continue
        if n >= 1:
            return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                                   # not Linux
        return max(1, os.cpu_count() or 1)


def get_num_threads() -> int:
    """Threads the fast path uses for its elementwise passes (see :func:`set_num_threads`)."""
    return _default_threads() if _THREADS is None else _THREADS


def set_num_threads(n: int | None) -> None:
    """Use ``n`` threads for the fast path's elementwise passes (None: OpenBLAS's default rule,
    OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / the usable CPUs). The results do not depend on it:
    every element is computed by the same operations whichever thread runs it."""
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
