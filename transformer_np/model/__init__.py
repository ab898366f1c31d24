"""The model built from the ops: config, parameters, the encoder stack, heads, losses, gradient checks.

:mod:`.config` (``EncoderConfig``), :mod:`.params` (parameters as a flat dict of dotted names),
:mod:`.encoder` (the layer and the stack: the article's equations, one dispatch to :mod:`transformer_np.fast`)
with its argument and cache checks in :mod:`.checks`, :mod:`.heads` and :mod:`.losses`; the Hugging Face
families beyond BERT's layer, :mod:`.modernbert` and :mod:`.mpnet`; :mod:`.budget` (memory estimates made
before allocating). ``gradcheck`` (with the families' checks in :mod:`.gradcheck_families`) and ``flops`` are
modules of their own (import them as ``transformer_np.model.gradcheck`` / ``.flops``); the names below are the
model's public API.
"""

from .config import EncoderConfig, count_parameters
from .encoder import encoder_backward, encoder_forward, encoder_layer_backward, encoder_layer_forward
from .heads import (
                    cls_classifier_backward,
                    cls_classifier_forward,
                    mean_pool_backward,
                    mean_pool_forward,
                    pooler_backward,
                    pooler_forward,
                    tagger_backward,
                    tagger_forward,
)
from .losses import cross_entropy_backward, cross_entropy_forward
from .params import init_params, param_shapes, validate_params

__all__ = [
    "EncoderConfig", "cls_classifier_backward", "cls_classifier_forward", "count_parameters",
    "cross_entropy_backward", "cross_entropy_forward", "encoder_backward", "encoder_forward",
    "encoder_layer_backward", "encoder_layer_forward", "init_params", "mean_pool_backward", "mean_pool_forward",
    "param_shapes", "pooler_backward", "pooler_forward", "tagger_backward", "tagger_forward", "validate_params",
]
