r"""The reference the engine is held to: the textbook kernels, under the names and signatures of
:mod:`transformer_np.fast`'s.

Each is the textbook computation of its op module (read the module for the derivation), without
the argument checks of the public function. The engine's tests run a kernel here and its namesake in
:mod:`transformer_np.fast` on the same inputs and compare (``tests/ops/test_fast_path.py``); nothing in
the library calls this module (the textbook layer of :mod:`transformer_np.model.encoder` calls the op
modules). A composite backward here frees nothing mid-way: with ``free_cache=True`` the whole sublayer
cache is dropped once it returns. (Until issue 46 this was ``transformer_np.ops.plain``; that path still
imports it.)
"""

from __future__ import annotations

import numpy as np

from ..ops.activations import _activation_backward as activation_backward
from ..ops.activations import _activation_forward as activation_forward
from ..ops.attention import _attention_backward as attention_backward
from ..ops.attention import _attention_forward as attention_forward
from ..ops.attention import _mha_backward
from ..ops.attention import _mha_forward as mha_forward
from ..ops.cache import release
from ..ops.dropout import _dropout_backward as dropout_backward
from ..ops.dropout import _dropout_forward as dropout_forward
from ..ops.feedforward import _ffn_backward
from ..ops.feedforward import _ffn_forward as ffn_forward
from ..ops.layernorm import _layernorm_backward as layernorm_backward
from ..ops.layernorm import _layernorm_forward as layernorm_forward
from ..ops.linear import _linear_backward as linear_backward
from ..ops.linear import _linear_forward as linear_forward
from ..ops.residual import _residual_backward as residual_backward
from ..ops.residual import _residual_forward as residual_forward
from ..ops.softmax import _softmax as softmax

__all__ = ["linear_forward", "linear_backward", "softmax", "attention_forward", "attention_backward",
           "mha_forward", "mha_backward", "layernorm_forward", "layernorm_backward", "activation_forward",
           "activation_backward", "ffn_forward", "ffn_backward", "dropout_forward", "dropout_backward",
           "residual_forward", "residual_backward"]


def mha_backward(dout: np.ndarray, cache: dict, free_cache: bool = False) -> tuple[np.ndarray, dict]:
    """The plain multi-head attention backward; ``free_cache`` frees the cache when it returns."""
    out = _mha_backward(dout, cache)
    if free_cache:
        release(cache)
    return out


def ffn_backward(dout: np.ndarray, cache: dict, free_cache: bool = False) -> tuple[np.ndarray, dict]:
    """The plain feed-forward backward; ``free_cache`` frees the cache when it returns."""
    out = _ffn_backward(dout, cache)
    if free_cache:
        release(cache)
    return out
