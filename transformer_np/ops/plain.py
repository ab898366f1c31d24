r"""The plain path's kernels, under the same names and signatures as :mod:`transformer_np.ops.fast`.

Each is the textbook computation of its op module (read the module for the derivation), without
the argument checks of the public function — the caller has checked once, at the boundary.
``encoder_forward(..., fast=False)`` runs the stack through these; the default runs it through
:mod:`transformer_np.ops.fast`. A composite backward here frees nothing mid-way: with
``free_cache=True`` the caller drops the whole sublayer cache once it returns.
"""

from __future__ import annotations

import numpy as np

from .activations import _activation_backward as activation_backward
from .activations import _activation_forward as activation_forward
from .attention import _attention_backward as attention_backward
from .attention import _attention_forward as attention_forward
from .attention import _mha_backward
from .attention import _mha_forward as mha_forward
from .cache import release
from .dropout import _dropout_backward as dropout_backward
from .dropout import _dropout_forward as dropout_forward
from .feedforward import _ffn_backward
from .feedforward import _ffn_forward as ffn_forward
from .layernorm import _layernorm_backward as layernorm_backward
from .layernorm import _layernorm_forward as layernorm_forward
from .linear import _linear_backward as linear_backward
from .linear import _linear_forward as linear_forward
from .residual import _residual_backward as residual_backward
from .residual import _residual_forward as residual_forward
from .softmax import _softmax as softmax

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
