"""The bench's settled blocks: before each timed call, untimed calls of the same side for at least the
settle time (and at least one), so that no timed call directly follows a call of the other library
(whose idle worker threads may still be spinning on a core).

Checked with fake clocks and fake callables that record the order of the calls: no timed unit tests."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from transformer_np.perf import bench, profile, timing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: The --json keys before the settled blocks (round 4's baseline run): none may go away.
OLD_ROW_KEYS = {"attempts", "attention_bound", "dtype", "gflops", "limit_fraction", "limit_s", "limit_torch_ratio",
                "mode", "numpy_ms", "other_load_cores", "peak_fraction", "ratio_vs_torch", "rounds", "rounds_run",
                "shape", "spread", "steady", "torch_gflops", "torch_ms"}
OLD_MACHINE_KEYS = {"blas", "clock", "cpu", "cpu_count", "date", "load_average", "load_average_after",
                    "matmul_peak_gflops", "numpy", "openblas_env", "other_load_cores_before", "platform", "python",
                    "threads", "threads_lowered_from", "threads_source", "torch", "torch_threads"}
OLD_MINILM_KEYS = {"clock", "max_abs_diff_embeddings", "numpy_per_s", "rounds", "sentence_transformers_per_s",
                   "sentences", "throughput_ratio"}


class Recorder:
    """A fake wall clock (advanced only by the fake calls) and a log of events: ("call", side, start, end)
    for every call of a fake side and ("read",) for every read of the timing clock."""

    def __init__(self, monkeypatch, timing_clock: str = "cpu"):
        self.t, self.events = 0.0, []
        monkeypatch.setattr(timing.time, "perf_counter", lambda: self.t)
        if timing_clock == "cpu":                     # the timed calls read process_time: log each read
            monkeypatch.setattr(timing.time, "process_time", self._read)

    def _read(self) -> float:
        self.events.append(("read",))
        return self.t

    def side(self, name: str, seconds: float):
        def call(*args, **kwargs):
            start = self.t
            self.t += seconds
            self.events.append(("call", name, start, self.t))
        return call

    def timed_calls(self) -> list[int]:
        """Indexes (in :meth:`calls`) of the timed calls: those between a start read of the timing clock
        (the 1st, 3rd, … read) and its end read."""
        out, k, reads = [], -1, 0
        for e in self.events:
            if e[0] == "call":
                k += 1
                if reads % 2:                                # inside a (start, end) pair of reads
                    out.append(k)
            else:
                reads += 1
        return out

    def calls(self) -> list[tuple]:
        return [e for e in self.events if e[0] == "call"]


def _check_blocks(rec: Recorder, settle: float, same_side, timed_calls=None) -> list[tuple[str, int]]:
    """For every timed call (default :meth:`Recorder.timed_calls`): the call just before it is an untimed
    call of its own side (``same_side(untimed, timed)``); that side's run of untimed calls spans at least
    ``settle`` and stops at its first call that reaches it. Returns (timed side, untimed calls) per block."""
    calls, out = rec.calls(), []
    for i in rec.timed_calls() if timed_calls is None else timed_calls:
        timed = calls[i][1]
        j = i - 1
        assert j >= 0 and same_side(calls[j][1], timed), \
            f"timed {timed} directly after {calls[j]} (calls: {calls[max(0, j - 3):i + 1]})"
        run = []
        while j >= 0 and same_side(calls[j][1], timed):
            run.append(calls[j])
            j -= 1
        run.reverse()
        block_start = run[0][2]
        # the block ran until `settle` had passed, and not one call longer (the first call counts even at 0)
        assert run[-1][3] - block_start >= settle
        assert len(run) == 1 or run[-2][3] - block_start < settle
        out.append((timed, len(run)))
    return out


def test_settled_call_waits_the_settle_time_and_at_least_one_call(monkeypatch):
    """Calls of 0.75 time units: settle 2 needs three untimed calls (0.75, 1.5, 2.25), settle 1.5 two
    (the boundary counts as reached), settle 0 still one; the timed call is then fn's own duration."""
    for settle, untimed in ((2.0, 3), (1.5, 2), (0.0, 1)):
        rec = Recorder(monkeypatch, "wall")
        fn = rec.side("a", 0.75)
        assert bench.settled_call(fn, settle, timing.time.perf_counter) == (0.75, untimed)
        assert len(rec.calls()) == untimed + 1


