r"""Training tasks for the encoder: synthetic data, MLM corruption, and the heads glue (with backward).

The seeds say the stack is "architecture-agnostic to the training task": the same
H^(N) (B, n, d) feeds whichever head the task needs. Four tasks, each generated in code
from a ``numpy.random.Generator`` (so a batch is a pure function of the generator's seed):

* ``sort``  — input [CLS] x₁ … x_L (x_i among ``n_symbols`` symbols); at position i the target
  is the i-th smallest x. Per-token head (tagger), C = n_symbols. Chance loss ln C.
* ``cls``   — a toy grammar: is the bracket string balanced (Dyck-1)? Half of the examples are
  drawn balanced, half are random strings with equally many "(" and ")" (so counting alone
  does not solve it; the label is always computed by the checker). [CLS] classifier, C = 2.
* ``tag``   — tag every token with how often it occurs in its own sequence: 1, 2 or ≥ 3
  (classes 0, 1, 2). Per-token head, C = 3; needs attention across positions.
* ``mlm``   — masked language modelling on the tiny character-level corpus in
  ``transformer_np/data/`` with BERT's 80/10/10 corruption and an output layer tied to the
  token embedding E_tok.

Token ids 0–3 are special in every task: [PAD] 0, [CLS] 1, [SEP] 2, [MASK] 3. Position 0
always holds [CLS]; its label is −100 (ignored) in the per-token tasks.

MLM corruption (Devlin et al. 2019): every non-special token is *chosen* independently with
probability 0.15; a chosen token becomes [MASK] with probability 0.8, a uniformly random
regular token with probability 0.1 (which may by chance equal the original), and stays
unchanged with probability 0.1. The label is the original token at chosen positions and −100
elsewhere, so the loss is only over chosen positions.

MLM output layer (BERT's "cls.predictions"), with E = ``embeddings.word`` (V, d):
    T      = LN( GELU( H W_t + b_t ) )              (B, n, d)
    logits = T Eᵀ + b_out                           (B, n, V)
backward: dT = dlogits E,  dE += Σ_{b,i} dlogits_{bi}ᵀ T_{bi}  (added to the embedding's own
gradient from the input side: the table is used twice), db_out = Σ dlogits.

Head parameters live in the same flat dict as the encoder's, under ``head.``:
``head.W`` (d, C) and ``head.b`` (C,) for cls/tag/sort; ``head.transform.W`` (d, d),
``head.transform.b``, ``head.ln.gamma``, ``head.ln.beta`` (d,) and ``head.bias`` (V,) for mlm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._validate import as_int_array, check_cache, check_choice, check_float, check_int, check_rng, describe
from ..model.config import EncoderConfig
from ..model.heads import cls_classifier_backward, cls_classifier_forward, tagger_backward, tagger_forward
from ..model.losses import cross_entropy_backward, cross_entropy_forward
from ..model.params import init_params
from ..model.stack import encoder_backward, encoder_forward
from ..ops.activations import activation_backward, activation_forward
from ..ops.layernorm import layernorm_backward, layernorm_forward
from ..ops.linear import linear_backward, linear_forward

__all__ = ["TASKS", "PAD", "CLS", "SEP", "MASK", "N_SPECIAL", "Task", "get_task", "load_corpus",
           "mlm_corrupt", "is_balanced", "task_config", "head_param_shapes", "init_model", "split_params",
           "model_forward", "model_backward", "accuracy"]

TASKS = ("sort", "cls", "tag", "mlm")
PAD, CLS, SEP, MASK = 0, 1, 2, 3
N_SPECIAL = 4
SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
IGNORE = -100
DATA_DIR = Path(__file__).resolve().parents[1] / "data"
CORPUS_FILE = "corpus.txt"


# ----------------------------------------------------------------------------- the tasks
@dataclass(frozen=True)
class Task:
    """A task: how to make a batch and what the head predicts.

    Attributes:
        name: one of ``TASKS``.
        head: "tagger" (per-token), "cls" ([CLS] classifier) or "mlm" (tied output layer).
        vocab_size: V, the token ids are in [0, V).
        n_classes: C, the head's output size (= V for mlm).
        seq_len: n, the length of every sequence, [CLS] included.
        options: task-specific settings (``n_symbols``, ``mask_prob``, …).
        vocab: the token strings (id → string) — characters for mlm.
    """

    name: str
    head: str
    vocab_size: int
    n_classes: int
    seq_len: int
    options: dict = field(default_factory=dict)
    vocab: tuple = ()
    corpus_ids: np.ndarray | None = field(default=None, repr=False, compare=False)

    def make_batch(self, rng: np.random.Generator, batch_size: int) -> dict:
        """{"input_ids": (B, n) int64, "attention_mask": (B, n) int64, "labels": (B,) or (B, n) int64}."""
        check_rng(rng)
        check_int(batch_size, "batch_size", minimum=1)
        return _MAKERS[self.name](self, rng, batch_size)

    def to_dict(self) -> dict:
        """What a checkpoint stores to rebuild the task with :func:`get_task`."""
        return {"name": self.name, "seq_len": self.seq_len, **self.options}


def _with_cls(body: np.ndarray) -> np.ndarray:
    """Prepend [CLS] to every row of ``body`` (B, L) → (B, L + 1)."""
    return np.concatenate([np.full((body.shape[0], 1), CLS, dtype=np.int64), body], axis=1)


def _ones_mask(ids: np.ndarray) -> np.ndarray:
    return np.ones_like(ids, dtype=np.int64)


def _sort_batch(task: Task, rng, B):
    S, L = task.options["n_symbols"], task.seq_len - 1
    x = rng.integers(0, S, size=(B, L))                              # symbols 0 … S−1
    labels = np.full((B, L + 1), IGNORE, dtype=np.int64)
    labels[:, 1:] = np.sort(x, axis=1)                               # i-th smallest at position i
    ids = _with_cls(x + N_SPECIAL)
    return {"input_ids": ids, "attention_mask": _ones_mask(ids), "labels": labels}


def is_balanced(brackets: np.ndarray) -> np.ndarray:
    """Dyck-1 membership of each row of ``brackets`` (B, L) holding +1 for "(" and −1 for ")":
    every prefix sum ≥ 0 and the total is 0."""
    depth = np.cumsum(brackets, axis=1)                              # (B, L)
    return (depth.min(axis=1) >= 0) & (depth[:, -1] == 0)


def _random_equal_count(rng, B, L):
    """(B, L) rows of ±1 with L/2 of each, uniformly permuted."""
    base = np.repeat(np.array([[1, -1]]), L // 2, axis=0).reshape(1, L)
    return rng.permuted(np.broadcast_to(base, (B, L)), axis=1)


def _cls_batch(task: Task, rng, B):
    L = task.seq_len - 1
    want_balanced = rng.random(B) < 0.5
    x = _random_equal_count(rng, B, L)                               # (B, L) ±1
    todo = np.flatnonzero(want_balanced & ~is_balanced(x))
    while todo.size:                                                 # rejection: P(balanced) = 1/(L/2 + 1)
        cand = _random_equal_count(rng, todo.size, L)
        ok = is_balanced(cand)
        x[todo[ok]] = cand[ok]
        todo = todo[~ok]
    labels = is_balanced(x).astype(np.int64)                         # the checker decides, always
    ids = _with_cls(np.where(x > 0, N_SPECIAL, N_SPECIAL + 1))       # "(" = 4, ")" = 5
    return {"input_ids": ids, "attention_mask": _ones_mask(ids), "labels": labels}


def _tag_batch(task: Task, rng, B):
    S, L = task.options["n_symbols"], task.seq_len - 1
    x = rng.integers(0, S, size=(B, L))
    counts = (x[:, :, None] == x[:, None, :]).sum(axis=2)           # (B, L): occurrences of x_i
    labels = np.full((B, L + 1), IGNORE, dtype=np.int64)
    labels[:, 1:] = np.minimum(counts, 3) - 1                        # 1, 2, ≥3 → 0, 1, 2
    ids = _with_cls(x + N_SPECIAL)
    return {"input_ids": ids, "attention_mask": _ones_mask(ids), "labels": labels}


def _mlm_batch(task: Task, rng, B):
    L, corpus = task.seq_len - 1, task.corpus_ids
    starts = rng.integers(0, corpus.size - L + 1, size=B)
    windows = corpus[starts[:, None] + np.arange(L)[None, :]]        # (B, L) character ids
    clean = _with_cls(windows)
    ids, labels = mlm_corrupt(clean, rng, task.vocab_size, mask_prob=task.options["mask_prob"])
    return {"input_ids": ids, "attention_mask": _ones_mask(ids), "labels": labels, "clean_ids": clean}


_MAKERS = {"sort": _sort_batch, "cls": _cls_batch, "tag": _tag_batch, "mlm": _mlm_batch}


# ----------------------------------------------------------------------------- MLM corruption
def mlm_corrupt(input_ids: np.ndarray, rng: np.random.Generator, vocab_size: int, mask_prob: float = 0.15,
                mask_id: int = MASK, n_special: int = N_SPECIAL) -> tuple[np.ndarray, np.ndarray]:
    """BERT's 80/10/10 corruption. Returns ``(corrupted_ids, labels)``, both like ``input_ids``.

    Ids below ``n_special`` are never chosen. Each other position is chosen with probability
    ``mask_prob``; a chosen one becomes ``mask_id`` w.p. 0.8, a uniform random regular token
    (id in [n_special, vocab_size)) w.p. 0.1, or stays as is w.p. 0.1. ``labels`` holds the
    original id at chosen positions and −100 elsewhere.
    """
    ids = as_int_array(input_ids, "input_ids")
    check_rng(rng)
    check_int(vocab_size, "vocab_size", minimum=n_special + 1)
    check_float(mask_prob, "mask_prob", 0.0, 1.0)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"input_ids must lie in [0, {vocab_size - 1}], got values in [{ids.min()}, {ids.max()}]")
    eligible = ids >= n_special
    u = rng.random(ids.shape + (3,))                                 # one draw per decision, fixed order
    chosen = eligible & (u[..., 0] < mask_prob)
    to_mask = chosen & (u[..., 1] < 0.8)
    to_random = chosen & ~to_mask & (u[..., 2] < 0.5)                # half of the remaining 20 %
    random_tokens = rng.integers(n_special, vocab_size, size=ids.shape)
    out = np.where(to_mask, mask_id, np.where(to_random, random_tokens, ids))
    labels = np.where(chosen, ids, IGNORE)
    return out.astype(np.int64), labels.astype(np.int64)


# ----------------------------------------------------------------------------- corpus and factory
def load_corpus(path: str | Path | None = None) -> str:
    """The shipped text (``transformer_np/data/corpus.txt``), whitespace runs collapsed to one space."""
    p = Path(path) if path is not None else DATA_DIR / CORPUS_FILE
    if not p.is_file():
        raise ValueError(f"corpus file not found: {p}")
    return " ".join(p.read_text(encoding="utf-8").split())


_DEFAULT_LEN = {"sort": 9, "cls": 13, "tag": 13, "mlm": 33}


def get_task(name: str, seq_len: int | None = None, n_symbols: int | None = None,
             mask_prob: float = 0.15, corpus_path: str | None = None) -> Task:
    """Build a task. ``seq_len`` counts the [CLS] position (defaults: sort 9, cls 13, tag 13, mlm 33).

    ``n_symbols``: alphabet size of sort (default 16) and tag (default 8).
    """
    check_choice(name, "task", TASKS)
    seq_len = _DEFAULT_LEN[name] if seq_len is None else seq_len
    check_int(seq_len, "seq_len", minimum=2)
    if name in ("sort", "tag"):
        S = (16 if name == "sort" else 8) if n_symbols is None else n_symbols
        check_int(S, "n_symbols", minimum=2)
        C = S if name == "sort" else 3
        vocab = SPECIAL_TOKENS + tuple(f"s{i}" for i in range(S))
        return Task(name, "tagger", N_SPECIAL + S, C, seq_len, {"n_symbols": S}, vocab)
    if name == "cls":
        if (seq_len - 1) % 2:
            raise ValueError(f"seq_len for cls must be odd ([CLS] + an even number of brackets), got {seq_len}")
        return Task(name, "cls", N_SPECIAL + 2, 2, seq_len, {}, SPECIAL_TOKENS + ("(", ")"))
    text = load_corpus(corpus_path)
    chars = tuple(sorted(set(text)))
    lookup = {c: i + N_SPECIAL for i, c in enumerate(chars)}
    corpus_ids = np.fromiter((lookup[c] for c in text), dtype=np.int64, count=len(text))
    if corpus_ids.size < seq_len:
        raise ValueError(f"the corpus has {corpus_ids.size} characters, fewer than seq_len − 1 = {seq_len - 1}")
    V = N_SPECIAL + len(chars)
    opts = {"mask_prob": float(mask_prob)}
    if corpus_path is not None:
        opts["corpus_path"] = str(corpus_path)
    return Task(name, "mlm", V, V, seq_len, opts, SPECIAL_TOKENS + chars, corpus_ids)


# ----------------------------------------------------------------------------- model = encoder + head
def task_config(task: Task, n_layers: int, d_model: int, n_heads: int = 4, norm: str = "post",
                d_ff: int | None = None, dropout: float = 0.0, activation: str = "gelu",
                layer_norm_eps: float = 1e-5) -> EncoderConfig:
    """An :class:`EncoderConfig` sized for ``task`` (vocabulary, max_len = seq_len, d_ff = 4 d)."""
    if not isinstance(task, Task):
        raise TypeError(f"task must be a Task (see get_task), got {describe(task)}")
    return EncoderConfig(n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                         d_ff=4 * d_model if d_ff is None else d_ff, activation=activation,
                         norm_position=norm, layer_norm_eps=layer_norm_eps, dropout=dropout,
                         vocab_size=task.vocab_size, max_len=task.seq_len)


def head_param_shapes(task: Task, config: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """The head's parameters (names start with ``head.``)."""
    d = config.d_model
    if task.head == "mlm":
        return {"head.transform.W": (d, d), "head.transform.b": (d,), "head.ln.gamma": (d,),
                "head.ln.beta": (d,), "head.bias": (task.vocab_size,)}
    return {"head.W": (d, task.n_classes), "head.b": (task.n_classes,)}


