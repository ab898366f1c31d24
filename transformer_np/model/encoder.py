r"""The encoder layer, Post-LN and Pre-LN: the article's equations, one op of :mod:`transformer_np.ops` per term.

Post-LN (the original Transformer and BERT; the lesson's equations):
    Z      = LN_1( H^(ℓ−1) + MHA(H^(ℓ−1)) )
    H^(ℓ)  = LN_2( Z + FFN(Z) )

Pre-LN (most modern models; the article's pseudocode):
    Z      = H^(ℓ−1) + MHA( LN_1(H^(ℓ−1)) )
    H^(ℓ)  = Z + FFN( LN_2(Z) )
    and one final LN after the last layer (in :mod:`transformer_np.model.stack`).

Dropout (training only) sits on each sublayer's output before the residual add and on the attention
weights — where BERT puts it. ``mask`` is the additive attention mask (:mod:`transformer_np.ops.masks`);
encoder self-attention is otherwise unmasked — bidirectional.

:func:`_layer_train` is the forward, each line one term of the equations with the cache its backward needs;
:func:`_layer_grads` is the backward, the chain rule through the same terms in reverse. Neither checks its
arguments: the public functions (:func:`~transformer_np.model.stack.encoder_layer_forward`,
:func:`~transformer_np.model.stack.encoder_forward` and their backwards, in :mod:`transformer_np.model.stack`,
importable from here as before) check them once. :class:`Textbook` presents this layer under the speed
engine's names; the two functions at the end are the only places where the engine meets this module, one for
the forward and one for the backward: the stack hands them the engine's layer when its path flag asks for it.
This file never changes for speed (llm.c's rule); the engine's equivalence tests (``tests/ops/``) hold it to
this layer.
"""

from __future__ import annotations

import numpy as np

from .._compat import forward_moved
from ..ops import kernels as op  # the ops' unchecked kernels: the public functions have checked the arguments
from ..ops.cache import reader
from .config import EncoderConfig
from .params import sub_params


# ----------------------------------------------------------------------------- the layer
def _layer_train(x: np.ndarray, p: dict, config: EncoderConfig, mask: np.ndarray | None, training: bool,
                 rng) -> tuple[np.ndarray, dict]:
    """One encoder layer with its cache for the backward, unchecked (the caller has checked x, p, mask,
    training and rng): the equations of the module docstring, one sublayer op each."""
    attn_p, ffn_p = sub_params(p, "attn."), sub_params(p, "ffn.")
    drop, eps, h = config.dropout, float(config.layer_norm_eps), config.n_heads
    c: dict = {"kind": "encoder_layer", "norm_position": config.norm_position, "shape": x.shape}
    if config.norm_position == "post":
        a, c["attn"] = op.mha_forward(x, attn_p, h, mask, drop, training, rng)              # MHA(H): (B, n, d)
        a, c["drop1"] = op.dropout_forward(a, drop, training, rng)
        r, c["res1"] = op.residual_forward(x, a)                                            # H + MHA(H)
        z, c["ln1"] = op.layernorm_forward(r, p["ln1.gamma"], p["ln1.beta"], eps)           # Z
        f, c["ffn"] = op.ffn_forward(z, ffn_p, config.activation)                           # FFN(Z): (B, n, d)
        f, c["drop2"] = op.dropout_forward(f, drop, training, rng)
        r, c["res2"] = op.residual_forward(z, f)                                            # Z + FFN(Z)
        out, c["ln2"] = op.layernorm_forward(r, p["ln2.gamma"], p["ln2.beta"], eps)         # H^(ℓ)
    else:
        y, c["ln1"] = op.layernorm_forward(x, p["ln1.gamma"], p["ln1.beta"], eps)           # LN(H)
        a, c["attn"] = op.mha_forward(y, attn_p, h, mask, drop, training, rng)              # MHA(LN(H))
        a, c["drop1"] = op.dropout_forward(a, drop, training, rng)
        z, c["res1"] = op.residual_forward(x, a)                                            # Z = H + MHA(LN(H))
        y, c["ln2"] = op.layernorm_forward(z, p["ln2.gamma"], p["ln2.beta"], eps)           # LN(Z)
        f, c["ffn"] = op.ffn_forward(y, ffn_p, config.activation)                           # FFN(LN(Z))
        f, c["drop2"] = op.dropout_forward(f, drop, training, rng)
        out, c["res2"] = op.residual_forward(z, f)                                          # H^(ℓ) = Z + FFN(LN(Z))
    return out, c


