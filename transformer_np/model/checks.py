r"""The encoder's checks, kept out of :mod:`transformer_np.model.stack` by role: the arguments of
:func:`~transformer_np.model.stack.encoder_forward` and
:func:`~transformer_np.model.stack.encoder_layer_forward` (the path flags, dropout's random generator,
the stack's inputs), and the errors that name a non-finite parameter or the layer where a pass overflowed.

The encoder calls them once, before its kernels (which check nothing). Nothing here is public API; the
module does not import the stack module (which imports it).
"""

from __future__ import annotations

import numpy as np

from .._validate import all_finite, as_float_array, as_int_array, check_bool, check_rng
from ..errors import InputTypeError, InputValueError, NonFiniteError
from ..ops.cache import ParamGuard
from ..ops.masks import validate_attention_mask
from .config import EncoderConfig

__all__: list[str] = []


# ----------------------------------------------------------------------------- arguments
def _check_paths(fast, store_attention) -> None:
    check_bool(fast, "fast")
    check_bool(store_attention, "store_attention")
    if not fast and not store_attention:
        raise InputValueError("store_attention=False needs the fast path (fast=True): the plain path keeps "
                              "the textbook cache, attention matrix included")


def _check_dropout_rng(config: EncoderConfig, training, rng) -> None:
    check_bool(training, "training")
    if training and config.dropout > 0:
        if rng is None:
            raise InputValueError(f"rng must be a numpy.random.Generator when training=True and dropout = "
                                  f"{config.dropout} > 0 (e.g. rng=np.random.default_rng(0)), got None")
        check_rng(rng)


def _check_inputs(config, dtype, input_ids, attention_mask, token_type_ids, inputs_embeds):
    if (input_ids is None) == (inputs_embeds is None):
        raise InputValueError("give exactly one of input_ids and inputs_embeds, got "
                              + ("both" if input_ids is not None else "neither"))
    if input_ids is not None:
        if not config.has_embeddings:
            raise InputValueError("input_ids needs a token embedding, but the config has vocab_size = None; "
                                  "pass inputs_embeds (H^(0)) instead")
        ids = as_int_array(input_ids, "input_ids", ndim=2)
        B, n = ids.shape
        V = config.vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= V):
            bad = ids[(ids < 0) | (ids >= V)].flat[0]
            raise InputValueError(f"input_ids must lie in [0, {V - 1}] (vocab_size = {V}), got {int(bad)}")
        x = ids
    else:
        x = as_float_array(inputs_embeds, "inputs_embeds", ndim=3)
        B, n, d = x.shape
        if d != config.d_model:
            raise InputValueError(f"inputs_embeds must have shape (B, n, d_model) = (*, *, {config.d_model}), "
                                  f"got shape {x.shape}")
        if x.dtype != dtype:
            raise InputTypeError(f"inputs_embeds must have the params' dtype {dtype}, got {x.dtype} "
                                 f"(convert with inputs_embeds.astype(np.{dtype}))")
    if n < 1 or B < 1:
        raise InputValueError(f"the input must have at least one sequence and one position, got (B, n) = ({B}, {n})")
    if n > config.max_len:
        raise InputValueError(f"sequence length n = {n} exceeds max_len = {config.max_len}")
    if attention_mask is not None:
        attention_mask = validate_attention_mask(attention_mask, (B, n))
    if token_type_ids is not None:
        if input_ids is None:
            raise InputValueError("token_type_ids only applies with input_ids (inputs_embeds is already H^(0))")
        tt = as_int_array(token_type_ids, "token_type_ids", ndim=2)
        if tt.shape != (B, n):
            raise InputValueError(f"token_type_ids must have shape (B, n) = {(B, n)}, got shape {tt.shape}")
        T = config.type_vocab_size
        if T == 0:
            if tt.any():
                raise InputValueError("token_type_ids given, but the config has type_vocab_size = 0")
            tt = None
        elif tt.size and (tt.min() < 0 or tt.max() >= T):
            raise InputValueError(f"token_type_ids must lie in [0, {T - 1}] (type_vocab_size = {T}), "
                                  f"got {int(tt[(tt < 0) | (tt >= T)].flat[0])}")
        token_type_ids = tt
    return x, attention_mask, token_type_ids


# ----------------------------------------------------------------------------- non-finite values
def _raise_nonfinite_param(params: dict, names, label: str = "params") -> None:
    """Raise :class:`NonFiniteError` naming the first of ``names`` in ``params`` that holds NaN/inf (the
    error path of an inference forward whose output is not finite); return when they are all finite."""
    for name in names:
        a = params[name]
        if not all_finite(a):
            _raise_nonfinite(label, name, a)


def _raise_nonfinite(label: str, name: str, a: np.ndarray) -> None:
    bad = int(a.size - np.count_nonzero(np.isfinite(a)))
    first = np.unravel_index(int(np.argmin(np.isfinite(a))), a.shape)
    raise NonFiniteError(f"{label}[{name!r}] must contain only finite values, got {bad} NaN/inf entries "
                         f"(the first at index {tuple(int(i) for i in first)}: {a[first]}); the weights are "
                         f"corrupt or came from a diverged run")


def _check_finite_params(params: dict, guard: ParamGuard, label: str = "params") -> None:
    """Refuse a parameter holding NaN/inf, naming it — at almost no cost: the guard's fingerprints (rᵀA with
    positive r, or a copy of a vector) are finite whenever the parameter is, so only a parameter whose
    fingerprint is not finite (NaN/inf inside, or a sum that overflowed) is scanned in full."""
    for name, fp in guard.prints.items():
        if not all_finite(fp) and not all_finite(params[name]):
            _raise_nonfinite(label, name, params[name])


def _raise_overflow(where: str, hidden: list, dtype) -> None:
    """Name the first layer whose output stopped being finite (the input was checked finite)."""
    first = next((i for i, h in enumerate(hidden) if not all_finite(h)), len(hidden))
    at = f"in layer {first}" if first < len(hidden) else "in the final LayerNorm"
    scale = float(np.max(np.abs(hidden[0])))
    raise NonFiniteError(f"the {where} pass overflowed {dtype} {at}: its output is not finite although the input "
                         f"was (max |H^(0)| = {scale:.3g}); the input or weight scale is too large for this dtype "
                         f"(rescale inputs_embeds / the weights, or use float64)")
