r"""DeBERTa-v2/v3 as a Hugging Face family: its ``config.json`` fields and its tensor names, both ways.

The model is :mod:`transformer_np.model.deberta`. Config fields read (each validated; a failure a
:class:`~transformer_np.errors.ModelConfigError` naming it): hidden_size, num_hidden_layers,
num_attention_heads, intermediate_size, vocab_size, max_position_embeddings, type_vocab_size, hidden_act,
layer_norm_eps, pad_token_id, hidden_dropout_prob / attention_probs_dropout_prob (one probability here),
embedding_size, position_biased_input, relative_attention, max_relative_positions (< 1: max_position_embeddings),
position_buckets, pos_att_type (a list, or the older "p2c|c2p" string), share_att_key, norm_rel_ebd
("none" or "layer_norm"). Refused, by name: ``conv_kernel_size`` > 0 (the convolution after the first
layer), an ``attention_head_size`` other than hidden_size / num_attention_heads, ``pos_att_type`` entries
other than c2p / p2c, ``hidden_act`` not a supported activation.

Names (HF ``DebertaV2Model``; task models under ``deberta.``)::

    embeddings.word_embeddings.weight                  embeddings.word
    embeddings.position_embeddings.weight              embeddings.position          (position_biased_input)
    embeddings.token_type_embeddings.weight            embeddings.token_type        (type_vocab_size > 0)
    embeddings.embed_proj.weight                       embeddings.project.W (ᵀ)     (embedding_size ≠ hidden_size)
    embeddings.LayerNorm.{weight,bias}                 embeddings.ln.{gamma,beta}
    encoder.rel_embeddings.weight                      relative.embeddings          (relative_attention)
    encoder.LayerNorm.{weight,bias}                    relative.ln.{gamma,beta}     (norm_rel_ebd = layer_norm)
    encoder.layer.{i}.attention.self.query_proj.*      layers.{i}.attn.W_Q (ᵀ), b_Q   (key_proj: W_K, value_proj: W_V)
    encoder.layer.{i}.attention.self.pos_key_proj.*    layers.{i}.attn.W_PK (ᵀ), b_PK (c2p, share_att_key false)
    encoder.layer.{i}.attention.self.pos_query_proj.*  layers.{i}.attn.W_PQ (ᵀ), b_PQ (p2c, share_att_key false)
    encoder.layer.{i}.attention.output.dense.*         layers.{i}.attn.W_O (ᵀ), b_O
    encoder.layer.{i}.attention.output.LayerNorm.*     layers.{i}.ln1.{gamma,beta}
    encoder.layer.{i}.intermediate.dense.*             layers.{i}.ffn.W_1 (ᵀ), b_1
    encoder.layer.{i}.output.dense.*                   layers.{i}.ffn.W_2 (ᵀ), b_2
    encoder.layer.{i}.output.LayerNorm.*               layers.{i}.ln2.{gamma,beta}
"""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import ModelConfigError
from ..model.config import EncoderConfig
from ..model.deberta import POS_ATT_TYPES, DebertaArch
from ._config_fields import _Fields

__all__ = ["read_deberta", "deberta_configs", "deberta_name_rows", "deberta_table_size", "deberta_hf_dict",
           "deberta_ignored"]

#: HF activation names → ours (families.HF_ACTIVATIONS, which this module cannot import: families imports it)
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def _bool(f: _Fields, key: str, default: bool) -> bool:
    v = f.hf.get(key, default)
    if not isinstance(v, bool):
        raise f._fail(key, "a boolean (true/false)", v)
    return v


def _pos_att_type(f: _Fields) -> tuple[str, ...]:
    v = f.hf.get("pos_att_type")
    if v is None:
        return ()
    if isinstance(v, str):                 # DebertaV2Config's older form: "p2c|c2p"
        v = [x.strip() for x in v.lower().split("|")]
    if not isinstance(v, list) or any(x not in POS_ATT_TYPES for x in v):
        raise ModelConfigError(f"{f.source} field 'pos_att_type' must be a list of entries of {list(POS_ATT_TYPES)} "
                               f"(or a 'p2c|c2p' string), got {f.hf.get('pos_att_type')!r}")
    return tuple(dict.fromkeys(v))


