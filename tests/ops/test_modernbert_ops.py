"""ModernBERT's ops against Hugging Face's code: rotary tables (theirs float32), the rotation itself, the
sliding-window mask; and the GLU's halves in HF's order."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_np.ops.glu import glu_forward
from transformer_np.ops.local_attention import sliding_window_mask
from transformer_np.ops.masks import combine_masks, padding_mask
from transformer_np.ops.rotary import rotary_forward, rotary_tables


def _modernbert():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import transformers
    from transformers.models.modernbert import modeling_modernbert as MM

    return torch, transformers, MM


@pytest.mark.parametrize("layer_type, theta", [("full_attention", 160_000.0), ("sliding_attention", 10_000.0)])
def test_rotary_tables_are_hfs_up_to_its_float32(layer_type, theta):
    """HF computes the angles m·ω_k and their cos/sin in float32; ours are float64. The difference is float32's
    rounding of the angle (|Δφ| ≤ eps32·φ) and of cos/sin: |Δ| ≤ 2·eps32·(1 + max φ)."""
    torch, transformers, MM = _modernbert()
    cfg = transformers.ModernBertConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=3, vocab_size=10,
                                        pad_token_id=0)
    rope = MM.ModernBertRotaryEmbedding(cfg)
    n, dk = 300, 16
    cos, sin = rope(torch.zeros(1, n, 32, dtype=torch.float64), torch.arange(n)[None], layer_type)
    C, S = rotary_tables(n, dk, theta)
    bound = 2 * np.finfo(np.float32).eps * (1 + (n - 1))
    assert np.abs(C - cos[0].numpy()).max() <= bound and np.abs(S - sin[0].numpy()).max() <= bound
    assert np.abs(C - cos[0].numpy()).max() > 1e-9           # HF's tables are float32 numbers, not float64 ones


def test_rotation_is_hfs_bit_for_bit_in_float32(rng):
    torch, transformers, MM = _modernbert()
    n, dk = 7, 8
    C, S = (t.astype(np.float32) for t in rotary_tables(n, dk, 10_000.0))
    q, k = (rng.standard_normal((2, 3, n, dk)).astype(np.float32) for _ in range(2))
    ref_q, ref_k = MM.apply_rotary_pos_emb(torch.tensor(q), torch.tensor(k), torch.tensor(C)[None],
                                           torch.tensor(S)[None])
    # exact: x·C + rot(x)·S, the same IEEE float32 products and sum in the same order
    assert np.array_equal(rotary_forward(q, C, S)[0], ref_q.numpy())
    assert np.array_equal(rotary_forward(k, C, S)[0], ref_k.numpy())     # exact: as for q above


@pytest.mark.parametrize("local_attention", [2, 4, 7, 100])
def test_sliding_window_mask_is_hfs_eager_mask(local_attention):
    torch, transformers, MM = _modernbert()
    from transformers.masking_utils import create_bidirectional_sliding_window_mask

    cfg = transformers.ModernBertConfig(hidden_size=8, num_attention_heads=2, num_hidden_layers=1, vocab_size=10,
                                        pad_token_id=0, local_attention=local_attention)
    cfg._attn_implementation = "eager"
    am = np.ones((2, 12), dtype=np.int64)
    am[1, 9:] = 0
    ref = create_bidirectional_sliding_window_mask(config=cfg, inputs_embeds=torch.zeros(2, 12, 8, dtype=torch.float64),
                                                   attention_mask=torch.tensor(am))
    ours = combine_masks(padding_mask(am), sliding_window_mask(12, local_attention // 2))
    # exact: both are 0 or float64's most negative finite number
    assert np.array_equal(np.broadcast_to(ours, ref.shape), ref.numpy())


def test_glu_halves_are_input_then_gate(rng):
    u = rng.standard_normal((3, 10))
    y, _ = glu_forward(u, "relu")
    # exact: relu(a)·g is a product of the same numbers
    assert np.array_equal(y, np.maximum(u[:, :5], 0) * u[:, 5:])
