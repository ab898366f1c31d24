r"""Forward and backward of a Hugging Face family model: its embedding front-end around our stack.

For a family config (:class:`~transformer_np.io.families.HFEncoderConfig`) the model is

    e_i    = E_word[x_i] + E_pos[π_i] + E_type[t_i]          (B, n, E)   tables of width E
    H^(0)  = Dropout(LN_E(e))  [· W_p + b_p]                 (B, n, d)   projection when factorised
    H^(N)  = the encoder stack on H^(0)                       (B, n, d)   :func:`encoder_forward`

with π_i = i (BERT, DistilBERT, ALBERT, ELECTRA) or RoBERTa's π_i = p + Σ_{j≤i}[x_j ≠ p] for real
tokens and π_i = p for tokens equal to the padding id p (see :mod:`transformer_np.io.families`).
The backward runs the stack's backward, then the projection's (dW_p = H_LNᵀ dH^(0)), the
LayerNorm's and the three lookups' scatter-adds — every gradient is the true derivative of the
forward. (HF defines the gradient of an ``nn.Embedding`` row at ``padding_idx`` as 0; we do not —
see ``docs/guide/frameworks.md``.)

For an :class:`~transformer_np.model.config.EncoderConfig` (plain BERT) both functions call
:func:`encoder_forward` / :func:`encoder_backward` unchanged, so one call runs any supported family.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_int_array, check_bool, check_cache, describe
from ..errors import InputTypeError, InputValueError
from ..model.config import EncoderConfig
from ..model.deberta import deberta_backward, deberta_forward
from ..model.encoder import encoder_backward, encoder_forward
from ..model.modernbert import modernbert_backward, modernbert_forward
from ..model.mpnet import mpnet_stack_backward, mpnet_stack_forward
from ..model.params import check_param_arrays
from ..ops import kernels as op  # the ops' unchecked kernels: the arguments are checked here, once
from ..ops.cache import check_for_backward
from ..ops.dropout import dropout_backward, dropout_forward
from ..ops.embeddings import embedding_backward, embedding_forward
from ..ops.layernorm import layernorm_backward, layernorm_forward
from ..ops.linear import linear_backward, linear_forward
from ..ops.masks import validate_attention_mask
from .families import HFEncoderConfig, hf_param_shapes

__all__ = ["hf_forward", "hf_backward", "validate_hf_params", "position_ids"]

_OPTIONAL = ("pooler.W", "pooler.b")


def validate_hf_params(params, config: HFEncoderConfig, name: str = "params") -> np.dtype:
    """Names, shapes and one float dtype of a family model's params (the pooler is optional)."""
    if not isinstance(params, dict):
        raise InputTypeError(f"{name} must be a dict of name -> numpy array, got {describe(params)}")
    return check_param_arrays(params, hf_param_shapes(config), name, optional=_OPTIONAL,
                              what=f"the {config.model_type} config")


def position_ids(input_ids: np.ndarray, config: HFEncoderConfig) -> np.ndarray:
    """The rows of the position table each token reads: 0 … n−1, or RoBERTa's padding-aware ids."""
    B, n = input_ids.shape
    if not config.family.offset_positions:
        return np.broadcast_to(np.arange(n), (B, n))                       # (B, n)
    p = config.position_pad
    real = (input_ids != p).astype(np.int64)                               # (B, n)
    return np.cumsum(real, axis=1) * real + p                              # (B, n)


def _stack_params(params: dict) -> dict:
    return {k: v for k, v in params.items() if k.startswith("layers.")}


def _run_stack(params: dict, config: HFEncoderConfig, H0: np.ndarray, attention_mask, training: bool, rng,
               store_attention: bool, for_backward: bool) -> tuple[np.ndarray, dict]:
    """The family's stack on H^(0): :func:`encoder_forward`, or MPNet's (:mod:`transformer_np.model.mpnet`)."""
    if config.family.relative_bias is None:
        return encoder_forward(_stack_params(params), config.stack, inputs_embeds=H0, attention_mask=attention_mask,
                               training=training, rng=rng, store_attention=store_attention,
                               for_backward=for_backward)
    stack = {**_stack_params(params), "relative_bias": params["relative_bias"]}
    mask = None if attention_mask is None else op.padding_mask(attention_mask, H0.dtype)   # (B, 1, 1, n)
    return mpnet_stack_forward(stack, config.stack, H0, config.relative_attention_num_buckets, mask, training, rng,
                               for_backward=for_backward)