def init_model(task: Task, config: EncoderConfig, seed: int = 0, dtype=np.float32, std: float = 0.02) -> dict:
    """Encoder params (:func:`init_params`, seed ``seed``) + head params (N(0, std²) weights, zero
    biases, γ = 1), drawn from a separate generator so the encoder is the same for every head."""
    if config.vocab_size != task.vocab_size:
        raise ValueError(f"config.vocab_size must equal the task's vocabulary {task.vocab_size}, "
                         f"got {config.vocab_size}")
    params = init_params(config, seed=seed, dtype=dtype, std=std)
    rng = np.random.default_rng([seed, 1])
    for name, shape in head_param_shapes(task, config).items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "gamma":
            a = np.ones(shape)
        elif leaf in ("b", "beta", "bias"):
            a = np.zeros(shape)
        else:
            a = rng.normal(0.0, std, size=shape)
        params[name] = a.astype(np.dtype(dtype))
    return params


def split_params(params: dict) -> tuple[dict, dict]:
    """(encoder params, head params) — views of the same arrays, no copies."""
    enc = {k: v for k, v in params.items() if not k.startswith("head.")}
    head = {k: v for k, v in params.items() if k.startswith("head.")}
    return enc, head


def _mlm_head_forward(H, p, E, eps):
    z, c_lin = linear_forward(H, p["head.transform.W"], p["head.transform.b"])   # (B, n, d)
    a, c_act = activation_forward(z, "gelu")
    T, c_ln = layernorm_forward(a, p["head.ln.gamma"], p["head.ln.beta"], eps)  # (B, n, d)
    logits = T @ E.T + p["head.bias"]                                          # (B, n, V): tied to E_tok
    return logits, {"lin": c_lin, "act": c_act, "ln": c_ln, "T": T, "E": E}


