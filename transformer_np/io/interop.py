r"""Weights that move both ways between transformer_np, PyTorch and Hugging Face encoders; the Hugging Face side.

Two conventions meet here:

* **row vectors vs. ``nn.Linear``.** We write y = x W + b with W of shape (d_in, d_out);
  ``nn.Linear`` stores ``weight`` of shape (d_out, d_in) and computes y = x weightᵀ + b.
  So every weight matrix is transposed on the way in and on the way out:
  ``W = weight.T``. Embedding tables, LayerNorm γ/β and biases are copied as they are.
* **names.** Our params are a flat dict of dotted names (see :mod:`transformer_np.model.params`);
  each framework has its own. The tables below and in :mod:`transformer_np.io.interop_torch` are the
  whole mapping.

Hugging Face ``BertModel`` (Post-LN; ``{i}`` = layer index)::

    embeddings.word_embeddings.weight                 embeddings.word
    embeddings.position_embeddings.weight             embeddings.position
    embeddings.token_type_embeddings.weight           embeddings.token_type
    embeddings.LayerNorm.{weight,bias}                embeddings.ln.{gamma,beta}
    encoder.layer.{i}.attention.self.query.*          layers.{i}.attn.W_Q (ᵀ), b_Q
    encoder.layer.{i}.attention.self.key.*            layers.{i}.attn.W_K (ᵀ), b_K
    encoder.layer.{i}.attention.self.value.*          layers.{i}.attn.W_V (ᵀ), b_V
    encoder.layer.{i}.attention.output.dense.*        layers.{i}.attn.W_O (ᵀ), b_O
    encoder.layer.{i}.attention.output.LayerNorm.*    layers.{i}.ln1.{gamma,beta}
    encoder.layer.{i}.intermediate.dense.*            layers.{i}.ffn.W_1 (ᵀ), b_1
    encoder.layer.{i}.output.dense.*                  layers.{i}.ffn.W_2 (ᵀ), b_2
    encoder.layer.{i}.output.LayerNorm.*              layers.{i}.ln2.{gamma,beta}
    pooler.dense.{weight,bias}                        pooler.W (ᵀ), pooler.b   (optional)

The other families (RoBERTa, XLM-R, CamemBERT, data2vec-text, DistilBERT, ALBERT, ELECTRA,
ERNIE) and what differs in them — names, RoBERTa's position ids, ALBERT's and ELECTRA's
factorised embeddings (``embeddings.project.W``/``.b``), ALBERT's shared layer — are in
:mod:`transformer_np.io.families`. A BERT config is an :class:`EncoderConfig` (run it with
:func:`encoder_forward`); every other family's is an :class:`HFEncoderConfig` (run it with
:func:`transformer_np.io.hf_model.hf_forward`, which runs BERT too).

Task models (``BertFor*``, ``RobertaFor*``, ...) hold the same tensors under their base-model
prefix (``bert.``, ``roberta.``, ``distilbert.``, ``albert.``, ``electra.``, ...), detected
automatically; their task heads (every name *outside* the prefix) are not part of the encoder
and are ignored. The buffers ``embeddings.position_ids`` / ``embeddings.token_type_ids`` (old
checkpoints store them) are ignored too. Anything else that does not fit is an error.

The PyTorch side — ``nn.TransformerEncoder`` / ``nn.TransformerEncoderLayer``, its table (the fused
``in_proj`` Q/K/V) and :class:`~transformer_np.io.interop_torch.TorchLayerConfig` — is
:mod:`transformer_np.io.interop_torch`; its public names are re-exported here
(:func:`~transformer_np.io.interop_torch.from_torch`,
:func:`~transformer_np.io.interop_torch.to_torch_state_dict`, ...). The table machinery both sides
share is in ``transformer_np.io._state_tables``.

What goes in as a single layer comes back under the single layer's names: :func:`from_hf` of an HF
layer (``BertLayer``, ...) returns an ``HFEncoderConfig`` with ``bare_layer=True``, whose exports use
the layer's own names (``from_torch`` of a bare ``nn.TransformerEncoderLayer`` does the same).

Every mapping works on parameters *and* on gradients: a gradient has the same names
and shapes as its parameter, and the transpose commutes with differentiation
(∂L/∂weight = (∂L/∂W)ᵀ when weight = Wᵀ).

torch and transformers are imported lazily inside the functions that need them; the
``*_from_*`` / ``config_from_hf_dict`` functions are pure NumPy.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .._optional import require
from .._validate import describe
from ..errors import InputTypeError, InputValueError, ModelConfigError
from ..model.config import EncoderConfig
from ._state_tables import _export, _import, _rows_for
from .families import (
    FAMILIES,
    HF_ACTIVATIONS,
    SUPPORTED_MODEL_TYPES,
    HFEncoderConfig,
    encoder_config_from_spec,
    hf_name_table,
    hf_param_shapes,
    hf_table_size,
    pooler_rows,
    read_hf_config,
    supported_text,
)
from .family_deberta import deberta_configs, deberta_hf_dict, deberta_ignored
from .family_modernbert import modernbert_configs, modernbert_hf_dict
from .hf_model import hf_backward, hf_forward
from .interop_torch import (
    TorchLayerConfig,
    _module_dtype,
    _to_torch_tensors,
    from_torch,
    params_from_torch_state_dict,
    require_torch,
    to_torch_state_dict,
    torch_state_dict_from_params,
)

__all__ = ["config_from_hf_dict", "hf_dict_from_config", "params_from_hf_state_dict",
           "hf_state_dict_from_params", "params_from_torch_state_dict", "torch_state_dict_from_params",
           "from_torch", "from_hf", "from_hf_bert", "to_torch_state_dict", "to_hf_state_dict", "HF_ACTIVATIONS",
           "HFEncoderConfig", "TorchLayerConfig", "SUPPORTED_MODEL_TYPES", "hf_forward", "hf_backward",
           "hf_module_names"]

_HF_ACT_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
_HF_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


# ----------------------------------------------------------------------------- HF config
def config_from_hf_dict(hf_config: dict, source: str = "hf_config") -> EncoderConfig | HFEncoderConfig:
    """The config of a Hugging Face ``config.json`` dict (or ``XConfig.to_dict()``) of any supported family.

    The family comes from ``model_type`` (else from the class names in ``architectures``, else BERT).
    BERT gives an :class:`EncoderConfig` — hidden_size → d_model, num_hidden_layers → n_layers,
    num_attention_heads → n_heads, intermediate_size → d_ff, hidden_act → activation (see
    :data:`HF_ACTIVATIONS`), layer_norm_eps, vocab_size, max_position_embeddings → max_len,
    type_vocab_size; always Post-LN, learned absolute positions, embedding LayerNorm, no final
    LayerNorm. Every other family gives an :class:`HFEncoderConfig` holding such an EncoderConfig
    plus what differs (see :mod:`transformer_np.io.families`).

    Dropout: our config has one probability, HF two. We take the hidden one
    (``hidden_dropout_prob``; DistilBERT's ``dropout``) and warn when the attention one differs —
    it only matters in training, where dropout masks never match across frameworks anyway.

    Every field read is validated; ``source`` (e.g. the path of config.json) starts the messages.

    Raises:
        ModelConfigError (a ValueError) naming the field, what was expected and what was received:
        a missing required field, an integer that is a bool / string / float / null, a non-finite
        or out-of-range number, an unsupported model_type (the message lists the supported ones),
        ``position_embedding_type`` other than "absolute", an unknown ``hidden_act``,
        ``is_decoder`` / ``add_cross_attention``, ALBERT layer groups, ERNIE task ids.
        InputTypeError when ``hf_config`` is not a dict.
    """
    fam, spec = read_hf_config(hf_config, source)
    if fam.model_type == "modernbert":
        enc, arch = modernbert_configs(spec)
        return HFEncoderConfig("modernbert", enc, max_position_embeddings=spec["max_position_embeddings"],
                               pad_token_id=spec["pad_token_id"], modernbert=arch)
    if fam.model_type == "deberta-v2":
        enc, arch = deberta_configs(spec)
        return HFEncoderConfig("deberta-v2", enc, embedding_size=spec["embedding_size"],
                               max_position_embeddings=spec["max_position_embeddings"],
                               pad_token_id=spec["pad_token_id"], deberta=arch)
    enc = encoder_config_from_spec(fam, spec)
    if fam.model_type == "bert":
        return enc
    return HFEncoderConfig(fam.model_type, enc, embedding_size=spec["embedding_size"],
                           max_position_embeddings=spec["max_position_embeddings"], pad_token_id=spec["pad_token_id"],
                           relative_attention_num_buckets=spec.get("relative_attention_num_buckets"))


def as_family_config(config, what: str) -> HFEncoderConfig:
    """An HFEncoderConfig for either kind of config (BERT's EncoderConfig is checked and wrapped)."""
    if isinstance(config, HFEncoderConfig):
        return config
    _check_bert_like(config, what)
    return HFEncoderConfig("bert", config)


def _check_bert_like(config: EncoderConfig, what: str) -> None:
    """A config that BERT's names can express, else ValueError naming the field."""
    if not isinstance(config, EncoderConfig):
        raise InputTypeError(f"config must be an EncoderConfig or HFEncoderConfig, got {describe(config)}")
    need = {"norm_position": "post", "positional": "learned", "share_layers": False,
            "use_final_layer_norm": False, "embedding_layer_norm": True, "has_embeddings": True}
    for field, want in need.items():
        got = getattr(config, field)
        if got != want:
            raise InputValueError(f"{what}: BERT's layout needs config.{field} = {want!r}, got {got!r}")


def hf_dict_from_config(config: EncoderConfig | HFEncoderConfig) -> dict:
    """The reverse of :func:`config_from_hf_dict`: keyword arguments for the family's config class
    (``BertConfig(**hf_dict_from_config(config))``; for the other families the dict also carries
    ``model_type``, so ``transformers.AutoConfig.for_model(**d)`` builds the right class).

    Both dropout fields get ``config.dropout``. Exact GELU maps to "gelu", the tanh
    approximation to "gelu_new".
    """
    fc = as_family_config(config, "hf_dict_from_config")
    if fc.bare_layer:
        raise InputValueError("hf_dict_from_config: a bare-layer config has no vocabulary; use the model's config")
    c = fc.encoder
    if fc.model_type == "modernbert":
        return modernbert_hf_dict(fc)
    if fc.model_type == "deberta-v2":
        return deberta_hf_dict(fc)
    if fc.model_type == "distilbert":
        return {"model_type": "distilbert", "vocab_size": c.vocab_size, "dim": c.d_model, "n_layers": c.n_layers,
                "n_heads": c.n_heads, "hidden_dim": c.d_ff, "activation": _HF_ACT_OUT[c.activation],
                "dropout": c.dropout, "attention_dropout": c.dropout, "max_position_embeddings": fc.n_positions,
                "pad_token_id": fc.pad_token_id if fc.pad_token_id is not None else 0}
    out = {"vocab_size": c.vocab_size, "hidden_size": c.d_model, "num_hidden_layers": c.n_layers,
           "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff, "hidden_act": _HF_ACT_OUT[c.activation],
           "hidden_dropout_prob": c.dropout, "attention_probs_dropout_prob": c.dropout,
           "max_position_embeddings": fc.n_positions, "type_vocab_size": c.type_vocab_size,
           "layer_norm_eps": c.layer_norm_eps}
    if isinstance(config, EncoderConfig):
        out["position_embedding_type"] = "absolute"
        return out
    out = {"model_type": fc.model_type, **out}
    if fc.pad_token_id is not None:
        out["pad_token_id"] = fc.pad_token_id
    if fc.model_type in ("albert", "electra"):
        out["embedding_size"] = fc.E
    if fc.model_type == "mpnet":            # no token-type table; the relative position table's rows
        del out["type_vocab_size"]
        out["relative_attention_num_buckets"] = fc.relative_attention_num_buckets
    return out


def _strip_prefix(state: Mapping, prefix: str | None, detect: str) -> dict:
    """Detect (prefix=None: ``detect`` if any name starts with it) or apply a name prefix; names
    outside it are task heads, dropped."""
    if not isinstance(state, Mapping):
        raise InputTypeError(f"state must be a mapping of name -> array (a state dict), got {describe(state)}")
    if prefix is None:
        prefix = detect if detect and any(k.startswith(detect) for k in state) else ""
    elif not isinstance(prefix, str):
        raise InputTypeError(f"prefix must be a str or None, got {describe(prefix)}")
    if not prefix:
        return dict(state)
    inner = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not inner:
        raise InputValueError(f"state has no tensor under the prefix {prefix!r}")
    return inner


def _family_shapes(fc: HFEncoderConfig) -> dict:
    shapes = dict(hf_param_shapes(fc))
    if pooler_rows(fc):
        d = fc.d_model
        shapes.update({"pooler.W": (d, d), "pooler.b": (d,)})
    return shapes


def params_from_hf_state_dict(state: Mapping[str, np.ndarray], config: EncoderConfig | HFEncoderConfig, dtype=None,
                              prefix: str | None = None) -> dict[str, np.ndarray]:
    """Our params from a Hugging Face state dict of any supported family (NumPy arrays or torch tensors).

    Args:
        state: name → tensor, e.g. ``safetensors.numpy.load_file("model.safetensors")`` or
            ``model.state_dict()``. Names are those of the module docstring / :mod:`~transformer_np.io.families`.
        config: the config (from :func:`config_from_hf_dict`, or :func:`from_hf`).
        dtype: float32/float64 of the result; None keeps float64 if the state is all
            float64, else float32.
        prefix: None detects the family's task-model prefix (``"bert."``, ``"roberta."``, ...;
            the task heads outside it are ignored); "" means no prefix.

    Returns a params dict that :func:`validate_params` (BERT) / :func:`hf_forward` accepts, with
    ``pooler.W`` (d, d) and ``pooler.b`` when the state has the pooler. Weight matrices are
    transposed (``W = weight.T``) and copied (contiguous), so the result shares no memory with ``state``.

    Raises ValueError naming the tensor for a missing, unexpected or misshapen tensor.
    """
    fc = as_family_config(config, "params_from_hf_state_dict")
    detect = "" if fc.bare_layer else fc.family.base_prefix + "."
    inner = _strip_prefix(state, prefix, detect)
    source = f"Hugging Face {fc.model_type}" + (" layer" if fc.bare_layer else "")
    ignored = () if fc.bare_layer else _HF_BUFFERS + (deberta_ignored(fc) if fc.deberta is not None else ())
    rows = _rows_for(inner, hf_name_table(fc), hf_table_size(fc), pooler_rows(fc), ignored, source)
    shapes = _family_shapes(fc)
    params = _import(inner, rows, shapes, dtype, source)
    return {k: params[k] for k in shapes if k in params}            # our canonical order, pooler last


def hf_tensors_needed(shapes: Mapping[str, tuple], config: EncoderConfig | HFEncoderConfig,
                      prefix: str | None = None) -> dict[str, str]:
    """The tensors :func:`params_from_hf_state_dict` would read from a state dict whose names and shapes are
    ``shapes`` (e.g. a safetensors header) — checked the same way, before any tensor is read.

    Returns ``{file name: our name}`` for every tensor the config needs (plus the optional pooler when present):
    exactly the tensors to read. Names outside the family's prefix (task heads) and the position/token-type
    buffers are not in it: they are never read. Raises the InputValueError :func:`params_from_hf_state_dict`
    raises for a missing or unexpected tensor (by name) or a misshapen one (name, expected and found shape)."""
    fc = as_family_config(config, "hf_tensors_needed")
    detect = "" if fc.bare_layer else fc.family.base_prefix + "."
    inner = _strip_prefix(shapes, prefix, detect)
    if prefix is None:                                  # as _strip_prefix detects it
        prefix = detect if detect and any(k.startswith(detect) for k in shapes) else ""
    source = f"Hugging Face {fc.model_type}" + (" layer" if fc.bare_layer else "")
    ignored = () if fc.bare_layer else _HF_BUFFERS + (deberta_ignored(fc) if fc.deberta is not None else ())
    rows = _rows_for(inner, hf_name_table(fc), hf_table_size(fc), pooler_rows(fc), ignored, source)
    want = _family_shapes(fc)
    for fw, ours, transpose in rows:
        expected = tuple(want[ours][::-1] if transpose else want[ours])
        if tuple(inner[fw]) != expected:
            raise InputValueError(f"{source} tensor {fw!r} must have shape {expected} (for {ours!r} of shape "
                                  f"{tuple(want[ours])}), got shape {tuple(inner[fw])}")
    return {prefix + fw: ours for fw, ours, _ in rows}


def hf_state_dict_from_params(tree: Mapping[str, np.ndarray], config: EncoderConfig | HFEncoderConfig,
                              prefix: str = "") -> dict[str, np.ndarray]:
    """The reverse of :func:`params_from_hf_state_dict`, in NumPy: our params *or grads*
    → the family's HF names (``prefix`` + name, e.g. ``prefix="bert."`` for a BertFor* model),
    weight matrices transposed back to ``nn.Linear``'s (d_out, d_in). ``pooler.W``/``pooler.b``
    are exported when present. A bare-layer config gives the layer's own names
    (``attention.self.query.weight``, ...). Arrays are fresh contiguous copies in the tree's dtype."""
    fc = as_family_config(config, "hf_state_dict_from_params")
    if not isinstance(prefix, str):
        raise InputTypeError(f"prefix must be a str, got {describe(prefix)}")
    if isinstance(tree, Mapping) and len(tree) + 1 < hf_table_size(fc):
        raise InputValueError(f"hf_state_dict_from_params: tree has {len(tree)} arrays, the {fc.model_type} config "
                              f"needs {hf_table_size(fc)}")
    out = _export(tree, list(hf_name_table(fc)), pooler_rows(fc), _family_shapes(fc), "hf_state_dict_from_params")
    return {prefix + k: v for k, v in out.items()}


def hf_module_names(config: EncoderConfig | HFEncoderConfig) -> dict[str, str]:
    """Our name → the HF name (of a base model, or of a bare layer) for every tensor of ``config``,
    pooler included where the family has one: how to read our names in HF's terms."""
    fc = as_family_config(config, "hf_module_names")
    return {ours: fw for fw, ours, _ in list(hf_name_table(fc)) + pooler_rows(fc)}


# ----------------------------------------------------------------------------- transformers modules
def _require_transformers():
    return require("transformers", "this function needs transformers: pip install transformers "
                                   "(or pip install 'transformer_np[hf]')")


def from_hf_bert(model, dtype=None) -> tuple[EncoderConfig, dict[str, np.ndarray]]:
    """``(config, params)`` from a ``transformers.BertModel`` or a ``BertFor*`` model (its
    ``bert.`` submodel; task heads ignored). The pooler is kept as ``pooler.W``/``pooler.b``
    when the model has one. Parameters keep the model's dtype (float64 if all float64, else
    float32) unless ``dtype`` is given. See :func:`config_from_hf_dict` for what is rejected;
    :func:`from_hf` does the same for every supported family.
    """
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "state_dict"):
        raise InputTypeError(f"model must be a transformers BertModel or BertFor* model, got {type(model).__name__}")
    config, params = from_hf(model, dtype=dtype)
    if not isinstance(config, EncoderConfig):
        raise InputValueError(f"from_hf_bert: model is a {config.model_type} model, not BERT; use from_hf")
    return config, params


def _hf_config_dict(cfg, where: str) -> dict:
    act = getattr(cfg, "hidden_act", getattr(cfg, "activation", "gelu"))
    if not isinstance(act, str):
        raise InputValueError(f"{where}.hidden_act is a callable {act!r}; use one of {sorted(HF_ACTIVATIONS)}")
    return cfg.to_dict()


def layer_hf_config(module):
    """The transformers config held by an HF layer's submodules (BertSelfAttention.config, ...), or None."""
    for m in module.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "to_dict") and hasattr(cfg, "model_type"):
            return cfg
    return None


