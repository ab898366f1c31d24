r"""``bench --profile minilm``: where MiniLM's ``encode`` spends its time, next to sentence-transformers.

Both encode the same generated sentences (:func:`transformer_np.perf.minilm_bench._sentences`), batch size
32, float32, the same thread count; rounds alternate (ours, theirs, ours, …) and each part's time is
the median over the rounds. Each side's timed call is settled as the bench's rows are
(:func:`transformer_np.perf.timing.settled_call`): it follows at least ``settle`` seconds (and at least one
call) of its own side's untimed encoding of the first 64 sentences, so the other library's idle worker
threads have stopped spinning before it starts. The parts:

* **tokenisation**: text → padded id arrays (ours: :meth:`PretrainedEncoder.tokenize`; theirs:
  ``SentenceTransformer.tokenize``, the Rust ``tokenizers`` library);
* **embeddings**: the word + position + type lookup and its LayerNorm;
* **layers**: the six encoder layers;
* **pooling**: mean over real tokens and L2 normalisation;
* **other**: the rest of the call — batching, sorting by length, checks, moving data.

Each part is timed by wrapping the function that does it (ours: the encoder's embedding and layer
functions; theirs: forward hooks on the BERT modules), so the parts of one call add up to its total
with "other" the remainder — ours times N when encode runs its batches on N threads (then each part is
the sum of the threads' seconds). ``clock="cpu"`` (one thread) times by the process's CPU time.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from contextlib import contextmanager

from .._optional import require
from . import machine, minilm_bench, timing

PARTS = ("tokenisation", "embeddings", "layers", "pooling", "other")

__all__ = ["PARTS", "minilm_profile", "format_minilm_profile"]


class _Timer:
    """Seconds per part; each thread keeps its own stack of open parts (encode may run batches on
    several threads: then the parts add up the threads' seconds)."""

    def __init__(self, clock: str):
        self.now = time.perf_counter if clock == "wall" else time.process_time
        self.parts = dict.fromkeys(PARTS, 0.0)
        self._local = threading.local()
        self._lock = threading.Lock()

    def start(self, part: str) -> None:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        self._local.stack.append((part, self.now()))

    def stop(self) -> None:
        part, t0 = self._local.stack.pop()
        elapsed = self.now() - t0
        with self._lock:
            self.parts[part] += elapsed

    def wrap(self, part: str, fn):
        def timed(*args, **kwargs):
            self.start(part)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stop()
        return timed


@contextmanager
def _patched(obj, name: str, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _ours_once(model, sentences, clock: str) -> dict:
    """Our encode's parts; with batch threads (:func:`transformer_np.fast.get_batch_threads`) > 1 the
    parts add up every thread's seconds and "other" is threads × the total, less them."""
    from ..fast import get_batch_threads
    from ..io import pretrained
    from ..model import stack

    t = _Timer(clock)
    with _patched(model, "tokenize", t.wrap("tokenisation", model.tokenize)), \
            _patched(stack, "embed_block", t.wrap("embeddings", stack.embed_block)), \
            _patched(stack, "layer_block", t.wrap("layers", stack.layer_block)), \
            _patched(pretrained, "pool", t.wrap("pooling", pretrained.pool)), \
            _patched(pretrained, "l2_normalize", t.wrap("pooling", pretrained.l2_normalize)):
        t0 = t.now()
        model.encode(sentences, batch_size=32)
        total = t.now() - t0
    t.parts["other"] = total * get_batch_threads() - sum(t.parts.values())
    return {**t.parts, "total": total}


def _theirs_once(st, sentences, clock: str) -> dict:
    t = _Timer(clock)
    bert = st[0].auto_model
    hooks = []
    for part, module in (("embeddings", bert.embeddings), ("layers", bert.encoder)):
        hooks.append(module.register_forward_pre_hook(lambda m, a, part=part: t.start(part)))
        hooks.append(module.register_forward_hook(lambda m, a, o: t.stop()))
    for module in list(st)[1:]:                                    # Pooling, Normalize
        hooks.append(module.register_forward_pre_hook(lambda m, a: t.start("pooling")))
        hooks.append(module.register_forward_hook(lambda m, a, o: t.stop()))
    try:
        name = "preprocess" if hasattr(st, "preprocess") else "tokenize"   # sentence-transformers ≥ 5 / older
        with _patched(st, name, t.wrap("tokenisation", getattr(st, name))):
            t0 = t.now()
            st.encode(sentences, batch_size=32, normalize_embeddings=False)   # Normalize is in its pipeline
            total = t.now() - t0
    finally:
        for h in hooks:
            h.remove()
    t.parts["other"] = total - sum(t.parts.values())
    return {**t.parts, "total": total}


def _settled_rounds(sides, rounds: int, settle: float, log=None) -> dict:
    """``{name: [timed() of each round]}`` for ``sides`` = ((name, timed, warm), …), side after side in
    every round, each ``timed()`` call settled by :func:`transformer_np.perf.timing.settled_call` (``warm``
    called for at least ``settle`` seconds, and at least once, just before it). ``log(r)`` as round r starts."""
    runs: dict = {name: [] for name, _, _ in sides}
    for r in range(rounds):
        if log:
            log(r + 1)
        for name, timed, warm in sides:
            timing.settled_call(lambda t=timed, n=name: runs[n].append(t()), settle, time.perf_counter, warm)
    return runs


def minilm_profile(n_sentences: int = 1000, rounds: int = 3, threads: int | None = None, clock: str = "wall",
                   log=None, settle: float | None = None) -> dict:
    """The per-part times (seconds, median over ``rounds`` alternating rounds) of our ``encode`` and
    sentence-transformers' on the same sentences, and each side's sentences per second. ``settle``: seconds
    of untimed calls of a side before each of its timed calls (default :data:`transformer_np.perf.timing.SETTLE_S`)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = machine._import_torch()
    SentenceTransformer = require("sentence_transformers", "the MiniLM profile needs sentence-transformers: "
                                  "pip install sentence-transformers").SentenceTransformer
    from ..io.pretrained import MODEL_NAME, load_pretrained, model_folder

    if clock not in timing.CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(timing.CLOCKS)}, got {clock!r}")
    if clock == "cpu" and threads != 1:
        raise ValueError(f"clock='cpu' needs threads=1, got threads={threads}")
    settle = timing.SETTLE_S if settle is None else settle
    timing._check_settle(settle)
    ours = load_pretrained(MODEL_NAME)
    st = SentenceTransformer(str(model_folder(MODEL_NAME)), device="cpu")
    sentences = minilm_bench._sentences(n_sentences)
    limiter, torch_threads = None, torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
        if threads != machine._blas_threads()[0]:
            limiter = machine._limit_blas_threads(threads)
    try:
        with machine.library_thread_defaults() as counts:             # as encode runs for a user
            ours.encode(sentences[:64])                               # warm-up: weights in float32, pools
            st.encode(sentences[:64])
            short = sentences[:64]
            runs = _settled_rounds((("numpy", lambda: _ours_once(ours, sentences, clock),
                                     lambda: ours.encode(short, batch_size=32)),
                                    ("sentence_transformers", lambda: _theirs_once(st, sentences, clock),
                                     lambda: st.encode(short, batch_size=32))), rounds, settle,
                                   None if log is None else lambda r: log(
                                       f"MiniLM profile: round {r} of {rounds} ({n_sentences} sentences each "
                                       f"side, each after {settle:g} s of its own side's untimed calls) …"))
    finally:
        torch.set_num_threads(torch_threads)
        if limiter is not None:
            limiter.restore_original_limits()
    out = {"sentences": n_sentences, "rounds": rounds, "clock": clock, "settle_s": settle,
           "threads": threads if threads is not None else machine._blas_threads()[0], **counts}
    for side, rs in runs.items():
        parts = {k: statistics.median(r[k] for r in rs) for k in PARTS + ("total",)}
        out[side] = {**{f"{k}_s": round(v, 4) for k, v in parts.items()},
                     "sentences_per_s": round(n_sentences / parts["total"], 1)}
    out["throughput_ratio"] = round(out["numpy"]["sentences_per_s"] / out["sentence_transformers"]["sentences_per_s"],
                                    3)
    return out


def format_minilm_profile(doc: dict) -> str:
    """A plain table: each part's time for both sides and their ratio."""
    a, b = doc["numpy"], doc["sentence_transformers"]
    lines = [f"MiniLM encode, {doc['sentences']} sentences, batch 32, float32, {doc['threads']} thread(s), "
             f"median of {doc['rounds']} rounds ({'process CPU time' if doc['clock'] == 'cpu' else 'wall clock'})",
             "", "| part | NumPy s | sentence-transformers s | NumPy / theirs |", "|---|---:|---:|---:|"]
    for k in PARTS + ("total",):
        x, y = a[f"{k}_s"], b[f"{k}_s"]
        ratio = f"{x / y:.2f}×" if y > 0 else "n/a"
        lines.append(f"| {k} | {x:.3f} | {y:.3f} | {ratio} |")
    if doc.get("batch_threads", 1) > 1:
        lines += ["", f"NumPy runs whole batches on {doc['batch_threads']} threads: its parts add up the threads' "
                      f"seconds (other = {doc['batch_threads']} × total, less them); its total is the wall clock."]
    lines += ["", f"sentences/s: NumPy {a['sentences_per_s']:.0f}, sentence-transformers {b['sentences_per_s']:.0f} "
                  f"(throughput ratio {doc['throughput_ratio']:.2f})"]
    return "\n".join(lines)
