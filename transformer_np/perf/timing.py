"""Timing of the bench's rows: settled, interleaved blocks of two (or three) calls, and the spread of their ratios.

The lowest layer of :mod:`transformer_np.perf` (standard library only): :data:`SETTLE_S` and
:func:`settled_call` (untimed calls of a side before its timed call), :func:`interleaved` (alternating
settled blocks, the median of the per-round ratios) and :func:`spread`. Used by the bench's rows
(:mod:`transformer_np.perf.bench`), the MiniLM throughput (:mod:`transformer_np.perf.minilm_bench`), the
MiniLM profile and the busy-machine study; the method is described in :mod:`transformer_np.perf.bench`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

__all__ = ["CLOCKS", "SETTLE_S", "settled_call", "interleaved", "spread"]


#: The clocks a row can be timed with: wall time, or this process's CPU time ("cpu": only meaningful with
#: one thread each side — then it is the work done, whatever share of the cores other processes leave).
CLOCKS = ("wall", "cpu")

#: Seconds of untimed calls of a side (by the wall clock, and at least one call) before each of its timed
#: calls. OpenBLAS's idle worker threads spin for about 0.1 s after a call before they sleep, and on 2 cores a
#: spinning NumPy worker steals a core from torch's next call; twice that timeout lets them park (the
#: measurements: docs/bench_notes.md, "SETTLE_S").
SETTLE_S = 0.2


def settled_call(fn: Callable, settle: float, now: Callable[[], float], warm: Callable | None = None
                 ) -> tuple[float, int]:
    """(time of one call of ``fn`` by ``now``, untimed calls made before it).

    First ``warm`` (default ``fn`` itself) is called until ``settle`` seconds of the wall clock have
    passed since this block began, and at least once: so the timed call follows a call of its own
    side, and any other library's threads have been idle for at least ``settle`` seconds."""
    warm = fn if warm is None else warm
    t0, calls = time.perf_counter(), 0
    while True:
        warm()
        calls += 1
        if time.perf_counter() - t0 >= settle:
            break
    t1 = now()
    fn()
    return now() - t1, calls


def interleaved(a: Callable, b: Callable, rounds: int, warmup: int = 1, clock: str = "wall",
                c: Callable | None = None, progress: Callable[[int, int], None] | None = None,
                settle: float = SETTLE_S, warm: tuple[Callable | None, ...] | None = None) -> dict:
    """Time a and b in alternating blocks; medians of the times and of the per-round a/b, and the
    spread of those ratios (:func:`spread`). ``clock``: one of :data:`CLOCKS`.

    Each round is a block of a, then a block of b (then of ``c``, if given: the bench's NumPy-limit
    call, ``c_ms`` its median). A block is :func:`settled_call`: untimed calls of its own side for at
    least ``settle`` seconds (and at least one), then one timed call — so no timed call directly
    follows a call of the other side, whose worker threads may still be spinning. ``warm`` (one entry
    per side, None for the side itself) gives a cheaper untimed call for a side whose call is long
    (MiniLM's encode of 1,000 sentences settles on a short batch). ``progress(i, rounds)`` is called
    after round i (1-based); ``settle_calls``: the median untimed calls per block, per side."""
    now = (lambda: time.perf_counter()) if clock == "wall" else (lambda: time.process_time())
    sides = [a, b] + ([c] if c is not None else [])
    warm = tuple(warm) if warm is not None else (None,) * len(sides)
    if len(warm) != len(sides):
        raise ValueError(f"warm must give one entry per side ({len(sides)}), got {len(warm)}")
    _check_settle(settle)
    for _ in range(warmup):
        for fn in sides:
            fn()
    times: list[list[float]] = [[] for _ in sides]
    calls: list[list[int]] = [[] for _ in sides]
    for i in range(rounds):
        for k, fn in enumerate(sides):
            t, n = settled_call(fn, settle, now, warm[k])
            times[k].append(t)
            calls[k].append(n)
        if progress is not None:
            progress(i + 1, rounds)
    ta, tb = times[0], times[1]
    ratios = [x / y for x, y in zip(ta, tb)]
    out = {"a_ms": 1e3 * statistics.median(ta), "b_ms": 1e3 * statistics.median(tb),
           "ratio": statistics.median(ratios), "ratios": ratios, "spread": spread(ratios),
           "settle_s": settle, "settle_calls": [statistics.median(n) for n in calls]}
    if c is not None:
        out["c_ms"] = 1e3 * statistics.median(times[2])
        out["c_over_a"] = [z / x for x, z in zip(ta, times[2])]
    return out


def spread(values: list[float]) -> dict:
    """min, quartiles, max of the per-round ratios and ``rel_range`` = (max − min) / median.

    Quartiles by :func:`statistics.quantiles` (``method="inclusive"``: with 5 rounds, q1 and q3
    are the 2nd and 4th smallest). One round gives a zero spread."""
    v = sorted(values)
    med = statistics.median(v)
    q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else (v[0], v[0], v[0])
    return {"min": v[0], "q1": q1, "median": med, "q3": q3, "max": v[-1],
            "rel_range": (v[-1] - v[0]) / med if med else 0.0}


def _check_settle(settle) -> None:
    if isinstance(settle, bool) or not isinstance(settle, (int, float)) or not settle >= 0 or settle > 60:
        raise ValueError(f"settle must be a number of seconds from 0 to 60, got {settle!r}")
