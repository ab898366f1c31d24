r"""Weights that move both ways between transformer_np, PyTorch and Hugging Face encoders.

Two conventions meet here:

* **row vectors vs. ``nn.Linear``.** We write y = x W + b with W of shape (d_in, d_out);
  ``nn.Linear`` stores ``weight`` of shape (d_out, d_in) and computes y = x weightᵀ + b.
  So every weight matrix is transposed on the way in and on the way out:
  ``W = weight.T``. Embedding tables, LayerNorm γ/β and biases are copied as they are.
* **names.** Our params are a flat dict of dotted names (see :mod:`transformer_np.model.params`);
  each framework has its own. The tables below are the whole mapping.

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

PyTorch ``nn.TransformerEncoder`` (``layers.{i}.`` prefix; a bare
``nn.TransformerEncoderLayer`` has none)::

    self_attn.in_proj_weight  (3d, d)   [W_Qᵀ; W_Kᵀ; W_Vᵀ]  stacked row blocks
    self_attn.in_proj_bias    (3d,)     [b_Q; b_K; b_V]
    self_attn.out_proj.*                attn.W_O (ᵀ), b_O
    linear1.*                           ffn.W_1 (ᵀ), b_1
    linear2.*                           ffn.W_2 (ᵀ), b_2
    norm1.*                             ln1.{gamma,beta}   (before attention when norm_first)
    norm2.*                             ln2.{gamma,beta}
    norm.*  (TransformerEncoder only)   final_ln.{gamma,beta}

What goes in as a single layer comes back under the single layer's names: :func:`from_torch`
of a bare ``nn.TransformerEncoderLayer`` returns a :class:`TorchLayerConfig` (an
``EncoderConfig``, equal to the plain one), and the exports given that config use the layer's own
names (``self_attn.in_proj_weight``); :func:`from_hf` of an HF layer (``BertLayer``, ...) returns an
``HFEncoderConfig`` with ``bare_layer=True``, with the same effect.

Every mapping works on parameters *and* on gradients: a gradient has the same names
and shapes as its parameter, and the transpose commutes with differentiation
(∂L/∂weight = (∂L/∂W)ᵀ when weight = Wᵀ).

torch and transformers are imported lazily inside the functions that need them; the
``*_from_*`` / ``config_from_hf_dict`` functions are pure NumPy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from .._validate import FLOAT_DTYPES, describe, mismatch_detail
from ..errors import InputTypeError, InputValueError
from ..model.config import EncoderConfig
from ..model.params import param_shapes
from .families import (
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
from .hf_model import hf_backward, hf_forward

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
    enc = encoder_config_from_spec(fam, spec)
    if fam.model_type == "bert":
        return enc
    return HFEncoderConfig(fam.model_type, enc, embedding_size=spec["embedding_size"],
                           max_position_embeddings=spec["max_position_embeddings"], pad_token_id=spec["pad_token_id"])


def _as_family_config(config, what: str) -> HFEncoderConfig:
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
    fc = _as_family_config(config, "hf_dict_from_config")
    if fc.bare_layer:
        raise InputValueError("hf_dict_from_config: a bare-layer config has no vocabulary; use the model's config")
    c = fc.encoder
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
    return out


# ----------------------------------------------------------------------------- arrays in, arrays out
def _as_numpy(x, name: str) -> np.ndarray:
    """A NumPy view of an array-like; torch tensors are detached and moved to the CPU."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):      # a torch.Tensor, without importing torch
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":            # NumPy has no bfloat16
            x = x.float()
        x = x.numpy()
    if not isinstance(x, np.ndarray):
        raise InputTypeError(f"state[{name!r}] must be a numpy array or torch tensor, got {describe(x)}")
    return x


