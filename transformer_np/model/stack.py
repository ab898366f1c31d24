r"""The encoder's public functions: one layer and the N-layer stack, checked, by either path.

The stack:
    H^(0) = Dropout(Embeddings(input_ids))        or  H^(0) = inputs_embeds (given as is)
    H^(ℓ) = EncoderLayer_ℓ(H^(ℓ−1)),  ℓ = 1 … N    (parameter-independent layers, or one
                                                    shared set with ``share_layers``)
    out   = LN_final(H^(N))  if the config has a final LayerNorm, else H^(N)

EncoderLayer is :mod:`transformer_np.model.encoder`: the article's equations, Post-LN or Pre-LN, and nothing
else (read it first). Dropout on the embeddings is BERT's. The only mask is the padding mask
(``attention_mask``: 1 = real token, 0 = padding); encoder self-attention is otherwise unmasked — bidirectional.

This module is what sits around the layer:

* the checks, once: :func:`encoder_forward` / :func:`encoder_layer_forward` check the config, the parameters,
  the inputs and the masks, and the kernels below them check nothing;
* the path: ``fast=True`` (the default) runs the speed engine (:mod:`transformer_np.fast`: row-blocked
  attention, fused QKV, in-place buffers, blocked GELU), the same layer rearranged; ``fast=False`` the
  textbook layer. :func:`_kernels` turns the flag into the kernels of one path — the engine's layer module
  (:mod:`transformer_np.fast.layer`) or :class:`~transformer_np.model.encoder.Textbook` — and the layer
  module's two dispatch points run them (the backward by the path its cache records). The split keeps the
  textbook file free of everything here (issue 46): a student reads the layer without the flags, the
  buffers and the cache bookkeeping; ``tests/ops/test_fast_path.py`` proves the two paths give the same
  outputs and gradients;
* inference: ``for_backward=False`` runs the same layers keeping nothing for a backward (the engine: no
  activation derivative, each layer's residual sums and LayerNorms in its own buffers); no parameter
  fingerprints are taken, and a non-finite parameter is looked for, and named, only when the output is not
  finite;
* stale caches: the backward refuses a cache that can no longer be used
  (:class:`~transformer_np.errors.StaleCacheError`): one freed by ``free_cache=True``
  (:mod:`transformer_np.ops.cache`), or one whose parameters changed since the forward (a fingerprint per
  parameter, recorded by the forward: see :class:`~transformer_np.ops.cache.ParamGuard`).

Until issue 46 this was :mod:`transformer_np.model.encoder`; every name still imports from there.
"""

from __future__ import annotations

import numpy as np

from .._validate import (
    all_finite,
    as_float_array,
    check_bool,
    check_cache,
    check_dout,
    describe,
    mismatch_detail,
)
from ..errors import InputTypeError, InputValueError, NonFiniteError
from ..fast import layer as engine
from ..ops import kernels as op  # the ops' unchecked kernels: the arguments are checked here, once
from ..ops.attention import MHA_PARAM_NAMES, check_attention_mask
from ..ops.cache import FREED_MESSAGE, ParamGuard, check_for_backward, check_not_freed, reader
from ..ops.feedforward import FFN_PARAM_NAMES
from ..ops.masks import combine_masks
from .checks import (
    _check_dropout_rng,
    _check_finite_params,
    _check_inputs,
    _check_paths,
    _raise_nonfinite_param,
    _raise_overflow,
)
from .config import EncoderConfig
from .encoder import Textbook, _layer_backward, _prefixed

# the layer by the kernels given, under the name bench --profile times (perf/profile.py), as embed_block below
from .encoder import _layer_forward as layer_block
from .params import layer_prefix, param_shapes, sub_params, validate_params

__all__ = ["encoder_layer_forward", "encoder_layer_backward", "encoder_forward", "encoder_backward",
           "FREED_MESSAGE"]

#: the embedding lookup tables: checked for replacement only, not fingerprinted — a lookup's backward
#: is a scatter of dH that never reads the table, so changing its values cannot make a gradient stale
#: (as in PyTorch, whose embedding saves no weight for backward), and the word table is the largest
#: array of a model (BERT-base: 23 M numbers, more than a layer's weights).
LOOKUP_TABLES = ("embeddings.word", "embeddings.position", "embeddings.token_type")


