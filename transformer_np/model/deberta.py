r"""DeBERTa-v2/v3 in NumPy (He et al. 2021; HF ``DebertaV2Model``): BERT's Post-LN layer with disentangled
attention, positions as relative embeddings shared by every layer.

The model, on input_ids x (B, n) with the 0/1 attention mask m (B, n) (all ones when None):

    e      = E_word[x] (+ E_pos[i] if ``position_biased_input``) (+ E_type[t] if type_vocab_size > 0)   (B, n, E)
    H^(0)  = Dropout( m ⊙ LN_emb( e [W_p] ) )            W_p (E, d), no bias, only when E ≠ d
    R      = LN_rel(E_rel)  (E_rel when ``norm_rel_ebd`` is not "layer_norm")     (2k, d), k = att_span
    layer ℓ:  Z = LN_1( H + Dropout(DA(H)) ),   H' = LN_2( Z + Dropout(FFN(Z)) )

    DA(H):   Q, K, V = H W_{Q,K,V} + b             (B, h, n, d_k) per head
             R' = Dropout(R);  P_K = R' W_PK + b_PK,  P_Q = R' W_PQ + b_PQ   (W_K / W_Q when ``share_att_key``)
             S  = (Q Kᵀ + c2p + p2c) / s           :mod:`transformer_np.ops.disentangled`
             O  = Dropout(softmax(where(keep, S, min))) V,   keep[b, i, j] = m[b, i] m[b, j]
             DA = O W_O + b_O

k = ``position_buckets`` when > 0, else ``max_relative_positions`` (HF: the config's, or
``max_position_embeddings`` when < 1); s = √(d_k (1 + |pos_att_type|)) (float32's square root, as HF);
the relative positions δ[i, j] = i − j, log-bucketed when ``position_buckets`` > 0. c2p and p2c only when
``relative_attention`` and named in ``pos_att_type``. A padded query row keeps no key: HF's masked_fill makes it
attend uniformly to all keys, and so do we. ``conv_kernel_size`` > 0 (a convolution after the first layer) is
not implemented: the loader refuses it.

Backward: the chain in reverse. Each layer's attention returns, besides dH and its weights' gradients,
dR_ℓ (the gradient of its R' through P_K / P_Q, through its dropout); every layer reads the one R, so

    dR = Σ_ℓ dR_ℓ,    dE_rel = LN_rel's backward of dR,

and with ``share_att_key`` W_K and W_Q collect both their content and their position gradients. The
front end: the mask multiplies (its gradient is m ⊙ the upstream), the LayerNorm's, the projection's and
the lookups' scatter-adds.

Parameters (ours; in brackets only when the config has them)::

    embeddings.word (V, E) [embeddings.position (P, E)] [embeddings.token_type (T, E)] [embeddings.project.W (E, d)]
    embeddings.ln.gamma, .beta (d,)
    [relative.embeddings (2k, d)]      [relative.ln.gamma, .beta (d,)]
    layers.{ℓ}.attn.W_Q, b_Q, W_K, b_K, W_V, b_V, W_O, b_O     (d, d) / (d,)
    layers.{ℓ}.attn.W_PK, b_PK  [c2p, unshared]    layers.{ℓ}.attn.W_PQ, b_PQ  [p2c, unshared]
    layers.{ℓ}.ln1.*, ffn.W_1, b_1, W_2, b_2, ln2.*              BERT's
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validate import as_int_array, check_bool, check_cache, check_dout, describe
from ..errors import InputTypeError, InputValueError, ModelConfigError
from ..ops.attention import merge_heads, split_heads
from ..ops.disentangled import (
    deberta_scale,
    disentangled_scores,
    disentangled_scores_backward,
    position_indices,
    relative_position_ids,
    replace_masked_attention_backward,
    replace_masked_attention_forward,
)
from ..ops.dropout import dropout_backward, dropout_forward
from ..ops.embeddings import embedding_backward, embedding_forward
from ..ops.feedforward import ffn_backward, ffn_forward
from ..ops.layernorm import layernorm_backward, layernorm_forward
from ..ops.linear import linear_backward, linear_forward
from ..ops.masks import validate_attention_mask
from .checks import _check_dropout_rng
from .config import EncoderConfig
from .params import check_param_arrays, sub_params

__all__ = ["DebertaArch", "POS_ATT_TYPES", "deberta_param_shapes", "deberta_forward", "deberta_backward",
           "deberta_layer_forward", "deberta_layer_backward", "deberta_attention_forward",
           "deberta_attention_backward", "deberta_attention_alone"]

POS_ATT_TYPES = ("c2p", "p2c")


@dataclass(frozen=True)
class DebertaArch:
    """What DeBERTa-v2 adds to an :class:`EncoderConfig` (d, h, d_ff, activation, ε, p, vocabulary, token types).

    Attributes:
        max_relative_positions: m ≥ 1, already resolved (HF: the config's, or max_position_embeddings when < 1).
        position_buckets: b > 0 for log buckets, ≤ 0 for none.
        relative_attention: whether the c2p / p2c terms and the relative table exist.
        pos_att_type: a tuple of distinct entries of ``("c2p", "p2c")``; it sets the scale even without
            relative attention, as in HF.
        share_att_key: the position keys/queries reuse W_K / W_Q.
        norm_rel_ebd: the relative table goes through a LayerNorm (HF ``norm_rel_ebd = "layer_norm"``).
        position_biased_input: an absolute position table is added to the embeddings.
        max_position_embeddings: rows of that table.
        embedding_size: E, the width of the embedding tables (d when None).
    """

    max_relative_positions: int
    position_buckets: int = -1
    relative_attention: bool = True
    pos_att_type: tuple[str, ...] = ("p2c", "c2p")
    share_att_key: bool = True
    norm_rel_ebd: bool = True
    position_biased_input: bool = False
    max_position_embeddings: int = 512
    embedding_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_relative_positions", "position_buckets", "max_position_embeddings"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ModelConfigError(f"{name} must be an int, got {v!r}")
        if self.max_relative_positions < 1 or self.max_position_embeddings < 1:
            raise ModelConfigError(f"max_relative_positions and max_position_embeddings must be ≥ 1, got "
                                   f"{self.max_relative_positions} and {self.max_position_embeddings}")
        if self.position_buckets > 0 and self.max_relative_positions - 1 <= self.position_buckets // 2:
            raise ModelConfigError(f"position_buckets = {self.position_buckets} needs max_relative_positions − 1 > "
                                   f"position_buckets // 2 (the log buckets' base), got max_relative_positions = "
                                   f"{self.max_relative_positions}")
        if self.position_buckets == 1:
            raise ModelConfigError("position_buckets must be ≤ 0 (no buckets) or ≥ 2, got 1")
        t = self.pos_att_type
        if not isinstance(t, tuple) or any(x not in POS_ATT_TYPES for x in t) or len(set(t)) != len(t):
            raise ModelConfigError(f"pos_att_type must be a tuple of distinct entries of {POS_ATT_TYPES}, got {t!r}")
        for name in ("relative_attention", "share_att_key", "norm_rel_ebd", "position_biased_input"):
            if not isinstance(getattr(self, name), bool):
                raise ModelConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        E = self.embedding_size
        if E is not None and (isinstance(E, bool) or not isinstance(E, int) or E < 1):
            raise ModelConfigError(f"embedding_size must be a positive int or None, got {E!r}")

    @property
    def span(self) -> int:
        """k = att_span: the relative table has 2k rows."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions

    @property
    def scale_factor(self) -> int:
        return 1 + len(self.pos_att_type)

    @property
    def c2p(self) -> bool:
        return self.relative_attention and "c2p" in self.pos_att_type

    @property
    def p2c(self) -> bool:
        return self.relative_attention and "p2c" in self.pos_att_type


def _layer_shapes(config: EncoderConfig, arch: DebertaArch, pre: str) -> dict:
    d, f = config.d_model, config.d_ff
    s = {}
    for nm in ("Q", "K", "V"):
        s[f"{pre}attn.W_{nm}"], s[f"{pre}attn.b_{nm}"] = (d, d), (d,)
    if not arch.share_att_key:
        for nm, on in (("PK", arch.c2p), ("PQ", arch.p2c)):
            if on:
                s[f"{pre}attn.W_{nm}"], s[f"{pre}attn.b_{nm}"] = (d, d), (d,)
    s[f"{pre}attn.W_O"], s[f"{pre}attn.b_O"] = (d, d), (d,)
    s[f"{pre}ln1.gamma"], s[f"{pre}ln1.beta"] = (d,), (d,)
    s.update({f"{pre}ffn.W_1": (d, f), f"{pre}ffn.b_1": (f,), f"{pre}ffn.W_2": (f, d), f"{pre}ffn.b_2": (d,)})
    s[f"{pre}ln2.gamma"], s[f"{pre}ln2.beta"] = (d,), (d,)
    return s


def deberta_param_shapes(config: EncoderConfig, arch: DebertaArch) -> dict[str, tuple[int, ...]]:
    """Every parameter name → shape (the module docstring's table), in a fixed order."""
    d = config.d_model
    E = d if arch.embedding_size is None else arch.embedding_size
    s: dict = {"embeddings.word": (config.vocab_size, E)}
    if arch.position_biased_input:
        s["embeddings.position"] = (arch.max_position_embeddings, E)
    if config.type_vocab_size:
        s["embeddings.token_type"] = (config.type_vocab_size, E)
    if E != d:
        s["embeddings.project.W"] = (E, d)
    s["embeddings.ln.gamma"], s["embeddings.ln.beta"] = (d,), (d,)
    if arch.relative_attention:
        s["relative.embeddings"] = (2 * arch.span, d)
    if arch.norm_rel_ebd:        # HF builds this LayerNorm whenever the config asks for it
        s["relative.ln.gamma"], s["relative.ln.beta"] = (d,), (d,)
    for i in range(config.n_layers):
        s.update(_layer_shapes(config, arch, f"layers.{i}."))
    return s


# ----------------------------------------------------------------------------- the attention
def _project(x: np.ndarray, p: dict, nm: str, h: int, c: dict, key: str) -> np.ndarray:
    y, c[key] = linear_forward(x, p["W_" + nm], p["b_" + nm])                     # (B, n, d)
    return split_heads(y, h)                                                       # (B, h, n, d_k)


def deberta_attention_forward(x: np.ndarray, p: dict, config: EncoderConfig, arch: DebertaArch, rel, idx: tuple,
                              keep, training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    """DA(H) on x (B, n, d): ``rel`` the (normalised) relative table (2k, d) or None, ``idx`` = (c, p) of
    :func:`~transformer_np.ops.disentangled.position_indices`, ``keep`` bool (B, 1, n, n) or None."""
    h, drop = config.n_heads, config.dropout
    c: dict = {"kind": "deberta_attention", "share": arch.share_att_key}
    Q = _project(x, p, "Q", h, c, "q")
    K = _project(x, p, "K", h, c, "k")
    V = _project(x, p, "V", h, c, "v")
    PK = PQ = None
    if arch.c2p or arch.p2c:
        r, c["rel_drop"] = dropout_forward(rel, drop, training, rng)               # (2k, d) HF's pos_dropout
        r = r[None]                                                                # (1, 2k, d)
        if arch.c2p:
            PK = _project(r, p, "K" if arch.share_att_key else "PK", h, c, "pk")  # (1, h, 2k, d_k)
        if arch.p2c:
            PQ = _project(r, p, "Q" if arch.share_att_key else "PQ", h, c, "pq")  # (1, h, 2k, d_k)
    s = deberta_scale(Q.shape[-1], arch.scale_factor)
    S, c["scores"] = disentangled_scores(Q, K, s, idx[0], PK, idx[1], PQ)        # (B, h, n, n)
    O, c["attn"] = replace_masked_attention_forward(S, V, keep, drop, training, rng)   # (B, h, n, d_k)
    out, c["o"] = linear_forward(merge_heads(O), p["W_O"], p["b_O"])               # (B, n, d)
    return out, c


def deberta_attention_backward(dout: np.ndarray, c: dict) -> tuple[np.ndarray, dict, np.ndarray | None]:
    """``(dx, grads, dR)``: dR (2k, d) the gradient of the relative table this layer read (None without one)."""
    check_cache(c, "cache", "deberta_attention")
    g: dict = {}
    dO, g["W_O"], g["b_O"] = linear_backward(dout, c["o"])                         # (B, n, d)
    h = c["attn"]["V"].shape[1]
    dS, dV = replace_masked_attention_backward(split_heads(dO, h), c["attn"])     # (B, h, n, n), (B, h, n, d_k)
    dQ, dK, dPK, dPQ = disentangled_scores_backward(dS, c["scores"])
    dx = 0.0
    for nm, key, dY in (("Q", "q", dQ), ("K", "k", dK), ("V", "v", dV)):
        dx_i, g["W_" + nm], g["b_" + nm] = linear_backward(merge_heads(dY), c[key])
        dx = dx + dx_i                                                             # (B, n, d) three paths
    dr = None
    for nm, key, dP in (("PK", "pk", dPK), ("PQ", "pq", dPQ)):
        if dP is None:
            continue
        dr_i, dW, db = linear_backward(merge_heads(dP), c[key])                   # (1, 2k, d)
        dr = dr_i if dr is None else dr + dr_i
        w = {"PK": "K", "PQ": "Q"}[nm] if c["share"] else nm
        g["W_" + w] = g.get("W_" + w, 0.0) + dW                                    # shared: content + position
        g["b_" + w] = g.get("b_" + w, 0.0) + db
    if dr is not None:
        dr = dropout_backward(dr[0], c["rel_drop"])                                # (2k, d)
    return dx, g, dr


def _relative_inputs(params: dict, config: EncoderConfig, arch: DebertaArch, m: np.ndarray, c: dict | None):
    """What every layer's attention reads besides H: R (normalised), the position indices, the kept pairs."""
    rel = None
    if arch.relative_attention:
        rel = params["relative.embeddings"]                                        # (2k, d)
        if arch.norm_rel_ebd:
            rel, ln = layernorm_forward(rel, params["relative.ln.gamma"], params["relative.ln.beta"],
                                        float(config.layer_norm_eps))
            if c is not None:
                c["rel_ln"] = ln
    n = m.shape[1]
    delta = relative_position_ids(n, arch.position_buckets, arch.max_relative_positions)   # (n, n)
    keep = (m[:, None, :, None] * m[:, None, None, :]) > 0                          # (B, 1, n, n) m_i m_j
    return rel, position_indices(delta, arch.span), keep


def deberta_attention_alone(x: np.ndarray, params: dict, config: EncoderConfig, arch: DebertaArch, layer: int,
                            attention_mask=None) -> np.ndarray:
    """Layer ``layer``'s attention sublayer DA(x) on x (B, n, d), as the whole model runs it (inference): the
    relative table, the positions of n tokens and the mask m_i m_j built from the model's ``params`` (for
    checking one sublayer on a framework's own input, :mod:`transformer_np.testing`)."""
    B, n = x.shape[:2]
    m = np.ones((B, n), dtype=x.dtype) if attention_mask is None else np.asarray(attention_mask).astype(x.dtype)
    rel, idx, keep = _relative_inputs(params, config, arch, m, None)
    p = sub_params(params, f"layers.{layer}.attn.")
    return deberta_attention_forward(x, p, config, arch, rel, idx, keep)[0]


# ----------------------------------------------------------------------------- one layer
def deberta_layer_forward(x: np.ndarray, p: dict, config: EncoderConfig, arch: DebertaArch, rel, idx: tuple,
                          keep=None, training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    """One DeBERTa layer on x (B, n, d) (BERT's Post-LN chain around the disentangled attention)."""
    drop, eps = config.dropout, float(config.layer_norm_eps)
    c: dict = {"kind": "deberta_layer"}
    a, c["attn"] = deberta_attention_forward(x, sub_params(p, "attn."), config, arch, rel, idx, keep, training,
                                             rng)                                 # (B, n, d)
    a, c["drop1"] = dropout_forward(a, drop, training, rng)
    z, c["ln1"] = layernorm_forward(x + a, p["ln1.gamma"], p["ln1.beta"], eps)      # Z = LN₁(H + DA(H))
    f, c["ffn"] = ffn_forward(z, sub_params(p, "ffn."), config.activation)        # (B, n, d)
    f, c["drop2"] = dropout_forward(f, drop, training, rng)
    out, c["ln2"] = layernorm_forward(z + f, p["ln2.gamma"], p["ln2.beta"], eps)   # H' = LN₂(Z + FFN(Z))
    return out, c


def deberta_layer_backward(dout: np.ndarray, cache: dict) -> tuple[np.ndarray, dict, np.ndarray | None]:
    """``(dx, grads, dR)``: the Post-LN chain in reverse; grads keyed like the layer's params."""
    check_cache(cache, "cache", "deberta_layer")
    g: dict = {}
    dr, g["ln2.gamma"], g["ln2.beta"] = layernorm_backward(dout, cache["ln2"])     # r = Z + FFN(Z)
    dz_ffn, gf = ffn_backward(dropout_backward(dr, cache["drop2"]), cache["ffn"])
    dz = dr + dz_ffn                                                               # skip + FFN
    dr, g["ln1.gamma"], g["ln1.beta"] = layernorm_backward(dz, cache["ln1"])       # r = H + DA(H)
    dx_attn, ga, dR = deberta_attention_backward(dropout_backward(dr, cache["drop1"]), cache["attn"])
    g.update({"attn." + k: v for k, v in ga.items()})
    g.update({"ffn." + k: v for k, v in gf.items()})
    return dr + dx_attn, g, dR                                                     # skip + attention


# ----------------------------------------------------------------------------- the model
def _embed(params: dict, config: EncoderConfig, arch: DebertaArch, ids: np.ndarray, tt, m: np.ndarray,
           training: bool, rng, c: dict) -> np.ndarray:
    """H^(0) = Dropout(m ⊙ LN(e [W_p])) (B, n, d)."""
    e, c["word"] = embedding_forward(ids, params["embeddings.word"], "input_ids")   # (B, n, E)
    B, n = ids.shape
    if arch.position_biased_input:
        if n > arch.max_position_embeddings:
            raise InputValueError(f"input_ids has {n} positions, but the position table has "
                                  f"max_position_embeddings = {arch.max_position_embeddings} rows")
        pe, c["position"] = embedding_forward(np.broadcast_to(np.arange(n), (B, n)), params["embeddings.position"],
                                              "position ids")
        e = e + pe
    if config.type_vocab_size:
        tt = np.zeros((B, n), dtype=np.int64) if tt is None else tt
        te, c["token_type"] = embedding_forward(tt, params["embeddings.token_type"], "token_type_ids")
        e = e + te
    elif tt is not None and np.any(tt):
        raise InputValueError("token_type_ids given, but the config has type_vocab_size = 0 (no token-type table)")
    if "embeddings.project.W" in params:
        e, c["project"] = linear_forward(e, params["embeddings.project.W"])        # (B, n, d) no bias
    e, c["ln"] = layernorm_forward(e, params["embeddings.ln.gamma"], params["embeddings.ln.beta"],
                                   float(config.layer_norm_eps))
    c["m"] = m[:, :, None]                                                         # (B, n, 1)
    H, c["drop"] = dropout_forward(e * c["m"], config.dropout, training, rng)      # padded tokens zeroed
    return H


def deberta_forward(params: dict, config: EncoderConfig, arch: DebertaArch, input_ids, attention_mask=None,
                    token_type_ids=None, training: bool = False, rng=None,
                    for_backward: bool = True) -> tuple[np.ndarray, dict]:
    """The whole model on ``input_ids`` (B, n) with a 0/1 ``attention_mask`` (B, n) or None (all real).

    Returns ``(H^(N), cache)``; the cache's ``hidden_states`` are H^(0) … H^(N) and ``attentions`` the N
    softmax weights; with ``for_backward=False`` only these two."""
    if not isinstance(config, EncoderConfig) or not isinstance(arch, DebertaArch):
        raise InputTypeError(f"config must be an EncoderConfig and arch a DebertaArch, got {describe(config)} and "
                             f"{describe(arch)}")
    check_bool(for_backward, "for_backward")
    _check_dropout_rng(config, training, rng)
    dtype = check_param_arrays(params, deberta_param_shapes(config, arch), "params", what="the deberta-v2 config")
    ids = as_int_array(input_ids, "input_ids", ndim=2)
    B, n = ids.shape
    m = np.ones((B, n), dtype=dtype) if attention_mask is None else \
        validate_attention_mask(attention_mask, (B, n)).astype(dtype)                # (B, n) 1 = real, 0 = padding
    tt = None if token_type_ids is None else as_int_array(token_type_ids, "token_type_ids", ndim=2)
    if tt is not None and tt.shape != (B, n):
        raise InputValueError(f"token_type_ids must have shape (B, n) = {(B, n)}, got shape {tt.shape}")
    c: dict = {"kind": "deberta", "names": dict.fromkeys(params)}
    H = _embed(params, config, arch, ids, tt, m, training, rng, c)
    rel, idx, keep = _relative_inputs(params, config, arch, m, c)                  # R (2k, d), (c, p), (B, 1, n, n)
    hidden, attns, layers = [H], [], []
    for i in range(config.n_layers):
        H, lc = deberta_layer_forward(H, sub_params(params, f"layers.{i}."), config, arch, rel, idx, keep,
                                      training, rng)                               # (B, n, d)
        hidden.append(H)
        attns.append(lc["attn"]["attn"]["weights"])
        layers.append(lc)
    if not for_backward:
        return H, {"kind": "deberta", "for_backward": False, "hidden_states": hidden, "attentions": attns}
    c.update(hidden_states=hidden, attentions=attns, layers=layers, shape=H.shape, rel_shape=(2 * arch.span,
                                                                                               config.d_model))
    return H, c


def deberta_backward(dout: np.ndarray, cache: dict, input_grad: bool = False) -> dict:
    """Every parameter's gradient (names of :func:`deberta_param_shapes`); ``input_grad=True`` adds
    ``"inputs_embeds"`` = ∂L/∂E_word[x] (B, n, E), HF's ``inputs_embeds``."""
    check_cache(cache, "cache", "deberta")
    check_bool(input_grad, "input_grad")
    if cache.get("for_backward") is False:
        raise InputTypeError("cache comes from a forward with for_backward=False, which keeps nothing for a "
                             "backward: run the forward with for_backward=True")
    dH = check_dout(dout, "dout", cache["shape"], finite=True)
    g: dict = {}
    dR = None
    for i in reversed(range(len(cache["layers"]))):
        dH, gl, dR_i = deberta_layer_backward(dH, cache["layers"][i])
        g.update({f"layers.{i}.{k}": v for k, v in gl.items()})
        if dR_i is not None:
            dR = dR_i if dR is None else dR + dR_i                                 # Σ_ℓ dR_ℓ: one shared R
    names = cache["names"]
    if "relative.embeddings" in names:
        dR = np.zeros(cache["rel_shape"], dtype=dH.dtype) if dR is None else dR    # no term reads it: 0
        if "rel_ln" in cache:
            dR, g["relative.ln.gamma"], g["relative.ln.beta"] = layernorm_backward(dR, cache["rel_ln"])
        g["relative.embeddings"] = dR
    if "relative.ln.gamma" in names and "relative.ln.gamma" not in g:             # a LayerNorm nothing reads
        g["relative.ln.gamma"] = np.zeros_like(dH[0, 0])
        g["relative.ln.beta"] = np.zeros_like(dH[0, 0])
    de = dropout_backward(dH, cache["drop"]) * cache["m"]                          # (B, n, d) m ⊙ upstream
    de, g["embeddings.ln.gamma"], g["embeddings.ln.beta"] = layernorm_backward(de, cache["ln"])
    if "project" in cache:
        de, g["embeddings.project.W"], _ = linear_backward(de, cache["project"])  # (B, n, E)
    g["embeddings.word"] = embedding_backward(de, cache["word"])
    if "position" in cache:
        g["embeddings.position"] = embedding_backward(de, cache["position"])
    if "token_type" in cache:
        g["embeddings.token_type"] = embedding_backward(de, cache["token_type"])
    out = {k: g[k] for k in names}
    if input_grad:
        out["inputs_embeds"] = de                                                  # e = e_word + …: its share
    return out