def from_hf(module, dtype=None) -> tuple[EncoderConfig | HFEncoderConfig, dict[str, np.ndarray]]:
    """``(config, params)`` from a transformers encoder of any supported family, or from one of its layers.

    * A model — ``BertModel``, ``RobertaModel``, ``XLMRobertaModel``, ``CamembertModel``,
      ``Data2VecTextModel``, ``DistilBertModel``, ``AlbertModel``, ``ElectraModel``, ``ErnieModel``
      or any of their ``*For*`` task models (the base model's tensors; task heads ignored): BERT
      gives an :class:`EncoderConfig`, the others an :class:`HFEncoderConfig`. Run either with
      :func:`hf_forward`.
    * A layer — ``BertLayer``, ``RobertaLayer``, ``AlbertLayer``, DistilBERT's ``TransformerBlock``,
      ...: an :class:`HFEncoderConfig` with ``bare_layer=True`` (no embeddings, ``layers.0.*`` params),
      whose exports use the layer's own names. Run it with ``hf_forward(params, config,
      inputs_embeds=H)``.

    Parameters keep the module's dtype (float64 if all float64, else float32) unless ``dtype`` is
    given. Unsupported architectures raise :class:`~transformer_np.errors.ModelConfigError` listing
    the supported ones.
    """
    config, is_model = hf_config_of(module)
    prefix = None if is_model else ""
    params = params_from_hf_state_dict(module.state_dict(), config, dtype=_module_dtype(module, dtype), prefix=prefix)
    return config, params


