r"""Weights that move both ways between transformer_np, PyTorch and Hugging Face BERT.

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

``BertFor*`` task models hold the same tensors under a ``bert.`` prefix, detected
automatically; their task heads (``cls.*``, ``classifier.*``, ``qa_outputs.*``: every
name *outside* the ``bert.`` prefix) are not part of the encoder and are ignored.
The buffers ``embeddings.position_ids`` / ``embeddings.token_type_ids`` (old checkpoints
store them) are ignored too. Anything else that does not fit is an error.

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

Every mapping works on parameters *and* on gradients: a gradient has the same names
and shapes as its parameter, and the transpose commutes with differentiation
(∂L/∂weight = (∂L/∂W)ᵀ when weight = Wᵀ).

torch and transformers are imported lazily inside the functions that need them; the
``*_from_*`` / ``config_from_hf_dict`` functions are pure NumPy.
"""

from __future__ import annotations

import warnings
from typing import Mapping

import numpy as np

from .._validate import FLOAT_DTYPES, describe, mismatch_detail
from ..model.config import EncoderConfig
from ..model.params import param_shapes

__all__ = ["config_from_hf_dict", "hf_dict_from_config", "params_from_hf_state_dict",
           "hf_state_dict_from_params", "params_from_torch_state_dict", "torch_state_dict_from_params",
           "from_torch", "from_hf_bert", "to_torch_state_dict", "to_hf_state_dict", "HF_ACTIVATIONS"]

#: HF ``hidden_act`` → our ``activation``. "gelu_new" and "gelu_pytorch_tanh" are the same
#: function ½x(1 + tanh(√(2/π)(x + 0.044715x³))), computed two ways.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
_HF_ACT_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
_HF_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_HF_PREFIX = "bert."

# ----------------------------------------------------------------------------- HF config
_HF_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def config_from_hf_dict(hf_config: dict) -> EncoderConfig:
    """An :class:`EncoderConfig` from a BERT ``config.json`` dict (or ``BertConfig.to_dict()``).

    Field mapping: hidden_size → d_model, num_hidden_layers → n_layers,
    num_attention_heads → n_heads, intermediate_size → d_ff, hidden_act → activation
    (see :data:`HF_ACTIVATIONS`), layer_norm_eps, vocab_size, max_position_embeddings →
    max_len, type_vocab_size; always Post-LN, learned absolute positions, embedding
    LayerNorm, no final LayerNorm.

    Dropout: our config has one probability, BERT two. We take ``hidden_dropout_prob``
    (embeddings and sublayer outputs) and warn when ``attention_probs_dropout_prob``
    differs — it only matters in training, where dropout masks never match across
    frameworks anyway.

    Raises ValueError naming the field for what we cannot represent: a model_type other
    than "bert", ``position_embedding_type`` other than "absolute" (relative_key,
    relative_key_query), an unknown ``hidden_act``, ``is_decoder`` / ``add_cross_attention``.
    """
    if not isinstance(hf_config, Mapping):
        raise TypeError(f"hf_config must be a dict (a BERT config.json), got {describe(hf_config)}")
    missing = [k for k in _HF_REQUIRED if k not in hf_config]
    if missing:
        raise ValueError(f"hf_config is missing the BERT config fields {missing}")
    model_type = hf_config.get("model_type", "bert")
    if model_type != "bert":
        raise ValueError(f"hf_config model_type must be 'bert' (BERT-family layout and names), got {model_type!r}")
    pos = hf_config.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ValueError(f"hf_config position_embedding_type must be 'absolute' (learned absolute positions); "
                         f"got {pos!r}, which transformer_np does not implement")
    for flag in ("is_decoder", "add_cross_attention"):
        if hf_config.get(flag, False):
            raise ValueError(f"hf_config {flag}=True is not supported: transformer_np builds an encoder only")
    act = hf_config.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        raise ValueError(f"hf_config hidden_act must be one of {sorted(HF_ACTIVATIONS)}, got {act!r}")
    p_hidden = float(hf_config.get("hidden_dropout_prob", 0.1))
    p_attn = float(hf_config.get("attention_probs_dropout_prob", p_hidden))
    if p_attn != p_hidden:
        warnings.warn(f"hf_config has hidden_dropout_prob = {p_hidden} but attention_probs_dropout_prob = "
                      f"{p_attn}; transformer_np uses one dropout and takes hidden_dropout_prob = {p_hidden} "
                      "(no effect in inference)", stacklevel=2)
    return EncoderConfig(
        n_layers=int(hf_config["num_hidden_layers"]), d_model=int(hf_config["hidden_size"]),
        n_heads=int(hf_config["num_attention_heads"]), d_ff=int(hf_config["intermediate_size"]),
        activation=HF_ACTIVATIONS[act], norm_position="post",
        layer_norm_eps=float(hf_config.get("layer_norm_eps", 1e-12)), dropout=p_hidden,
        vocab_size=int(hf_config["vocab_size"]), max_len=int(hf_config.get("max_position_embeddings", 512)),
        type_vocab_size=int(hf_config.get("type_vocab_size", 2)), positional="learned",
        share_layers=False, final_layer_norm=False, embedding_layer_norm=True)