def _target_dtype(arrays: list[np.ndarray], dtype) -> np.dtype:
    """The dtype of the imported params: ``dtype`` if given, else float64 when every source
    tensor is float64, else float32 (float16/bfloat16 checkpoints are widened to float32)."""
    if dtype is not None:
        dt = np.dtype(dtype)
        if dt not in FLOAT_DTYPES:
            raise InputTypeError(f"dtype must be float32 or float64, got {dt}")
        return dt
    for a in arrays:
        if not np.issubdtype(a.dtype, np.floating):
            raise InputTypeError(f"expected floating-point weights, got a tensor of dtype {a.dtype}")
    if arrays and all(a.dtype == np.float64 for a in arrays):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _rows_for(state: Mapping, rows: Iterable[tuple[str, str, bool]], n_rows: int, optional: list, ignored,
              source: str) -> list[tuple[str, str, bool]]:
    """The rows of a name table, after checking ``state`` holds exactly those names.

    The table is walked lazily and only as far as the state can match it: a config that asks
    for a million layers is refused from the counts, before a million rows are built.
    """
    if not isinstance(state, Mapping):
        raise InputTypeError(f"state must be a mapping of name -> array (a state dict), got {describe(state)}")
    if n_rows > len(state):
        missing = []
        for fw, _, _ in rows:
            if fw not in state:
                missing.append(fw)
                if len(missing) > 8:
                    break
        raise InputValueError(f"{source} state dict does not match the config: it has {len(state)} tensors, the "
                              f"config needs {n_rows} ({mismatch_detail(missing, [])})")
    rows = list(rows)
    known = {fw for fw, _, _ in rows} | {fw for fw, _, _ in optional}
    missing = [fw for fw, _, _ in rows if fw not in state]
    unexpected = [k for k in state if k not in known and k not in ignored]
    if missing or unexpected:
        raise InputValueError(f"{source} state dict does not match the config ({mismatch_detail(missing, unexpected)})")
    return rows + [r for r in optional if r[0] in state]


def _import(state: Mapping, rows: list[tuple[str, str, bool]], shapes: dict, dtype,
            source: str) -> dict[str, np.ndarray]:
    """Framework state dict → our params (rows already matched by :func:`_rows_for`), shapes checked."""
    arrays = {fw: _as_numpy(state[fw], fw) for fw, _, _ in rows}
    dt = _target_dtype(list(arrays.values()), dtype)
    params: dict[str, np.ndarray] = {}
    for fw, ours, transpose in rows:
        a = arrays[fw]
        want = shapes[ours][::-1] if transpose else shapes[ours]
        if a.shape != tuple(want):
            raise InputValueError(f"{source} tensor {fw!r} must have shape {tuple(want)} (for {ours!r} of shape "
                                  f"{shapes[ours]}), got shape {a.shape}")
        params[ours] = np.ascontiguousarray(a.T if transpose else a, dtype=dt)
    return params


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
    fc = _as_family_config(config, "params_from_hf_state_dict")
    detect = "" if fc.bare_layer else fc.family.base_prefix + "."
    inner = _strip_prefix(state, prefix, detect)
    source = f"Hugging Face {fc.model_type}" + (" layer" if fc.bare_layer else "")
    ignored = () if fc.bare_layer else _HF_BUFFERS
    rows = _rows_for(inner, hf_name_table(fc), hf_table_size(fc), pooler_rows(fc), ignored, source)
    shapes = _family_shapes(fc)
    params = _import(inner, rows, shapes, dtype, source)
    return {k: params[k] for k in shapes if k in params}            # our canonical order, pooler last


def _export(tree: Mapping, table, optional, shapes: dict, what: str) -> dict[str, np.ndarray]:
    """Our params (or grads) → framework names, transposes included."""
    if not isinstance(tree, Mapping):
        raise InputTypeError(f"tree must be a dict of name -> numpy array (params or grads), got {describe(tree)}")
    ours = {o for _, o, _ in table} | {o for _, o, _ in optional}
    missing = [o for _, o, _ in table if o not in tree]
    # "inputs_embeds" is the input's gradient in an encoder_backward result, not a parameter.
    unexpected = [k for k in tree if k not in ours and k != "inputs_embeds"]
    if missing or unexpected:
        raise InputValueError(f"{what}: tree does not match the config ({mismatch_detail(missing, unexpected)})")
    out: dict[str, np.ndarray] = {}
    dtype = None
    for fw, o, transpose in table + [r for r in optional if r[1] in tree]:
        a = tree[o]
        if not isinstance(a, np.ndarray) or a.dtype not in FLOAT_DTYPES:
            raise InputTypeError(f"{what}: tree[{o!r}] must be a float32/float64 numpy array, got {describe(a)}")
        if a.shape != tuple(shapes[o]):
            raise InputValueError(f"{what}: tree[{o!r}] must have shape {tuple(shapes[o])}, got shape {a.shape}")
        if dtype is None:
            dtype = a.dtype
        elif a.dtype != dtype:
            raise InputTypeError(f"{what}: tree arrays must share one dtype: tree[{o!r}] is {a.dtype}, others {dtype}")
        out[fw] = np.ascontiguousarray(a.T if transpose else a)
    return out