def hf_forward(params: dict, config, input_ids=None, attention_mask=None, token_type_ids=None,
               inputs_embeds=None, training: bool = False, rng: np.random.Generator | None = None, *,
               store_attention: bool = True, for_backward: bool = True) -> tuple[np.ndarray, dict]:
    """Run a family model (or a bare HF layer) on ``input_ids`` (B, n).

    Args:
        params: the dict of :func:`transformer_np.io.interop.params_from_hf_state_dict` / ``from_hf``.
        config: an :class:`HFEncoderConfig`, or an :class:`EncoderConfig` (plain BERT: this is
            :func:`encoder_forward`).
        input_ids, attention_mask (1 = real, 0 = padding), token_type_ids: as HF's.
        inputs_embeds: only for a bare layer (``config.bare_layer``): the layer's input (B, n, d).
        training, rng: dropout, as in :func:`encoder_forward`.
        store_attention, for_backward: as in :func:`encoder_forward` (keyword only); with
            ``for_backward=False`` (inference) the cache keeps ``hidden_states`` and ``attentions``
            only, and :func:`hf_backward` refuses it.

    Returns:
        ``(H, cache)``: H^(N) (B, n, d_model); ``cache["hidden_states"]`` (H^(0) … H^(N), H^(0)
        after the projection) and ``cache["attentions"]`` as in :func:`encoder_forward`.
    """
    if isinstance(config, EncoderConfig):
        return encoder_forward(params, config, input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids, inputs_embeds=inputs_embeds, training=training, rng=rng,
                               store_attention=store_attention, for_backward=for_backward)
    if not isinstance(config, HFEncoderConfig):
        raise InputTypeError(f"config must be an EncoderConfig or HFEncoderConfig, got {describe(config)}")
    dtype = validate_hf_params(params, config)
    if config.bare_layer:
        if input_ids is not None or token_type_ids is not None:
            raise InputValueError(f"a bare {config.model_type} layer takes inputs_embeds (its input H, (B, n, d)), "
                                  "not input_ids / token_type_ids")
        return encoder_forward(_stack_params(params), config.stack, inputs_embeds=inputs_embeds,
                               attention_mask=attention_mask, training=training, rng=rng,
                               store_attention=store_attention, for_backward=for_backward)
    if inputs_embeds is not None or input_ids is None:
        raise InputValueError(f"a {config.model_type} model takes input_ids (B, n); inputs_embeds is only for a "
                              "bare layer (HF's inputs_embeds replaces the word lookup only, ours would be H^(0))")
    check_bool(training, "training")
    check_bool(for_backward, "for_backward")
    ids = as_int_array(input_ids, "input_ids", ndim=2)
    B, n = ids.shape
    if attention_mask is not None:
        attention_mask = validate_attention_mask(attention_mask, (B, n))
    if config.modernbert is not None:       # no position table: rotary positions inside every layer
        if n > config.max_len:
            raise InputValueError(f"input_ids has {n} positions, but the modernbert config allows "
                                  f"max_position_embeddings = {config.max_len}")
        if token_type_ids is not None and np.any(as_int_array(token_type_ids, "token_type_ids", ndim=2)):
            raise InputValueError("token_type_ids given, but modernbert has no token-type embedding")
        return modernbert_forward(params, config.encoder, config.modernbert, ids, attention_mask, training, rng,
                                  for_backward=for_backward)
    if config.deberta is not None:          # its own front end: masked embeddings, relative embeddings
        return deberta_forward(params, config.encoder, config.deberta, ids, attention_mask, token_type_ids, training,
                               rng, for_backward=for_backward)
    pos = position_ids(ids, config)
    if pos.size and pos.max() >= config.n_positions:
        raise InputValueError(f"input_ids has {n} positions, which needs position ids up to {int(pos.max())}, but "
                              f"the {config.model_type} position table has {config.n_positions} rows "
                              f"(longest input: max_len = {config.max_len} tokens)")
    c: dict = {"kind": "hf_model", "config": config}
    e, c["word"] = embedding_forward(ids, params["embeddings.word"], "input_ids")          # (B, n, E)
    p_e, c["position"] = embedding_forward(pos, params["embeddings.position"], "position ids")
    e = e + p_e
    if config.type_vocab_size:
        tt = np.zeros((B, n), dtype=np.int64) if token_type_ids is None else as_int_array(
            token_type_ids, "token_type_ids", ndim=2)
        if tt.shape != (B, n):
            raise InputValueError(f"token_type_ids must have shape (B, n) = {(B, n)}, got shape {tt.shape}")
        t_e, c["token_type"] = embedding_forward(tt, params["embeddings.token_type"], "token_type_ids")
        e = e + t_e
    elif token_type_ids is not None and np.any(as_int_array(token_type_ids, "token_type_ids", ndim=2)):
        raise InputValueError(f"token_type_ids given, but {config.model_type} has no token-type embedding")
    e, c["ln"] = layernorm_forward(e, params["embeddings.ln.gamma"], params["embeddings.ln.beta"],
                                   config.layer_norm_eps)                                     # (B, n, E)
    H0, c["drop"] = dropout_forward(e, config.dropout, training, rng)
    if config.has_projection:
        H0, c["project"] = linear_forward(H0, params["embeddings.project.W"], params["embeddings.project.b"])
    H0 = H0.astype(dtype, copy=False)                                                         # (B, n, d)
    H, c["stack"] = _run_stack(params, config, H0, attention_mask, training, rng, store_attention, for_backward)
    c["hidden_states"], c["attentions"] = c["stack"]["hidden_states"], c["stack"]["attentions"]
    if not for_backward:           # the front-end's caches feed only a backward
        c = {"kind": "hf_model", "config": config, "for_backward": False, "hidden_states": c["hidden_states"],
             "attentions": c["attentions"]}
    return H, c