def _check_bert_like(config: EncoderConfig, what: str) -> None:
    """A config that BERT's names can express, else ValueError naming the field."""
    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config must be an EncoderConfig, got {describe(config)}")
    need = {"norm_position": "post", "positional": "learned", "share_layers": False,
            "use_final_layer_norm": False, "embedding_layer_norm": True, "has_embeddings": True}
    for field, want in need.items():
        got = getattr(config, field)
        if got != want:
            raise ValueError(f"{what}: BERT's layout needs config.{field} = {want!r}, got {got!r}")


def hf_dict_from_config(config: EncoderConfig) -> dict:
    """The reverse of :func:`config_from_hf_dict`: keyword arguments for ``transformers.BertConfig``
    (``BertConfig(**hf_dict_from_config(config))``).

    Both dropout fields get ``config.dropout``. Exact GELU maps to "gelu", the tanh
    approximation to "gelu_new".
    """
    _check_bert_like(config, "hf_dict_from_config")
    return {"vocab_size": config.vocab_size, "hidden_size": config.d_model,
            "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
            "intermediate_size": config.d_ff, "hidden_act": _HF_ACT_OUT[config.activation],
            "hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.dropout,
            "max_position_embeddings": config.max_len, "type_vocab_size": config.type_vocab_size,
            "layer_norm_eps": config.layer_norm_eps, "position_embedding_type": "absolute"}


# ----------------------------------------------------------------------------- name tables
# (framework name, our name, transpose?) — one row per tensor.
def _hf_table(config: EncoderConfig) -> list[tuple[str, str, bool]]:
    rows = [("embeddings.word_embeddings.weight", "embeddings.word", False),
            ("embeddings.position_embeddings.weight", "embeddings.position", False)]
    if config.type_vocab_size:
        rows.append(("embeddings.token_type_embeddings.weight", "embeddings.token_type", False))
    rows += [("embeddings.LayerNorm.weight", "embeddings.ln.gamma", False),
             ("embeddings.LayerNorm.bias", "embeddings.ln.beta", False)]
    linear = (("attention.self.query", "attn.W_Q", "attn.b_Q"), ("attention.self.key", "attn.W_K", "attn.b_K"),
              ("attention.self.value", "attn.W_V", "attn.b_V"),
              ("attention.output.dense", "attn.W_O", "attn.b_O"),
              ("intermediate.dense", "ffn.W_1", "ffn.b_1"), ("output.dense", "ffn.W_2", "ffn.b_2"))
    norms = (("attention.output.LayerNorm", "ln1"), ("output.LayerNorm", "ln2"))
    for i in range(config.n_layers):
        hf, us = f"encoder.layer.{i}.", f"layers.{i}."
        for mod, W, b in linear:
            rows += [(hf + mod + ".weight", us + W, True), (hf + mod + ".bias", us + b, False)]
        for mod, ln in norms:
            rows += [(hf + mod + ".weight", us + ln + ".gamma", False), (hf + mod + ".bias", us + ln + ".beta", False)]
    return rows


_HF_POOLER = [("pooler.dense.weight", "pooler.W", True), ("pooler.dense.bias", "pooler.b", False)]