def hf_state_dict_from_params(tree: Mapping[str, np.ndarray], config: EncoderConfig | HFEncoderConfig,
                              prefix: str = "") -> dict[str, np.ndarray]:
    """The reverse of :func:`params_from_hf_state_dict`, in NumPy: our params *or grads*
    → the family's HF names (``prefix`` + name, e.g. ``prefix="bert."`` for a BertFor* model),
    weight matrices transposed back to ``nn.Linear``'s (d_out, d_in). ``pooler.W``/``pooler.b``
    are exported when present. A bare-layer config gives the layer's own names
    (``attention.self.query.weight``, ...). Arrays are fresh contiguous copies in the tree's dtype."""
    fc = _as_family_config(config, "hf_state_dict_from_params")
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
    fc = _as_family_config(config, "hf_module_names")
    return {ours: fw for fw, ours, _ in list(hf_name_table(fc)) + pooler_rows(fc)}


# ----------------------------------------------------------------------------- torch names (NumPy)
@dataclass(frozen=True, eq=False)
class TorchLayerConfig(EncoderConfig):
    """The config of a bare ``nn.TransformerEncoderLayer``, as :func:`from_torch` returns it.

    It *is* an :class:`EncoderConfig` (``n_layers = 1``, no final LayerNorm, no embeddings) and
    compares equal to the plain EncoderConfig with the same fields; the only difference is that
    the torch exports (:func:`to_torch_state_dict`, :func:`torch_state_dict_from_params`, and
    :func:`params_from_torch_state_dict` on import) default to the layer's own names
    (``self_attn.in_proj_weight``, not ``layers.0.self_attn.in_proj_weight``): what goes in as a
    single layer comes back under the single layer's names.
    """

    def __eq__(self, other):
        if isinstance(other, EncoderConfig):
            names = [f.name for f in dataclasses.fields(EncoderConfig)]
            return all(getattr(self, n) == getattr(other, n) for n in names)
        return NotImplemented

    __hash__ = EncoderConfig.__hash__


def _single_layer(config: EncoderConfig, single_layer: bool | None) -> bool:
    """``single_layer`` as given, or (None) whether ``config`` came from a bare layer."""
    if single_layer is None:
        return isinstance(config, TorchLayerConfig) and config.n_layers == 1 and not config.use_final_layer_norm
    if not isinstance(single_layer, bool):
        raise InputTypeError(f"single_layer must be a bool or None, got {describe(single_layer)}")
    return single_layer


def _check_torch_like(config: EncoderConfig, what: str) -> None:
    """A config that nn.TransformerEncoder can express, else ValueError naming the field."""
    if not isinstance(config, EncoderConfig):
        raise InputTypeError(f"config must be an EncoderConfig, got {describe(config)}")
    if config.has_embeddings:
        raise InputValueError(f"{what}: nn.TransformerEncoder has no embeddings, but config.vocab_size = "
                         f"{config.vocab_size}; use to_hf_state_dict for a BERT-style model")
    if config.share_layers:
        raise InputValueError(f"{what}: nn.TransformerEncoder has independent layers, got config.share_layers = True")


def _torch_layer_names(pre: str) -> dict[str, str]:
    """torch name → our name for the tensors that map one to one (in_proj is split apart)."""
    return {pre + "self_attn.out_proj.weight": "attn.W_O", pre + "self_attn.out_proj.bias": "attn.b_O",
            pre + "linear1.weight": "ffn.W_1", pre + "linear1.bias": "ffn.b_1",
            pre + "linear2.weight": "ffn.W_2", pre + "linear2.bias": "ffn.b_2",
            pre + "norm1.weight": "ln1.gamma", pre + "norm1.bias": "ln1.beta",
            pre + "norm2.weight": "ln2.gamma", pre + "norm2.bias": "ln2.beta"}