def hf_backward(dH: np.ndarray, cache: dict, free_cache: bool = False, *, input_grad: bool = False) -> dict:
    """Gradients of every parameter (names of :func:`hf_forward`'s params), from ∂L/∂H^(N).

    A bare layer's (and plain BERT's) result is :func:`encoder_backward`'s, including
    ``"inputs_embeds"`` for a bare layer. ``input_grad=True`` (a family model) adds
    ``"inputs_embeds"``: ∂L/∂e_word (B, n, E), the gradient of the word lookup's output — what
    Hugging Face's ``inputs_embeds`` replaces.
    """
    check_bool(input_grad, "input_grad")
    if isinstance(cache, dict) and cache.get("kind") == "encoder":
        return encoder_backward(dH, cache, free_cache=free_cache)
    if isinstance(cache, dict) and cache.get("kind") == "modernbert":
        check_bool(input_grad, "input_grad")
        return modernbert_backward(dH, cache, input_grad)
    if isinstance(cache, dict) and cache.get("kind") == "deberta":
        return deberta_backward(dH, cache, input_grad)
    check_cache(cache, "cache", "hf_model")
    check_for_backward(cache, "hf_forward")
    config: HFEncoderConfig = cache["config"]
    if cache["stack"]["kind"] == "mpnet_stack":
        grads = mpnet_stack_backward(dH, cache["stack"])
    else:
        grads = encoder_backward(dH, cache["stack"], free_cache=free_cache)
    dH0 = grads.pop("inputs_embeds")                                                          # (B, n, d)
    if "project" in cache:
        dH0, grads["embeddings.project.W"], grads["embeddings.project.b"] = linear_backward(dH0, cache["project"])
    de = dropout_backward(dH0, cache["drop"])                                                 # (B, n, E)
    de, grads["embeddings.ln.gamma"], grads["embeddings.ln.beta"] = layernorm_backward(de, cache["ln"])
    grads["embeddings.word"] = embedding_backward(de, cache["word"])
    word_grad = de                           # e = e_word + e_pos (+ e_type): each term's gradient is de
    grads["embeddings.position"] = embedding_backward(de, cache["position"])
    if "token_type" in cache:
        grads["embeddings.token_type"] = embedding_backward(de, cache["token_type"])
    out = {k: grads[k] for k in hf_param_shapes(config)}
    if input_grad:
        out["inputs_embeds"] = word_grad
    return out