def _as_numpy(x, name: str) -> np.ndarray:
    """A NumPy view of an array-like; torch tensors are detached and moved to the CPU."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):      # a torch.Tensor, without importing torch
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":            # NumPy has no bfloat16
            x = x.float()
        x = x.numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"state[{name!r}] must be a numpy array or torch tensor, got {describe(x)}")
    return x


def _target_dtype(arrays: list[np.ndarray], dtype) -> np.dtype:
    """The dtype of the imported params: ``dtype`` if given, else float64 when every source
    tensor is float64, else float32 (float16/bfloat16 checkpoints are widened to float32)."""
    if dtype is not None:
        dt = np.dtype(dtype)
        if dt not in FLOAT_DTYPES:
            raise TypeError(f"dtype must be float32 or float64, got {dt}")
        return dt
    for a in arrays:
        if not np.issubdtype(a.dtype, np.floating):
            raise TypeError(f"expected floating-point weights, got a tensor of dtype {a.dtype}")
    if arrays and all(a.dtype == np.float64 for a in arrays):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _import(state: Mapping, table: list[tuple[str, str, bool]], optional: list[tuple[str, str, bool]],
            ignored: tuple[str, ...], shapes: dict, dtype, source: str) -> dict[str, np.ndarray]:
    """Framework state dict → our params, with full checks (missing/unexpected/shape)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping of name -> array (a state dict), got {describe(state)}")
    known = {fw for fw, _, _ in table} | {fw for fw, _, _ in optional}
    missing = [fw for fw, _, _ in table if fw not in state]
    unexpected = [k for k in state if k not in known and k not in ignored]
    if missing or unexpected:
        raise ValueError(f"{source} state dict does not match the config "
                         f"({mismatch_detail(missing, unexpected)})")
    rows = table + [r for r in optional if r[0] in state]
    arrays = {fw: _as_numpy(state[fw], fw) for fw, _, _ in rows}
    dt = _target_dtype(list(arrays.values()), dtype)
    params: dict[str, np.ndarray] = {}
    for fw, ours, transpose in rows:
        a = arrays[fw]
        want = shapes[ours][::-1] if transpose else shapes[ours]
        if a.shape != tuple(want):
            raise ValueError(f"{source} tensor {fw!r} must have shape {tuple(want)} (for {ours!r} of shape "
                             f"{shapes[ours]}), got shape {a.shape}")
        params[ours] = np.ascontiguousarray(a.T if transpose else a, dtype=dt)
    return params


