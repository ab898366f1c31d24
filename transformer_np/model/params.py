r"""Parameters as a flat dict of arrays with stable dotted names.

    embeddings.word            (vocab_size, d)        token embedding E_tok
    embeddings.position        (max_len, d)           learned positions (positional="learned")
    embeddings.token_type      (type_vocab_size, d)   segments (type_vocab_size > 0)
    embeddings.ln.gamma/beta   (d,)                   BERT's embedding LayerNorm
    layers.{ℓ}.attn.W_Q/W_K/W_V/W_O  (d, d)           ℓ = 0 … N−1 (only 0 when share_layers)
    layers.{ℓ}.attn.b_Q/b_K/b_V/b_O  (d,)
    layers.{ℓ}.ln1.gamma/beta  (d,)                   LN after attention (post) / before it (pre)
    layers.{ℓ}.ffn.W_1 (d, d_ff), .b_1 (d_ff,), .W_2 (d_ff, d), .b_2 (d,)
    layers.{ℓ}.ln2.gamma/beta  (d,)
    final_ln.gamma/beta        (d,)                   after the stack (pre-LN default)

Gradients use exactly these names and shapes, so gradcheck, interop and optimisers walk
one structure. A params dict may also carry BERT's pooler (``pooler.W`` (d, d),
``pooler.b`` (d,)), which the encoder itself does not use.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import FLOAT_DTYPES, check_choice, check_float_dtype, check_int, describe, mismatch_detail
from ..errors import InputTypeError, InputValueError
from ..ops.attention import MHA_PARAM_NAMES
from ..ops.feedforward import FFN_PARAM_NAMES
from .budget import check_memory, estimate_encoder
from .config import EncoderConfig

__all__ = ["param_shapes", "init_params", "validate_params", "layer_prefix", "sub_params",
           "OPTIONAL_PARAMS"]

INITS = ("bert", "xavier")
OPTIONAL_PARAMS = ("pooler.W", "pooler.b")


def layer_prefix(config: EncoderConfig, layer: int) -> str:
    """The name prefix of layer ``layer`` (0-based): shared layers all read layers.0."""
    return "layers.0." if config.share_layers else f"layers.{layer}."


def sub_params(params: dict, prefix: str) -> dict:
    """{name[len(prefix):]: array} for the names under ``prefix`` (a view, no copies)."""
    k = len(prefix)
    return {name[k:]: a for name, a in params.items() if name.startswith(prefix)}


def param_shapes(config: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter name of ``config`` mapped to its shape, in a fixed order."""
    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config must be an EncoderConfig, got {describe(config)}")
    d, f = config.d_model, config.d_ff
    shapes: dict[str, tuple[int, ...]] = {}
    if config.has_embeddings:
        shapes["embeddings.word"] = (config.vocab_size, d)
        if config.positional == "learned":
            shapes["embeddings.position"] = (config.max_len, d)
        if config.type_vocab_size:
            shapes["embeddings.token_type"] = (config.type_vocab_size, d)
        if config.embedding_layer_norm:
            shapes["embeddings.ln.gamma"] = (d,)
            shapes["embeddings.ln.beta"] = (d,)
    n_distinct = 1 if config.share_layers else config.n_layers
    for layer in range(n_distinct):
        pre = f"layers.{layer}."
        for name in MHA_PARAM_NAMES:
            shapes[pre + "attn." + name] = (d, d) if name.startswith("W") else (d,)
        shapes[pre + "ln1.gamma"] = (d,)
        shapes[pre + "ln1.beta"] = (d,)
        ffn = {"W_1": (d, f), "b_1": (f,), "W_2": (f, d), "b_2": (d,)}
        for name in FFN_PARAM_NAMES:
            shapes[pre + "ffn." + name] = ffn[name]
        shapes[pre + "ln2.gamma"] = (d,)
        shapes[pre + "ln2.beta"] = (d,)
    if config.use_final_layer_norm:
        shapes["final_ln.gamma"] = (d,)
        shapes["final_ln.beta"] = (d,)
    return shapes


