r"""The engine's encoder layer and the stack's two other blocks, forward and backward: what
:mod:`transformer_np.model.stack` runs with ``fast=True`` (the default).

The same equations as the textbook layer of :mod:`transformer_np.model.encoder` (read it first), the
sublayers taken from this package, rearranged for speed and memory:

* the residual sums are written into the sublayer output's buffer (:func:`_residual_into`) and a Post-LN
  LayerNorm's x̂ over its input (:func:`_layernorm_over`): a sublayer's output is a new array the layer
  owns, so no (B, n, d) array is allocated for them;
* the FFN keeps its input as the LayerNorm that made it (:func:`~transformer_np.fast.ffn.lin1_from_layernorm`),
  and the backward adds dZ into a gradient it owns (``acc=``);
* the products run at one OpenBLAS thread when the attention core splits its heads over the batch threads
  and does most of the layer's products (:func:`_blas_one_thread`);
* inference (``for_backward=False``) runs :func:`~transformer_np.fast.inference.layer_infer`; the embedding
  block with learned positions and the final LayerNorm have inference versions that keep nothing.

Every function here has the name and signature of its textbook twin in
:class:`transformer_np.model.encoder.Textbook`, and none checks its arguments (the encoder's public
functions have). This module imports ``ops`` and this package, never ``model``: the layer's parameters
come as one dict (``attn.W_Q``, …) and the config is read by attribute.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from .. import fast as kernels  # looked up at call time: a spy on transformer_np.fast.mha_forward sees the layer
from ..ops import kernels as op
from ..ops.cache import reader
from . import blocks
from .ffn import _ffn_backward, _layernorm_backward, _layernorm_forward, _layernorm_value, lin1_from_layernorm
from .inference import _embeddings_infer, _layer_infer, _sub
from .threads import _blas_single

# The measurements behind this threshold: docs/bench_notes.md, "One BLAS thread for an attention-bound layer".
_ATTENTION_SHARE = 0.5


def _blas_one_thread(shape: tuple, config, dropout: bool) -> bool:
    """Whether the layer of input ``shape`` (B, n, d) runs its products at one OpenBLAS thread: no attention
    dropout, the attention core split over the batch threads (its own rule,
    :func:`~transformer_np.fast.blocks._shard_blocks`), and the attention's products (Q Kᵀ and A V,
    4·B·n²·d) at least :data:`_ATTENTION_SHARE` of the layer's (with the projections' 8·B·n·d² and the
    FFN's 4·B·n·d·d_ff: :func:`transformer_np.model.flops.layer_flops`'s terms)."""
    B, n, d = shape
    h = config.n_heads
    if dropout or len(blocks._shard_blocks((B, h), n, n, d // h)) < 2:
        return False                                  # (a split needs B, n ≥ 1)
    attention = 4 * B * n * n * d
    total = attention + 8 * B * n * d * d + 4 * B * n * d * config.d_ff
    return attention >= _ATTENTION_SHARE * total


# ----------------------------------------------------------------------------- the layer
def layer_forward(x: np.ndarray, p: dict, config, mask: np.ndarray | None, training: bool, rng,
                  store_attention: bool = True, for_backward: bool = True) -> tuple[np.ndarray, dict]:
    """One encoder layer, unchecked: the inference layer, or :func:`_layer_train` (at one OpenBLAS thread
    when :func:`_blas_one_thread` says so, which the cache records for the backward)."""
    if not for_backward:
        return _layer_infer(x, p, config, mask, training, rng, store_attention)
    single = _blas_one_thread(x.shape, config, training and config.dropout > 0)
    with _blas_single() if single else nullcontext():
        out, c = _layer_train(x, p, config, mask, training, rng, store_attention)
    c["blas_one_thread"] = single                     # the backward runs the same way
    return out, c


def _layer_train(x: np.ndarray, p: dict, config, mask: np.ndarray | None, training: bool, rng,
                 store_attention: bool) -> tuple[np.ndarray, dict]:
    """:func:`layer_forward` with a cache for the backward."""
    keep_a = {} if store_attention else {"store_attention": False}
    attn_p, ffn_p = _sub(p, "attn."), _sub(p, "ffn.")
    drop, eps, h = config.dropout, float(config.layer_norm_eps), config.n_heads
    c: dict = {"kind": "encoder_layer", "norm_position": config.norm_position, "fast": True, "shape": x.shape}
    if config.norm_position == "post":
        a, c["attn"] = kernels.mha_forward(x, attn_p, h, mask, drop, training, rng, **keep_a)   # (B, n, d)
        a, c["drop1"] = kernels.dropout_forward(a, drop, training, rng)
        r, c["res1"] = _residual_into(x, a)                                   # H + MHA(H), in a's buffer
        del a                                    # no sublayer output outlives its use
        z, c["ln1"] = _layernorm_over(r, p["ln1.gamma"], p["ln1.beta"], eps)  # Z
        del r
        f, c["ffn"] = kernels.ffn_forward(z, ffn_p, config.activation)        # (B, n, d)
        lin1_from_layernorm(c["ffn"], c["ln1"], p["ln1.beta"])                # the backward rebuilds Z from LN_1
        f, c["drop2"] = kernels.dropout_forward(f, drop, training, rng)
        r, c["res2"] = _residual_into(z, f)                                   # Z + FFN(Z)
        del f, z
        out, c["ln2"] = _layernorm_over(r, p["ln2.gamma"], p["ln2.beta"], eps)   # H^(ℓ)
    else:
        y, c["ln1"] = kernels.layernorm_forward(x, p["ln1.gamma"], p["ln1.beta"], eps)   # LN(H)
        a, c["attn"] = kernels.mha_forward(y, attn_p, h, mask, drop, training, rng, **keep_a)
        del y
        a, c["drop1"] = kernels.dropout_forward(a, drop, training, rng)
        z, c["res1"] = _residual_into(x, a)                                   # Z = H + MHA(LN(H))
        del a
        y, c["ln2"] = kernels.layernorm_forward(z, p["ln2.gamma"], p["ln2.beta"], eps)   # LN(Z)
        f, c["ffn"] = kernels.ffn_forward(y, ffn_p, config.activation)
        del y
        lin1_from_layernorm(c["ffn"], c["ln2"], p["ln2.beta"])                # the backward rebuilds LN(Z)
        f, c["drop2"] = kernels.dropout_forward(f, drop, training, rng)
        out, c["res2"] = _residual_into(z, f)                                 # H^(ℓ) = Z + FFN(LN(Z))
    return out, c


def _residual_into(x: np.ndarray, fx: np.ndarray) -> tuple[np.ndarray, dict]:
    """x + F(x) written into F(x)'s buffer, which the layer owns (a sublayer's output is a new array, and so
    is its dropout's), so no (B, n, d) array is allocated; the same sum bit for bit (floating-point addition
    is commutative) and the same cache as the residual op."""
    fx += x
    return fx, {"kind": "residual", "shape": x.shape}


def _layernorm_over(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> tuple[np.ndarray, dict]:
    """The LayerNorm of a residual sum the layer owns and does not read again (Post-LN): x̂ is written over x
    (:func:`~transformer_np.fast.ffn._layernorm_forward`), the same bits."""
    return _layernorm_forward(x, gamma, beta, eps, overwrite=True)


def layer_backward(dout: np.ndarray, cache: dict, free_cache: bool) -> tuple[np.ndarray, dict]:
    """Backward of :func:`layer_forward`, unchecked (with the products at one OpenBLAS thread when the
    forward ran so)."""
    with _blas_single() if cache.get("blas_one_thread") else nullcontext():
        return _layer_grads(dout, cache, free_cache)


def _layer_grads(dout: np.ndarray, cache: dict, free_cache: bool) -> tuple[np.ndarray, dict]:
    """:func:`layer_backward`'s body."""
    take = reader(cache, free_cache)
    g: dict = {}
    ln_back = kernels.layernorm_backward
    if free_cache:                           # dx over x̂: the LayerNorm caches' x̂ are the layer's own arrays
        def ln_back(dy, c):
            return _layernorm_backward(dy, c, True)
    # Every gradient sum below goes into the buffer of a gradient this function owns (a sublayer
    # backward's result is a new array), never into dout; the sums are the same bit for bit (addition
    # is commutative), and no (B, n, d) gradient outlives its last use.
    if cache["norm_position"] == "post":
        dr, g["ln2.gamma"], g["ln2.beta"] = ln_back(dout, take("ln2"))
        dz, df = kernels.residual_backward(dr, take("res2"))     # the skip path: dz gets dr as is
        df = kernels.dropout_backward(df, take("drop2"))
        dz_ffn, gf = _ffn_backward(df, take("ffn"), free_cache, acc=dz)   # dZ = dr + ∂FFN/∂Z, into dr (ours)
        del df, dz, dr
        dr, g["ln1.gamma"], g["ln1.beta"] = ln_back(dz_ffn, take("ln1"))
        del dz_ffn
        dx, da = kernels.residual_backward(dr, take("res1"))
        del dr
        dx_attn, ga = kernels.mha_backward(kernels.dropout_backward(da, take("drop1")), take("attn"), free_cache)
        del da
        dx_attn += dx                                             # dH = dr + ∂MHA/∂H
        dx = dx_attn
    else:
        dz, df = kernels.residual_backward(dout, take("res2"))    # both are dout itself: not ours
        dy, gf = kernels.ffn_backward(kernels.dropout_backward(df, take("drop2")), take("ffn"), free_cache)
        del df
        dz_ln, g["ln2.gamma"], g["ln2.beta"] = ln_back(dy, take("ln2"))
        del dy
        dz_ln += dz                                               # dZ = dout + ∂LN_2/∂Z
        dx, da = kernels.residual_backward(dz_ln, take("res1"))
        del dz, dz_ln
        dy, ga = kernels.mha_backward(kernels.dropout_backward(da, take("drop1")), take("attn"), free_cache)
        del da
        dx_ln, g["ln1.gamma"], g["ln1.beta"] = ln_back(dy, take("ln1"))
        del dy
        dx_ln += dx                                               # dH = dZ + ∂LN_1/∂H
        dx = dx_ln
    g.update({"attn." + k: v for k, v in ga.items()})
    g.update({"ffn." + k: v for k, v in gf.items()})
    return dx, g


# ----------------------------------------------------------------------------- the stack's other blocks
def embeddings_forward(p: dict, ids: np.ndarray, token_type_ids: np.ndarray | None, config,
                       for_backward: bool) -> tuple[np.ndarray, dict | None]:
    """The embedding block: for inference with learned positions :func:`_embeddings_infer` (no cache),
    else the textbook block (:func:`transformer_np.ops.kernels.embeddings_forward`)."""
    eps = float(config.layer_norm_eps)
    if not for_backward and config.positional == "learned":
        return _embeddings_infer(p, ids, token_type_ids, eps, config.embedding_layer_norm), None
    return op.embeddings_forward(p, ids, token_type_ids, config.positional, eps, config.embedding_layer_norm)


def final_norm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float,
                       for_backward: bool) -> tuple[np.ndarray, dict | None]:
    """The stack's final LayerNorm: this package's, or for inference its value only (no cache)."""
    if not for_backward:
        return _layernorm_value(x, gamma, beta, eps), None
    return kernels.layernorm_forward(x, gamma, beta, eps)


def final_norm_backward(dy: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Backward of :func:`final_norm_forward`."""
    return kernels.layernorm_backward(dy, cache)
