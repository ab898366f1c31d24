r"""ModernBERT as a Hugging Face family: its ``config.json`` fields and its tensor names, both ways.

The model is :mod:`transformer_np.model.modernbert`. Config fields read (every one validated, a failure a
:class:`~transformer_np.errors.ModelConfigError` naming it): hidden_size, num_hidden_layers,
num_attention_heads, intermediate_size, vocab_size, max_position_embeddings, hidden_activation, norm_eps,
norm_bias, attention_bias, mlp_bias, pad_token_id, local_attention, the layer types (``layer_types``, or the
older ``global_attn_every_n_layers``: full attention where ℓ mod n = 0), RoPE's θ per type
(``rope_parameters``, or the older ``global_rope_theta`` / ``local_rope_theta``; only the "default" rope
type), and the three dropouts (embedding_dropout, attention_dropout, mlp_dropout: one probability here).

Names (HF ``ModernBertModel``; task models under ``model.``)::

    embeddings.tok_embeddings.weight          embeddings.word
    embeddings.norm.{weight,bias}             embeddings.ln.{gamma,beta}
    layers.{i}.attn_norm.{weight,bias}        layers.{i}.ln1.{gamma,beta}        (i ≥ 1)
    layers.{i}.attn.Wqkv.{weight,bias}        layers.{i}.attn.W_QKV (ᵀ), b_QKV
    layers.{i}.attn.Wo.{weight,bias}          layers.{i}.attn.W_O (ᵀ), b_O
    layers.{i}.mlp_norm.{weight,bias}         layers.{i}.ln2.{gamma,beta}
    layers.{i}.mlp.Wi.{weight,bias}           layers.{i}.ffn.W_1 (ᵀ), b_1
    layers.{i}.mlp.Wo.{weight,bias}           layers.{i}.ffn.W_2 (ᵀ), b_2
    final_norm.{weight,bias}                  final_ln.{gamma,beta}

(biases only where the config has them; none in the released checkpoints).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

from ..errors import ModelConfigError
from ..model.config import EncoderConfig
from ..model.modernbert import ModernBertArch
from ._config_fields import _Fields, _json_value

__all__ = ["read_modernbert", "modernbert_configs", "modernbert_name_rows", "modernbert_table_size",
           "modernbert_hf_dict"]

_HF_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}
_HF_TYPE_OF = {v: k for k, v in _HF_TYPES.items()}
_DEFAULT_THETA = {"full": 160_000.0, "sliding": 10_000.0}
#: HF activation names → ours (families.HF_ACTIVATIONS, which this module cannot import: families imports it)
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def _bool(f: _Fields, key: str, default: bool = False) -> bool:
    v = f.hf.get(key, default)
    if not isinstance(v, bool):
        raise f._fail(key, "a boolean (true/false)", v)
    return v


def _layer_types(f: _Fields, n_layers: int) -> tuple[str, ...]:
    types = f.hf.get("layer_types")
    if types is None:
        every = f.int("global_attn_every_n_layers", 3)
        return tuple("sliding" if i % every else "full" for i in range(n_layers))
    if not isinstance(types, list) or len(types) != n_layers or any(t not in _HF_TYPES for t in types):
        raise f._fail("layer_types", f"a list of {n_layers} entries (num_hidden_layers), each 'full_attention' or "
                      "'sliding_attention'", types)
    return tuple(_HF_TYPES[t] for t in types)


def _rope_thetas(f: _Fields) -> dict[str, float]:
    rp = f.hf.get("rope_parameters")
    legacy = {"full": f.float("global_rope_theta", _DEFAULT_THETA["full"], min_inclusive=False),
              "sliding": f.float("local_rope_theta", _DEFAULT_THETA["sliding"], min_inclusive=False)}
    if rp is None:
        return legacy
    if not isinstance(rp, dict):
        raise f._fail("rope_parameters", "an object with 'full_attention' and 'sliding_attention' entries", rp)
    out = {}
    for hf_type, ours in _HF_TYPES.items():
        entry = rp.get(hf_type) or {}
        sub = _Fields(entry, f"{f.source} field 'rope_parameters.{hf_type}':") if isinstance(entry, dict) else None
        if sub is None:
            raise f._fail(f"rope_parameters.{hf_type}", "an object", entry)
        kind = entry.get("rope_type", "default")
        if kind != "default":
            raise ModelConfigError(f"{f.source} field 'rope_parameters.{hf_type}.rope_type' is {_json_value(kind)}; "
                                   f"only the 'default' rotary embedding (θ^(−2k/d)) is implemented")
        out[ours] = sub.float("rope_theta", legacy[ours], min_inclusive=False)
    return out


def read_modernbert(f: _Fields) -> dict:
    """The validated fields of a ModernBertConfig (a spec dict, as the other families' readers return)."""
    d, L = f.int("hidden_size"), f.int("num_hidden_layers")
    drops = {k: f.float(k, 0.0, maximum=1.0, max_inclusive=False)
             for k in ("embedding_dropout", "attention_dropout", "mlp_dropout")}
    if len(set(drops.values())) > 1:
        warnings.warn(f"{f.source} has {drops}; transformer_np uses one dropout probability and takes "
                      f"attention_dropout = {drops['attention_dropout']} (no effect in inference)", stacklevel=4)
    thetas = _rope_thetas(f)
    arch = ModernBertArch(layer_types=_layer_types(f, L), local_attention=f.int("local_attention", 128, minimum=0),
                          global_rope_theta=thetas["full"], local_rope_theta=thetas["sliding"],
                          attention_bias=_bool(f, "attention_bias"), mlp_bias=_bool(f, "mlp_bias"),
                          norm_bias=_bool(f, "norm_bias"))
    p = drops["attention_dropout"]
    n_heads = f.int("num_attention_heads")
    if d % n_heads == 0 and (d // n_heads) % 2:
        raise ModelConfigError(f"{f.source}: the head width hidden_size / num_attention_heads = {d // n_heads} must be "
                               f"even (rotary embeddings turn pairs of features)")
    return dict(d_model=d, n_layers=L, n_heads=n_heads, d_ff=f.int("intermediate_size"),
                vocab_size=f.int("vocab_size"), max_position_embeddings=f.int("max_position_embeddings", 8192),
                type_vocab_size=0, hidden_act=f.choice("hidden_activation", _ACTS, "gelu"),
                layer_norm_eps=f.float("norm_eps", 1e-5, min_inclusive=False, maximum=1.0), p_hidden=p, p_attn=p,
                pad_token_id=f.int("pad_token_id", 50283, minimum=0, allow_none=True), embedding_size=d,
                dropout_fields=("attention_dropout", "attention_dropout"), modernbert=arch)



def modernbert_configs(spec: dict) -> tuple[EncoderConfig, ModernBertArch]:
    """The stack's EncoderConfig (Pre-LN, no position table, final LN) and the ModernBertArch of a spec."""
    enc = EncoderConfig(n_layers=spec["n_layers"], d_model=spec["d_model"], n_heads=spec["n_heads"],
                        d_ff=spec["d_ff"], activation=_ACTS[spec["hidden_act"]], norm_position="pre",
                        layer_norm_eps=spec["layer_norm_eps"], dropout=spec["p_hidden"],
                        vocab_size=spec["vocab_size"], max_len=spec["max_position_embeddings"], type_vocab_size=0,
                        positional="none", final_layer_norm=True, embedding_layer_norm=True)
    return enc, spec["modernbert"]


def _ln_rows(hf: str, ours: str, bias: bool) -> list:
    return [(hf + ".weight", ours + ".gamma", False)] + ([(hf + ".bias", ours + ".beta", False)] if bias else [])


def _linear_rows(hf: str, W: str, b: str, bias: bool) -> list:
    return [(hf + ".weight", W, True)] + ([(hf + ".bias", b, False)] if bias else [])


def modernbert_name_rows(config) -> Iterator[tuple[str, str, bool]]:
    """(HF name, our name, transpose?) for every tensor of a ModernBERT HFEncoderConfig, in our order."""
    arch, nb = config.modernbert, config.modernbert.norm_bias
    yield "embeddings.tok_embeddings.weight", "embeddings.word", False
    yield from _ln_rows("embeddings.norm", "embeddings.ln", nb)
    for i in range(config.n_layers):
        hp, op = f"layers.{i}.", f"layers.{i}."
        if i > 0:
            yield from _ln_rows(hp + "attn_norm", op + "ln1", nb)
        yield from _linear_rows(hp + "attn.Wqkv", op + "attn.W_QKV", op + "attn.b_QKV", arch.attention_bias)
        yield from _linear_rows(hp + "attn.Wo", op + "attn.W_O", op + "attn.b_O", arch.attention_bias)
        yield from _ln_rows(hp + "mlp_norm", op + "ln2", nb)
        yield from _linear_rows(hp + "mlp.Wi", op + "ffn.W_1", op + "ffn.b_1", arch.mlp_bias)
        yield from _linear_rows(hp + "mlp.Wo", op + "ffn.W_2", op + "ffn.b_2", arch.mlp_bias)
    yield from _ln_rows("final_norm", "final_ln", nb)


def modernbert_table_size(config) -> int:
    """How many rows :func:`modernbert_name_rows` yields (from the counts, without building them)."""
    arch, L = config.modernbert, config.n_layers
    ln = 1 + arch.norm_bias                                       # a LayerNorm's tensors
    per_layer = ln + 2 * (1 + arch.attention_bias) + 2 * (1 + arch.mlp_bias)   # mlp_norm, Wqkv, Wo, Wi, Wo
    return 1 + ln + L * per_layer + (L - 1) * ln + ln            # word, its norm, layers, attn_norms (ℓ ≥ 1), final


def modernbert_hf_dict(config) -> dict:
    """ModernBertConfig keyword arguments of an HFEncoderConfig (``AutoConfig.for_model(**d)``)."""
    c, a = config.encoder, config.modernbert
    act = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}[c.activation]
    return {"model_type": "modernbert", "vocab_size": c.vocab_size, "hidden_size": c.d_model,
            "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff,
            "hidden_activation": act, "max_position_embeddings": config.n_positions, "norm_eps": c.layer_norm_eps,
            "norm_bias": a.norm_bias, "attention_bias": a.attention_bias, "mlp_bias": a.mlp_bias,
            "embedding_dropout": c.dropout, "attention_dropout": c.dropout, "mlp_dropout": c.dropout,
            "pad_token_id": config.pad_token_id, "local_attention": a.local_attention,
            "layer_types": [_HF_TYPE_OF[t] for t in a.layer_types],
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": a.global_rope_theta},
                                "sliding_attention": {"rope_type": "default", "rope_theta": a.local_rope_theta}}}
