r"""The ops' unchecked kernels under public names, for the layers above: the textbook layer of
:mod:`transformer_np.model.encoder` runs them, and the speed engine (:mod:`transformer_np.fast`), whose
functions have the same names and signatures, is tested against them (``tests/ops/test_fast_path.py``).

Each is the textbook computation of its op module (read the module for the derivation), without the argument
checks of the public function — the caller has checked once, at the boundary. (In an op module the same
kernel is the public name with a leading underscore: ``attention._mha_forward``.) A composite backward here
frees nothing mid-way: with ``free_cache=True`` the whole sublayer cache is dropped once it returns. (Until
issue 46 this was ``transformer_np.ops.plain``; that path still imports it.)
"""

from __future__ import annotations

import numpy as np

from .activations import _FUNCS as ACTIVATION_FUNCS  # noqa: F401  (no twin: see below)
from .activations import _VALUE_FUNCS as ACTIVATION_VALUES  # noqa: F401  (no twin: see below)
from .activations import _activation_backward as activation_backward
from .activations import _activation_forward as activation_forward
from .attention import _attention_backward as attention_backward
from .attention import _attention_forward as attention_forward
from .attention import _mha_backward
from .attention import _mha_forward as mha_forward
from .attention_bias import _biased_mha_backward as biased_mha_backward  # noqa: F401  (no twin: see below)
from .attention_bias import _biased_mha_forward as biased_mha_forward  # noqa: F401  (no twin: see below)
from .cache import release
from .dropout import _dropout_backward as dropout_backward
from .dropout import _dropout_forward as dropout_forward
from .embeddings import _embedding_backward as embedding_backward  # noqa: F401  (no twin: see below)
from .embeddings import _embeddings_backward as embeddings_backward  # noqa: F401  (no twin: see below)
from .embeddings import _embeddings_forward as embeddings_forward  # noqa: F401  (no twin: see below)
from .embeddings import _raise_table_row as raise_table_row  # noqa: F401  (no twin: see below)
from .erf import _erf as erf  # noqa: F401  (no twin: see below)
from .feedforward import _ffn_backward
from .feedforward import _ffn_forward as ffn_forward
from .glu import _glu_ffn_backward as glu_ffn_backward  # noqa: F401  (no twin: see below)
from .glu import _glu_ffn_forward as glu_ffn_forward  # noqa: F401  (no twin: see below)
from .layernorm import _layernorm_backward as layernorm_backward
from .layernorm import _layernorm_forward as layernorm_forward
from .linear import _linear_backward as linear_backward
from .linear import _linear_forward as linear_forward
from .masks import _padding_mask as padding_mask  # noqa: F401  (no twin: see below)
from .relative_position import (  # noqa: F401  (no twin: see below)
    _relative_position_bias_backward as relative_position_bias_backward,
)
from .residual import _residual_backward as residual_backward
from .residual import _residual_forward as residual_forward
from .rotary import _rotary_backward as rotary_backward  # noqa: F401  (no twin: see below)
from .rotary import _rotary_forward as rotary_forward  # noqa: F401  (no twin: see below)
from .softmax import _softmax as softmax

__all__ = ["linear_forward", "linear_backward", "softmax", "attention_forward", "attention_backward",
           "mha_forward", "mha_backward", "layernorm_forward", "layernorm_backward", "activation_forward",
           "activation_backward", "ffn_forward", "ffn_backward", "dropout_forward", "dropout_backward",
           "residual_forward", "residual_backward"]
# __all__ lists the kernels the engine has twins of (tests/ops/test_fast_path.py holds the two sets equal); the
# embedding block's kernels, the padding mask, the table-row error and the activation tables below them are for
# the textbook stack (model/encoder.py) and the engine's own kernels, and have no twin; so are the family
# variants' kernels (GLU feed-forward, rotary, relative-position bias, biased attention, the embedding lookup's
# backward, erf), which model/modernbert.py, model/mpnet.py, io/hf_model.py and the worksheets run.


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
