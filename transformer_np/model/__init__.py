"""The model built from the ops: config, parameters, the encoder stack, heads, losses, gradient checks.

The map:

* :mod:`~transformer_np.model.encoder` — one encoder layer, Post-LN and Pre-LN: the article's equations, one op
  per term, forward and backward, and two dispatch points to the speed engine (:mod:`transformer_np.fast`);
* :mod:`~transformer_np.model.stack` — the public functions around it (:func:`encoder_layer_forward`,
  :func:`encoder_forward` and their backwards): the checks, the ``fast=`` flag, the N-layer stack, inference
  and stale-cache bookkeeping (the old path ``model.encoder`` still gives every one of them);
* :mod:`~transformer_np.model.checks` — the encoder's argument checks and its errors;
* :mod:`~transformer_np.model.config`, :mod:`~transformer_np.model.params` — the config and the parameters;
  :mod:`~transformer_np.model.budget` — the memory an encoder call will need, checked before it runs;
* :mod:`~transformer_np.model.heads`, :mod:`~transformer_np.model.losses` — pooling, classifier, tagger;
  cross-entropy;
* :mod:`~transformer_np.model.mpnet`, :mod:`~transformer_np.model.modernbert`, :mod:`~transformer_np.model.deberta`
  — the family variants' layers;
* ``gradcheck`` (with ``gradcheck_families`` and ``gradcheck_deberta``) and ``flops`` — modules of their own
  (import them as ``transformer_np.model.gradcheck`` / ``.flops``).

The names below are the model's public API.
"""

from .config import EncoderConfig, count_parameters
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
from .stack import encoder_backward, encoder_forward, encoder_layer_backward, encoder_layer_forward

__all__ = [
    "EncoderConfig", "cls_classifier_backward", "cls_classifier_forward", "count_parameters",
    "cross_entropy_backward", "cross_entropy_forward", "encoder_backward", "encoder_forward",
    "encoder_layer_backward", "encoder_layer_forward", "init_params", "mean_pool_backward", "mean_pool_forward",
    "param_shapes", "pooler_backward", "pooler_forward", "tagger_backward", "tagger_forward", "validate_params",
]
