r"""The inputs of :func:`transformer_np.testing.compare_with_torch`, checked (a part of it: import from there).

Every mask torch's encoder modules take, and Hugging Face's, with the two conventions side by side:

==============================  ===========================  ==========================================================
argument                        convention                   shape
==============================  ===========================  ==========================================================
``attention_mask``              Hugging Face: integers,      (B, n)
                                1 = real token, 0 = padding
``src_key_padding_mask``        torch: boolean,              (B, n)
                                True = padding
``src_mask`` / ``attn_mask``    torch: boolean (True = may   (n, n), or (B·h, n, n) per head (torch's batch-major
                                not attend) or float (added  order: row b·h + head)
                                to the scores, −inf blocks)
``is_causal``                   torch: position i attends    — (alone: the causal mask is built and given to torch
                                to j ≤ i only                with its hint; with ``src_mask``: that mask must be causal)
==============================  ===========================  ==========================================================

A mask that fits neither padding convention (a boolean ``attention_mask``, an integer ``src_key_padding_mask``,
values other than 0/1) is refused with a message saying which is which; so is a real token that may attend to no
key once every mask is combined (its undefined value would reach every later position). A *padded* query with no key
(a causal mask with padding on the left) is left out of the comparison instead (:mod:`transformer_np.testing.rows`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._validate import describe
from ..errors import InputTypeError, InputValueError
from . import rows as _rows

CONVENTIONS = ("attention_mask is Hugging Face's convention: integers, 1 = real token, 0 = padding; "
               "src_key_padding_mask is torch's: booleans, True = padding")


def is_bfloat16(x) -> bool:
    """``x`` is a torch bfloat16 tensor (NumPy has no bfloat16: :func:`to_numpy` reads it as float32, exactly)."""
    return str(getattr(x, "dtype", "")) == "torch.bfloat16"


def to_numpy(x, name: str) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        x = (x.float() if is_bfloat16(x) else x).numpy()     # bfloat16 → float32 is exact (its upper 16 bits)
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise InputTypeError(f"{name} must be a numpy array or torch tensor, got {describe(x)}")
    return x


def float_input(x, name: str, ndim: int) -> np.ndarray:
    """A finite float array of ``ndim`` dimensions, in its own dtype."""
    x = to_numpy(x, name)
    if not np.issubdtype(x.dtype, np.floating):
        raise InputTypeError(f"{name} must be a float array (the layer's input), got dtype {x.dtype}")
    if x.ndim != ndim:
        raise InputValueError(f"{name} must have {ndim} dimensions, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise InputValueError(f"{name} must be finite")
    return x


def grad_output(R, shape: tuple, dt: np.dtype, pad: np.ndarray | None, seed: int) -> np.ndarray:
    """The upstream gradient R: given, or standard normal (seeded) with zeros at padded positions.
    ``pad`` is a boolean array broadcastable to ``shape`` (True = padded position).

    The default R has a stream of its own, ``default_rng([seed, 1])``: drawn from ``default_rng(seed)`` it equalled
    an input made the usual way (``np.random.default_rng(0).normal(size=x_shape)``), and a Post-LN layer's output
    is nearly that input normalised, so the LayerNorm backward cancelled R to ~1 % of its size and round-off
    failed float32's tolerances (a BertLayer at HF's init: input gradient 5.9e-6 norm-relative against 1.2e-7
    with an independent R)."""
    if R is None:
        R = np.random.default_rng([seed, 1]).standard_normal(shape)
        if pad is not None:
            R = np.where(pad, 0.0, R)
        return R.astype(dt)
    R = to_numpy(R, "grad_output")
    if R.shape != tuple(shape):
        raise InputValueError(f"grad_output must have the output's shape {tuple(shape)}, got shape {R.shape}")
    if not np.issubdtype(R.dtype, np.floating) or not np.all(np.isfinite(R)):
        raise InputValueError("grad_output must be a finite float array")
    return R


# ----------------------------------------------------------------------------- padding
def padding(attention_mask, src_key_padding_mask, B: int, n: int) -> np.ndarray | None:
    """The (B, n) int64 mask, 1 = real token, from either convention (or None); refused when it fits neither."""
    if attention_mask is not None and src_key_padding_mask is not None:
        raise InputValueError("give attention_mask or src_key_padding_mask, not both (they say the same thing the "
                              f"opposite way round: {CONVENTIONS})")
    if src_key_padding_mask is not None:
        m = to_numpy(src_key_padding_mask, "src_key_padding_mask")
        if m.dtype != bool:
            hint = (" — it holds 0 and 1: if 1 marks real tokens it is Hugging Face's mask, pass it as "
                    "attention_mask=" if np.isin(m, (0, 1)).all() else "")
            raise InputTypeError(f"src_key_padding_mask must be boolean (torch's convention, True = padding), got "
                                 f"dtype {m.dtype}{hint} ({CONVENTIONS})")
        _padding_shape(m, "src_key_padding_mask", B, n)
        am = (~m).astype(np.int64)
        name = "src_key_padding_mask"
    elif attention_mask is not None:
        m = to_numpy(attention_mask, "attention_mask")
        if m.dtype == bool:
            raise InputTypeError("attention_mask is boolean, which fits neither convention safely: "
                                 f"{CONVENTIONS}. Pass torch's mask as src_key_padding_mask=, or Hugging Face's as "
                                 "integers (attention_mask.astype(int))")
        _padding_shape(m, "attention_mask", B, n)
        if not np.all((m == 0) | (m == 1)):
            bad = np.unique(m[(m != 0) & (m != 1)])[:4].tolist()
            raise InputValueError(f"attention_mask must hold 1 (real token) and 0 (padding) only, got values {bad} "
                                  f"({CONVENTIONS})")
        am = m.astype(np.int64)
        name = "attention_mask"
    else:
        return None
    empty = np.flatnonzero(am.sum(axis=1) == 0)
    if empty.size:
        hint = (" — if 1 marks padding in your mask, it is torch's convention: pass it as src_key_padding_mask= "
                "(booleans)" if name == "attention_mask" else "")
        raise InputValueError(f"{name} row {int(empty[0])} has no real token: attention over no key is undefined "
                              f"(torch returns NaN there){hint}")
    return am


def _padding_shape(m: np.ndarray, name: str, B: int, n: int) -> None:
    if m.shape != (B, n):
        raise InputValueError(f"{name} must have shape (B, n) = {(B, n)}, got shape {m.shape}")


# ----------------------------------------------------------------------------- attention masks
@dataclass
class AttentionMasks:
    """The masks of one comparison: ``am`` (B, n) 1 = real token, or None; ``extra`` our additive mask
    broadcastable to (B, h, n, n) in the run's dtype, padding included (a sum, not the elementwise minimum of
    :func:`~transformer_np.ops.masks.combine_masks`, which holds for 0/−∞ masks only), or None; ``torch_mask``
    and ``is_causal`` what torch is given (its own mask, unchanged, or the causal mask built here); ``dead`` (B, n)
    True at the padded queries left with no key (left out of the comparison), or None."""

    am: np.ndarray | None = None
    extra: np.ndarray | None = None
    torch_mask: object = None
    is_causal: bool = False
    notes: list = field(default_factory=list)
    dead: np.ndarray | None = None


def attention_masks(am, src_mask, is_causal, B: int, h: int, n: int, dt: np.dtype, tdt, torch) -> AttentionMasks:
    """torch's ``src_mask``/``attn_mask`` and ``is_causal`` → our additive mask, checked; with ``am``, every query
    must keep a key."""
    if isinstance(is_causal, (np.bool_,)):
        is_causal = bool(is_causal)
    if not isinstance(is_causal, bool):
        raise InputTypeError(f"is_causal must be a bool, got {describe(is_causal)}")
    out = AttentionMasks(am=am, is_causal=is_causal)
    causal = np.triu(np.ones((n, n), dtype=bool), k=1)                     # (n, n): True = the future
    if src_mask is None:
        if is_causal:                                                      # torch needs the mask with its hint
            out.torch_mask = torch.nn.Transformer.generate_square_subsequent_mask(n, dtype=tdt)
            out.extra = np.where(causal, -np.inf, 0.0).astype(dt)[None, None]       # (1, 1, n, n)
            out.notes.append("is_causal=True: the causal mask (torch's generate_square_subsequent_mask) is given to "
                             "torch with the hint, and added to our scores")
    else:
        tensor = src_mask if hasattr(src_mask, "detach") else None
        m = to_numpy(src_mask, "src_mask")
        if m.ndim == 2 and m.shape == (n, n):
            per_head = False
        elif m.ndim == 3 and m.shape == (B * h, n, n):
            per_head = True
        else:
            raise InputValueError(f"src_mask (attn_mask) must have shape (n, n) = {(n, n)} or, per head, "
                                  f"(B·num_heads, n, n) = {(B * h, n, n)}, got shape {m.shape}")
        if m.dtype == bool:
            blocked = m
            add = np.where(m, -np.inf, 0.0).astype(dt)
            if tensor is None:
                tensor = torch.from_numpy(m.copy())
        elif np.issubdtype(m.dtype, np.floating):
            if np.isnan(m).any() or np.isposinf(m).any():
                raise InputValueError("src_mask (attn_mask) must hold finite numbers or -inf (a blocked position), "
                                      "got NaN or +inf")
            add = m.astype(dt)
            blocked = np.isneginf(add)
            tensor = torch.from_numpy(add.copy())
            if m.dtype != dt:
                out.notes.append(f"src_mask: {m.dtype} cast to {dt}, the run's dtype (torch needs the float mask in "
                                 "the query's dtype)")
        else:
            raise InputTypeError("src_mask (attn_mask) must be boolean (torch's convention: True = may not attend) "
                                 f"or float (added to the scores; -inf blocks), got dtype {m.dtype}")
        if is_causal:
            cut = blocked.reshape(-1, n, n)
            if not (np.array_equal(cut, np.broadcast_to(causal, cut.shape))
                    and np.all(add.reshape(-1, n, n)[:, ~causal] == 0)):
                raise InputValueError("is_causal=True is torch's hint that src_mask is the causal mask (position i "
                                      "attends to j <= i), but src_mask is not: torch may then ignore the mask. "
                                      "Pass is_causal=False with your mask, or is_causal=True alone")
        out.torch_mask = tensor
        out.extra = add.reshape(B, h, n, n) if per_head else add[None, None]          # (B|1, h|1, n, n)
    out.dead = _every_real_query_keeps_a_key(out, B, h, n)
    if out.extra is not None and am is not None:         # padding on top: a padded key is blocked whatever the
        out.extra = np.where((am == 0)[:, None, None, :], -np.inf, out.extra).astype(dt)   # mask adds (B, h|1, n, n)
    out.extra = _rows.finite_mask(out.extra, out.dead)   # a row with no key: finite and uniform in ours, not 0/0
    return out


def _every_real_query_keeps_a_key(masks: AttentionMasks, B: int, h: int, n: int) -> np.ndarray | None:
    """(B, n) the padded queries with no key (left out of the comparison), or None; a real token with no key is
    refused."""
    rows = _rows.mask_rows(masks.extra, masks.am, B, n)
    if rows is None:
        return None
    real = rows if masks.am is None else rows & (masks.am == 1)
    dead = np.argwhere(real)
    if dead.size:
        b, q = (int(v) for v in dead[0])
        raise InputValueError(f"with these masks, query {q} of sequence {b}, a real token, may attend to no key: "
                              "attention over no key is undefined (torch returns NaN or 0 there), and its value "
                              "reaches every later position (a padded query with no key is left out of the "
                              "comparison instead)")
    return rows


# ----------------------------------------------------------------------------- ids
def check_ids(ids: np.ndarray, config, model: str) -> None:
    """``input_ids`` within the vocabulary and within the position table, before torch sees them (torch answers
    with an IndexError, transformers with a RuntimeError about sizes)."""
    from ..io.families import HFEncoderConfig
    from ..io.hf_model import position_ids

    V = config.vocab_size
    bad = np.argwhere((ids < 0) | (ids >= V))
    if bad.size:
        at = tuple(int(i) for i in bad[0])
        raise InputValueError(f"inputs (input_ids) must be token ids in [0, vocab_size) = [0, {V}) for {model}, got "
                              f"{int(ids[at])} at index {at} ({len(bad)} ids out of range)")
    if isinstance(config, HFEncoderConfig):
        rows, pos = config.n_positions, position_ids(ids, config)
    else:
        rows, pos = config.max_len, np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    if pos.size and int(pos.max()) >= rows:
        longest = rows - (config.offset if isinstance(config, HFEncoderConfig) else 0)
        raise InputValueError(f"inputs (input_ids) has sequences of {ids.shape[1]} tokens, which need position ids up "
                              f"to {int(pos.max())}, but {model}'s position table has {rows} rows "
                              f"(max_position_embeddings): at most {longest} tokens")


def check_token_types(tt: np.ndarray, config, B: int, n: int, model: str) -> None:
    T = config.type_vocab_size
    if not T:
        raise InputValueError(f"token_type_ids given, but {model} has no token-type embedding")
    if tt.shape != (B, n):
        raise InputValueError(f"token_type_ids must have the shape of input_ids {(B, n)}, got shape {tt.shape}")
    bad = np.argwhere((tt < 0) | (tt >= T))
    if bad.size:
        at = tuple(int(i) for i in bad[0])
        raise InputValueError(f"token_type_ids must be in [0, type_vocab_size) = [0, {T}) for {model}, got "
                              f"{int(tt[at])} at index {at}")


def padding_index_positions(mod, ids: np.ndarray, config) -> tuple[np.ndarray, list[str]]:
    """(B, n) True where a token reads an ``nn.Embedding`` row at its ``padding_idx`` (the word table's, and
    RoBERTa's position table's), and the tables concerned. torch defines the gradient of such a row as 0; ours
    is the true derivative of the forward, so the two agree only when the upstream gradient is 0 there."""
    from ..io.families import HFEncoderConfig
    from ..io.hf_model import position_ids

    hit = np.zeros(ids.shape, dtype=bool)
    tables = []
    for name, m in mod.named_modules():
        idx = getattr(m, "padding_idx", None)
        if idx is None or not name.endswith(("word_embeddings", "tok_embeddings", "position_embeddings")):
            continue
        if name.endswith(("word_embeddings", "tok_embeddings")):          # tok_embeddings: ModernBERT's word table
            where = ids == idx
        elif isinstance(config, HFEncoderConfig):
            where = position_ids(ids, config) == idx
        else:
            where = np.broadcast_to(np.arange(ids.shape[1]), ids.shape) == idx
        if where.any():
            hit |= where
            tables.append(f"{name} (padding_idx = {idx})")
    return hit, tables
