"""transformer_np — a pure-NumPy reference implementation of the Transformer encoder stack.

Every sublayer is an explicit ``*_forward(...) -> (out, cache)`` with a hand-written
``*_backward(dout, cache)``; they compose into an encoder layer (Post-LN and Pre-LN)
and an N-layer stack.

The package, by layer (each imports only the layers before it; ``tests/test_layering.py``): :mod:`.ops` (the
textbook ops and the family variants) ← :mod:`.fast` (the speed engine) ← :mod:`.model` (config, parameters,
the encoder, heads, losses, gradient checks) ← :mod:`.io` (checkpoints, interop, the tokenizer) and
:mod:`.worksheets` (hand calculations) ← :mod:`.training`, :mod:`.testing` (comparisons with frameworks) and
:mod:`.perf` (the benchmark) ← :mod:`.course` (the lesson studies) and :mod:`.grader` (the exercise grader) ←
:mod:`.cli` (one module per command; ``__main__`` runs it). Under them all, the shared base: :mod:`.errors` (the
error classes), ``_validate`` (argument checks), ``_memory`` (the memory limit), ``_files`` (bounded, atomic
file I/O), ``_optional`` (optional imports with an install hint), ``_compat`` (old import paths) and
:mod:`.textout` (untrusted text for a terminal or a CSV cell).

Quick start::

    import numpy as np
    import transformer_np as tnp

    cfg = tnp.EncoderConfig(n_layers=2, d_model=4, n_heads=1, d_ff=16)
    params = tnp.init_params(cfg, seed=0)                       # dict: dotted name -> array
    H0 = np.random.default_rng(0).normal(size=(1, 3, 4))        # H^(0): (B, n, d_model)
    H, cache = tnp.encoder_forward(params, cfg, inputs_embeds=H0)
    grads = tnp.encoder_backward(np.ones_like(H), cache)        # same keys as params + "inputs_embeds"
"""

from . import _compat
from .model.config import EncoderConfig, count_parameters
from .model.encoder import encoder_backward, encoder_forward, encoder_layer_backward, encoder_layer_forward
from .model.heads import (
    cls_classifier_backward,
    cls_classifier_forward,
    mean_pool_backward,
    mean_pool_forward,
    pooler_backward,
    pooler_forward,
    tagger_backward,
    tagger_forward,
)
from .model.losses import cross_entropy_backward, cross_entropy_forward
from .model.params import init_params, param_shapes, validate_params
from .ops.activations import (
    activation_backward,
    activation_forward,
    gelu_backward,
    gelu_forward,
    gelu_tanh_backward,
    gelu_tanh_forward,
    relu_backward,
    relu_forward,
)
from .ops.attention import attention_backward, attention_forward, merge_heads, mha_backward, mha_forward, split_heads
from .ops.dropout import dropout_backward, dropout_forward
from .ops.embeddings import (
    embedding_backward,
    embedding_forward,
    embeddings_backward,
    embeddings_forward,
    sinusoidal_positional_encoding,
)
from .ops.erf import erf
from .ops.feedforward import ffn_backward, ffn_forward
from .ops.layernorm import layernorm_backward, layernorm_forward
from .ops.linear import linear_backward, linear_forward
from .ops.masks import causal_mask, combine_masks, padding_mask
from .ops.residual import residual_backward, residual_forward
from .ops.softmax import softmax, softmax_backward, softmax_forward

__version__ = "0.2.0"

_compat.install(__name__)   # ``transformer_np.interop`` & co. (the flat layout of 0.1) keep importing


#: The application entry points, imported on first use (``tnp.check``, ``from transformer_np import
#: load_pretrained``): the core (``ops``, ``fast``, ``model``) imports NumPy and nothing of ``io``,
#: ``worksheets`` or the rest (``tests/test_core_imports.py``).
_LAZY = {
    "check": "transformer_np.worksheets",
    "load_pretrained": "transformer_np.io.pretrained",
}
#: the application packages, ``tnp.worksheets.example_path()`` & co. without importing them first (as when
#: the top level imported them eagerly)
_SUBPACKAGES = ("io", "worksheets", "training", "testing", "perf", "course", "grader", "cli", "fast")


def __getattr__(name: str):
    """``tnp.check``, ``tnp.load_pretrained``: an application entry point, imported on first use;
    ``tnp.worksheets``, ``tnp.io``, …: an application package, likewise; ``tnp.interop``, ``tnp.trace``, …:
    a module of the old flat layout, likewise."""
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value                      # the next lookup is a plain attribute
        return value
    if name in _SUBPACKAGES or name in _compat.MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "EncoderConfig",
    "activation_backward",
    "activation_forward",
    "attention_backward",
    "attention_forward",
    "causal_mask",
    "check",
    "cls_classifier_backward",
    "cls_classifier_forward",
    "combine_masks",
    "count_parameters",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "dropout_backward",
    "dropout_forward",
    "embedding_backward",
    "embedding_forward",
    "embeddings_backward",
    "embeddings_forward",
    "encoder_backward",
    "encoder_forward",
    "encoder_layer_backward",
    "encoder_layer_forward",
    "erf",
    "ffn_backward",
    "ffn_forward",
    "gelu_backward",
    "gelu_forward",
    "gelu_tanh_backward",
    "gelu_tanh_forward",
    "init_params",
    "layernorm_backward",
    "layernorm_forward",
    "linear_backward",
    "linear_forward",
    "load_pretrained",
    "mean_pool_backward",
    "mean_pool_forward",
    "merge_heads",
    "mha_backward",
    "mha_forward",
    "padding_mask",
    "param_shapes",
    "pooler_backward",
    "pooler_forward",
    "relu_backward",
    "relu_forward",
    "residual_backward",
    "residual_forward",
    "sinusoidal_positional_encoding",
    "softmax",
    "softmax_backward",
    "softmax_forward",
    "split_heads",
    "tagger_backward",
    "tagger_forward",
    "validate_params",
    "__version__",
]