def _mlm_head_backward(dlogits, c):
    T, E = c["T"], c["E"]
    d = T.shape[-1]
    g = {"head.bias": dlogits.reshape(-1, dlogits.shape[-1]).sum(axis=0)}     # (V,)
    dE = dlogits.reshape(-1, dlogits.shape[-1]).T @ T.reshape(-1, d)           # (V, d): the output use of E
    dT = dlogits @ E                                                           # (B, n, d)
    da, g["head.ln.gamma"], g["head.ln.beta"] = layernorm_backward(dT, c["ln"])
    dz = activation_backward(da, c["act"])
    dH, g["head.transform.W"], g["head.transform.b"] = linear_backward(dz, c["lin"])
    return dH, g, dE


def model_forward(params: dict, config: EncoderConfig, task: Task, batch: dict, training: bool = False,
                  rng: np.random.Generator | None = None) -> tuple[float, dict]:
    """Encoder + head + cross-entropy. Returns ``(loss, cache)``; ``cache["logits"]`` holds the
    head's output ((B, C) for cls, (B, n, C) otherwise) for accuracy/inspection."""
    if not isinstance(task, Task):
        raise TypeError(f"task must be a Task (see get_task), got {describe(task)}")
    if not isinstance(batch, dict) or "input_ids" not in batch or "labels" not in batch:
        raise TypeError(f"batch must be a dict with 'input_ids' and 'labels', got {describe(batch)}")
    enc, head = split_params(params)
    missing = sorted(set(head_param_shapes(task, config)) - set(head))
    if missing:
        raise ValueError(f"params is missing the {task.head} head's parameters {missing}")
    H, enc_cache = encoder_forward(enc, config, input_ids=batch["input_ids"],
                                   attention_mask=batch.get("attention_mask"), training=training, rng=rng)
    if task.head == "cls":
        logits, hc = cls_classifier_forward(H, head["head.W"], head["head.b"])
    elif task.head == "tagger":
        logits, hc = tagger_forward(H, head["head.W"], head["head.b"])
    else:
        logits, hc = _mlm_head_forward(H, head, enc["embeddings.word"], config.layer_norm_eps)
    loss, ce = cross_entropy_forward(logits, batch["labels"])
    return loss, {"kind": "model", "head": task.head, "enc": enc_cache, "head_cache": hc, "ce": ce,
                  "logits": logits}