def _layer_grads(dout: np.ndarray, cache: dict, free_cache: bool) -> tuple[np.ndarray, dict]:
    """Backward of :func:`_layer_train`, unchecked: the chain rule through the same equations, in reverse.
    With ``free_cache`` each sublayer's cache is dropped as soon as its backward returns."""
    take, g = reader(cache, free_cache), {}
    if cache["norm_position"] == "post":
        dr, g["ln2.gamma"], g["ln2.beta"] = op.layernorm_backward(dout, take("ln2"))
        dz, df = op.residual_backward(dr, take("res2"))             # the skip path: dz gets dr as is
        dz_ffn, gf = op.ffn_backward(op.dropout_backward(df, take("drop2")), take("ffn"), free_cache)
        dz_ffn += dz                                              # dZ = dr + ∂FFN/∂Z
        dr, g["ln1.gamma"], g["ln1.beta"] = op.layernorm_backward(dz_ffn, take("ln1"))
        dx, da = op.residual_backward(dr, take("res1"))
        dx_attn, ga = op.mha_backward(op.dropout_backward(da, take("drop1")), take("attn"), free_cache)
        dx_attn += dx                                             # dH = dr + ∂MHA/∂H
        dx = dx_attn
    else:
        dz, df = op.residual_backward(dout, take("res2"))           # both are dout itself: not ours
        dy, gf = op.ffn_backward(op.dropout_backward(df, take("drop2")), take("ffn"), free_cache)
        dz_ln, g["ln2.gamma"], g["ln2.beta"] = op.layernorm_backward(dy, take("ln2"))
        dz_ln += dz                                               # dZ = dout + ∂LN_2/∂Z
        dx, da = op.residual_backward(dz_ln, take("res1"))
        dy, ga = op.mha_backward(op.dropout_backward(da, take("drop1")), take("attn"), free_cache)
        dx_ln, g["ln1.gamma"], g["ln1.beta"] = op.layernorm_backward(dy, take("ln1"))
        dx_ln += dx                                               # dH = dZ + ∂LN_1/∂H
        dx = dx_ln
    g.update(_prefixed("attn.", ga))
    g.update(_prefixed("ffn.", gf))
    return dx, g


def _inference_cache(c: dict) -> dict:
    """What an inference cache keeps of a layer's cache: its kind, shape and attention weights (the
    dispatch point of :func:`_layer_forward` adds the path)."""
    return {"kind": "encoder_layer", "for_backward": False, "norm_position": c["norm_position"],
            "shape": c["shape"], "attn": {"kind": "mha", "for_backward": False,
                                          "attn": {"weights": c["attn"]["attn"]["weights"]}}}


class Textbook:
    """The layer above and the stack's two other blocks (the embeddings, the final LayerNorm) under the
    names and signatures of the speed engine's layer module, so that the stack
    (:mod:`transformer_np.model.stack`) runs either through the same calls."""

    @staticmethod
    def layer_forward(x, p, config, mask, training, rng, store_attention=True, for_backward=True):
        out, c = _layer_train(x, p, config, mask, training, rng)   # (store_attention: True, checked)
        return (out, c) if for_backward else (out, _inference_cache(c))

    layer_backward = staticmethod(_layer_grads)

    @staticmethod
    def embeddings_forward(p, ids, token_type_ids, config, for_backward):
        return op.embeddings_forward(p, ids, token_type_ids, config.positional, float(config.layer_norm_eps),
                                     config.embedding_layer_norm)

    @staticmethod
    def final_norm_forward(x, gamma, beta, eps, for_backward):
        return op.layernorm_forward(x, gamma, beta, eps)

    final_norm_backward = staticmethod(op.layernorm_backward)


def _prefixed(prefix: str, grads: dict) -> dict:
    return {prefix + k: v for k, v in grads.items()}


# ----------------------------------------------------------------------------- the two dispatch points
def _layer_forward(x: np.ndarray, p: dict, config: EncoderConfig, mask: np.ndarray | None, training: bool, rng,
                   kernels=Textbook, store_attention: bool = True,
                   for_backward: bool = True) -> tuple[np.ndarray, dict]:
    """One encoder layer, unchecked, by ``kernels``: :class:`Textbook`, or the engine's layer module when the
    stack's path flag asks for it. The cache records which, for :func:`_layer_backward`."""
    out, c = kernels.layer_forward(x, p, config, mask, training, rng, store_attention, for_backward)
    c["fast"] = kernels is not Textbook                                   # the path, read by the backward below
    return out, c


def _layer_backward(dout: np.ndarray, cache: dict, free_cache: bool, engine) -> tuple[np.ndarray, dict]:
    """Backward of :func:`_layer_forward`, unchecked, by the path its cache records: :class:`Textbook`'s, or
    ``engine``'s (the engine's layer module, which the stack passes)."""
    return (engine if cache["fast"] else Textbook).layer_backward(dout, cache, free_cache)


# ----------------------------------------------------------------------------- old paths
#: the checked entry points and the stack, which lived here until issue 46 split the textbook layer from them:
#: ``from transformer_np.model.encoder import encoder_forward`` still works (the same objects)
_MOVED_TO_STACK = ("encoder_layer_forward", "encoder_layer_backward", "encoder_forward", "encoder_backward",
                   "layer_param_shapes", "LOOKUP_TABLES", "FREED_MESSAGE", "_check_layer_params",
                   "_kernels")
__getattr__ = forward_moved(__name__, dict.fromkeys(_MOVED_TO_STACK, "transformer_np.model.stack"))