def _norm_rel_ebd(f: _Fields) -> bool:
    v = f.hf.get("norm_rel_ebd", "none")
    parts = [x.strip() for x in v.lower().split("|")] if isinstance(v, str) else None
    if parts is None or any(x not in ("none", "layer_norm") for x in parts):
        raise f._fail("norm_rel_ebd", "'none' or 'layer_norm'", v)
    return "layer_norm" in parts


def read_deberta(f: _Fields) -> dict:
    """The validated fields of a DebertaV2Config (a spec dict, as the other families' readers return)."""
    conv = f.int("conv_kernel_size", 0, minimum=0)
    if conv > 0:
        raise ModelConfigError(f"{f.source} field 'conv_kernel_size' is {conv}: DeBERTa's convolution after the first "
                               f"layer (ConvLayer) is not implemented; only configs with conv_kernel_size = 0")
    d, h = f.int("hidden_size"), f.int("num_attention_heads")
    head = f.hf.get("attention_head_size")
    if head is not None and (d % h or head != d // h):
        raise ModelConfigError(f"{f.source} field 'attention_head_size' is {head!r}: only hidden_size / "
                               f"num_attention_heads = {d / h:g} is implemented")
    P = f.int("max_position_embeddings", 512)
    mrp = f.int("max_relative_positions", -1, minimum=-(2 ** 31))
    E = f.int("embedding_size", d)
    p_hidden = f.float("hidden_dropout_prob", 0.1, maximum=1.0, max_inclusive=False)
    fields = dict(max_relative_positions=mrp if mrp >= 1 else P,
                  position_buckets=f.int("position_buckets", -1, minimum=-(2 ** 31)),
                  relative_attention=_bool(f, "relative_attention", False), pos_att_type=_pos_att_type(f),
                  share_att_key=_bool(f, "share_att_key", False), norm_rel_ebd=_norm_rel_ebd(f),
                  position_biased_input=_bool(f, "position_biased_input", True), max_position_embeddings=P,
                  embedding_size=E)
    try:
        arch = DebertaArch(**fields)
    except ModelConfigError as e:
        raise ModelConfigError(f"{f.source}: {e}") from None
    return dict(d_model=d, n_layers=f.int("num_hidden_layers"), n_heads=h, d_ff=f.int("intermediate_size"),
                vocab_size=f.int("vocab_size"), max_position_embeddings=P,
                type_vocab_size=f.int("type_vocab_size", 0, minimum=0),
                hidden_act=f.choice("hidden_act", _ACTS, "gelu"),
                layer_norm_eps=f.float("layer_norm_eps", 1e-7, min_inclusive=False, maximum=1.0), p_hidden=p_hidden,
                p_attn=f.float("attention_probs_dropout_prob", p_hidden, maximum=1.0, max_inclusive=False),
                pad_token_id=f.int("pad_token_id", 0, minimum=0, allow_none=True), embedding_size=E,
                dropout_fields=("hidden_dropout_prob", "attention_probs_dropout_prob"), deberta=arch)


def deberta_configs(spec: dict) -> tuple[EncoderConfig, DebertaArch]:
    """The stack's EncoderConfig (Post-LN, BERT's layer) and the DebertaArch of a spec."""
    arch: DebertaArch = spec["deberta"]
    enc = EncoderConfig(n_layers=spec["n_layers"], d_model=spec["d_model"], n_heads=spec["n_heads"],
                        d_ff=spec["d_ff"], activation=_ACTS[spec["hidden_act"]], norm_position="post",
                        layer_norm_eps=spec["layer_norm_eps"], dropout=spec["p_hidden"],
                        vocab_size=spec["vocab_size"], max_len=spec["max_position_embeddings"],
                        type_vocab_size=spec["type_vocab_size"],
                        positional="learned" if arch.position_biased_input else "none", final_layer_norm=False,
                        embedding_layer_norm=True)
    return enc, arch


_LAYER = (("attention.self.query_proj", "attn.W_Q", "attn.b_Q"), ("attention.self.key_proj", "attn.W_K", "attn.b_K"),
          ("attention.self.value_proj", "attn.W_V", "attn.b_V"))


def deberta_name_rows(config) -> Iterator[tuple[str, str, bool]]:
    """(HF name, our name, transpose?) for every tensor of a DeBERTa-v2 HFEncoderConfig, in our order."""
    a: DebertaArch = config.deberta
    yield "embeddings.word_embeddings.weight", "embeddings.word", False
    if a.position_biased_input:
        yield "embeddings.position_embeddings.weight", "embeddings.position", False
    if config.type_vocab_size:
        yield "embeddings.token_type_embeddings.weight", "embeddings.token_type", False
    if a.embedding_size is not None and a.embedding_size != config.d_model:
        yield "embeddings.embed_proj.weight", "embeddings.project.W", True
    yield "embeddings.LayerNorm.weight", "embeddings.ln.gamma", False
    yield "embeddings.LayerNorm.bias", "embeddings.ln.beta", False
    if a.relative_attention:
        yield "encoder.rel_embeddings.weight", "relative.embeddings", False
    if a.norm_rel_ebd:
        yield "encoder.LayerNorm.weight", "relative.ln.gamma", False
        yield "encoder.LayerNorm.bias", "relative.ln.beta", False
    for i in range(config.n_layers):
        hp, op = f"encoder.layer.{i}.", f"layers.{i}."
        rows = list(_LAYER)
        if not a.share_att_key:
            if a.c2p:
                rows.append(("attention.self.pos_key_proj", "attn.W_PK", "attn.b_PK"))
            if a.p2c:
                rows.append(("attention.self.pos_query_proj", "attn.W_PQ", "attn.b_PQ"))
        rows += [("attention.output.dense", "attn.W_O", "attn.b_O")]
        for hf, W, b in rows:
            yield hp + hf + ".weight", op + W, True
            yield hp + hf + ".bias", op + b, False
        for hf, ours in (("attention.output.LayerNorm", "ln1"), ("intermediate.dense", None),
                         ("output.dense", None), ("output.LayerNorm", "ln2")):
            if ours is not None:
                yield hp + hf + ".weight", op + ours + ".gamma", False
                yield hp + hf + ".bias", op + ours + ".beta", False
            else:
                k = "1" if hf.startswith("intermediate") else "2"
                yield hp + hf + ".weight", op + "ffn.W_" + k, True
                yield hp + hf + ".bias", op + "ffn.b_" + k, False


def deberta_table_size(config) -> int:
    """How many rows :func:`deberta_name_rows` yields (from the counts, without building them)."""
    a: DebertaArch = config.deberta
    pos_proj = 0 if a.share_att_key else a.c2p + a.p2c
    front = (3 + a.position_biased_input + bool(config.type_vocab_size)
             + (a.embedding_size is not None and a.embedding_size != config.d_model))
    return front + a.relative_attention + 2 * a.norm_rel_ebd + config.n_layers * (2 * (4 + pos_proj) + 8)


def deberta_ignored(config) -> tuple[str, ...]:
    """State-dict names that are read by neither side: a position table in a checkpoint whose config has
    ``position_biased_input`` false (transformers ignores it too: ``_keys_to_ignore_on_load_unexpected``)."""
    return () if config.deberta.position_biased_input else ("embeddings.position_embeddings.weight",)


def deberta_hf_dict(config) -> dict:
    """DebertaV2Config keyword arguments of an HFEncoderConfig (``AutoConfig.for_model(**d)``)."""
    c, a = config.encoder, config.deberta
    act = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}[c.activation]
    return {"model_type": "deberta-v2", "vocab_size": c.vocab_size, "hidden_size": c.d_model,
            "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff,
            "hidden_act": act, "hidden_dropout_prob": c.dropout, "attention_probs_dropout_prob": c.dropout,
            "max_position_embeddings": a.max_position_embeddings, "type_vocab_size": c.type_vocab_size,
            "layer_norm_eps": c.layer_norm_eps, "pad_token_id": config.pad_token_id,
            "embedding_size": c.d_model if a.embedding_size is None else a.embedding_size,
            "position_biased_input": a.position_biased_input, "relative_attention": a.relative_attention,
            "max_relative_positions": a.max_relative_positions, "position_buckets": a.position_buckets,
            "pos_att_type": list(a.pos_att_type), "share_att_key": a.share_att_key,
            "norm_rel_ebd": "layer_norm" if a.norm_rel_ebd else "none"}