def _torch_table(config: EncoderConfig, single_layer: bool) -> list[tuple[str, str, bool]]:
    """(torch name, our name, transpose?) rows, without the fused in_proj tensors."""
    if single_layer and (config.n_layers != 1 or config.use_final_layer_norm):
        raise InputValueError("single_layer=True (a bare nn.TransformerEncoderLayer) needs config.n_layers = 1 and "
                         f"no final LayerNorm, got n_layers = {config.n_layers}, "
                         f"final LayerNorm = {config.use_final_layer_norm}")
    rows = []
    for i in range(config.n_layers):
        tp = "" if single_layer else f"layers.{i}."
        for fw, ours in _torch_layer_names(tp).items():
            rows.append((fw, f"layers.{i}." + ours, ours.split(".")[1].startswith("W")))
    if config.use_final_layer_norm:
        rows += [("norm.weight", "final_ln.gamma", False), ("norm.bias", "final_ln.beta", False)]
    return rows


def _in_proj_names(config: EncoderConfig, single_layer: bool) -> list[tuple[str, str]]:
    """(torch prefix, our prefix) for each layer's fused Q/K/V projection."""
    return [("" if single_layer else f"layers.{i}.", f"layers.{i}.attn.") for i in range(config.n_layers)]


def params_from_torch_state_dict(state: Mapping, config: EncoderConfig, dtype=None,
                                 single_layer: bool | None = None) -> dict[str, np.ndarray]:
    """Our params from the state dict of ``nn.TransformerEncoder`` (``single_layer=False``)
    or of a bare ``nn.TransformerEncoderLayer`` (``single_layer=True``); NumPy or torch values.
    ``single_layer=None``: a bare layer exactly when ``config`` is a :class:`TorchLayerConfig`.

    The fused ``self_attn.in_proj_weight`` (3d, d) is split into its three (d, d) row blocks
    and each is transposed: W_Q = in_proj_weight[:d]ᵀ, W_K = [d:2d]ᵀ, W_V = [2d:]ᵀ.
    """
    _check_torch_like(config, "params_from_torch_state_dict")
    single_layer = _single_layer(config, single_layer)
    if not isinstance(state, Mapping):
        raise InputTypeError(f"state must be a mapping of name -> array (a state dict), got {describe(state)}")
    d = config.d_model
    shapes = dict(param_shapes(config))
    table = _torch_table(config, single_layer)
    # Treat in_proj_{weight,bias} as pseudo-parameters of shape (d, 3d) / (3d,) for the checks.
    fused = []
    for tp, op in _in_proj_names(config, single_layer):
        shapes[op + "W_QKV"], shapes[op + "b_QKV"] = (d, 3 * d), (3 * d,)
        fused += [(tp + "self_attn.in_proj_weight", op + "W_QKV", True),
                  (tp + "self_attn.in_proj_bias", op + "b_QKV", False)]
    rows = _rows_for(state, table + fused, len(table) + len(fused), [], (), "PyTorch")
    flat = _import(state, rows, shapes, dtype, "PyTorch")
    for _, op in _in_proj_names(config, single_layer):
        W, b = flat.pop(op + "W_QKV"), flat.pop(op + "b_QKV")       # (d, 3d), (3d,)
        for j, s in enumerate("QKV"):
            flat[op + "W_" + s] = np.ascontiguousarray(W[:, j * d:(j + 1) * d])
            flat[op + "b_" + s] = np.ascontiguousarray(b[j * d:(j + 1) * d])
    return {k: flat[k] for k in param_shapes(config)}               # our canonical order


