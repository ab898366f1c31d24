"""Row-blocked attention (attention.py's ``_BLOCK_SCORES``): blocks of query rows give the
same output, weights and gradients as the whole score matrix at once."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_np as tnp


@pytest.mark.parametrize("mask_kind", [None, "padding", "full"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_row_blocked_attention_equals_one_block(monkeypatch, mask_kind, dropout):
    """Blocks of query rows (forced small here) give the same O, A and gradients as one block."""
    import transformer_np.ops.attention as attention
    rng = np.random.default_rng(0)
    B, h, n, dk = 2, 3, 11, 4
    Q, K, V, dO = (rng.standard_normal((B, h, n, dk)) for _ in range(4))
    mask = {None: None,
            "padding": tnp.padding_mask(np.array([[1] * n, [1] * 7 + [0] * 4]), np.float64),  # (B, 1, 1, n)
            "full": np.where(rng.random((B, 1, n, n)) < 0.2, np.finfo(np.float64).min, 0.0)}[mask_kind]

    def run():
        O, c = attention.attention_forward(Q, K, V, mask, dropout, dropout > 0, np.random.default_rng(1))
        return (O, c["weights"]) + attention.attention_backward(dO, c)

    whole = run()
    monkeypatch.setattr(attention, "_BLOCK_SCORES", B * h * n * 2)   # 2 query rows per block: 6 blocks
    assert len(attention._row_blocks(B * h, n, n)) == 6
    blocked = run()
    for a, b in zip(whole, blocked):
        np.testing.assert_allclose(b, a, rtol=1e-13, atol=1e-14)


def test_row_blocked_attention_gradcheck(monkeypatch):
    import transformer_np.ops.attention as attention
    from transformer_np.model.gradcheck import rel_error
    monkeypatch.setattr(attention, "_BLOCK_SCORES", 2 * 5 * 3)       # 3 query rows per block
    rng = np.random.default_rng(2)
    Q, K, V = (rng.standard_normal((2, 5, 7, 3)) for _ in range(3))
    R = rng.standard_normal((2, 5, 7, 3))
    loss = lambda q: float(np.sum(attention.attention_forward(q, K, V)[0] * R))   # noqa: E731
    _, c = attention.attention_forward(Q, K, V)
    dQ = attention.attention_backward(R, c)[0]
    num = np.zeros_like(Q)
    for i in np.ndindex(Q.shape):
        e = np.zeros_like(Q)
        e[i] = 1e-6
        num[i] = (loss(Q + e) - loss(Q - e)) / 2e-6
    assert rel_error(dQ, num) < 1e-7
