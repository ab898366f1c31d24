"""Contextual embeddings in all-MiniLM-L6-v2: the measurements of notebook 03 (drawn by
:mod:`transformer_np.course.plots.contextual`).

Sentence vectors use the model's own pooling rule, :func:`transformer_np.io.pretrained.pool` (mean over the real
tokens, as sentence-transformers), so the numbers here are those of ``model.encode``.
"""

from __future__ import annotations

import numpy as np

from .._compat import forward_moved as _forward_moved
from ..io.pretrained import PretrainedEncoder, check_sentences, cosine_similarity_matrix, l2_normalize, pool

__all__ = ["word_vectors_by_layer", "layer_labels", "sense_similarity_by_layer",
           "nearest_centroid_loo_accuracy", "mean_attention_distance", "probe_by_layer", "notable_heads",
           "contextual_report", "separation", "BANK_SENTENCES", "POS_SENTENCES", "SENSE_SENTENCES",
           "ATTENTION_SENTENCE"]


# ----------------------------------------------------------------------------- contextual embeddings
# The measurements of notebooks/03_contextual_embeddings.ipynb and its figures.
BANK_SENTENCES = {
    # "bank" is the 4th token ([CLS] the X bank …) in every sentence, so E_tok + E_pos + E_type,
    # and hence H^(0), is identical for all of them: only the context differs.
    "river": ["the river bank was flooded after the storm .",
              "the grassy bank sloped down to the water .",
              "the muddy bank of the stream was slippery .",
              "the steep bank above the lake had collapsed ."],
    "money": ["the savings bank was closed after the crash .",
              "the central bank raised interest rates again .",
              "the local bank approved my loan yesterday .",
              "the investment bank hired new traders ."],
}


def word_vectors_by_layer(model: PretrainedEncoder, sentences, word: str, dtype=np.float64) -> np.ndarray:
    """The vector of ``word`` (a single vocabulary piece, first occurrence) in each sentence at
    every depth: row 0 the static embedding E_tok[word], rows 1 … N+1 the hidden states
    H^(0) … H^(N). Returns (N + 2, S, d_model)."""
    sentences = check_sentences(sentences)
    if word not in model.tokenizer.vocab:
        raise ValueError(f"word {word!r} is not a single piece of the vocabulary")
    wid = model.tokenizer.vocab[word]
    batch = model.tokenize(sentences)
    pos = []
    for s, row in zip(sentences, batch["input_ids"]):
        hit = np.flatnonzero(row == wid)
        if hit.size == 0:
            raise ValueError(f"word {word!r} is not a token of the sentence {s!r}")
        pos.append(int(hit[0]))
    hs = model.forward(batch, dtype=dtype, output_hidden_states=True)["hidden_states"]
    rows = np.arange(len(sentences))
    static = np.broadcast_to(model.params_as(dtype)["embeddings.word"][wid], (len(sentences), model.config.d_model))
    return np.stack([static] + [h[rows, pos] for h in hs])                 # (N + 2, S, d)


def layer_labels(n_layers: int) -> list[str]:
    """["E_tok", "H^(0)", …, "H^(N)"] for the rows of :func:`word_vectors_by_layer`."""
    return ["E_tok"] + [f"H^({l})" for l in range(n_layers + 1)]


def sense_similarity_by_layer(V: np.ndarray, labels) -> dict[str, np.ndarray]:
    """Mean cosine between pairs of occurrences with the same label ("within") and with
    different labels ("across") at each depth. V (L, S, d) → {"within": (L,), "across": (L,)}."""
    labels = np.asarray(labels)
    same = labels[:, None] == labels[None, :]
    off = ~np.eye(len(labels), dtype=bool)
    within, across = [], []
    for X in V:
        C = cosine_similarity_matrix(X)
        within.append(C[same & off].mean())
        across.append(C[~same].mean())
    return {"within": np.array(within), "across": np.array(across)}


def nearest_centroid_loo_accuracy(X: np.ndarray, labels) -> float:
    """Leave-one-out accuracy of a nearest-centroid classifier (cosine) on the rows of X (S, d):
    each row is assigned the label whose centroid (of the other rows) is closest in angle."""
    labels = np.asarray(labels)
    U = l2_normalize(np.asarray(X, dtype=np.float64))
    classes = np.unique(labels)
    correct = 0
    for i in range(len(U)):
        keep = np.arange(len(U)) != i
        cents = np.stack([U[keep & (labels == c)].mean(0) for c in classes])    # (C, d)
        correct += classes[np.argmax(l2_normalize(cents) @ U[i])] == labels[i]
    return correct / len(U)


