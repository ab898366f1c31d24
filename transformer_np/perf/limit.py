r"""The NumPy limit of a benchmark row: the work NumPy cannot avoid for one encoder layer.

For a row (shape, dtype, mode) the limit is the time, on this machine and in the same run, of

* **every matrix product of the layer, each as one ``np.matmul`` call** on its full shape
  (:func:`layer_gemms`: the fused Q/K/V projection, Q Kᵀ and A V over all (batch, head) slices,
  the output projection and the two FFN products; with ``fwd+bwd`` also the backward's products —
  two per linear, four for attention), written into preallocated outputs; plus
* **one elementwise pass (``np.exp``) over every (n × n) block of scores** — B·h·n² elements, on
  blocks of :data:`EXP_BLOCK` elements that stay in the CPU cache, spread over the row's threads
  (NumPy releases the GIL inside a ufunc, so threads share the pass: alone, two threads took
  0.46–0.50 ms for attn-512's 2 M scores in float32, one 0.74–0.76 ms; right after 2-thread products,
  OpenBLAS's spinning idle worker takes most of that gain, see ``_EXP_POOL``).

measured back to back (:func:`limit_call` returns one callable that does both). A softmax
needs at least one exp per score; torch's fused attention kernel does it in registers, NumPy
in at least one pass over memory or cache. Everything else the layer does — the rest of the
softmax, the scale and mask, LayerNorm, GELU, the bias adds, dropout, Python between the calls —
is left out, so the limit is a lower bound on NumPy's time for the work arranged this way, and
``limit / time`` (the row's ``limit_fraction``) says how much of the time is that unavoidable work. A
layer that arranges it otherwise can beat it: the fast layer's batch shards (and its attention-bound
training layers) run their products at one OpenBLAS thread each, so no idle OpenBLAS worker spins
against their exp passes, and ``long`` fwd showed a fraction of 1.04–1.17 (sessions 7 and 8). It is tight for
attention-bound rows (the (n, n) scores dominate, :func:`attention_bound`) and loose for
FFN-heavy ones, whose GELU and LayerNorm passes it does not count.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["EXP_BLOCK", "layer_gemms", "attention_bound", "limit_call"]

#: Elements per block of the exp pass: 256 KiB in float32, within L2 on current x86 cores.
EXP_BLOCK = 1 << 16

# The exp pass's own threads: threads − 1 workers, the caller being the first (not the fast path's elementwise
# pool, which runs inline at its default of one thread); the measurements: docs/bench_notes.md, "_EXP_POOL".
_EXP_POOL: tuple[int, ThreadPoolExecutor] | None = None
_EXP_POOL_LOCK = threading.Lock()


def _exp_workers(count: int) -> ThreadPoolExecutor:
    """A pool of at least ``count`` threads for the exp pass's shares after the first (created once, grown)."""
    global _EXP_POOL
    with _EXP_POOL_LOCK:
        if _EXP_POOL is None or _EXP_POOL[0] < count:
            if _EXP_POOL is not None:
                _EXP_POOL[1].shutdown(wait=False)
            _EXP_POOL = (count, ThreadPoolExecutor(count, thread_name_prefix="transformer_np_limit"))
        return _EXP_POOL[1]


def attention_bound(dims) -> bool:
    """True when the layer's (n × n) scores outnumber its (n × d_ff) FFN activations: h·n > d_ff."""
    B, n, d, h, f = dims
    return h * n > f