# ----------------------------------------------------------------------------- the path, and one layer checked
def _kernels(fast: bool):
    """The path's kernels: the engine's layer module, or the textbook layer's (the same names and signatures).
    A forward asks with its ``fast`` argument; a backward's layer goes by the path its cache records
    (:func:`transformer_np.model.encoder._layer_backward`), the final LayerNorm's by ``cache["fast"]``."""
    return engine if fast else Textbook


def layer_param_shapes(config: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """The parameters of one layer (names without the "layers.ℓ." prefix) and their shapes."""
    d, f = config.d_model, config.d_ff
    shapes = {"attn." + k: (d, d) if k.startswith("W") else (d,) for k in MHA_PARAM_NAMES}
    shapes.update({"ln1.gamma": (d,), "ln1.beta": (d,)})
    shapes.update({"ffn." + k: s for k, s in zip(FFN_PARAM_NAMES, ((d, f), (f,), (f, d), (d,)))})
    shapes.update({"ln2.gamma": (d,), "ln2.beta": (d,)})
    return shapes


def _check_layer_params(p, config: EncoderConfig, dtype) -> None:
    if not isinstance(p, dict):
        raise InputTypeError(f"p must be a dict of the layer's parameters (attn.W_Q, …), got {describe(p)}")
    shapes = layer_param_shapes(config)
    missing = [k for k in shapes if k not in p]
    extra = [k for k in p if k not in shapes]
    if missing or extra:
        raise InputValueError(f"p does not match one layer of the config ({mismatch_detail(missing, extra)}); "
                              f"pass sub_params(params, 'layers.ℓ.')")
    for k, shape in shapes.items():
        as_float_array(p[k], f"p[{k!r}]", dtype=dtype, finite=False)
        if p[k].shape != shape:
            raise InputValueError(f"p[{k!r}] must have shape {shape}, got shape {p[k].shape}")


def encoder_layer_forward(x: np.ndarray, p: dict, config: EncoderConfig, mask: np.ndarray | None = None,
                          training: bool = False, rng: np.random.Generator | None = None,
                          fast: bool = True, store_attention: bool = True, *,
                          for_backward: bool = True) -> tuple[np.ndarray, dict]:
    """One encoder layer H^(ℓ−1) → H^(ℓ), both (B, n, d_model).

    ``p`` holds the layer's parameters without the "layers.ℓ." prefix (``attn.W_Q``, …,
    ``ln1.gamma``, ``ffn.W_1``, …, ``ln2.beta``). ``mask`` is additive, broadcastable to
    (B, h, n, n) (see :mod:`transformer_np.ops.masks`). The placement comes from
    ``config.norm_position``. ``fast=False`` runs the plain (textbook) kernels.
    ``store_attention=False`` (fast path only) keeps no attention matrix: see :func:`encoder_forward`.
    ``for_backward=False`` (inference): see :func:`encoder_forward`; the cache then holds
    ``cache["attn"]["attn"]["weights"]`` (A, or None with ``store_attention=False``) and
    :func:`encoder_layer_backward` refuses it.
    """
    if not isinstance(config, EncoderConfig):
        raise InputTypeError(f"config must be an EncoderConfig, got {describe(config)}")
    as_float_array(x, "x", ndim=3)
    if x.shape[-1] != config.d_model:
        raise InputValueError(f"x must have shape (B, n, d_model) = (*, *, {config.d_model}), got shape {x.shape}")
    _check_layer_params(p, config, x.dtype)
    if mask is not None:
        B, n, _ = x.shape
        check_attention_mask(mask, (B, config.n_heads, n, n), x.dtype)
    _check_dropout_rng(config, training, rng)
    _check_paths(fast, store_attention)
    check_bool(for_backward, "for_backward")
    if not for_backward:
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                out, cache = layer_block(x, p, config, mask, training, rng, _kernels(fast), store_attention, False)
            if not all_finite(out):
                raise NonFiniteError(f"the forward pass overflowed {x.dtype} in this layer: its output is not "
                                     f"finite although the input and the parameters are; the input or weight "
                                     f"scale is too large for this dtype (rescale them, or use float64)")
        except NonFiniteError:    # the parameters are scanned only now (inference keeps no fingerprints)
            _raise_nonfinite_param(p, layer_param_shapes(config), "p")
            raise
        return out, cache
    guard = ParamGuard(p, layer_param_shapes(config), label="p")
    _check_finite_params(p, guard, "p")
    out, cache = layer_block(x, p, config, mask, training, rng, _kernels(fast), store_attention)
    cache["guard"] = guard
    return out, cache


def encoder_layer_backward(dout: np.ndarray, cache: dict, free_cache: bool = False) -> tuple[np.ndarray, dict]:
    """Returns ``(dx, grads)``, grads keyed like the layer's ``p`` (``attn.W_Q``, …).

    ``free_cache=True`` drops each sublayer's cache entries as soon as its backward is done
    (lower peak memory); the cache cannot then be used for a second backward. On the fast path its
    arrays also serve as the backward's buffers (each LayerNorm's dx is written over its x̂), so an
    array taken out of the cache beforehand may be overwritten: copy it first. A freed cache, or
    one whose parameters changed since the forward, raises
    :class:`~transformer_np.errors.StaleCacheError`.
    """
    check_cache(cache, "cache", "encoder_layer")
    check_for_backward(cache, "encoder_layer_forward")
    check_bool(free_cache, "free_cache")
    check_not_freed(cache)
    check_dout(dout, "dout", cache["shape"])
    if "guard" in cache:
        cache["guard"].check()
    return _layer_backward(dout, cache, free_cache, engine)


# ----------------------------------------------------------------------------- the stack
def encoder_forward(params: dict, config: EncoderConfig, input_ids=None, attention_mask=None,
                    token_type_ids=None, inputs_embeds=None, training: bool = False,
                    rng: np.random.Generator | None = None, extra_mask: np.ndarray | None = None,
                    fast: bool = True, store_attention: bool = True, *,
                    for_backward: bool = True) -> tuple[np.ndarray, dict]:
    """Run the encoder stack. Give exactly one of ``input_ids`` (B, n) and ``inputs_embeds``
    (B, n, d_model) — the latter is H^(0) itself and skips the embedding block.

    Args:
        params: the dict of :func:`init_params` (validated: names, shapes, one dtype).
        config: the :class:`EncoderConfig`.
        attention_mask: (B, n) of 1 (real token) / 0 (padding); None = all real.
        token_type_ids: (B, n) segment ids (with ``input_ids`` only); None = all 0.
        training: enables dropout (then ``rng``, a ``numpy.random.Generator``, is required
            when ``config.dropout > 0``).
        extra_mask: an additional additive mask broadcastable to (B, h, n, n), e.g.
            :func:`causal_mask` — only for contrasting an encoder with a decoder.
        fast: True (default) runs the stack through the engine (:mod:`transformer_np.fast`); False
            through the textbook layer (:mod:`transformer_np.model.encoder`), the ops' own kernels — the same
            results to rounding, with every intermediate (e.g. the attention scores) in the cache.
        store_attention: False (fast path only) keeps no (B, h, n, n) attention matrix for the
            backward: each layer caches its rows' softmax maxima and sums, and the backward
            recomputes A by row blocks (the FlashAttention trade: an extra Q Kᵀ product and exp
            per block for O(n) memory per block instead of O(n²) per layer). The gradients are
            the same; ``cache["attentions"]`` then holds None, and
            :func:`transformer_np.fast.attention_weights` rebuilds a layer's A on request
            (``attention_weights(cache["layers"][ℓ]["attn"]["attn"])``).
        for_backward: False for inference (keyword only): the same output to rounding, and a cache
            that keeps only what the API reports — ``hidden_states``, and ``attentions`` (None
            entries with ``store_attention=False``) — and nothing a backward needs, so
            :func:`encoder_backward` refuses it. The fast path then runs each layer's inference
            kernels: no parameter fingerprints (:class:`~transformer_np.ops.cache.ParamGuard`), no
            activation derivative, attention that keeps only its weights, residual sums and
            LayerNorms in the layer's own buffers. The plain path (``fast=False``) computes its
            textbook caches as usual and drops them. Non-finite parameters are still refused, naming
            the parameter: they are looked for only when the output is not finite (NaN and inf
            propagate through every op of a layer), instead of before every forward.

    Returns:
        ``(H, cache)``: H of shape (B, n, d_model), in the params' dtype. The cache feeds
        :func:`encoder_backward` and exposes ``cache["hidden_states"]`` (H^(0) … H^(N);
        for Pre-LN the residual stream before the final LayerNorm) and
        ``cache["attentions"]`` (N arrays of shape (B, h, n, n), or None with
        ``store_attention=False``).

    Raises:
        InputTypeError / InputValueError: a bad argument (named in the message).
        NonFiniteError: a non-finite input, or an overflow of the dtype inside the stack.
    """
    if not isinstance(config, EncoderConfig):
        raise InputTypeError(f"config must be an EncoderConfig, got {describe(config)}")
    dtype = validate_params(params, config)
    _check_dropout_rng(config, training, rng)
    _check_paths(fast, store_attention)
    check_bool(for_backward, "for_backward")
    x, attention_mask, token_type_ids = _check_inputs(config, dtype, input_ids, attention_mask,
                                                      token_type_ids, inputs_embeds)
    B, n = x.shape[:2]
    mask = None if attention_mask is None else op.padding_mask(attention_mask, dtype)  # (B, 1, 1, n)
    if extra_mask is not None:
        check_attention_mask(extra_mask, (B, config.n_heads, n, n), dtype, "extra_mask")
        mask = combine_masks(mask, extra_mask)
    names = list(param_shapes(config))
    kernels = _kernels(fast)
    cache: dict = {"kind": "encoder", "config": config, "from_ids": input_ids is not None, "fast": fast}
    if for_backward:
        guard = ParamGuard(params, [k for k in names if k not in LOOKUP_TABLES],
                           identity_only=[k for k in names if k in LOOKUP_TABLES])
        _check_finite_params(params, guard)
        cache["guard"] = guard
    else:
        cache["for_backward"] = False
    try:
        if input_ids is not None:
            emb = sub_params(params, "embeddings.")
            try:
                with np.errstate(over="ignore", invalid="ignore"):
                    e, cache["embeddings"] = embed_block(emb, x, token_type_ids, config, fast, for_backward)
            except NonFiniteError:
                op.raise_table_row(emb, x, token_type_ids, config.positional, "params['embeddings.{key}']")
                raise
            if not all_finite(e):   # lookup tables are checked on the rows read, here, not in full at every call
                op.raise_table_row(emb, x, token_type_ids, config.positional, "params['embeddings.{key}']")
            H, cache["emb_drop"] = op.dropout_forward(e, config.dropout, training, rng)   # H^(0): (B, n, d)
        else:
            H = x                                                                       # H^(0) = inputs_embeds
        hidden, attns, layer_caches = [H], [], []
        # Overflow is detected once, after the stack, and reported as an error (below) rather than
        # as a stream of RuntimeWarnings followed by a NaN output.
        with np.errstate(over="ignore", invalid="ignore"):
            for layer in range(config.n_layers):
                p = sub_params(params, layer_prefix(config, layer))
                H, lc = layer_block(H, p, config, mask, training, rng, kernels, store_attention,
                                       for_backward)                                       # (B, n, d)
                if for_backward:
                    lc["guard"] = guard          # encoder_layer_backward on this layer checks the model's params
                    layer_caches.append(lc)
                hidden.append(H)
                attns.append(lc["attn"]["attn"]["weights"])                             # (B, h, n, n) or None
            if config.use_final_layer_norm:
                g, b, eps = params["final_ln.gamma"], params["final_ln.beta"], float(config.layer_norm_eps)
                H, cache["final_ln"] = kernels.final_norm_forward(H, g, b, eps, for_backward)
        if not all_finite(H):
            _raise_overflow("forward", hidden, dtype)
    except NonFiniteError:
        if not for_backward:     # inference took no fingerprints: a non-finite parameter is named here
            _raise_nonfinite_param(params, [k for k in names if k not in LOOKUP_TABLES])
        raise
    if for_backward:
        cache["layers"] = layer_caches
    else:                            # the embedding block's and final LayerNorm's caches feed only a backward
        cache.pop("embeddings", None)
        cache.pop("final_ln", None)
        cache.pop("emb_drop", None)
    cache.update(hidden_states=hidden, attentions=attns, out_shape=H.shape, dtype=dtype)
    return H, cache


def embed_block(p: dict, ids: np.ndarray, token_type_ids, config: EncoderConfig, fast: bool,
           for_backward: bool) -> tuple[np.ndarray, dict | None]:
    """The embedding block by the path asked for, unchecked (``bench --profile`` times it here)."""
    return _kernels(fast).embeddings_forward(p, ids, token_type_ids, config, for_backward)


def encoder_backward(dH: np.ndarray, cache: dict, return_hidden_grads: bool = False, free_cache: bool = False):
    """Backward through the whole stack.

    Returns a dict with the gradient of every parameter (same names and shapes as the
    params; shared layers' gradients summed over depth) plus ``"inputs_embeds"`` when the
    forward was given ``inputs_embeds``. With ``return_hidden_grads=True`` returns
    ``(grads, dhidden)`` where ``dhidden[ℓ]`` = ∂L/∂H^(ℓ) for ℓ = 0 … N (the residual
    stream of ``cache["hidden_states"]``).

    ``free_cache=True`` releases the cache as the backward goes, as autograd does: each
    layer's entries (``cache["layers"][ℓ]``, ``cache["attentions"][ℓ]``,
    ``cache["hidden_states"][ℓ + 1]``) become None once that layer's backward no longer
    needs them, sublayer by sublayer inside the layer, so the peak memory of a forward +
    backward no longer holds the whole cache next to the gradients. The gradients are the
    same; the cache cannot be backpropagated again. On the fast path the cache's arrays also serve
    as the backward's buffers (each LayerNorm's dx is written over its x̂): an array taken out of
    the cache beforehand may be overwritten (``hidden_states`` and ``attentions`` are not).

    Raises:
        StaleCacheError: the cache was freed by an earlier ``free_cache=True`` backward, or a
            parameter was changed in place (or its array replaced in ``params``) since the
            forward — the error names it.
        NonFiniteError: dH is not finite, or the backward overflowed the dtype.
    """
    check_cache(cache, "cache", "encoder")
    check_for_backward(cache, "encoder_forward")
    config: EncoderConfig = cache["config"]
    check_bool(return_hidden_grads, "return_hidden_grads")
    check_bool(free_cache, "free_cache")
    check_not_freed(cache)
    dH = check_dout(dH, "dH", cache["out_shape"], finite=True)
    if dH.dtype != cache["dtype"]:
        raise InputTypeError(f"dH must have the forward's dtype {cache['dtype']}, got {dH.dtype}")
    cache["guard"].check()
    take = reader(cache, free_cache)
    grads: dict = {}
    with np.errstate(over="ignore", invalid="ignore"):
        if "final_ln" in cache:
            dH, grads["final_ln.gamma"], grads["final_ln.beta"] = _kernels(cache["fast"]).final_norm_backward(
                dH, take("final_ln"))
        dhidden = [dH]
        for layer in reversed(range(config.n_layers)):
            layer_cache = cache["layers"][layer]
            if free_cache:   # the layer's output and A are not read by its backward; its cache goes below
                cache["layers"][layer] = cache["attentions"][layer] = cache["hidden_states"][layer + 1] = None
            dH, g = _layer_backward(dH, layer_cache, free_cache, engine)
            del layer_cache
            prefix = layer_prefix(config, layer)
            for k, v in g.items():
                key = prefix + k
                grads[key] = grads[key] + v if key in grads else v  # shared layers: sum over depth
            dhidden.append(dH)
        dhidden.reverse()
        if free_cache:
            cache["hidden_states"][0] = None
        if cache["from_ids"]:
            de = op.dropout_backward(dH, take("emb_drop"))
            grads.update(_prefixed("embeddings.", op.embeddings_backward(de, take("embeddings"))))
        else:
            grads["inputs_embeds"] = dH
    bad = [k for k, g in grads.items() if not all_finite(g)]
    if bad:
        raise NonFiniteError(f"the backward pass overflowed {cache['dtype']}: the gradients of {bad[:4]} are not "
                             f"finite although dH was; the upstream gradient or the activations are too large "
                             f"for this dtype (scale dH down, or use float64)")
    return (grads, dhidden) if return_hidden_grads else grads