def mean_attention_distance(attentions, attention_mask: np.ndarray) -> np.ndarray:
    """The average distance |i − j| travelled by the attention mass that goes from a real word
    to a real word, per layer and head: Σ_ij A_ij |i − j| / Σ_ij A_ij over word positions i, j,
    with [CLS] and [SEP] left out as queries and keys (they act as attention "sinks"; mass
    sent to them has no meaningful distance). attentions: N arrays (B, h, T, T) → (N, h)."""
    m = np.asarray(attention_mask).astype(bool).copy()                    # (B, T)
    lengths = m.sum(1)
    m[:, 0] = False
    m[np.arange(len(m)), lengths - 1] = False                             # drop [CLS] and [SEP]
    T = m.shape[1]
    dist = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])           # (T, T)
    pair = (m[:, :, None] & m[:, None, :])[:, None]                       # (B, 1, T, T) word → word
    out = []
    for A in attentions:
        Aw = A * pair                                                      # (B, h, T, T)
        out.append((Aw * dist).sum((0, 2, 3)) / np.maximum(Aw.sum((0, 2, 3)), 1e-300))   # (h,)
    return np.stack(out)


# Two small hand-made probing sets for the lesson's "syntax low, semantics high" intuition.
# Each word (one vocabulary piece) occurs in two sentences per class.
POS_SENTENCES = {   # syntax: word -> (used as a noun, used as a verb)
 "book": (["she read a book on the train .", "the book was long ."],
          ["please book a table for two .", "we book our flights early ."]),
 "watch": (["he wore a gold watch .", "my watch stopped at noon ."],
           ["we watch the news every night .", "they watch the birds ."]),
 "park": (["the children played in the park .", "a park opened nearby ."],
          ["you can park the car here .", "they park outside the shop ."]),
 "light": (["the light was too bright .", "turn off the light ."],
           ["light the candles now .", "they light a fire every evening ."]),
 "run": (["she went for a run .", "the run took an hour ."], ["i run every morning .", "they run to the station ."]),
 "play": (["we saw a play last night .", "the play was funny ."],
          ["the kids play outside .", "we play chess on sundays ."]),
 "fish": (["the fish swam away .", "we ate fish for dinner ."], ["they fish in the lake .", "we fish every summer ."]),
 "call": (["i missed your call .", "the call lasted an hour ."],
          ["please call me tomorrow .", "they call their mother daily ."]),
}
SENSE_SENTENCES = {  # semantics: word -> (natural sense, human-made / institutional sense)
 "bank": (["the river bank was muddy .", "we sat on the grassy bank ."],
          ["the bank raised interest rates .", "i opened an account at the bank ."]),
 "plant": (["the plant needs water and sunlight .", "a green plant grew by the window ."],
           ["the plant produces steel for cars .", "workers at the power plant went on strike ."]),
 "bat": (["a bat flew out of the cave .", "the bat hunts insects at night ."],
         ["he swung the bat at the ball .", "she bought a new cricket bat ."]),
 "spring": (["water flowed from the mountain spring .", "we drank from a cold spring ."],
            ["the spring in the mattress broke .", "a metal spring holds the door ."]),
 "mouse": (["the cat chased a mouse .", "a mouse ate the cheese ."],
           ["click the left mouse button .", "my computer mouse stopped working ."]),
 "crane": (["a crane stood in the marsh .", "the crane caught a fish ."],
           ["the crane lifted the steel beam .", "a tall crane towered over the site ."]),
 "seal": (["the seal swam near the rocks .", "a seal rested on the ice ."],
          ["break the seal on the envelope .", "the seal on the jar was tight ."]),
 "current": (["the current swept the boat away .", "a strong current runs in the river ."],
             ["the current flows through the wire .", "measure the electric current ."]),
}