def _strip_prefix(state: Mapping, prefix: str | None) -> tuple[dict, str]:
    """Detect (prefix=None) or apply a name prefix; names outside it are task heads, dropped."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping of name -> array (a state dict), got {describe(state)}")
    if prefix is None:
        prefix = _HF_PREFIX if any(k.startswith(_HF_PREFIX) for k in state) else ""
    if not prefix:
        return dict(state), ""
    inner = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not inner:
        raise ValueError(f"state has no tensor under the prefix {prefix!r}")
    return inner, prefix


def params_from_hf_state_dict(state: Mapping[str, np.ndarray], config: EncoderConfig, dtype=None,
                              prefix: str | None = None) -> dict[str, np.ndarray]:
    """Our params from a Hugging Face BERT state dict (NumPy arrays or torch tensors).

    Args:
        state: name → tensor, e.g. ``safetensors.numpy.load_file("model.safetensors")`` or
            ``model.state_dict()``. Names are those of the module docstring.
        config: the encoder's config (e.g. from :func:`config_from_hf_dict`).
        dtype: float32/float64 of the result; None keeps float64 if the state is all
            float64, else float32.
        prefix: None detects ``"bert."`` (BertFor* models; their task heads outside the
            prefix are ignored); "" means no prefix.

    Returns a params dict that :func:`validate_params` accepts, with ``pooler.W`` (d, d) and
    ``pooler.b`` when the state has the pooler. Weight matrices are transposed
    (``W = weight.T``) and copied (contiguous), so the result shares no memory with ``state``.

    Raises ValueError naming the tensor for a missing, unexpected or misshapen tensor.
    """
    _check_bert_like(config, "params_from_hf_state_dict")
    inner, _ = _strip_prefix(state, prefix)
    shapes = dict(param_shapes(config), **{"pooler.W": (config.d_model, config.d_model),
                                           "pooler.b": (config.d_model,)})
    params = _import(inner, _hf_table(config), _HF_POOLER, _HF_BUFFERS, shapes, dtype, "Hugging Face BERT")
    return {k: params[k] for k in shapes if k in params}           # our canonical order, pooler last


def _export(tree: Mapping, table, optional, shapes: dict, what: str) -> dict[str, np.ndarray]:
    """Our params (or grads) → framework names, transposes included."""
    if not isinstance(tree, Mapping):
        raise TypeError(f"tree must be a dict of name -> numpy array (params or grads), got {describe(tree)}")
    ours = {o for _, o, _ in table} | {o for _, o, _ in optional}
    missing = [o for _, o, _ in table if o not in tree]
    # "inputs_embeds" is the input's gradient in an encoder_backward result, not a parameter.
    unexpected = [k for k in tree if k not in ours and k != "inputs_embeds"]
    if missing or unexpected:
        raise ValueError(f"{what}: tree does not match the config ({mismatch_detail(missing, unexpected)})")
    out: dict[str, np.ndarray] = {}
    dtype = None
    for fw, o, transpose in table + [r for r in optional if r[1] in tree]:
        a = tree[o]
        if not isinstance(a, np.ndarray) or a.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{what}: tree[{o!r}] must be a float32/float64 numpy array, got {describe(a)}")
        if a.shape != tuple(shapes[o]):
            raise ValueError(f"{what}: tree[{o!r}] must have shape {tuple(shapes[o])}, got shape {a.shape}")
        if dtype is None:
            dtype = a.dtype
        elif a.dtype != dtype:
            raise TypeError(f"{what}: tree arrays must share one dtype: tree[{o!r}] is {a.dtype}, others {dtype}")
        out[fw] = np.ascontiguousarray(a.T if transpose else a)
    return out


def hf_state_dict_from_params(tree: Mapping[str, np.ndarray], config: EncoderConfig,
                              prefix: str = "") -> dict[str, np.ndarray]:
    """The reverse of :func:`params_from_hf_state_dict`, in NumPy: our params *or grads*
    → HF BERT names (``prefix`` + name, e.g. ``prefix="bert."`` for a BertFor* model),
    weight matrices transposed back to ``nn.Linear``'s (d_out, d_in). ``pooler.W``/``pooler.b``
    are exported when present. Arrays are fresh contiguous copies in the tree's dtype."""
    _check_bert_like(config, "hf_state_dict_from_params")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {describe(prefix)}")
    shapes = dict(param_shapes(config), **{"pooler.W": (config.d_model, config.d_model),
                                           "pooler.b": (config.d_model,)})
    out = _export(tree, _hf_table(config), _HF_POOLER, shapes, "hf_state_dict_from_params")
    return {prefix + k: v for k, v in out.items()}


# ----------------------------------------------------------------------------- torch names (NumPy)
def _check_torch_like(config: EncoderConfig, what: str) -> None:
    """A config that nn.TransformerEncoder can express, else ValueError naming the field."""
    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config must be an EncoderConfig, got {describe(config)}")
    if config.has_embeddings:
        raise ValueError(f"{what}: nn.TransformerEncoder has no embeddings, but config.vocab_size = "
                         f"{config.vocab_size}; use to_hf_state_dict for a BERT-style model")
    if config.share_layers:
        raise ValueError(f"{what}: nn.TransformerEncoder has independent layers, got config.share_layers = True")


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
        raise ValueError("single_layer=True (a bare nn.TransformerEncoderLayer) needs config.n_layers = 1 and "
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
                                 single_layer: bool = False) -> dict[str, np.ndarray]:
    """Our params from the state dict of ``nn.TransformerEncoder`` (``single_layer=False``)
    or of a bare ``nn.TransformerEncoderLayer`` (``single_layer=True``); NumPy or torch values.

    The fused ``self_attn.in_proj_weight`` (3d, d) is split into its three (d, d) row blocks
    and each is transposed: W_Q = in_proj_weight[:d]ᵀ, W_K = [d:2d]ᵀ, W_V = [2d:]ᵀ.
    """
    _check_torch_like(config, "params_from_torch_state_dict")
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping of name -> array (a state dict), got {describe(state)}")
    d = config.d_model
    shapes = dict(param_shapes(config))
    table = _torch_table(config, single_layer)
    # Treat in_proj_{weight,bias} as pseudo-parameters of shape (d, 3d) / (3d,) for the checks.
    fused = []
    for tp, op in _in_proj_names(config, single_layer):
        shapes[op + "W_QKV"], shapes[op + "b_QKV"] = (d, 3 * d), (3 * d,)
        fused += [(tp + "self_attn.in_proj_weight", op + "W_QKV", True),
                  (tp + "self_attn.in_proj_bias", op + "b_QKV", False)]
    flat = _import(state, table + fused, [], (), shapes, dtype, "PyTorch")
    for _, op in _in_proj_names(config, single_layer):
        W, b = flat.pop(op + "W_QKV"), flat.pop(op + "b_QKV")       # (d, 3d), (3d,)
        for j, s in enumerate("QKV"):
            flat[op + "W_" + s] = np.ascontiguousarray(W[:, j * d:(j + 1) * d])
            flat[op + "b_" + s] = np.ascontiguousarray(b[j * d:(j + 1) * d])
    return {k: flat[k] for k in param_shapes(config)}               # our canonical order


