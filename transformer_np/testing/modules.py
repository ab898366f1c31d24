"""The modules :func:`transformer_np.testing.compare_with_torch` accepts (a part of it: import from there).

Which kind a module is (torch encoder, ``nn.MultiheadAttention``, Hugging Face model or layer; anything else refused
with the list of what is supported), the conversion of a bare ``nn.MultiheadAttention``, the name tables, and what
must never change silently: a module in training mode with dropout (refused unless the caller asks for dropout off),
an attention scale other than 1/√d_k (refused), and, with ``params=``, the configuration the caller's params come
with (every value the output depends on, compared like a tensor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._validate import describe
from ..errors import InputTypeError, InputValueError
from .criterion import TensorComparison

# ----------------------------------------------------------------------------- the module kinds
SUPPORTED_TORCH = ("nn.TransformerEncoderLayer", "nn.TransformerEncoder", "nn.MultiheadAttention (self-attention)")


def supported_text() -> str:
    from ..io.families import supported_text as families

    return (f"torch: {', '.join(SUPPORTED_TORCH)}; Hugging Face: {families()}, their task models' base model, "
            "or one of their layers (BertLayer, AlbertLayer, DistilBERT's TransformerBlock, ...)")


def kind_of(module) -> str:
    """"torch" (encoder layer / encoder), "mha", "hf_model" or "hf_layer"; anything else is refused with the list."""
    from ..io.interop import layer_hf_config
    from ..io.interop_torch import require_torch

    torch = require_torch()
    if isinstance(module, (torch.nn.TransformerEncoderLayer, torch.nn.TransformerEncoder)):
        return "torch"
    if isinstance(module, torch.nn.MultiheadAttention):
        return "mha"
    if not isinstance(module, torch.nn.Module):
        raise InputTypeError(f"module must be a torch module, got {describe(module)}; supported: "
                             f"{supported_text()}")
    if isinstance(module, torch.jit.ScriptModule):       # a stock module's TorchScript: its class is gone
        raise InputTypeError(f"module is a TorchScript module ({type(module).__name__} of "
                             f"{getattr(module, 'original_name', '?')}), which is compared as your own module: "
                             "compare_with_torch(module, x, config=..., names=...) — for a scripted "
                             "nn.TransformerEncoder(Layer), names=names_for(the eager module) — and sublayers= for "
                             "the first sublayer that differs (docs/guide/testing.md, 'Your own module')")
    try:
        import transformers
    except ImportError:  # pragma: no cover - depends on the environment
        raise InputTypeError(f"module {type(module).__name__} is not supported (and transformers is not installed "
                             f"for Hugging Face models); supported: {supported_text()}") from None
    if isinstance(module, transformers.PreTrainedModel):
        if module.base_model is not module:
            raise InputValueError(f"module is the task model {type(module).__name__}, whose output is not the "
                                  f"encoder's: compare its base model, module.{module.base_model_prefix}")
        return "hf_model"
    if layer_hf_config(module) is None:
        raise InputTypeError(f"module must be a supported module, got {type(module).__name__}; supported: "
                             f"{supported_text()}")
    return "hf_layer"


@dataclass(frozen=True)
class MHAConfig:
    """What the comparison needs to know of a bare nn.MultiheadAttention (one "layer": its tolerances are one
    layer's)."""

    d_model: int
    n_heads: int
    n_layers: int = 1


def mha_config(mha) -> MHAConfig:
    """The config of a self-attention nn.MultiheadAttention; unsupported options are refused by name. Its params
    are ours under :func:`transformer_np.ops.attention.mha_forward`'s names (``W_Q``, ``b_Q``, …, ``W_O``, ``b_O``)."""
    d = mha.embed_dim
    if not mha._qkv_same_embed_dim:
        raise InputValueError(f"module has kdim = {mha.kdim} / vdim = {mha.vdim} different from embed_dim = {d}: "
                              "only self-attention (query = key = value = the input) is compared")
    if mha.in_proj_bias is None or mha.out_proj.bias is None:
        raise InputValueError("module was built with bias=False: transformer_np's projections have biases")
    if mha.bias_k is not None or mha.bias_v is not None:
        raise InputValueError("module was built with add_bias_kv=True: unsupported")
    if mha.add_zero_attn:
        raise InputValueError("module was built with add_zero_attn=True: unsupported")
    return MHAConfig(d, mha.num_heads)


def param_views(mod, names: dict[str, tuple[str, bool]]) -> dict[str, np.ndarray]:
    """Our params as views of the module's own tensors, through the name table: W = weightᵀ (a transposed view),
    torch's fused in_proj split into its row blocks. No copy: the comparison reads the module copy's weights
    themselves, so its weight entries are exact by construction (see
    :func:`transformer_np.testing.criterion._compare`)."""
    out = {}
    for fw, p in mod.named_parameters():
        row = names.get(fw)
        if row is None:
            continue
        ours, transposed = row
        a = p.detach().numpy()
        if "|" in ours:
            base, _, leaves = ours.rpartition(".")
            leaves = leaves.split("|")
            d = a.shape[0] // len(leaves)
            for j, leaf in enumerate(leaves):
                block = a[j * d:(j + 1) * d]                                 # (d, d) or (d,)
                out[f"{base}.{leaf}" if base else leaf] = block.T if transposed else block
        else:
            out[ours] = a.T if transposed else a
    return out


_MHA_NAMES = {"in_proj_weight": ("W_Q|W_K|W_V", True), "in_proj_bias": ("b_Q|b_K|b_V", False),
              "out_proj.weight": ("W_O", True), "out_proj.bias": ("b_O", False)}


def _torch_names_ours(config, single: bool) -> dict[str, tuple[str, bool]]:
    """torch name → (our name, transposed?); the fused in_proj maps to "…attn.W_Q|W_K|W_V"."""
    from ..io.interop_torch import torch_table

    out = {fw: (ours, t) for fw, ours, t in torch_table(config, single)}
    for i in range(config.n_layers):
        tp = "" if single else f"layers.{i}."
        out[tp + "self_attn.in_proj_weight"] = (f"layers.{i}.attn.W_Q|W_K|W_V", True)
        out[tp + "self_attn.in_proj_bias"] = (f"layers.{i}.attn.b_Q|b_K|b_V", False)
    return out


def names_of(kind: str, config, module, torch) -> dict[str, tuple[str, bool]]:
    if kind == "mha":
        return dict(_MHA_NAMES)
    if kind == "torch":
        return _torch_names_ours(config, isinstance(module, torch.nn.TransformerEncoderLayer))
    from ..io.families import hf_name_table, pooler_rows
    from ..io.interop import as_family_config

    fc = as_family_config(config, "compare_with_torch")
    return {fw: (o, t) for fw, o, t in list(hf_name_table(fc)) + pooler_rows(fc)}


def batch_first(mod, kind: str) -> bool:
    if kind == "mha":
        return bool(mod.batch_first)
    if kind != "torch":
        return True
    layer = mod if not hasattr(mod, "layers") else mod.layers[0]
    return bool(getattr(layer.self_attn, "batch_first", False))




# ----------------------------------------------------------------------------- nothing silent
def training_dropout(module, torch) -> list[str]:
    """'name (p = …)' of every submodule in training mode whose dropout probability is > 0."""
    out = []
    for name, m in module.named_modules():
        if not m.training:
            continue
        p = None
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            p = m.p
        elif isinstance(m, torch.nn.MultiheadAttention):
            p = m.dropout
        if p:
            out.append(f"{name or type(module).__name__} (p = {p:g})")
    return out


def check_attention_scale(module, config) -> None:
    """Refuse an attention module whose ``scaling`` is not 1/√d_k, the only scale transformer_np computes."""
    d_k = config.d_model // config.n_heads
    for name, m in module.named_modules():
        s = getattr(m, "scaling", None)
        # a computed float compared with d_k**-0.5 computed another way: equal to round-off, not bit for bit
        if isinstance(s, float) and not math.isclose(s, d_k ** -0.5, rel_tol=1e-12):
            raise InputValueError(f"module.{name}.scaling = {s:g}, but transformer_np scales the attention scores by "
                                  f"1/√d_k = {d_k ** -0.5:g} (d_k = {d_k}): unsupported")


#: The fields of a configuration that decide the shapes of the parameters: if one differs, no tensor can be compared.
STRUCTURAL = ("n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "type_vocab_size", "share_layers",
              "model_type", "embedding_size", "position rows", "bare_layer", "deberta layout")


def config_fields(config) -> dict:
    """Every configuration value the output depends on (dropout only acts in training, max_len only bounds the
    input): the stack's, and around it the family's (embedding width, position table, padding id)."""
    from ..io.families import HFEncoderConfig
    from ..model.config import EncoderConfig

    if isinstance(config, MHAConfig):
        return {"d_model": config.d_model, "n_heads": config.n_heads}
    if not isinstance(config, (EncoderConfig, HFEncoderConfig)):
        raise InputTypeError(f"config must be an EncoderConfig or HFEncoderConfig (yours, with params), got "
                             f"{describe(config)}")
    enc = config.encoder if isinstance(config, HFEncoderConfig) else config
    out = {k: getattr(enc, k) for k in ("n_layers", "d_model", "n_heads", "d_ff", "activation", "norm_position",
                                        "layer_norm_eps", "share_layers", "vocab_size", "type_vocab_size")}
    out["final LayerNorm"] = enc.use_final_layer_norm
    out["attention scale 1/√d_k"] = (enc.d_model // enc.n_heads) ** -0.5
    if enc.has_embeddings:
        out.update(positional=enc.positional, embedding_layer_norm=enc.embedding_layer_norm)
    if isinstance(config, HFEncoderConfig) and config.model_type != "bert":
        out.update(model_type=config.model_type, bare_layer=config.bare_layer)
        if not config.bare_layer:
            out.update({"embedding_size": config.E, "position rows": config.n_positions})
            if config.family.offset_positions:
                out["pad_token_id (RoBERTa's positions)"] = config.pad_token_id
        a = config.deberta
        if a is not None:                    # what decides the shapes, then the positions' buckets
            out["deberta layout"] = (a.relative_attention, a.span, a.pos_att_type, a.share_att_key, a.norm_rel_ebd,
                                     a.position_biased_input, a.max_position_embeddings, a.embedding_size)
            out["deberta buckets"] = (a.position_buckets, a.max_relative_positions)
    return out


def config_entries(yours, modules) -> list[TensorComparison]:
    """One "config" entry per field of :func:`config_fields`: ``ours`` is the caller's value, ``ref`` the module's;
    exact equality (each side holds the number it computes with), max_abs 0 when equal, inf when not."""
    a, b = config_fields(yours), config_fields(modules)
    out = []
    for k in dict.fromkeys(list(b) + list(a)):
        va, vb = a.get(k, "(absent)"), b.get(k, "(absent)")
        same = bool(va == vb)
        out.append(TensorComparison(k, "config", None, 0.0 if same else math.inf, (), np.array(va, dtype=object),
                                    np.array(vb, dtype=object)))
    return out