def torch_state_dict_from_params(tree: Mapping[str, np.ndarray], config: EncoderConfig,
                                 single_layer: bool | None = None) -> dict[str, np.ndarray]:
    """The reverse of :func:`params_from_torch_state_dict` in NumPy, for params *or grads*:
    in_proj_weight = [W_Qᵀ; W_Kᵀ; W_Vᵀ] (3d, d), in_proj_bias = [b_Q; b_K; b_V].
    ``single_layer=None``: the bare layer's names exactly when ``config`` is a :class:`TorchLayerConfig`
    (the config :func:`from_torch` returns for an ``nn.TransformerEncoderLayer``)."""
    _check_torch_like(config, "torch_state_dict_from_params")
    single_layer = _single_layer(config, single_layer)
    if not isinstance(tree, Mapping):
        raise InputTypeError(f"tree must be a dict of name -> numpy array (params or grads), got {describe(tree)}")
    d = config.d_model
    shapes = dict(param_shapes(config))
    table = _torch_table(config, single_layer)
    fused_tree = dict(tree)
    for tp, op in _in_proj_names(config, single_layer):
        for kind, shape in (("W_", (d, d)), ("b_", (d,))):
            parts = []
            for s in "QKV":
                name = op + kind + s
                a = fused_tree.pop(name, None)
                if not isinstance(a, np.ndarray) or a.shape != shape:
                    got = "missing" if a is None else describe(a)
                    raise InputValueError(f"torch_state_dict_from_params: tree[{name!r}] must be an array of shape "
                                     f"{shape}, got {got}")
                parts.append(a)
            # [W_Q | W_K | W_V] (d, 3d) transposed is [W_Qᵀ; W_Kᵀ; W_Vᵀ] (3d, d): torch's in_proj_weight.
            fused_tree[op + kind + "QKV"] = np.concatenate(parts, axis=-1)
        shapes[op + "W_QKV"], shapes[op + "b_QKV"] = (d, 3 * d), (3 * d,)
        table += [(tp + "self_attn.in_proj_weight", op + "W_QKV", True),
                  (tp + "self_attn.in_proj_bias", op + "b_QKV", False)]
    return _export(fused_tree, table, [], shapes, "torch_state_dict_from_params")


# ----------------------------------------------------------------------------- torch / transformers modules
def _require_torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("this function needs PyTorch: pip install torch==2.13.0 "
                          "(or pip install 'transformer_np[torch]')") from e
    return torch


def _torch_activation(layer) -> str:
    """Our activation name for an nn.TransformerEncoderLayer's ``activation``, or ValueError.

    torch stores the string argument as the function (``F.relu``/``F.gelu``); a callable
    argument is stored as given. We accept those two functions and the modules
    ``nn.ReLU()``, ``nn.GELU()`` (approximate "none" or "tanh"); anything else is a custom
    activation we cannot reproduce.
    """
    torch = _require_torch()
    F = torch.nn.functional
    act = layer.activation
    if act is F.relu or isinstance(act, torch.nn.ReLU):
        return "relu"
    if act is F.gelu:
        return "gelu"
    if isinstance(act, torch.nn.GELU):
        return {"none": "gelu", "tanh": "gelu_tanh"}[act.approximate]
    raise InputValueError(f"unsupported activation {act!r} in nn.TransformerEncoderLayer: use activation='relu' or "
                     "'gelu' (or F.relu / F.gelu / nn.ReLU() / nn.GELU())")


def _layernorm_eps(norm, name: str, d: int) -> float:
    """eps of an affine nn.LayerNorm over the last axis of size d, or ValueError naming ``name``."""
    torch = _require_torch()
    if type(norm) is not torch.nn.LayerNorm:
        raise InputValueError(f"{name} must be an nn.LayerNorm, got {type(norm).__name__}")
    if tuple(norm.normalized_shape) != (d,):
        raise InputValueError(f"{name}.normalized_shape must be ({d},), got {tuple(norm.normalized_shape)}")
    if norm.weight is None:
        raise InputValueError(f"{name} has elementwise_affine=False; transformer_np's LayerNorm always has γ and β")
    if norm.bias is None:
        raise InputValueError(f"{name} has bias=False; transformer_np's LayerNorm always has β")
    return float(norm.eps)


