"""The ops of the encoder, each ``x_forward(...) -> (out, cache)`` with a hand-written ``x_backward``:
the textbook, and nothing of the speed engine (that is :mod:`transformer_np.fast`, built on these).

The map — one module per op, the forward and backward next to their derivation:

* the README's table: :mod:`~transformer_np.ops.linear`, :mod:`~transformer_np.ops.softmax`,
  :mod:`~transformer_np.ops.attention` (scaled dot-product and multi-head attention, the heads' layout),
  :mod:`~transformer_np.ops.masks`, :mod:`~transformer_np.ops.layernorm`,
  :mod:`~transformer_np.ops.activations` and :mod:`~transformer_np.ops.erf`,
  :mod:`~transformer_np.ops.feedforward`, :mod:`~transformer_np.ops.residual`,
  :mod:`~transformer_np.ops.dropout`, :mod:`~transformer_np.ops.embeddings`;
* the family variants: :mod:`~transformer_np.ops.attention_bias`,
  :mod:`~transformer_np.ops.relative_position` (MPNet), :mod:`~transformer_np.ops.rotary`,
  :mod:`~transformer_np.ops.glu`, :mod:`~transformer_np.ops.local_attention` (ModernBERT),
  :mod:`~transformer_np.ops.disentangled` (DeBERTa's disentangled attention);
* :mod:`~transformer_np.ops.cache` — the cache protocol (freeing, the stale-parameter guard, and the
  table through which a textbook backward hands an engine cache to the engine);
* :mod:`~transformer_np.ops.kernels` — every op's unchecked kernel under a public name, for the layers
  above (the textbook encoder layer runs them; the engine is tested against them).

A public function checks its arguments; the same name with a leading underscore is its unchecked
kernel inside its module, which other packages reach as :mod:`transformer_np.ops.kernels`.

The functions ``erf`` and ``softmax`` are not re-exported here: their names are those of their
modules (``transformer_np.ops.erf``, ``transformer_np.ops.softmax``), which a package attribute
would shadow. Import them from their modules, or from ``transformer_np``.
"""

from .activations import (
                          ACTIVATIONS,
                          activation_backward,
                          activation_forward,
                          gelu_backward,
                          gelu_forward,
                          gelu_tanh_backward,
                          gelu_tanh_forward,
                          relu_backward,
                          relu_forward,
)
from .attention import (
                          MHA_PARAM_NAMES,
                          attention_backward,
                          attention_forward,
                          merge_heads,
                          mha_backward,
                          mha_forward,
                          split_heads,
)
from .dropout import dropout_backward, dropout_forward
from .embeddings import (
                          embedding_backward,
                          embedding_forward,
                          embeddings_backward,
                          embeddings_forward,
                          sinusoidal_positional_encoding,
)
from .feedforward import FFN_PARAM_NAMES, ffn_backward, ffn_forward
from .layernorm import layernorm_backward, layernorm_forward
from .linear import linear_backward, linear_forward
from .masks import causal_mask, combine_masks, mask_value, padding_mask, validate_attention_mask
from .residual import residual_backward, residual_forward
from .softmax import softmax_backward, softmax_forward

__all__ = [
    "ACTIVATIONS", "FFN_PARAM_NAMES", "MHA_PARAM_NAMES",
    "activation_backward", "activation_forward", "attention_backward", "attention_forward", "causal_mask",
    "combine_masks", "dropout_backward", "dropout_forward", "embedding_backward", "embedding_forward",
    "embeddings_backward", "embeddings_forward", "ffn_backward", "ffn_forward", "gelu_backward",
    "gelu_forward", "gelu_tanh_backward", "gelu_tanh_forward", "layernorm_backward", "layernorm_forward",
    "linear_backward", "linear_forward", "mask_value", "merge_heads", "mha_backward", "mha_forward",
    "padding_mask", "relu_backward", "relu_forward", "residual_backward", "residual_forward",
    "sinusoidal_positional_encoding", "softmax_backward", "softmax_forward", "split_heads",
    "validate_attention_mask",
]