def hf_config_of(module) -> tuple[EncoderConfig | HFEncoderConfig, bool]:
    """(the config :func:`from_hf` returns, whether the module is a model rather than a layer), without
    converting any weight."""
    torch = require_torch()
    if not isinstance(module, torch.nn.Module):
        raise InputTypeError(f"module must be a transformers model or layer (a torch.nn.Module), "
                             f"got {type(module).__name__}")
    transformers = _require_transformers()
    if isinstance(module, transformers.PreTrainedModel):
        name = type(module).__name__
        return config_from_hf_dict(_hf_config_dict(module.config, f"{name}.config"), source=f"{name}.config"), True
    cfg = layer_hf_config(module)
    _refuse_bare_layer(module)
    if cfg is None:
        raise InputTypeError(f"module must be a transformers encoder model ({supported_text()}) or one of their "
                             f"layers, got {type(module).__name__}")
    source = f"{type(module).__name__}'s config"
    fam, spec = read_hf_config(_hf_config_dict(cfg, source), source)
    enc = encoder_config_from_spec(fam, spec).replace(n_layers=1, vocab_size=None, type_vocab_size=0,
                                                      share_layers=False, max_len=2**31 - 1)
    return HFEncoderConfig(fam.model_type, enc, bare_layer=True), False


def _refuse_bare_layer(module) -> None:
    """A layer of a family whose layers cannot run alone (MPNet's attention reads the model's relative table)."""
    name = type(module).__name__
    for fam in FAMILIES.values():
        if not fam.bare_layers and any(name.startswith(a) for a in fam.architectures):
            raise ModelConfigError(f"a bare {fam.model_type} layer cannot run alone ({name}: its attention reads the "
                                   f"model's relative position table); compare the whole {fam.architectures[0]}Model")


def to_hf_state_dict(tree: Mapping[str, np.ndarray], config: EncoderConfig | HFEncoderConfig,
                     prefix: str = "") -> dict:
    """Our params (or grads) → a state dict of torch tensors with the family's transformers
    names (``prefix="bert."`` etc. for a task model; a bare-layer config gives the layer's own
    names). ``pooler.*`` is included when the tree has ``pooler.W``/``pooler.b``; for a tree
    without a pooler load into ``XModel(cfg, add_pooling_layer=False)``. Tensors are fresh CPU
    copies in the tree's dtype; ``load_state_dict(strict=True)`` copies them into the model's dtype.
    """
    return _to_torch_tensors(hf_state_dict_from_params(tree, config, prefix=prefix))