def init_params(config: EncoderConfig, seed: int = 0, dtype=np.float64, init: str = "bert",
                std: float = 0.02) -> dict[str, np.ndarray]:
    """Deterministic initial parameters.

    ``init="bert"``: every weight matrix and embedding ~ N(0, std²) (BERT: std = 0.02),
    biases 0, LayerNorm γ = 1, β = 0.
    ``init="xavier"``: weight matrices ~ U(−a, a), a = √(6 / (fan_in + fan_out)) (Glorot),
    embeddings ~ N(0, std²), biases 0, γ = 1, β = 0.

    Values are drawn in float64 in the fixed order of :func:`param_shapes` from
    ``np.random.default_rng(seed)`` and then cast, so float32 and float64 models built
    from the same seed hold the same numbers (up to rounding).

    Raises :class:`~transformer_np.errors.ResourceLimitError` before allocating anything when the
    parameters would not fit the memory limit (see :mod:`transformer_np.model.budget`).
    """
    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config must be an EncoderConfig, got {describe(config)}")
    check_int(seed, "seed", minimum=0)
    dt = check_float_dtype(dtype)
    check_choice(init, "init", INITS)
    if not (isinstance(std, (int, float)) and std > 0):
        raise ValueError(f"std must be a positive number, got {std!r}")
    check_memory(estimate_encoder(config, dt), "init_params")
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(config).items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "gamma":
            a = np.ones(shape)
        elif leaf == "beta" or leaf.startswith("b_"):
            a = np.zeros(shape)
        elif name.startswith("embeddings.") or init == "bert":
            a = rng.normal(0.0, std, size=shape)
        else:  # xavier for (fan_in, fan_out) weight matrices
            limit = math.sqrt(6.0 / (shape[0] + shape[1]))
            a = rng.uniform(-limit, limit, size=shape)
        params[name] = a.astype(dt)
    return params


def validate_params(params, config: EncoderConfig, name: str = "params") -> np.dtype:
    """Check names, shapes and dtypes of ``params`` against ``config``; return the dtype.

    Missing and unexpected names are listed; all arrays must share one float dtype.
    The optional BERT pooler (``pooler.W``, ``pooler.b``) is allowed.
    """
    if not isinstance(params, dict):
        raise TypeError(f"{name} must be a dict of name -> numpy array, got {describe(params)}")
    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config must be an EncoderConfig, got {describe(config)}")
    shapes = param_shapes(config)
    return check_param_arrays(params, shapes, name, optional=OPTIONAL_PARAMS)


def check_param_arrays(params: dict, shapes: dict, name: str = "params", optional=(), what: str = "the config"):
    """``params`` has exactly the names of ``shapes`` (plus any of ``optional``), each a float32/float64 array
    of its shape, all of one dtype; returns that dtype. Shared by :func:`validate_params` and the Hugging Face
    families' :func:`transformer_np.io.hf_model.validate_hf_params`."""
    missing = [k for k in shapes if k not in params]
    extra = [k for k in params if k not in shapes and k not in optional]
    if missing or extra:
        raise InputValueError(f"{name} does not match {what} ({mismatch_detail(missing, extra)})")
    dtype = None
    for k, shape in shapes.items():
        a = params[k]
        if not isinstance(a, np.ndarray):
            raise InputTypeError(f"{name}[{k!r}] must be a numpy array, got {describe(a)}")
        if a.dtype not in FLOAT_DTYPES:
            raise InputTypeError(f"{name}[{k!r}] must have dtype float32 or float64, got {a.dtype}")
        if dtype is None:
            dtype = a.dtype
        elif a.dtype != dtype:
            raise InputTypeError(f"{name} must all share one dtype: {name}[{k!r}] is {a.dtype}, others are {dtype}")
        if a.shape != shape:
            raise InputValueError(f"{name}[{k!r}] must have shape {shape}, got shape {a.shape}")
    return dtype
