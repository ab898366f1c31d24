"""An empty batch (B = 0) runs through one layer on every path and gives empty results of the right shape.

Found in session 8's review: the attention's block layout stepped over the batch axis by lead[0] = 0, so the
fast path raised Python's "range() arg 3 must not be zero" instead of returning (0, n, d)."""

import numpy as np
import pytest

from transformer_np.model.config import EncoderConfig
from transformer_np.model.encoder import encoder_layer_backward, encoder_layer_forward, layer_param_shapes


@pytest.mark.parametrize("fast, store_attention", [(True, True), (True, False), (False, True)])
def test_an_empty_batch_gives_empty_outputs_and_zero_gradients(fast, store_attention):
    cfg = EncoderConfig(n_layers=1, d_model=8, n_heads=2, d_ff=16)
    r = np.random.default_rng(0)
    p = {k: r.standard_normal(s) for k, s in layer_param_shapes(cfg).items()}
    x = np.zeros((0, 3, 8))                                            # (B = 0, n, d)
    out, cache = encoder_layer_forward(x, p, cfg, fast=fast, store_attention=store_attention)
    assert out.shape == (0, 3, 8)
    dx, grads = encoder_layer_backward(np.zeros_like(out), cache)
    assert dx.shape == (0, 3, 8)
    for name, shape in layer_param_shapes(cfg).items():
        assert grads[name].shape == shape
        assert not grads[name].any()                                   # exact: sums over no example are 0
    inferred, c = encoder_layer_forward(x, p, cfg, fast=fast, store_attention=store_attention, for_backward=False)
    assert inferred.shape == (0, 3, 8)
    weights = c["attn"]["attn"]["weights"]
    assert weights is None if not store_attention else weights.shape == (0, 2, 3, 3)