def layer_gemms(dims, mode: str) -> list[tuple[str, tuple[int, ...], tuple[int, ...], bool, bool]]:
    """(name, a_shape, b_shape, a_transposed, b_transposed) of each matrix product of one Post-LN layer.

    A transposed operand is passed as a transposed view (the layout the layer's own call sees);
    ``a_shape`` / ``b_shape`` are the shapes of the product's operands as multiplied."""
    B, n, d, h, f = dims
    M, dk = B * n, d // h
    fwd = [("X W_QKV", (M, d), (d, 3 * d), False, False),
           ("Q K^T", (B, h, n, dk), (B, h, dk, n), False, True),
           ("A V", (B, h, n, n), (B, h, n, dk), False, False),
           ("ctx W_O", (M, d), (d, d), False, False),
           ("Z W_1", (M, d), (d, f), False, False),
           ("f(U) W_2", (M, f), (f, d), False, False)]
    if mode == "fwd":
        return fwd
    bwd = [("dY W_2^T", (M, d), (d, f), False, True),
           ("f(U)^T dY", (f, M), (M, d), True, False),
           ("dU W_1^T", (M, f), (f, d), False, True),
           ("Z^T dU", (d, M), (M, f), True, False),
           ("dY W_O^T", (M, d), (d, d), False, True),
           ("ctx^T dY", (d, M), (M, d), True, False),
           ("dO V^T", (B, h, n, dk), (B, h, dk, n), False, True),
           ("A^T dO", (B, h, n, n), (B, h, n, dk), True, False),
           ("dS K", (B, h, n, n), (B, h, n, dk), False, False),
           ("dS^T Q", (B, h, n, n), (B, h, n, dk), True, False),
           ("dQKV W_QKV^T", (M, 3 * d), (3 * d, d), False, True),
           ("X^T dQKV", (d, M), (M, 3 * d), True, False)]
    return fwd + bwd


def _operand(shape, transposed: bool, dtype, rng) -> np.ndarray:
    """A random array multiplied as ``shape``; stored transposed (and viewed back) when ``transposed``."""
    if not transposed:
        return rng.standard_normal(shape).astype(dtype)
    stored = shape[:-2] + (shape[-1], shape[-2])
    return rng.standard_normal(stored).astype(dtype).swapaxes(-1, -2)


def limit_call(dims, dtype: str, mode: str, threads: int = 1, seed: int = 0) -> Callable[[], None]:
    """One call that runs the row's GEMMs (one ``np.matmul`` each) and its exp pass, back to back.

    Operands, outputs and exp buffers are allocated here, once: the call itself allocates nothing.
    The exp pass covers B·h·n² elements with :data:`EXP_BLOCK`-element blocks, each of ``threads``
    threads (the caller and ``threads − 1`` pool threads, whatever the fast path's elementwise thread
    count) working on its own in/out pair (inputs in [−10, 0]: no overflow, no subnormals)."""
    rng = np.random.default_rng(seed)
    products = []
    for _, a_shape, b_shape, ta, tb in layer_gemms(dims, mode):
        a, b = _operand(a_shape, ta, dtype, rng), _operand(b_shape, tb, dtype, rng)
        out = np.empty(a_shape[:-1] + b_shape[-1:], dtype=dtype)
        products.append((a, b, out))
    B, n, d, h, f = dims
    total = B * h * n * n
    size = min(EXP_BLOCK, total)
    blocks = math.ceil(total / size)
    workers = max(1, min(threads, blocks))
    buffers = [(rng.uniform(-10.0, 0.0, size).astype(dtype), np.empty(size, dtype=dtype)) for _ in range(workers)]
    last = total - (blocks - 1) * size                     # the last block may be partial

    def exp_share(w: int) -> None:
        src, dst = buffers[w]
        for i in range(w, blocks, workers):
            m = last if i == blocks - 1 else size
            np.exp(src[:m], out=dst[:m])

    def call() -> None:
        for a, b, out in products:
            np.matmul(a, b, out=out)
        # the pool is looked up per call: a row with more threads since this one was built replaced it
        pool = _exp_workers(workers - 1) if workers > 1 else None
        others = [pool.submit(exp_share, w) for w in range(1, workers)] if pool is not None else []
        exp_share(0)
        for f in others:
            f.result()                                   # every share done (a worker's error re-raised)

    return call
