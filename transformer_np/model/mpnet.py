r"""MPNet's encoder stack: BERT's Post-LN layer with a relative position bias in every attention.

Layer ℓ (HF ``MPNetLayer``), on H (B, n, d), with P = the relative position bias (1, h, n, n) of
:mod:`transformer_np.ops.relative_position`, one table T shared by every layer:

    Z      = LN_1( H + Dropout(MHA_P(H)) )          MHA_P: scores Q Kᵀ/√d_k + P + M
    H'     = LN_2( Z + Dropout(FFN(Z)) )

— :func:`transformer_np.model.stack.encoder_layer_forward`'s Post-LN form, the attention replaced by
:func:`transformer_np.ops.attention_bias.biased_mha_forward`. The stack computes P once from T and the
sequence length (HF: ``MPNetEncoder.compute_position_bias``) and runs the N layers on it.

Backward: each layer's backward is the Post-LN chain in reverse (as the encoder's), its attention
backward also returning dP_ℓ = Σ_batch dS_ℓ; since every layer reads the same P,

    dP = Σ_ℓ dP_ℓ,       dT = scatter-add of dP into the buckets (relative_position_bias_backward).

Parameters: the layers' ``layers.{ℓ}.*`` (BERT's names, :mod:`transformer_np.model.params`) and
``relative_bias`` (K, h), the table T.
"""

from __future__ import annotations

import numpy as np

from .._validate import check_bool, check_cache, check_dout, describe
from ..errors import InputTypeError
from ..ops import kernels as op  # the ops' unchecked kernels: the arguments are checked here, once
from ..ops.relative_position import relative_position_bias_forward
from .checks import _check_dropout_rng
from .config import EncoderConfig
from .params import check_param_arrays, param_shapes, sub_params

__all__ = ["mpnet_layer_forward", "mpnet_layer_backward", "mpnet_stack_forward", "mpnet_stack_backward",
           "mpnet_stack_shapes"]


def mpnet_stack_shapes(config: EncoderConfig, num_buckets: int) -> dict[str, tuple[int, ...]]:
    """The stack's parameter names → shapes: BERT's layers and the shared table ``relative_bias`` (K, h)."""
    return {**param_shapes(config), "relative_bias": (num_buckets, config.n_heads)}


# ----------------------------------------------------------------------------- one layer
def mpnet_layer_forward(x: np.ndarray, p: dict, config: EncoderConfig, P: np.ndarray, mask=None,
                        training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    """One MPNet layer on x (B, n, d) with the bias P (1, h, n, n) and an additive mask; ``(H', cache)``."""
    drop, eps = config.dropout, float(config.layer_norm_eps)
    c: dict = {"kind": "mpnet_layer"}
    a, c["attn"] = op.biased_mha_forward(x, sub_params(p, "attn."), config.n_heads, P, mask, drop, training,
                                       rng)                                                # (B, n, d)
    a, c["drop1"] = op.dropout_forward(a, drop, training, rng)
    z, c["ln1"] = op.layernorm_forward(x + a, p["ln1.gamma"], p["ln1.beta"], eps)         # Z = LN₁(H + MHA_P(H))
    f, c["ffn"] = op.ffn_forward(z, sub_params(p, "ffn."), config.activation)             # (B, n, d)
    f, c["drop2"] = op.dropout_forward(f, drop, training, rng)
    out, c["ln2"] = op.layernorm_forward(z + f, p["ln2.gamma"], p["ln2.beta"], eps)       # H' = LN₂(Z + FFN(Z))
    return out, c


def mpnet_layer_backward(dout: np.ndarray, cache: dict) -> tuple[np.ndarray, dict, np.ndarray]:
    """``(dx, grads, dP)``: the Post-LN chain in reverse; grads keyed like the layer's params."""
    check_cache(cache, "cache", "mpnet_layer")
    g: dict = {}
    dr, g["ln2.gamma"], g["ln2.beta"] = op.layernorm_backward(dout, cache["ln2"])        # r = Z + FFN(Z)
    dz_ffn, gf = op.ffn_backward(op.dropout_backward(dr, cache["drop2"]), cache["ffn"])
    dz = dr + dz_ffn                                                                       # dZ: skip + FFN paths
    dr, g["ln1.gamma"], g["ln1.beta"] = op.layernorm_backward(dz, cache["ln1"])          # r = H + MHA_P(H)
    dx_attn, ga, dP = op.biased_mha_backward(op.dropout_backward(dr, cache["drop1"]), cache["attn"])
    dx = dr + dx_attn                                                                      # dH: skip + attention
    g.update({"attn." + k: v for k, v in ga.items()})
    g.update({"ffn." + k: v for k, v in gf.items()})
    return dx, g, dP


# ----------------------------------------------------------------------------- the stack
def mpnet_stack_forward(params: dict, config: EncoderConfig, H0: np.ndarray, num_buckets: int, mask=None,
                        training: bool = False, rng=None, for_backward: bool = True) -> tuple[np.ndarray, dict]:
    """The N layers on H^(0) (B, n, d) with the additive ``mask`` (None or broadcastable to (B, h, n, n)).

    ``params`` holds ``layers.{ℓ}.*`` and ``relative_bias`` (K, h), K = ``num_buckets`` (HF's
    ``relative_attention_num_buckets``). Returns ``(H^(N), cache)``; the cache
    has ``hidden_states`` (H^(0) … H^(N)) and ``attentions`` (the N softmax weights (B, h, n, n)); with
    ``for_backward=False`` only these two."""
    if not isinstance(config, EncoderConfig):
        raise InputTypeError(f"config must be an EncoderConfig, got {describe(config)}")
    check_bool(for_backward, "for_backward")
    _check_dropout_rng(config, training, rng)
    check_param_arrays(params, mpnet_stack_shapes(config, num_buckets), "params", what="the MPNet stack")
    n = H0.shape[1]
    P, c_bias = relative_position_bias_forward(params["relative_bias"], n)                # (1, h, n, n)
    H, hidden, attns, layers = H0, [H0], [], []
    for i in range(config.n_layers):
        H, lc = mpnet_layer_forward(H, sub_params(params, f"layers.{i}."), config, P, mask, training, rng)
        hidden.append(H)                                                                   # (B, n, d)
        attns.append(lc["attn"]["attn"]["weights"])
        layers.append(lc)
    cache = {"kind": "mpnet_stack", "hidden_states": hidden, "attentions": attns}
    if for_backward:
        cache.update(layers=layers, bias=c_bias, shape=H0.shape)
    else:
        cache["for_backward"] = False
    return H, cache


def mpnet_stack_backward(dH: np.ndarray, cache: dict) -> dict:
    """Every parameter's gradient (``layers.{ℓ}.*``, ``relative_bias``) and ``"inputs_embeds"`` (dH^(0))."""
    check_cache(cache, "cache", "mpnet_stack")
    if cache.get("for_backward") is False:
        raise InputTypeError("cache comes from mpnet_stack_forward(..., for_backward=False), which keeps nothing "
                             "for a backward: run the forward with for_backward=True")
    check_dout(dH, "dH", cache["shape"], finite=True)
    grads, dP = {}, None
    for i in reversed(range(len(cache["layers"]))):
        dH, g, dP_i = mpnet_layer_backward(dH, cache["layers"][i])
        grads.update({f"layers.{i}.{k}": v for k, v in g.items()})
        dP = dP_i if dP is None else dP + dP_i                                             # Σ_ℓ dP_ℓ: one shared P
    out = dict(grads)
    out["relative_bias"] = op.relative_position_bias_backward(dP, cache["bias"])          # (K, h)
    out["inputs_embeds"] = dH
    return out
