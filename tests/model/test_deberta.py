"""DeBERTa-v2's model without torch: what it refuses (by name), what it keeps, and two properties of its maths."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_np.errors import InputTypeError, InputValueError, ModelConfigError
from transformer_np.model.config import EncoderConfig
from transformer_np.model.deberta import DebertaArch, deberta_backward, deberta_forward, deberta_param_shapes

CFG = EncoderConfig(n_layers=2, d_model=8, n_heads=2, d_ff=12, layer_norm_eps=1e-6, dropout=0.0, vocab_size=20,
                    max_len=16)
ARCH = DebertaArch(max_relative_positions=10, position_buckets=6, position_biased_input=True,
                   max_position_embeddings=16)


def params(arch=ARCH, seed=0):
    rng = np.random.default_rng(seed)
    return {k: (1 + 0.2 * rng.standard_normal(s)) if k.endswith("gamma") else 0.5 * rng.standard_normal(s)
            for k, s in deberta_param_shapes(CFG, arch).items()}


def test_bad_inputs_are_refused_by_name():
    p, ids = params(), np.arange(10).reshape(2, 5)
    with pytest.raises(InputValueError, match="attention_mask must contain only 0"):
        deberta_forward(p, CFG, ARCH, ids, np.full((2, 5), 2))
    with pytest.raises(InputValueError, match=r"attention_mask must have shape \(B, n\) = \(2, 5\)"):
        deberta_forward(p, CFG, ARCH, ids, np.ones((2, 4), dtype=int))
    with pytest.raises(InputValueError, match="token_type_ids given, but the config has type_vocab_size = 0"):
        deberta_forward(p, CFG, ARCH, ids, token_type_ids=np.ones((2, 5), dtype=int))
    with pytest.raises(InputValueError, match="input_ids has 17 positions, but the position table has "
                                              "max_position_embeddings = 16 rows"):
        deberta_forward(p, CFG, ARCH, np.zeros((1, 17), dtype=int))
    with pytest.raises(InputValueError, match=r"params does not match the deberta-v2 config .*attn.W_PK"):
        deberta_forward(params(), CFG, DebertaArch(max_relative_positions=10, share_att_key=False), ids)
    with pytest.raises(InputTypeError, match="arch a DebertaArch"):
        deberta_forward(p, CFG, "v3", ids)
    _, cache = deberta_forward(p, CFG, ARCH, ids, for_backward=False)
    with pytest.raises(InputTypeError, match="for_backward=False"):
        deberta_backward(np.zeros((2, 5, 8)), cache)


@pytest.mark.parametrize("bad, match", [
    (dict(pos_att_type=("c2p", "p2p")), "pos_att_type must be a tuple of distinct entries"),
    (dict(pos_att_type=["c2p"]), "pos_att_type must be a tuple"),
    (dict(position_buckets=1), "position_buckets must be ≤ 0"),
    (dict(max_relative_positions=0), "max_relative_positions and max_position_embeddings must be ≥ 1"),
    (dict(share_att_key=1), "share_att_key must be a bool"),
    (dict(embedding_size=0), "embedding_size must be a positive int"),
])
def test_bad_architectures_are_refused(bad, match):
    with pytest.raises(ModelConfigError, match=match):
        DebertaArch(**{"max_relative_positions": 10, **bad})


def test_padded_tokens_do_not_reach_real_ones_and_shapes_follow_the_config():
    """Changing a padded token's id changes no real position's output (its embedding is zeroed and its key hidden)
    — exact: the padded token's embedding is multiplied by 0 before anything reads it."""
    p = params()
    ids = np.array([[3, 4, 5, 6, 7], [3, 4, 5, 0, 0]])
    am = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    H, cache = deberta_forward(p, CFG, ARCH, ids, am)
    ids2 = ids.copy()
    ids2[1, 3:] = 9
    H2, _ = deberta_forward(p, CFG, ARCH, ids2, am)
    assert np.array_equal(H[:, :3], H2[:, :3]) and np.array_equal(H[0], H2[0])   # exact: see the docstring
    g = deberta_backward(np.ones_like(H), cache, input_grad=True)
    assert set(g) == set(p) | {"inputs_embeds"} and g["inputs_embeds"].shape == (2, 5, 8)
    assert not g["inputs_embeds"][1, 3:].any()        # exact: m = 0 multiplies the gradient there
    assert len(cache["hidden_states"]) == 3 and cache["attentions"][0].shape == (2, 2, 5, 5)