def model_backward(cache: dict) -> dict:
    """Gradient of the loss w.r.t. every parameter (encoder and head), keyed like the params.

    With the tied MLM output layer, ``embeddings.word`` receives the sum of its input-side
    gradient (the lookup's scatter-add) and its output-side gradient dlogitsᵀ T."""
    check_cache(cache, "cache", "model")
    dlogits = cross_entropy_backward(1.0, cache["ce"])
    hc, tied = cache["head_cache"], None
    if cache["head"] == "cls":
        dH, dW, db = cls_classifier_backward(dlogits, hc)
        g_head = {"head.W": dW, "head.b": db}
    elif cache["head"] == "tagger":
        dH, dW, db = tagger_backward(dlogits, hc)
        g_head = {"head.W": dW, "head.b": db}
    else:
        dH, g_head, tied = _mlm_head_backward(dlogits, hc)
    grads = encoder_backward(dH.astype(cache["enc"]["dtype"], copy=False), cache["enc"])
    if tied is not None:
        grads["embeddings.word"] = grads["embeddings.word"] + tied
    grads.update(g_head)
    return grads


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of non-ignored positions where argmax(logits) = label (nan if none)."""
    labels = as_int_array(labels, "labels")
    keep = labels != IGNORE
    if not keep.any():
        return float("nan")
    return float((logits.argmax(axis=-1)[keep] == labels[keep]).mean())
