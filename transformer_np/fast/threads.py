"""The fast path's thread pool for elementwise passes (see :mod:`transformer_np.fast`).

NumPy releases the GIL inside a ufunc's inner loop, so the elementwise passes of disjoint parts of an
array (GELU blocks, rows of a softmax block) run in parallel on Python threads, as the BLAS calls run
on OpenBLAS's. Every element is computed by the same operations whichever thread runs it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from .._optional import require
from ..errors import InputTypeError, InputValueError

__all__ = ["get_num_threads", "set_num_threads", "get_batch_threads", "set_batch_threads", "limit_blas_threads",
           "one_blas_thread", "library_thread_defaults"]


# ----------------------------------------------------------------------------- threads
# NumPy releases the GIL inside a ufunc's inner loop, so the elementwise passes of disjoint parts of an
# array (GELU blocks, rows of a softmax block) can run in parallel on Python threads, as the BLAS calls run
# on OpenBLAS's. By default they do not: one thread (a second one was measured slower on every benchmark
# layer: docs/bench_notes.md, "The engine's constants").
# set_num_threads(n) opts in (results are the same whatever the count).
_THREADS: int | None = None
_POOL: tuple[int, ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()
_DEFAULT_THREADS = 1


def _default_threads() -> int:
    return _DEFAULT_THREADS


def get_num_threads() -> int:
    """Threads the fast path uses for its elementwise passes (see :func:`set_num_threads`); 1 inside a
    shard of a batch (:func:`set_batch_threads`), whose thread already has a core of its own."""
    if getattr(_LOCAL, "in_shard", False):
        return 1
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


def _row_slices(rows: int, row_len: int, block: int) -> list[slice]:
    """Consecutive slices of range(rows), each about ``block`` elements of rows of ``row_len`` (at least one
    row a slice): the blocks of rows a row-wise temporary is made in, so that it stays in cache."""
    step = max(1, block // max(1, row_len))
    return [slice(r, min(r + step, rows)) for r in range(0, rows, step)]


def _rows_parallel(fn, rows: int) -> None:
    """fn(chunk) over consecutive row chunks, one per thread."""
    chunks = _chunks(rows, get_num_threads())
    _parallel(lambda i: fn(chunks[i]), len(chunks))


# ----------------------------------------------------------------------------- shards of a batch
# At two threads, the fast inference layer is faster run as two halves of the batch, each on its own thread
# with OpenBLAS at one thread, than as one batch with OpenBLAS at two: every product, exp pass and LayerNorm
# of a half then has a core to itself, and no OpenBLAS worker spins against the elementwise passes between
# products (measurements: docs/bench_notes.md, "The engine's constants"). Left at two OpenBLAS threads, the
# two halves fight over OpenBLAS's pool, so the shards need OpenBLAS's thread count set to one, which
# threadpoolctl does (scikit-learn's KMeans limits BLAS inside its own threads the same
# way); without threadpoolctl the batch is not split.
_BATCH_THREADS: int | None = None
_LOCAL = threading.local()                 # .in_shard: this thread runs one shard of a batch
_BLAS: list | None = None                  # threadpoolctl's controllers of the loaded BLAS libraries
_BLAS_LOCK = threading.Lock()
_BLAS_DEPTH = 0                            # shard regions running (in any thread)
_BLAS_SAVED: list[int] = []                # the thread counts to restore when the last region ends
_SHARD_POOL: tuple[int, ThreadPoolExecutor] | None = None
_THREADPOOLCTL_HINT = ("splitting a batch over threads needs threadpoolctl (to run OpenBLAS at one thread "
                       "in each): pip install threadpoolctl")


def _blas_libs() -> list:
    """threadpoolctl's controllers of the BLAS libraries loaded in this process ([] without threadpoolctl)."""
    global _BLAS
    if _BLAS is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _BLAS = []
        else:
            _BLAS = list(ThreadpoolController().select(user_api="blas").lib_controllers)
    return _BLAS


def get_batch_threads() -> int:
    """Threads the fast path splits a batch or the attention's heads over (see :func:`set_batch_threads`):
    the count set, else BLAS's own thread count (outside a region that holds it at one: :func:`_blas_single`);
    1 without threadpoolctl, and inside a shard."""
    if getattr(_LOCAL, "in_shard", False):
        return 1
    libs = _blas_libs()
    if not libs:
        return 1
    if _BATCH_THREADS is not None:
        return _BATCH_THREADS
    if _BLAS_DEPTH > 0:                      # OpenBLAS held at one thread by _blas_single: its count before
        return max(1, _BLAS_SAVED[0])
    return max(1, int(libs[0].get_num_threads()))