def _torch_layer_options(layer, where: str) -> dict:
    """Everything about one nn.TransformerEncoderLayer that our EncoderConfig must express."""
    torch = _require_torch()
    if not isinstance(layer, torch.nn.TransformerEncoderLayer):
        raise InputTypeError(f"{where} must be an nn.TransformerEncoderLayer, got {type(layer).__name__}")
    attn = layer.self_attn
    d = attn.embed_dim
    if not attn._qkv_same_embed_dim:
        raise InputValueError(f"{where}.self_attn has kdim = {attn.kdim} / vdim = {attn.vdim} different from "
                         f"embed_dim = {d}: unsupported (self-attention projects from d_model)")
    if attn.in_proj_bias is None or attn.out_proj.bias is None:
        raise InputValueError(f"{where}.self_attn was built with bias=False: transformer_np's projections have biases")
    if attn.bias_k is not None or attn.bias_v is not None:
        raise InputValueError(f"{where}.self_attn was built with add_bias_kv=True: unsupported")
    if attn.add_zero_attn:
        raise InputValueError(f"{where}.self_attn was built with add_zero_attn=True: unsupported")
    for lin in ("linear1", "linear2"):
        if getattr(layer, lin).bias is None:
            raise InputValueError(f"{where}.{lin} has no bias (bias=False): transformer_np's FFN has biases")
    eps1 = _layernorm_eps(layer.norm1, where + ".norm1", d)
    eps2 = _layernorm_eps(layer.norm2, where + ".norm2", d)
    if eps1 != eps2:
        raise InputValueError(f"{where}: norm1.eps = {eps1} and norm2.eps = {eps2} differ; "
                              "one layer_norm_eps is supported")
    drops = {"self_attn.dropout": float(attn.dropout), "dropout.p": float(layer.dropout.p),
             "dropout1.p": float(layer.dropout1.p), "dropout2.p": float(layer.dropout2.p)}
    if len(set(drops.values())) > 1:
        raise InputValueError(f"{where}: the dropout probabilities differ ({drops}); one dropout is supported")
    return {"d_model": d, "n_heads": attn.num_heads, "d_ff": layer.linear1.out_features,
            "activation": _torch_activation(layer), "norm_first": bool(layer.norm_first),
            "layer_norm_eps": eps1, "dropout": drops["dropout.p"]}


def _module_dtype(module, dtype) -> object:
    if dtype is not None:
        return dtype
    dts = {str(p.dtype) for p in module.parameters()}
    return np.float64 if dts == {"torch.float64"} else np.float32


def from_torch(module, dtype=None) -> tuple[EncoderConfig, dict[str, np.ndarray]]:
    """``(config, params)`` from an ``nn.TransformerEncoderLayer`` or ``nn.TransformerEncoder``.

    Supported: ``norm_first`` True/False (our "pre"/"post"), activation "relu"/"gelu" (string,
    ``F.relu``/``F.gelu``, ``nn.ReLU()``/``nn.GELU()``), ``batch_first`` either way (it changes
    only the input layout: feed our encoder (B, n, d), i.e. transpose a sequence-first input),
    any ``layer_norm_eps``, the encoder's final ``norm`` present or not (→ ``final_layer_norm``).
    The config has no embeddings (``vocab_size=None``, ``positional="none"``): run the encoder
    with ``inputs_embeds``. ``dropout`` is the layer's dropout probability; note that torch
    also applies dropout after the FFN activation, which transformer_np does not (a
    difference in training only — in eval mode both are the identity).

    A bare layer's config is a :class:`TorchLayerConfig` (equal to the plain EncoderConfig), so
    ``to_torch_state_dict(grads, config)`` then uses the layer's own names.

    Parameters keep the module's dtype (float64 if every parameter is float64, else float32),
    or ``dtype`` if given. Unsupported options (bias=False, add_bias_kv, kdim/vdim ≠ d, a custom
    activation, a non-LayerNorm or non-affine norm, layers that differ) raise ValueError naming
    the option.
    """
    torch = _require_torch()
    if isinstance(module, torch.nn.TransformerEncoderLayer):
        layers, norm, single = [module], None, True
    elif isinstance(module, torch.nn.TransformerEncoder):
        layers, norm, single = list(module.layers), module.norm, False
        if not layers:
            raise InputValueError("the nn.TransformerEncoder has no layers")
    else:
        raise InputTypeError(f"module must be an nn.TransformerEncoderLayer or nn.TransformerEncoder, "
                        f"got {type(module).__name__}")
    where = "module" if single else "module.layers"
    opts = _torch_layer_options(layers[0], where if single else where + "[0]")
    for i, layer in enumerate(layers[1:], start=1):
        other = _torch_layer_options(layer, f"{where}[{i}]")
        diff = {k: (opts[k], other[k]) for k in opts if opts[k] != other[k]}
        if diff:
            raise InputValueError(f"{where}[{i}] differs from {where}[0] in {diff}: "
                                  "all layers must share one configuration")
    if norm is not None:
        eps = _layernorm_eps(norm, "module.norm", opts["d_model"])
        if eps != opts["layer_norm_eps"]:
            raise InputValueError(f"module.norm.eps = {eps} differs from the layers' layer_norm_eps = "
                             f"{opts['layer_norm_eps']}; one layer_norm_eps is supported")
    config_class = TorchLayerConfig if single else EncoderConfig
    config = config_class(n_layers=len(layers), d_model=opts["d_model"], n_heads=opts["n_heads"],
                           d_ff=opts["d_ff"], activation=opts["activation"],
                           norm_position="pre" if opts["norm_first"] else "post",
                           layer_norm_eps=opts["layer_norm_eps"], dropout=opts["dropout"], vocab_size=None,
                           max_len=2**31 - 1, type_vocab_size=0, positional="none",
                           final_layer_norm=norm is not None, embedding_layer_norm=False)
    state = {k: v for k, v in module.state_dict().items()}
    params = params_from_torch_state_dict(state, config, dtype=_module_dtype(module, dtype), single_layer=single)
    return config, params