def test_no_timed_call_directly_follows_the_other_side(monkeypatch):
    """NumPy, torch and the limit in blocks (a, b, c, a, b, c, …) with calls of different lengths: every
    timed call follows untimed calls of its own side that together last at least the settle time."""
    rec = Recorder(monkeypatch)
    # durations and settle in binary fractions: the fake clock's sums are exact, so the boundary case is too
    a, b, c = rec.side("numpy", 0.0625), rec.side("torch", 0.375), rec.side("limit", 0.125)
    out = bench.interleaved(a, b, rounds=4, warmup=1, clock="cpu", c=c, settle=0.25)
    blocks = _check_blocks(rec, 0.25, lambda untimed, timed: untimed == timed)
    assert [s for s, _ in blocks] == ["numpy", "torch", "limit"] * 4             # the sides rotate
    assert [n for _, n in blocks] == [4, 1, 2] * 4          # 0.0625 × 4 = 0.25; one 0.375 call; 0.125 × 2
    assert out["settle_s"] == 0.25 and out["settle_calls"] == [4, 1, 2]
    assert out["a_ms"] == 62.5 and out["b_ms"] == 375.0                # exact: binary fractions of the fake clock
    assert out["ratios"] == [0.0625 / 0.375] * 4


def test_cheaper_warm_calls_settle_a_long_side(monkeypatch):
    """With ``warm`` given, the untimed calls are the warm ones and the long call runs only in the
    warm-up and timed: warmup + rounds times."""
    rec = Recorder(monkeypatch)
    a, b = rec.side("ours", 7.0), rec.side("theirs", 5.0)
    wa, wb = rec.side("ours-short", 0.45), rec.side("theirs-short", 0.3)
    bench.interleaved(a, b, rounds=3, warmup=1, clock="cpu", settle=0.2, warm=(wa, wb))
    blocks = _check_blocks(rec, 0.2, lambda untimed, timed: untimed == f"{timed}-short")
    assert blocks == [("ours", 1), ("theirs", 1)] * 3
    names = [e[1] for e in rec.calls()]
    assert names.count("ours") == names.count("theirs") == 1 + 3
    with pytest.raises(ValueError, match="warm"):
        bench.interleaved(a, b, rounds=1, warm=(wa,))


@pytest.mark.parametrize("bad", [-0.1, math.nan, 61.0, True, "0.2"])
def test_settle_refuses_what_is_not_a_time(bad):
    with pytest.raises(ValueError, match="settle"):
        bench.interleaved(lambda: None, lambda: None, rounds=1, settle=bad)


def test_bench_settle_flag_refuses_a_negative_time():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "transformer_np", "bench", "--quick", "--settle", "-1"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 2 and "--settle" in proc.stderr and "-1" in proc.stderr


class _FakeEncoder:
    """encode() takes 1 ms of fake time per sentence and returns zero embeddings."""

    def __init__(self, rec: Recorder, name: str):
        self.rec, self.name = rec, name

    def encode(self, sentences, batch_size=32, normalize_embeddings=True):
        rec = self.rec
        start = rec.t
        rec.t += 1e-3 * len(sentences)
        rec.events.append(("call", f"{self.name}:{len(sentences)}", start, rec.t))
        return np.zeros((len(sentences), 4), dtype=np.float32)


