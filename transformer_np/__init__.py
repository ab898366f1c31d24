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

#: Every name of the top level and the module it lives in, imported on first use (``tnp.encoder_forward``,
#: ``from transformer_np import check``): ``import transformer_np.ops`` then loads the ops and the shared base
#: alone — not the model, the engine or an application package (``tests/test_core_imports.py``).
_LAZY = {
    "EncoderConfig": "transformer_np.model.config",
    "count_parameters": "transformer_np.model.config",
    "encoder_backward": "transformer_np.model.stack",
    "encoder_forward": "transformer_np.model.stack",
    "encoder_layer_backward": "transformer_np.model.stack",
    "encoder_layer_forward": "transformer_np.model.stack",
    "cls_classifier_backward": "transformer_np.model.heads",
    "cls_classifier_forward": "transformer_np.model.heads",
    "mean_pool_backward": "transformer_np.model.heads",
    "mean_pool_forward": "transformer_np.model.heads",
    "pooler_backward": "transformer_np.model.heads",
    "pooler_forward": "transformer_np.model.heads",
    "tagger_backward": "transformer_np.model.heads",
    "tagger_forward": "transformer_np.model.heads",
    "cross_entropy_backward": "transformer_np.model.losses",
    "cross_entropy_forward": "transformer_np.model.losses",
    "init_params": "transformer_np.model.params",
    "param_shapes": "transformer_np.model.params",
    "validate_params": "transformer_np.model.params",
    "activation_backward": "transformer_np.ops.activations",
    "activation_forward": "transformer_np.ops.activations",
    "gelu_backward": "transformer_np.ops.activations",
    "gelu_forward": "transformer_np.ops.activations",
    "gelu_tanh_backward": "transformer_np.ops.activations",
    "gelu_tanh_forward": "transformer_np.ops.activations",
    "relu_backward": "transformer_np.ops.activations",
    "relu_forward": "transformer_np.ops.activations",
    "attention_backward": "transformer_np.ops.attention",
    "attention_forward": "transformer_np.ops.attention",
    "merge_heads": "transformer_np.ops.attention",
    "mha_backward": "transformer_np.ops.attention",
    "mha_forward": "transformer_np.ops.attention",
    "split_heads": "transformer_np.ops.attention",
    "dropout_backward": "transformer_np.ops.dropout",
    "dropout_forward": "transformer_np.ops.dropout",
    "embedding_backward": "transformer_np.ops.embeddings",
    "embedding_forward": "transformer_np.ops.embeddings",
    "embeddings_backward": "transformer_np.ops.embeddings",
    "embeddings_forward": "transformer_np.ops.embeddings",
    "sinusoidal_positional_encoding": "transformer_np.ops.embeddings",
    "erf": "transformer_np.ops.erf",
    "ffn_backward": "transformer_np.ops.feedforward",
    "ffn_forward": "transformer_np.ops.feedforward",
    "layernorm_backward": "transformer_np.ops.layernorm",
    "layernorm_forward": "transformer_np.ops.layernorm",
    "linear_backward": "transformer_np.ops.linear",
    "linear_forward": "transformer_np.ops.linear",
    "causal_mask": "transformer_np.ops.masks",
    "combine_masks": "transformer_np.ops.masks",
    "padding_mask": "transformer_np.ops.masks",
    "residual_backward": "transformer_np.ops.residual",
    "residual_forward": "transformer_np.ops.residual",
    "softmax": "transformer_np.ops.softmax",
    "softmax_backward": "transformer_np.ops.softmax",
    "softmax_forward": "transformer_np.ops.softmax",
    "check": "transformer_np.worksheets",
    "load_pretrained": "transformer_np.io.pretrained",
}

__version__ = "0.2.0"

_compat.install(__name__)   # ``transformer_np.interop`` & co. (the flat layout of 0.1) keep importing


#: the application packages, ``tnp.worksheets.example_path()`` & co. without importing them first (as when
#: the top level imported them eagerly)
_SUBPACKAGES = ("ops", "fast", "model", "io", "worksheets", "training", "testing", "perf", "course", "grader",
                "cli")


def __getattr__(name: str):
    """``tnp.encoder_forward``, ``tnp.check``, …: a name of the top level, imported from its module on first
    use; ``tnp.ops``, ``tnp.worksheets``, …: a subpackage, likewise; ``tnp.interop``, ``tnp.trace``, …:
    a module of the old flat layout, likewise."""
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value                      # the next lookup is a plain attribute
        return value
    if name in _SUBPACKAGES or name in _compat.MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))

__all__ = [*_LAZY, "__version__"]    # every name of the table above: one list, not two to keep in step
