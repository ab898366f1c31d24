"""MPNet's relative position bias: HF's buckets exactly, the bias a lookup of the table, bad tables refused."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_np.errors import InputValueError
from transformer_np.ops.attention import attention_forward
from transformer_np.ops.attention_bias import biased_attention_forward
from transformer_np.ops.relative_position import (
    relative_position_bias_backward,
    relative_position_bias_forward,
    relative_position_bucket,
)


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (64, 256), (16, 32)])
def test_buckets_are_hfs_for_every_distance(num_buckets, max_distance):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    r = np.arange(-5000, 5001)
    ref = MPNetEncoder.relative_position_bucket(torch.tensor(r), num_buckets=num_buckets, max_distance=max_distance)
    # exact: integer buckets (the float32 logarithm is taken as HF takes it)
    assert np.array_equal(relative_position_bucket(r, num_buckets, max_distance), ref.numpy())


def test_bias_is_the_table_read_by_bucket_and_its_gradient_the_scatter(rng):
    table = rng.standard_normal((32, 3))
    n = 40
    P, cache = relative_position_bias_forward(table, n)
    assert P.shape == (1, 3, n, n)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    b = relative_position_bucket(j - i)
    assert np.array_equal(P[0], table[b].transpose(2, 0, 1))         # exact: a lookup
    assert b.max() > 8                                                # the logarithmic buckets are read
    dP = rng.standard_normal((2, 3, n, n))
    dT = relative_position_bias_backward(dP, cache)
    for k in (0, 9, int(b.max())):
        np.testing.assert_allclose(dT[k], dP.sum(axis=0)[:, b == k].sum(axis=1), rtol=1e-13)
    assert not dT[b.max() + 1:].any()                                 # exact: rows no distance reads get 0


def test_bias_matches_hfs_compute_position_bias(rng):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    import transformers

    cfg = transformers.MPNetConfig(hidden_size=8, num_attention_heads=2, num_hidden_layers=1, intermediate_size=8,
                                   vocab_size=10)
    enc = transformers.models.mpnet.modeling_mpnet.MPNetEncoder(cfg).double()
    table = rng.standard_normal((32, 2))
    with torch.no_grad():
        enc.relative_attention_bias.weight.copy_(torch.tensor(table))
        ref = enc.compute_position_bias(torch.zeros(2, 50, 8, dtype=torch.float64)).numpy()
    P, _ = relative_position_bias_forward(table, 50)
    assert np.array_equal(np.broadcast_to(P, ref.shape), ref)         # exact: the same table rows


def test_too_small_a_table_is_refused(rng):
    with pytest.raises(InputValueError, match=r"table has 10 rows, but 40 tokens reach bucket \d+"):
        relative_position_bias_forward(rng.standard_normal((10, 2)), 40)


def test_a_zero_bias_is_plain_attention(rng):
    Q, K, V = (rng.standard_normal((2, 2, 5, 4)) for _ in range(3))
    O, _ = biased_attention_forward(Q, K, V, np.zeros((1, 2, 5, 5)))
    ref, _ = attention_forward(Q, K, V)
    np.testing.assert_allclose(O, ref, rtol=1e-14, atol=1e-15)