def probe_by_layer(model: PretrainedEncoder, sets: dict, dtype=np.float64) -> dict[str, np.ndarray]:
    """Two simple measurements per depth (E_tok, H^(0) … H^(N)) on a set {word: (class-0
    sentences, class-1 sentences)}:

    * ``"accuracy"``: leave-one-out nearest-centroid accuracy of the class over *all* words
      pooled (a class direction shared across words, e.g. noun vs verb). The same word is in
      both classes, so word identity alone cannot help: a left-out vector's own-word twins sit
      in the other class, which pushes accuracy *below* 0.5 when only identity is encoded.
    * ``"gap"``: for each word, mean cosine within a class minus across classes, averaged over
      words (how far apart the two usages of one word are).
    """
    Vs, labels, gaps = [], [], []
    for word, (a, b) in sets.items():
        V = word_vectors_by_layer(model, list(a) + list(b), word, dtype)   # (L, S_w, d)
        lab = [0] * len(a) + [1] * len(b)
        r = sense_similarity_by_layer(V, lab)
        Vs.append(V)
        labels += lab
        gaps.append(r["within"] - r["across"])
    V = np.concatenate(Vs, axis=1)                                          # (L, S, d)
    acc = np.array([nearest_centroid_loo_accuracy(X, labels) for X in V])
    return {"accuracy": acc, "gap": np.mean(gaps, axis=0)}


ATTENTION_SENTENCE = "the river bank was flooded after the storm ."


def notable_heads(A: list, tokens: list[str], query: str = "bank", key: str = "river") -> dict[str, tuple[int, int]]:
    """Pick (layer, head) pairs with a recognisable pattern in one sentence's attention maps
    A[ℓ] (h, T, T), 0-based layer: the strongest previous-token head, next-token head,
    [SEP]-sink head, and the head of the upper half of the stack where ``query`` attends most
    to ``key``."""
    T = len(tokens)
    prev = [(A[l][h].diagonal(-1).mean(), (l, h)) for l in range(len(A)) for h in range(A[l].shape[0])]
    nxt = [(A[l][h].diagonal(1).mean(), (l, h)) for l in range(len(A)) for h in range(A[l].shape[0])]
    sink = [(A[l][h][:, T - 1].mean(), (l, h)) for l in range(len(A)) for h in range(A[l].shape[0])]
    qi, ki = tokens.index(query), tokens.index(key)
    upper = range(len(A) // 2, len(A))          # upper half: not the trivial previous-token head
    qk = [(A[l][h][qi, ki], (l, h)) for l in upper for h in range(A[l].shape[0])]
    return {"previous token": max(prev)[1], "next token": max(nxt)[1], "[SEP] sink": max(sink)[1],
            f"'{query}' → '{key}'": max(qk)[1]}


def contextual_report(model: PretrainedEncoder) -> dict:
    """Every number of notebook 03 and the contextual_* figures, computed in float64."""
    sents = BANK_SENTENCES["river"] + BANK_SENTENCES["money"]
    senses = ["river"] * len(BANK_SENTENCES["river"]) + ["money"] * len(BANK_SENTENCES["money"])
    V = word_vectors_by_layer(model, sents, "bank")                         # (N + 2, 8, d)
    batch = model.tokenize(sents)
    H = model.forward(batch, dtype=np.float64)
    one = model.tokenize([ATTENTION_SENTENCE])
    att = model.forward(one, dtype=np.float64, output_attentions=True)["attentions"]
    tokens = model.tokenizer.convert_ids_to_tokens(one["input_ids"][0])
    A = [a[0] for a in att]                                                 # N × (h, T, T)
    return {
        "sentences": sents, "senses": senses, "layers": layer_labels(model.config.n_layers),
        "bank_vectors": V, "bank_similarity": sense_similarity_by_layer(V, senses),
        "bank_probe": np.array([nearest_centroid_loo_accuracy(X, senses) for X in V]),
        "cls_cosine": cosine_similarity_matrix(H[:, 0]),
        "mean_cosine": cosine_similarity_matrix(pool(H, batch["attention_mask"], "mean")),
        "attention_tokens": tokens, "attentions": A, "heads": notable_heads(A, tokens),
        "attention_distance": mean_attention_distance(att, one["attention_mask"]),
        "pos_probe": probe_by_layer(model, POS_SENTENCES), "sense_probe": probe_by_layer(model, SENSE_SENTENCES),
    }


def separation(C: np.ndarray, senses) -> float:
    """Mean cosine between sentences of the same sense minus across senses, from a cosine matrix C (S, S)."""
    s = np.asarray(senses)
    same, off = s[:, None] == s[None, :], ~np.eye(len(s), dtype=bool)
    return float(C[same & off].mean() - C[~same].mean())


_separation = separation          # the name used before 0.2

# Moved in 0.2: the figures to transformer_np.course.plots.contextual.
__getattr__ = _forward_moved(__name__, {n: "transformer_np.course.plots.contextual" for n in (
    "plot_bank_by_layer", "plot_pooling", "plot_heads", "plot_probes", "save_figures")})