def set_batch_threads(n: int | None) -> None:
    """Split the fast path's work into ``n`` parts run on ``n`` threads, OpenBLAS at one thread in each
    while they run (None: the default, BLAS's own thread count, which is the number of cores unless
    ``OPENBLAS_NUM_THREADS`` or threadpoolctl says otherwise; 1: never split). Three places split:

    * the inference layer (``for_backward=False``) runs shards of its batch, when the batch has at
      least ``n`` sequences and the layer at least 2²⁴ flops of products
      (:mod:`transformer_np.fast.inference`), never with dropout in training (one random stream);
    * ``PretrainedEncoder.encode`` runs whole batches on the threads in turn (then each layer is not
      split again);
    * the attention core (:func:`transformer_np.fast.attention_forward` without attention dropout,
      and :func:`~transformer_np.fast.attention_backward`) runs its blocks of heads, a head's row
      blocks together, when there are two heads' worth and 2²⁴ flops — in training too, where the
      projections and the FFN keep OpenBLAS's own threads, unless the attention does at least half the
      layer's products: then the whole training layer, forward and backward, runs its products at one
      OpenBLAS thread (:func:`transformer_np.fast.layer._blas_one_thread`; the cache records it).

    Each sequence's and head's result is computed by the same operations whichever thread runs it; the
    matrix products see fewer rows and one BLAS thread, so results agree to round-off, not bit for bit,
    across counts (bit for bit for one count on one machine). While a split runs, OpenBLAS runs at
    one thread for the whole process (as with threadpoolctl's ``threadpool_limits``): numpy products
    that another thread of yours runs meanwhile get one thread. Needs threadpoolctl for ``n`` > 1."""
    global _BATCH_THREADS
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
        raise InputTypeError(f"n must be a positive int or None, got {type(n).__name__} {n!r}")
    if n is not None and n < 1:
        raise InputValueError(f"n must be a positive int or None, got {n}")
    if n is not None and n > 1 and not _blas_libs():
        raise ImportError(_THREADPOOLCTL_HINT + " (threadpoolctl found no BLAS library)"
                          if _threadpoolctl_installed() else _THREADPOOLCTL_HINT)
    _BATCH_THREADS = n


@contextmanager
def library_thread_defaults() -> Iterator[dict]:
    """The fast path's thread settings at the library's defaults while the block runs, restored after it:
    elementwise threads (:func:`set_num_threads`, default 1) and batch threads (:func:`set_batch_threads`,
    default BLAS's thread count). Yields ``{"elementwise_threads": …, "batch_threads": …}`` as they are in
    the block. (The benchmark's: :mod:`transformer_np.perf.machine` re-exports it.)"""
    global _THREADS, _BATCH_THREADS
    saved = _THREADS, _BATCH_THREADS
    set_num_threads(None)
    _BATCH_THREADS = None                        # (set_batch_threads(None) without its threadpoolctl check)
    try:
        yield {"elementwise_threads": get_num_threads(), "batch_threads": get_batch_threads()}
    finally:
        _THREADS, _BATCH_THREADS = saved


def _threadpoolctl_installed() -> bool:
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def _blas_single() -> Iterator[None]:
    """OpenBLAS (every BLAS threadpoolctl found) at one thread while any shard region runs; the counts
    found on entry to the first region are restored when the last one ends, even on an exception."""
    global _BLAS_DEPTH, _BLAS_SAVED
    libs = _blas_libs()
    with _BLAS_LOCK:
        if _BLAS_DEPTH == 0:
            _BLAS_SAVED = [int(lib.get_num_threads()) for lib in libs]
            for lib in libs:
                _set_blas_threads(lib, 1)
        _BLAS_DEPTH += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS_DEPTH -= 1
            if _BLAS_DEPTH == 0:
                for lib, count in zip(libs, _BLAS_SAVED):
                    _set_blas_threads(lib, count)