def torch_state_dict_from_params(tree: Mapping[str, np.ndarray], config: EncoderConfig,
                                 single_layer: bool = False) -> dict[str, np.ndarray]:
    """The reverse of :func:`params_from_torch_state_dict` in NumPy, for params *or grads*:
    in_proj_weight = [W_Qᵀ; W_Kᵀ; W_Vᵀ] (3d, d), in_proj_bias = [b_Q; b_K; b_V]."""
    _check_torch_like(config, "torch_state_dict_from_params")
    if not isinstance(tree, Mapping):
        raise TypeError(f"tree must be a dict of name -> numpy array (params or grads), got {describe(tree)}")
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
                    raise ValueError(f"torch_state_dict_from_params: tree[{name!r}] must be an array of shape "
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
    raise ValueError(f"unsupported activation {act!r} in nn.TransformerEncoderLayer: use activation='relu' or "
                     "'gelu' (or F.relu / F.gelu / nn.ReLU() / nn.GELU())")


def _layernorm_eps(norm, name: str, d: int) -> float:
    """eps of an affine nn.LayerNorm over the last axis of size d, or ValueError naming ``name``."""
    torch = _require_torch()
    if type(norm) is not torch.nn.LayerNorm:
        raise ValueError(f"{name} must be an nn.LayerNorm, got {type(norm).__name__}")
    if tuple(norm.normalized_shape) != (d,):
        raise ValueError(f"{name}.normalized_shape must be ({d},), got {tuple(norm.normalized_shape)}")
    if norm.weight is None:
        raise ValueError(f"{name} has elementwise_affine=False; transformer_np's LayerNorm always has γ and β")
    if norm.bias is None:
        raise ValueError(f"{name} has bias=False; transformer_np's LayerNorm always has β")
    return float(norm.eps)


def _torch_layer_options(layer, where: str) -> dict:
    """Everything about one nn.TransformerEncoderLayer that our EncoderConfig must express."""
    torch = _require_torch()
    if not isinstance(layer, torch.nn.TransformerEncoderLayer):
        raise TypeError(f"{where} must be an nn.TransformerEncoderLayer, got {type(layer).__name__}")
    attn = layer.self_attn
    d = attn.embed_dim
    if not attn._qkv_same_embed_dim:
        raise ValueError(f"{where}.self_attn has kdim = {attn.kdim} / vdim = {attn.vdim} different from "
                         f"embed_dim = {d}: unsupported (self-attention projects from d_model)")
    if attn.in_proj_bias is None or attn.out_proj.bias is None:
        raise ValueError(f"{where}.self_attn was built with bias=False: transformer_np's projections have biases")
    if attn.bias_k is not None or attn.bias_v is not None:
        raise ValueError(f"{where}.self_attn was built with add_bias_kv=True: unsupported")
    if attn.add_zero_attn:
        raise ValueError(f"{where}.self_attn was built with add_zero_attn=True: unsupported")
    for lin in ("linear1", "linear2"):
        if getattr(layer, lin).bias is None:
            raise ValueError(f"{where}.{lin} has no bias (bias=False): transformer_np's FFN has biases")
    eps1 = _layernorm_eps(layer.norm1, where + ".norm1", d)
    eps2 = _layernorm_eps(layer.norm2, where + ".norm2", d)
    if eps1 != eps2:
        raise ValueError(f"{where}: norm1.eps = {eps1} and norm2.eps = {eps2} differ; one layer_norm_eps is supported")
    drops = {"self_attn.dropout": float(attn.dropout), "dropout.p": float(layer.dropout.p),
             "dropout1.p": float(layer.dropout1.p), "dropout2.p": float(layer.dropout2.p)}
    if len(set(drops.values())) > 1:
        raise ValueError(f"{where}: the dropout probabilities differ ({drops}); one dropout is supported")
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
            raise ValueError("the nn.TransformerEncoder has no layers")
    else:
        raise TypeError(f"module must be an nn.TransformerEncoderLayer or nn.TransformerEncoder, "
                        f"got {type(module).__name__}")
    where = "module" if single else "module.layers"
    opts = _torch_layer_options(layers[0], where if single else where + "[0]")
    for i, layer in enumerate(layers[1:], start=1):
        other = _torch_layer_options(layer, f"{where}[{i}]")
        diff = {k: (opts[k], other[k]) for k in opts if opts[k] != other[k]}
        if diff:
            raise ValueError(f"{where}[{i}] differs from {where}[0] in {diff}: all layers must share one configuration")
    if norm is not None:
        eps = _layernorm_eps(norm, "module.norm", opts["d_model"])
        if eps != opts["layer_norm_eps"]:
            raise ValueError(f"module.norm.eps = {eps} differs from the layers' layer_norm_eps = "
                             f"{opts['layer_norm_eps']}; one layer_norm_eps is supported")
    config = EncoderConfig(n_layers=len(layers), d_model=opts["d_model"], n_heads=opts["n_heads"],
                           d_ff=opts["d_ff"], activation=opts["activation"],
                           norm_position="pre" if opts["norm_first"] else "post",
                           layer_norm_eps=opts["layer_norm_eps"], dropout=opts["dropout"], vocab_size=None,
                           max_len=2**31 - 1, type_vocab_size=0, positional="none",
                           final_layer_norm=norm is not None, embedding_layer_norm=False)
    state = {k: v for k, v in module.state_dict().items()}
    params = params_from_torch_state_dict(state, config, dtype=_module_dtype(module, dtype), single_layer=single)
    return config, params


def from_hf_bert(model, dtype=None) -> tuple[EncoderConfig, dict[str, np.ndarray]]:
    """``(config, params)`` from a ``transformers.BertModel`` or a ``BertFor*`` model (its
    ``bert.`` submodel; task heads ignored). The pooler is kept as ``pooler.W``/``pooler.b``
    when the model has one. Parameters keep the model's dtype (float64 if all float64, else
    float32) unless ``dtype`` is given. See :func:`config_from_hf_dict` for what is rejected.
    """
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "state_dict"):
        raise TypeError(f"model must be a transformers BertModel or BertFor* model, got {type(model).__name__}")
    hf = cfg.to_dict()
    act = getattr(cfg, "hidden_act", "gelu")
    if not isinstance(act, str):
        raise ValueError(f"model.config.hidden_act is a callable {act!r}; use one of {sorted(HF_ACTIVATIONS)}")
    config = config_from_hf_dict(hf)
    params = params_from_hf_state_dict(model.state_dict(), config, dtype=_module_dtype(model, dtype))
    return config, params


