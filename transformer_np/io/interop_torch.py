r"""Weights that move both ways between transformer_np and PyTorch's ``nn.TransformerEncoder(Layer)``.

The conventions (``W = weight.T`` for every ``nn.Linear``; our flat dotted names) are those of
:mod:`transformer_np.io.interop`, which also re-exports everything public here; the Hugging Face side
lives there. PyTorch ``nn.TransformerEncoder`` (``layers.{i}.`` prefix; a bare
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
names (``self_attn.in_proj_weight``).

Every mapping works on parameters *and* on gradients (a gradient has its parameter's name and shape).
torch is imported lazily inside the functions that need it (:func:`from_torch`,
:func:`to_torch_state_dict`); the ``*_from_*`` functions are pure NumPy. The helpers
``require_torch``, ``_module_dtype`` and ``_to_torch_tensors`` serve the Hugging Face side too
(its models are torch modules).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .._optional import require
from .._validate import describe
from ..errors import InputTypeError, InputValueError
from ..model.config import EncoderConfig
from ..model.params import param_shapes
from ._state_tables import _export, _import, _rows_for

__all__ = ["TorchLayerConfig", "params_from_torch_state_dict", "torch_state_dict_from_params", "from_torch",
           "to_torch_state_dict"]


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


def torch_table(config: EncoderConfig, single_layer: bool) -> list[tuple[str, str, bool]]:
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


def _in_proj_rows(config: EncoderConfig, single_layer: bool) -> tuple[list[tuple[str, str, bool]], dict]:
    """The table rows of every layer's fused ``self_attn.in_proj_{weight,bias}``, as the pseudo-parameters
    ``attn.W_QKV`` (d, 3d; transposed) and ``attn.b_QKV`` (3d,), and their shapes for the checks."""
    d = config.d_model
    rows, shapes = [], {}
    for tp, op in _in_proj_names(config, single_layer):
        shapes[op + "W_QKV"], shapes[op + "b_QKV"] = (d, 3 * d), (3 * d,)
        rows += [(tp + "self_attn.in_proj_weight", op + "W_QKV", True),
                 (tp + "self_attn.in_proj_bias", op + "b_QKV", False)]
    return rows, shapes


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
    table = torch_table(config, single_layer)
    fused, fused_shapes = _in_proj_rows(config, single_layer)      # in_proj as pseudo-parameters
    shapes.update(fused_shapes)
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
    table = torch_table(config, single_layer)
    fused_tree = dict(tree)
    for _, op in _in_proj_names(config, single_layer):
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
    fused, fused_shapes = _in_proj_rows(config, single_layer)
    shapes.update(fused_shapes)
    return _export(fused_tree, table + fused, [], shapes, "torch_state_dict_from_params")


# ----------------------------------------------------------------------------- torch / transformers modules
def require_torch():
    return require("torch", "this function needs PyTorch: pip install torch==2.13.0 "
                            "(or pip install 'transformer_np[torch]')")


_require_torch = require_torch   # its name until issue 46 (tests call it)


def _torch_activation(layer) -> str:
    """Our activation name for an nn.TransformerEncoderLayer's ``activation``, or ValueError.

    torch stores the string argument as the function (``F.relu``/``F.gelu``); a callable
    argument is stored as given. We accept those two functions and the modules
    ``nn.ReLU()``, ``nn.GELU()`` (approximate "none" or "tanh"); anything else is a custom
    activation we cannot reproduce.
    """
    torch = require_torch()
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
    torch = require_torch()
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
    torch = require_torch()
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
    config, single = torch_config_of(module)
    state = {k: v for k, v in module.state_dict().items()}
    params = params_from_torch_state_dict(state, config, dtype=_module_dtype(module, dtype), single_layer=single)
    return config, params


def torch_config_of(module) -> tuple[EncoderConfig, bool]:
    """(the config :func:`from_torch` returns, whether the module is a bare layer), checked, without converting any
    weight."""
    torch = require_torch()
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
    return config, single


def _to_torch_tensors(arrays: dict) -> dict:
    torch = require_torch()
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