def _set_blas_threads(lib, count: int) -> None:
    """``lib.set_num_threads(count)`` from whichever thread calls it. threadpoolctl (3.8) lets only one
    thread — the first to set a pthreads OpenBLAS's process-wide count, until it releases it — change
    that count, and silently ignores the others: the regions of two threads, or a region in a thread
    other than the first one's, would run OpenBLAS at its full count or leave it at one thread. So the
    calling thread takes control for this one set and releases it (``clear_controlling_thread``; the
    ref count of :func:`_blas_single` already keeps concurrent regions from fighting)."""
    clear = getattr(type(lib), "clear_controlling_thread", None)   # OpenBLAS's controller, threadpoolctl ≥ 3.6
    if clear is not None:
        clear(force=True)
    lib.set_num_threads(count)
    if clear is not None:
        clear()


def in_shards(fn: Callable[[int], None], count: int) -> None:
    """fn(0), …, fn(count − 1) at once, one per thread (the caller runs fn(0)), with OpenBLAS at one
    thread (:func:`_blas_single`) and each thread marked as a shard (no nested split or elementwise
    pool). Every call finishes before this returns; the first exception (by shard index) is re-raised."""
    global _SHARD_POOL
    if count <= 1:
        fn(0)
        return
    with _POOL_LOCK:
        if _SHARD_POOL is None or _SHARD_POOL[0] < count - 1:
            if _SHARD_POOL is not None:
                _SHARD_POOL[1].shutdown(wait=False)          # its threads end once their work is done
            _SHARD_POOL = (count - 1, ThreadPoolExecutor(count - 1, thread_name_prefix="transformer_np_shard"))
        pool = _SHARD_POOL[1]
    err = np.geterr()                                        # np.errstate is per thread: carry the caller's

    def run(i: int) -> None:
        was = getattr(_LOCAL, "in_shard", False)
        _LOCAL.in_shard = True
        try:
            with np.errstate(**err):
                fn(i)
        finally:
            _LOCAL.in_shard = was

    errors: list[BaseException | None] = [None] * count
    with _blas_single():
        futures = [pool.submit(run, i) for i in range(1, count)]
        try:
            run(0)
        except BaseException as e:      # re-raised below, after every shard has finished
            errors[0] = e
        for i, f in enumerate(futures, start=1):
            errors[i] = f.exception()
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


_in_shards = in_shards   # the engine's modules import it by this name and look it up at call time (tests spy there)


# ----------------------------------------------------------------------------- BLAS threads around a block
# The library's one way to set BLAS's thread count around a block (the bench, the course's studies); the
# engine's own regions use _blas_single (reference-counted across threads, see above).
_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_warned = False           # one_blas_thread's missing-threadpoolctl warning is given once per process


def limit_blas_threads(count: int):
    """threadpoolctl's limiter running BLAS at ``count`` threads: a context manager, or call
    ``.restore_original_limits()`` to undo. Without threadpoolctl an ImportError says what to install."""
    threadpoolctl = require("threadpoolctl", "setting the BLAS thread count needs threadpoolctl: pip install "
                                             "threadpoolctl (or set OPENBLAS_NUM_THREADS before starting Python)")
    return threadpoolctl.threadpool_limits(count, user_api="blas")


def _one_thread_already() -> bool:
    return any(os.environ.get(v, "").strip() == "1" for v in _THREAD_VARIABLES) or (os.cpu_count() or 1) == 1


def one_blas_thread():
    """A context manager running its block with one BLAS thread (the caller's setting is restored), for the
    course's studies: small products, where BLAS threads bring nothing and, on a busy 2-core machine,
    OpenBLAS's spinning idle threads made each product 25–100× slower (notebook 02: 148–174 s with OpenBLAS's
    default threads, 34 s at one). Without threadpoolctl (optional: the ``notebooks`` extra installs it) the
    limit cannot be set inside a running process: a no-op that warns once (:class:`RuntimeWarning`) with what
    to install — unless ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is 1 already."""
    global _warned
    try:
        return limit_blas_threads(1)
    except ImportError:
        if not _warned and not _one_thread_already():
            _warned = True
            warnings.warn("threadpoolctl is not installed, so this study runs its small matrix products on all of "
                          "OpenBLAS's threads, which on a busy machine makes it several times slower (notebook 02: "
                          "148-174 s instead of 34). Install it with: pip install threadpoolctl (it comes with "
                          "pip install 'transformer_np[notebooks]'), or start Python with OPENBLAS_NUM_THREADS=1.",
                          RuntimeWarning, stacklevel=3)
        return contextlib.nullcontext()