def _require_transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("this function needs transformers: pip install transformers "
                          "(or pip install 'transformer_np[hf]')") from e
    return transformers


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


def _layer_hf_config(module):
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
    torch = _require_torch()
    if not isinstance(module, torch.nn.Module):
        raise InputTypeError(f"module must be a transformers model or layer (a torch.nn.Module), "
                             f"got {type(module).__name__}")
    transformers = _require_transformers()
    if isinstance(module, transformers.PreTrainedModel):
        name = type(module).__name__
        config = config_from_hf_dict(_hf_config_dict(module.config, f"{name}.config"), source=f"{name}.config")
        params = params_from_hf_state_dict(module.state_dict(), config, dtype=_module_dtype(module, dtype))
        return config, params
    cfg = _layer_hf_config(module)
    if cfg is None:
        raise InputTypeError(f"module must be a transformers encoder model ({supported_text()}) or one of their "
                             f"layers, got {type(module).__name__}")
    source = f"{type(module).__name__}'s config"
    fam, spec = read_hf_config(_hf_config_dict(cfg, source), source)
    enc = encoder_config_from_spec(fam, spec).replace(n_layers=1, vocab_size=None, type_vocab_size=0,
                                                      share_layers=False, max_len=2**31 - 1)
    config = HFEncoderConfig(fam.model_type, enc, bare_layer=True)
    params = params_from_hf_state_dict(module.state_dict(), config, dtype=_module_dtype(module, dtype), prefix="")
    return config, params


def _to_torch_tensors(arrays: dict) -> dict:
    torch = _require_torch()
    return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in arrays.items()}


def to_torch_state_dict(tree: Mapping[str, np.ndarray], config: EncoderConfig,
                        single_layer: bool | None = None) -> dict:
    """Our params (or grads) → a state dict of torch tensors for ``nn.TransformerEncoder``
    (names ``layers.{i}.*``, plus ``norm.*`` when the config has a final LayerNorm), or for a bare
    ``nn.TransformerEncoderLayer`` (its own names) — by default (``single_layer=None``) exactly when
    ``config`` came from one (:func:`from_torch` of a layer returns a :class:`TorchLayerConfig`);
    ``single_layer=True``/``False`` forces either.

    Tensors are fresh CPU copies in the tree's dtype (float64 stays float64);
    ``module.load_state_dict(sd, strict=True)`` copies them into the module's own dtype.
    """
    return _to_torch_tensors(torch_state_dict_from_params(tree, config, single_layer=single_layer))


def to_hf_state_dict(tree: Mapping[str, np.ndarray], config: EncoderConfig | HFEncoderConfig,
                     prefix: str = "") -> dict:
    """Our params (or grads) → a state dict of torch tensors with the family's transformers
    names (``prefix="bert."`` etc. for a task model; a bare-layer config gives the layer's own
    names). ``pooler.*`` is included when the tree has ``pooler.W``/``pooler.b``; for a tree
    without a pooler load into ``XModel(cfg, add_pooling_layer=False)``. Tensors are fresh CPU
    copies in the tree's dtype; ``load_state_dict(strict=True)`` copies them into the model's dtype.
    """
    return _to_torch_tensors(hf_state_dict_from_params(tree, config, prefix=prefix))
