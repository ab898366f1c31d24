"""The fast path's inference caches (``for_backward=False``): the same output as a training forward,
a cache that keeps nothing for a backward, and a backward that refuses it by name."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import assert_paths_close
from transformer_np import fast
from transformer_np.errors import InputValueError


def _mha_params(rng, d: int) -> dict:
    p = {f"W_{k}": rng.standard_normal((d, d)) / np.sqrt(d) for k in "QKVO"}
    p.update({f"b_{k}": rng.standard_normal(d) * 0.1 for k in "QKVO"})
    return p


@pytest.mark.parametrize("store_attention", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_mha_inference_matches_the_training_forward(store_attention, masked):
    rng = np.random.default_rng(3)
    B, n, d, h = 2, 40, 16, 4
    x = rng.standard_normal((B, n, d))
    p = _mha_params(rng, d)
    mask = None
    if masked:
        keep = rng.random((B, 1, 1, n)) > 0.3
        keep[..., 0] = True                                   # every row keeps a key
        mask = np.where(keep, 0.0, -1e9)
    y, cache = fast.mha_forward(x, p, h, mask, store_attention=store_attention)
    y_inf, c_inf = fast.mha_forward(x, p, h, mask, store_attention=store_attention, for_backward=False)
    assert_paths_close(y_inf, y, k=n, paths=("inference", "training forward"))
    assert set(c_inf) == {"kind", "n_heads", "attn", "for_backward"}    # no Q, K, V, context or x kept
    assert set(c_inf["attn"]) == {"kind", "weights", "for_backward"}
    if store_attention:
        assert_paths_close(c_inf["attn"]["weights"], cache["attn"]["weights"], k=d // h,
                           paths=("inference A", "training A"))
    else:
        assert c_inf["attn"]["weights"] is None


def test_a_backward_of_an_inference_cache_is_refused_by_name():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 8, 8))
    _, c = fast.mha_forward(x, _mha_params(rng, 8), 2, for_backward=False)
    with pytest.raises(InputValueError, match=r"mha_forward\(\.\.\., for_backward=False\)"):
        fast.mha_backward(np.ones_like(x), c)
    Q = rng.standard_normal((1, 2, 8, 4))
    _, ca = fast.attention_forward(Q, Q, Q, for_backward=False)
    with pytest.raises(InputValueError, match=r"attention_forward\(\.\.\., for_backward=False\)"):
        fast.attention_backward(np.ones_like(Q), ca)
