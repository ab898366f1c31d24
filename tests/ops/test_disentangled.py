"""DeBERTa's disentangled attention ops: HF's buckets and scale exactly, the scores as their definition, the
replacing mask, the gather's adjoint, a wrong backward caught by the gradient check, bad arguments refused."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_np.errors import InputValueError
from transformer_np.model.gradcheck import check_op
from transformer_np.ops.disentangled import (
    deberta_scale,
    disentangled_scores_backward,
    disentangled_scores_forward,
    gather_last_backward,
    log_bucket_position,
    position_indices,
    relative_position_ids,
    replace_masked_attention_backward,
    replace_masked_attention_forward,
)


def _hf():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    from transformers.models.deberta_v2 import modeling_deberta_v2 as MD

    return torch, MD


@pytest.mark.parametrize("buckets, max_position", [(256, 512), (64, 128), (8, 20), (6, 40), (2, 3)])
def test_buckets_are_hfs_for_every_distance(buckets, max_position):
    torch, MD = _hf()
    r = np.arange(-20000, 20001)
    ref = MD.make_log_bucket_position(torch.tensor(r), buckets, max_position).to(torch.long).numpy()
    # exact: integer buckets (the float32 logarithm taken as HF takes it)
    assert np.array_equal(log_bucket_position(r, buckets, max_position), ref)
    q = torch.zeros(1, 70, 4)
    ref = MD.build_relative_position(q, q, bucket_size=buckets, max_position=max_position)[0].numpy()
    assert np.array_equal(relative_position_ids(70, buckets, max_position), ref)      # exact: integers


def test_unbucketed_positions_and_the_scale_are_hfs():
    torch, MD = _hf()
    q = torch.zeros(1, 30, 4)
    # exact: integers
    assert np.array_equal(relative_position_ids(30), MD.build_relative_position(q, q)[0].numpy())
    for d, sf in ((8, 3), (64, 3), (16, 2), (7, 1)):
        # exact: the same float32 square root of the same float32 product
        assert deberta_scale(d, sf) == float(MD.scaled_size_sqrt(torch.zeros(1, d), sf))
    assert deberta_scale(8, 3) != np.sqrt(24.0)        # float32's root, not float64's


def test_scores_are_their_definition(rng):
    B, h, n, dk, k = 2, 3, 11, 4, 3
    Q, K = rng.standard_normal((2, B, h, n, dk))
    PK, PQ = rng.standard_normal((2, 1, h, 2 * k, dk))
    delta = relative_position_ids(n, 4, 8)
    c, p = position_indices(delta, k)
    assert c.min() == 0 and c.max() == 2 * k - 1      # clipped at both ends
    assert np.array_equal(p.T, c)                      # exact: δ is odd, so p(j, i) = c(i, j)
    S, _ = disentangled_scores_forward(Q, K, 2.5, c, PK, p, PQ)
    ref = np.empty_like(S)
    for i in range(n):
        for j in range(n):
            ref[..., i, j] = ((Q[..., i, :] * K[..., j, :]).sum(-1) + (Q[..., i, :] * PK[0, :, c[i, j]]).sum(-1)
                              + (K[..., j, :] * PQ[0, :, p[j, i]]).sum(-1)) / 2.5
    np.testing.assert_allclose(S, ref, rtol=1e-13, atol=1e-13)
    S0, _ = disentangled_scores_forward(Q, K, 2.5)
    np.testing.assert_allclose(S0, Q @ K.swapaxes(-1, -2) / 2.5, rtol=1e-14, atol=1e-14)


def test_gather_adjoint_is_the_scatter_add(rng):
    idx = rng.integers(0, 5, size=(6, 9))
    dy = rng.standard_normal((2, 3, 6, 9))
    ref = np.zeros((2, 3, 6, 5))
    for i in range(6):
        for j in range(9):
            ref[..., i, idx[i, j]] += dy[..., i, j]
    np.testing.assert_allclose(gather_last_backward(dy, idx, 5), ref, rtol=1e-14, atol=1e-14)
    assert gather_last_backward(dy.astype(np.float32), idx, 5).dtype == np.float32


def test_replacing_mask_padded_rows_attend_uniformly_and_pass_no_gradient(rng):
    B, h, n, dk = 2, 2, 6, 3
    am = np.ones((B, n))
    am[1, 4:] = 0
    keep = (am[:, None, :, None] * am[:, None, None, :]) > 0
    S, V = rng.standard_normal((B, h, n, n)), rng.standard_normal((B, h, n, dk))
    O, cache = replace_masked_attention_forward(S, V, keep)
    A = cache["weights"]
    # exact: every score of a padded row is the same min_float, so exp(0) / n
    assert np.array_equal(A[1, :, 4:], np.full((h, 2, n), 1.0 / n))
    assert not A[1, :, :4, 4:].any()                   # exact: exp(min − max) underflows to 0
    dS, dV = replace_masked_attention_backward(rng.standard_normal(O.shape), cache)
    assert not dS[1, :, 4:].any() and not dS[1, :, :4, 4:].any()   # exact: where(keep, ·, 0)
    assert np.abs(dS[0]).min() > 0


def test_a_wrong_backward_is_caught(rng):
    """The p2c term's gradient to K left out: the gradient check fails on K (and passes Q)."""
    B, h, n, dk, k = 2, 2, 8, 3, 3
    c, p = position_indices(relative_position_ids(n), k)
    arrays = {"Q": rng.standard_normal((B, h, n, dk)), "K": rng.standard_normal((B, h, n, dk)),
              "PQ": rng.standard_normal((1, h, 2 * k, dk))}

    def run(a):
        return disentangled_scores_forward(a["Q"], a["K"], 2.0, p_idx=p, PQ=a["PQ"])

    def wrong(R, cache):
        dQ, _, _, dPQ = disentangled_scores_backward(R, cache)
        return {"Q": dQ, "K": R.swapaxes(-1, -2) @ cache["Q"] / 2.0, "PQ": dPQ}

    r = check_op("wrong", run, wrong, arrays)
    assert r.per_tensor["K"] > 1e-3 and r.per_tensor["Q"] < 1e-7


def test_bad_arguments_are_refused(rng):
    Q = rng.standard_normal((1, 2, 5, 3))
    with pytest.raises(InputValueError, match=r"PK must have shape \(1, h, 2k, d_k\) = \(1, 2, 2k, 3\)"):
        disentangled_scores_forward(Q, Q, 1.0, np.zeros((5, 5), dtype=int), rng.standard_normal((1, 3, 4, 3)))
    with pytest.raises(InputValueError, match=r"index of PK must be \(n, n\) = \(5, 5\) with entries in \[0, 4\)"):
        disentangled_scores_forward(Q, Q, 1.0, np.full((5, 5), 4), rng.standard_normal((1, 2, 4, 3)))
    with pytest.raises(InputValueError, match="K must have Q's shape"):
        disentangled_scores_forward(Q, Q[..., :2], 1.0)
    with pytest.raises(InputValueError, match=r"max_position − 1 must exceed bucket_size // 2"):
        log_bucket_position([1, 2], 8, 5)
    with pytest.raises(InputValueError, match=r"keep must broadcast to S's shape \(1, 2, 5, 5\)"):
        replace_masked_attention_forward(rng.standard_normal((1, 2, 5, 5)), Q, np.ones((3, 1, 5, 5), dtype=bool))
    _, cache = disentangled_scores_forward(Q, Q, 1.0)
    with pytest.raises(ValueError, match="dS"):
        disentangled_scores_backward(np.zeros((1, 2, 5, 4)), cache)
