r"""ModernBERT (Warner et al. 2024) in NumPy: Pre-LN layers with rotary positions, GeGLU, no biases, and
local (sliding-window) attention in every layer but every third.

The model (HF ``ModernBertModel``), on input_ids x (B, n):

    H^(0)  = Dropout( LN_emb( E_word[x] ) )                       no position or token-type table
    layer ℓ = 0 … N−1, of type t_ℓ ∈ {full, sliding} (``layer_types``; by default full when ℓ mod 3 = 0):
      Y    = LN_attn,ℓ(H)           (identity for ℓ = 0: HF's first layer has no attention norm)
      H    = H + Dropout( Attn_ℓ(Y) )
      H    = H + GLU_ℓ( LN_mlp,ℓ(H) )
    out    = LN_final(H^(N))

    Attn(Y):  [Q | K | V] = Y W_QKV (+ b_QKV)         (B, n, 3d)   HF's fused ``Wqkv``, Q first
              Q, K ← RoPE(Q), RoPE(K) per head          θ = global_rope_theta (full) / local_rope_theta (sliding)
              O = softmax(Q Kᵀ/√d_k + M_t) V           M_full = padding; M_sliding = padding and |i − j| > w
              Attn = O W_O (+ b_O)
    GLU(Z):   act(U_A) ⊙ U_G, U = Z W_1 (+ b_1), then · W_2 (+ b_2)   (:mod:`transformer_np.ops.glu`)

w = ``local_attention`` // 2 (HF: ``config.sliding_window``; eager attention allows |i − j| ≤ w). Every
LayerNorm is LN(x) = γ ⊙ x̂ (+ β when ``norm_bias``); ModernBERT's checkpoints have no biases at all
(``attention_bias = mlp_bias = norm_bias = false``), and then the params hold none.

Backward: the chain in reverse, op by op (each op's own backward: rotary, attention, GLU, LayerNorm,
lookup). Both residual adds pass the gradient through unchanged, so the layer's dH is the sum of the
skip path and the sublayer's path. Dropout (one probability p for the embedding, the attention weights,
the attention output and inside the GLU, where HF puts ``embedding_dropout``, ``attention_dropout`` and
``mlp_dropout``) is applied at those places in training.

Parameters (ours; in brackets only with the corresponding bias flag)::

    embeddings.word (V, d), embeddings.ln.gamma [.beta]
    layers.{ℓ}.ln1.gamma [.beta]      (ℓ ≥ 1)                   HF layers.{ℓ}.attn_norm
    layers.{ℓ}.attn.W_QKV (d, 3d) [b_QKV], attn.W_O (d, d) [b_O]  HF attn.Wqkv, attn.Wo (transposed)
    layers.{ℓ}.ln2.gamma [.beta]                                 HF mlp_norm
    layers.{ℓ}.ffn.W_1 (d, 2f) [b_1], ffn.W_2 (f, d) [b_2]       HF mlp.Wi, mlp.Wo (transposed)
    final_ln.gamma [.beta]                                       HF final_norm
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validate import check_bool, check_cache, check_dout, describe
from ..errors import InputTypeError, InputValueError, ModelConfigError
from ..ops import kernels as op  # the ops' unchecked kernels: the arguments are checked here, once
from ..ops.attention import merge_heads, split_heads
from ..ops.embeddings import embedding_forward
from ..ops.local_attention import sliding_window_mask
from ..ops.masks import combine_masks
from ..ops.rotary import rotary_tables
from .checks import _check_dropout_rng
from .config import EncoderConfig
from .params import check_param_arrays, sub_params

__all__ = ["ModernBertArch", "modernbert_param_shapes", "modernbert_forward", "modernbert_backward",
           "modernbert_layer_forward", "modernbert_layer_backward"]

LAYER_TYPES = ("full", "sliding")


@dataclass(frozen=True)
class ModernBertArch:
    """What ModernBERT adds to an :class:`EncoderConfig` (d, h, d_ff = f, activation, ε, p, vocabulary).

    Attributes:
        layer_types: "full" or "sliding" for each layer (HF ``layer_types``).
        local_attention: the local window's total width; a query sees |i − j| ≤ local_attention // 2.
        global_rope_theta, local_rope_theta: RoPE's θ of the full and of the sliding layers.
        attention_bias, mlp_bias, norm_bias: whether the projections / GLU / LayerNorms have biases.
    """

    layer_types: tuple[str, ...]
    local_attention: int = 128
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.layer_types, tuple) or not self.layer_types or \
                any(t not in LAYER_TYPES for t in self.layer_types):
            raise ModelConfigError(f"layer_types must be a non-empty tuple of {LAYER_TYPES}, got {self.layer_types!r}")
        if isinstance(self.local_attention, bool) or not isinstance(self.local_attention, int) or \
                self.local_attention < 0:
            raise ModelConfigError(f"local_attention must be an int ≥ 0, got {self.local_attention!r}")
        for name in ("global_rope_theta", "local_rope_theta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
                raise ModelConfigError(f"{name} must be a finite number > 0, got {v!r}")
        for name in ("attention_bias", "mlp_bias", "norm_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ModelConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")

    @property
    def window(self) -> int:
        """w: the half-width of the local window."""
        return self.local_attention // 2


def _ln_shapes(name: str, d: int, bias: bool) -> dict:
    return {name + ".gamma": (d,), **({name + ".beta": (d,)} if bias else {})}


def modernbert_param_shapes(config: EncoderConfig, arch: ModernBertArch) -> dict[str, tuple[int, ...]]:
    """Every parameter name → shape (the module docstring's table), in a fixed order."""
    d, f, nb = config.d_model, config.d_ff, arch.norm_bias
    shapes = {"embeddings.word": (config.vocab_size, d), **_ln_shapes("embeddings.ln", d, nb)}
    for i in range(config.n_layers):
        pre = f"layers.{i}."
        if i > 0:
            shapes.update(_ln_shapes(pre + "ln1", d, nb))
        shapes[pre + "attn.W_QKV"] = (d, 3 * d)
        if arch.attention_bias:
            shapes[pre + "attn.b_QKV"] = (3 * d,)
        shapes[pre + "attn.W_O"] = (d, d)
        if arch.attention_bias:
            shapes[pre + "attn.b_O"] = (d,)
        shapes.update(_ln_shapes(pre + "ln2", d, nb))
        shapes[pre + "ffn.W_1"] = (d, 2 * f)
        if arch.mlp_bias:
            shapes[pre + "ffn.b_1"] = (2 * f,)
        shapes[pre + "ffn.W_2"] = (f, d)
        if arch.mlp_bias:
            shapes[pre + "ffn.b_2"] = (d,)
    shapes.update(_ln_shapes("final_ln", d, nb))
    return shapes


# ----------------------------------------------------------------------------- pieces
def _ln_forward(x: np.ndarray, p: dict, name: str, eps: float) -> tuple[np.ndarray, dict]:
    """LN with γ and, if the params hold one, β (else β = 0: HF's ``bias=False``)."""
    return op.layernorm_forward(x, p[name + ".gamma"], p.get(name + ".beta", 0.0), eps)


def _ln_backward(dy: np.ndarray, cache: dict, p_names: dict, name: str, g: dict) -> np.ndarray:
    dx, g[name + ".gamma"], dbeta = op.layernorm_backward(dy, cache)
    if name + ".beta" in p_names:
        g[name + ".beta"] = dbeta
    return dx


def _attn_forward(y: np.ndarray, p: dict, h: int, rope: tuple, mask, drop: float, training: bool,
                  rng) -> tuple[np.ndarray, dict]:
    """ModernBERT's attention on Y (B, n, d): fused QKV, RoPE on Q and K, softmax, output projection."""
    c: dict = {}
    d = y.shape[-1]
    qkv, c["qkv"] = op.linear_forward(y, p["W_QKV"], p.get("b_QKV"))                     # (B, n, 3d)
    Q, K, V = (split_heads(qkv[..., i * d:(i + 1) * d], h) for i in range(3))            # each (B, h, n, d_k)
    Q, c["rope_q"] = op.rotary_forward(Q, *rope)
    K, c["rope_k"] = op.rotary_forward(K, *rope)
    O, c["attn"] = op.attention_forward(Q, K, V, mask, drop, training, rng)               # (B, h, n, d_k)
    out, c["o"] = op.linear_forward(merge_heads(O), p["W_O"], p.get("b_O"))              # (B, n, d)
    out, c["drop"] = op.dropout_forward(out, drop, training, rng)
    return out, c


def _attn_backward(dout: np.ndarray, c: dict, g: dict) -> np.ndarray:
    dO, g["W_O"], db_O = op.linear_backward(op.dropout_backward(dout, c["drop"]), c["o"])     # (B, n, d)
    h = c["attn"]["Q"].shape[1]
    dQ, dK, dV = op.attention_backward(split_heads(dO, h), c["attn"])                     # (B, h, n, d_k)
    dQ, dK = op.rotary_backward(dQ, c["rope_q"]), op.rotary_backward(dK, c["rope_k"])
    dqkv = np.concatenate([merge_heads(t) for t in (dQ, dK, dV)], axis=-1)                # (B, n, 3d)
    dy, g["W_QKV"], db_QKV = op.linear_backward(dqkv, c["qkv"])                          # (B, n, d)
    if db_QKV is not None:
        g["b_QKV"], g["b_O"] = db_QKV, db_O
    return dy


# ----------------------------------------------------------------------------- one layer
def modernbert_layer_forward(x: np.ndarray, p: dict, config: EncoderConfig, rope: tuple, mask=None,
                             training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    """One layer on x (B, n, d); ``p`` its params (``ln1.*`` absent for the first layer), ``rope`` = (C, S)
    of its type, ``mask`` its additive mask (padding, and the window for a sliding layer)."""
    eps, drop = float(config.layer_norm_eps), config.dropout
    c: dict = {"kind": "modernbert_layer", "names": dict.fromkeys(p)}
    y = x
    if "ln1.gamma" in p:
        y, c["ln1"] = _ln_forward(x, p, "ln1", eps)                                        # LN_attn(H)
    a, c["attn"] = _attn_forward(y, sub_params(p, "attn."), config.n_heads, rope, mask, drop, training, rng)
    h = x + a                                                                              # H + Attn(LN(H))
    y, c["ln2"] = _ln_forward(h, p, "ln2", eps)                                            # LN_mlp(H)
    f, c["ffn"] = op.glu_ffn_forward(y, sub_params(p, "ffn."), config.activation, drop, training, rng)
    return h + f, c                                                                        # H + GLU(LN(H))


def modernbert_layer_backward(dout: np.ndarray, cache: dict) -> tuple[np.ndarray, dict]:
    """``(dx, grads)``: grads keyed like the layer's params."""
    check_cache(cache, "cache", "modernbert_layer")
    g: dict = {}
    dy, gf = op.glu_ffn_backward(dout, cache["ffn"])                                        # out = h + f
    dh = dout + _ln_backward(dy, cache["ln2"], cache["names"], "ln2", g)                   # skip + GLU paths
    ga: dict = {}
    dy = _attn_backward(dh, cache["attn"], ga)                                             # h = x + a
    dx = dh + (_ln_backward(dy, cache["ln1"], cache["names"], "ln1", g) if "ln1" in cache else dy)
    g.update({"attn." + k: v for k, v in ga.items()})
    g.update({"ffn." + k: v for k, v in gf.items()})
    return dx, g


# ----------------------------------------------------------------------------- the model
def _layer_setup(config: EncoderConfig, arch: ModernBertArch, n: int, attention_mask, dtype) -> tuple[dict, dict]:
    """Per layer type: the rotary tables (C, S) and the additive mask (None when nothing is hidden)."""
    pad = None if attention_mask is None else op.padding_mask(attention_mask, dtype)     # (B, 1, 1, n)
    local = combine_masks(pad, sliding_window_mask(n, arch.window, dtype)) if arch.window < n - 1 else pad
    d_k = config.d_model // config.n_heads
    ropes = {"full": rotary_tables(n, d_k, arch.global_rope_theta, dtype),
             "sliding": rotary_tables(n, d_k, arch.local_rope_theta, dtype)}
    return ropes, {"full": pad, "sliding": local}


def modernbert_forward(params: dict, config: EncoderConfig, arch: ModernBertArch, input_ids,
                       attention_mask=None, training: bool = False, rng=None,
                       for_backward: bool = True) -> tuple[np.ndarray, dict]:
    """The whole model on ``input_ids`` (B, n) with a checked 0/1 ``attention_mask`` (B, n) or None.

    Returns ``(out, cache)``: out = LN_final(H^(N)) (B, n, d); the cache's ``hidden_states`` are H^(0) …
    H^(N) (before the final norm) and ``attentions`` the N softmax weights; with ``for_backward=False``
    only these two."""
    if not isinstance(config, EncoderConfig) or not isinstance(arch, ModernBertArch):
        raise InputTypeError(f"config must be an EncoderConfig and arch a ModernBertArch, got {describe(config)} "
                             f"and {describe(arch)}")
    if len(arch.layer_types) != config.n_layers:
        raise InputValueError(f"arch.layer_types has {len(arch.layer_types)} entries for {config.n_layers} layers")
    check_bool(for_backward, "for_backward")
    _check_dropout_rng(config, training, rng)
    dtype = check_param_arrays(params, modernbert_param_shapes(config, arch), "params", what="the modernbert config")
    eps, drop = float(config.layer_norm_eps), config.dropout
    c: dict = {"kind": "modernbert", "names": dict.fromkeys(params)}
    e, c["word"] = embedding_forward(input_ids, params["embeddings.word"], "input_ids")   # (B, n, d)
    e, c["ln"] = _ln_forward(e, params, "embeddings.ln", eps)
    H, c["drop"] = op.dropout_forward(e, drop, training, rng)
    B, n = H.shape[:2]
    ropes, masks = _layer_setup(config, arch, n, attention_mask, dtype)
    hidden, attns, layers = [H], [], []
    for i, kind in enumerate(arch.layer_types):
        H, lc = modernbert_layer_forward(H, sub_params(params, f"layers.{i}."), config, ropes[kind], masks[kind],
                                         training, rng)                                    # (B, n, d)
        hidden.append(H)
        attns.append(lc["attn"]["attn"]["weights"])
        layers.append(lc)
    out, c["final_ln"] = _ln_forward(H, params, "final_ln", eps)
    c.update(hidden_states=hidden, attentions=attns, layers=layers, shape=out.shape)
    if not for_backward:
        c = {"kind": "modernbert", "for_backward": False, "hidden_states": hidden, "attentions": attns}
    return out, c


def modernbert_backward(dout: np.ndarray, cache: dict, input_grad: bool = False) -> dict:
    """Every parameter's gradient (names of :func:`modernbert_param_shapes`); ``input_grad=True`` adds
    ``"inputs_embeds"`` = ∂L/∂E_word[x] (B, n, d), HF's ``inputs_embeds``."""
    check_cache(cache, "cache", "modernbert")
    if cache.get("for_backward") is False:
        raise InputTypeError("cache comes from a forward with for_backward=False, which keeps nothing for a "
                             "backward: run the forward with for_backward=True")
    check_dout(dout, "dout", cache["shape"], finite=True)
    names, g = cache["names"], {}
    dH = _ln_backward(dout, cache["final_ln"], names, "final_ln", g)
    for i in reversed(range(len(cache["layers"]))):
        dH, gl = modernbert_layer_backward(dH, cache["layers"][i])
        g.update({f"layers.{i}.{k}": v for k, v in gl.items()})
    de = _ln_backward(op.dropout_backward(dH, cache["drop"]), cache["ln"], names, "embeddings.ln", g)
    g["embeddings.word"] = op.embedding_backward(de, cache["word"])
    out = {k: g[k] for k in names}
    if input_grad:
        out["inputs_embeds"] = de
    return out