def test_minilm_throughput_settles_each_side_on_a_short_batch(monkeypatch):
    """The throughput rounds: each timed encode of all sentences follows the same side's encodes of the
    first 64 sentences (≥ settle seconds); the document keeps its keys and says the settle time."""
    rec = Recorder(monkeypatch)
    ours, st = _FakeEncoder(rec, "ours"), _FakeEncoder(rec, "st")
    doc = bench._minilm_rounds(ours, st, n_sentences=200, rounds=3, clock="cpu", settle=0.2)
    blocks = _check_blocks(rec, 0.2, lambda untimed, timed: untimed == timed.split(":")[0] + ":64")
    assert blocks == [("ours:200", 4), ("st:200", 4)] * 3                 # 0.064 × 4 ≥ 0.2 > 0.064 × 3
    assert set(doc) == OLD_MINILM_KEYS | {"settle_s"} and doc["settle_s"] == 0.2
    assert doc["throughput_ratio"] == pytest.approx(1.0)


def test_minilm_throughput_with_its_limit_times_three_settled_sides(monkeypatch):
    """With ``limit``, each round also times the limit of encoding all sentences, settled on the limit of
    the first 64; the document adds limit_s, limit_fraction and limit_torch_ratio."""
    rec = Recorder(monkeypatch)
    ours, st = _FakeEncoder(rec, "ours"), _FakeEncoder(rec, "st")

    def limit(sentences):                                # half of an encode's fake time
        def call():
            start = rec.t
            rec.t += 0.5e-3 * len(sentences)
            rec.events.append(("call", f"limit:{len(sentences)}", start, rec.t))
        return call

    doc = bench._minilm_rounds(ours, st, n_sentences=200, rounds=3, clock="cpu", settle=0.2, limit=limit)
    blocks = _check_blocks(rec, 0.2, lambda untimed, timed: untimed == timed.split(":")[0] + ":64")
    assert blocks == [("ours:200", 4), ("st:200", 4), ("limit:200", 7)] * 3   # 0.032 × 7 ≥ 0.2 > 0.032 × 6
    assert set(doc) == OLD_MINILM_KEYS | {"settle_s", "limit_s", "limit_fraction", "limit_torch_ratio"}
    assert doc["limit_fraction"] == pytest.approx(0.5) and doc["limit_torch_ratio"] == pytest.approx(0.5)
    assert doc["limit_s"] == pytest.approx(0.1)


def test_minilm_profile_rounds_are_settled(monkeypatch):
    """``bench --profile minilm``'s rounds: ours then theirs, each timed pass after its own side's short
    encodes for the settle time; each side's results in round order."""
    rec = Recorder(monkeypatch, "wall")
    results = iter(range(100))

    def timed(name):
        call = rec.side(name, 2.0)

        def run():
            call()
            return next(results)
        return run

    short = {n: rec.side(f"{n}-short", 0.07) for n in ("numpy", "st")}
    logged = []
    runs = profile._settled_rounds((("numpy", timed("numpy"), short["numpy"]), ("st", timed("st"), short["st"])),
                                   rounds=2, settle=0.2, log=logged.append)
    long_calls = [i for i, e in enumerate(rec.calls()) if not e[1].endswith("-short")]
    blocks = _check_blocks(rec, 0.2, lambda untimed, timed_: untimed == f"{timed_}-short", long_calls)
    assert blocks == [("numpy", 3), ("st", 3)] * 2                        # 0.07 × 3 = 0.21 ≥ 0.2
    assert runs == {"numpy": [0, 2], "st": [1, 3]} and logged == [1, 2]


def test_bench_rows_keep_their_keys_and_say_the_settle(monkeypatch):
    """A tiny in-process run (1 thread, 1 round): the rows have every key they had before plus
    ``settle_calls`` (≥ 1 per side), and the machine block says ``settle_s``."""
    pytest.importorskip("torch", reason="the benchmark compares against PyTorch")
    doc = bench.run_benchmark([bench.parse_shape("2,8,16,2,32")], ["float32"], ("fwd", "fwd+bwd"), rounds=1,
                              memory=False, threads=1, settle=0.01)
    for r in doc["results"]:
        assert set(r) == OLD_ROW_KEYS | {"settle_calls"}
        assert set(r["settle_calls"]) == {"numpy", "torch", "limit"} and min(r["settle_calls"].values()) >= 1
    assert set(doc["machine"]) >= OLD_MACHINE_KEYS and doc["machine"]["settle_s"] == 0.01
    assert "0.01 s" in bench.format_table(doc)