def _to_torch_tensors(arrays: dict) -> dict:
    torch = _require_torch()
    return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in arrays.items()}


def to_torch_state_dict(tree: Mapping[str, np.ndarray], config: EncoderConfig, single_layer: bool = False) -> dict:
    """Our params (or grads) → a state dict of torch tensors for ``nn.TransformerEncoder``
    (names ``layers.{i}.*``, plus ``norm.*`` when the config has a final LayerNorm), or, with
    ``single_layer=True``, for a bare ``nn.TransformerEncoderLayer``.

    Tensors are fresh CPU copies in the tree's dtype (float64 stays float64);
    ``module.load_state_dict(sd, strict=True)`` copies them into the module's own dtype.
    """
    return _to_torch_tensors(torch_state_dict_from_params(tree, config, single_layer=single_layer))


def to_hf_state_dict(tree: Mapping[str, np.ndarray], config: EncoderConfig, prefix: str = "") -> dict:
    """Our params (or grads) → a state dict of torch tensors with ``transformers.BertModel``
    names (``prefix="bert."`` for a BertFor* model). ``pooler.*`` is included when the tree
    has ``pooler.W``/``pooler.b``; for a tree without a pooler load into
    ``BertModel(cfg, add_pooling_layer=False)``. Tensors are fresh CPU copies in the tree's
    dtype; ``load_state_dict(strict=True)`` copies them into the model's dtype.
    """
    return _to_torch_tensors(hf_state_dict_from_params(tree, config, prefix=prefix))
