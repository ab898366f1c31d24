"""Every mask torch's encoder modules take, through transformer_np.testing: ``src_mask``/``attn_mask`` (boolean or
additive float, 2-D or per head) and ``is_causal``, alone and with a key padding mask, for nn.TransformerEncoderLayer,
nn.TransformerEncoder and nn.MultiheadAttention; torch's padding convention under its own name
(``src_key_padding_mask``, True = padding) beside Hugging Face's (``attention_mask``, 1 = token); a mask that fits
neither refused with a message saying which is which."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="transformer_np.testing compares with PyTorch: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="pip install transformers")

from transformer_np.errors import InputTypeError, InputValueError  # noqa: E402
from transformer_np.testing import assert_matches_torch, compare_with_torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.hf]
F64 = torch.float64
B, N, D, H = 2, 6, 16, 4


def modules():
    torch.manual_seed(0)
    return {
        "layer": (torch.nn.TransformerEncoderLayer(D, H, 32, dropout=0.0, batch_first=True, dtype=F64), True),
        "layer-seq-first": (torch.nn.TransformerEncoderLayer(D, H, 32, dropout=0.0, norm_first=True, dtype=F64),
                            False),
        "encoder": (torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(D, H, 32, dropout=0.0, batch_first=True, dtype=F64), 2,
            norm=torch.nn.LayerNorm(D, dtype=F64), enable_nested_tensor=False), True),
        "mha": (torch.nn.MultiheadAttention(D, H, batch_first=True, dtype=F64), True),
        "mha-seq-first": (torch.nn.MultiheadAttention(D, H, dtype=F64), False),
    }


def masks(rng):
    allowed = rng.random((N, N)) < 0.6
    np.fill_diagonal(allowed, True)                                  # every query keeps a key (itself)
    allowed_h = rng.random((B * H, N, N)) < 0.6
    allowed_h[:, np.arange(N), np.arange(N)] = True
    add = rng.normal(size=(N, N))
    add[~allowed] = -np.inf
    add_h = rng.normal(size=(B * H, N, N))
    add_h[~allowed_h] = -np.inf
    return {"none": {}, "bool 2-D": {"src_mask": ~allowed}, "float 2-D": {"src_mask": add},
            "bool per head": {"attn_mask": ~allowed_h}, "float per head": {"attn_mask": add_h},
            "is_causal": {"is_causal": True},
            "causal mask + is_causal": {"src_mask": np.triu(np.ones((N, N), dtype=bool), 1), "is_causal": True},
            "causal float mask, no hint": {"src_mask": np.triu(np.full((N, N), -np.inf), 1)}}


PAD = np.array([[False] * N, [False] * 4 + [True] * 2])             # torch's convention: True = padding
MASKS = list(masks(np.random.default_rng(0)))


@pytest.mark.parametrize("padded", [False, True], ids=["no padding", "padding"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("kind", list(modules()))
def test_every_mask_alone_and_with_padding(kind, mask, padded):
    module, batch_first = modules()[kind]
    kw = dict(masks(np.random.default_rng(0))[mask])
    if padded:
        kw["src_key_padding_mask"] = PAD
    x = np.random.default_rng(1).normal(size=(B, N, D) if batch_first else (N, B, D))
    report = assert_matches_torch(module, x, **kw)
    if kw:                                                        # the mask reached torch: the output changed
        plain = compare_with_torch(module, x)
        assert not np.allclose(report["output"].ref, plain["output"].ref)


def test_padding_plus_causal_in_three_lines():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, dtype=F64)
    x = np.random.default_rng(0).normal(size=(2, 6, 16))
    assert_matches_torch(layer, x, src_key_padding_mask=PAD, is_causal=True)


def test_torch_tensors_are_taken_as_they_are():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, dtype=F64)
    x = torch.randn(2, 6, 16, dtype=F64)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(6, dtype=F64)
    assert_matches_torch(layer, x, src_mask=causal, is_causal=True, src_key_padding_mask=torch.from_numpy(PAD))


def test_the_two_padding_conventions_say_the_same_thing():
    model = transformers.BertModel(transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                                           num_attention_heads=4, intermediate_size=32)).double().eval()
    ids = np.random.default_rng(0).integers(2, 50, size=(2, 6))
    hf = compare_with_torch(model, ids, attention_mask=(~PAD).astype(int))
    tr = compare_with_torch(model, ids, src_key_padding_mask=PAD)
    assert hf.ok and tr.ok
    np.testing.assert_array_equal(hf["output"].ref, tr["output"].ref)       # the same torch call: exact


# ----------------------------------------------------------------------------- refused, saying which is which
def _layer():
    return torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, dtype=F64)


def _x():
    return np.random.default_rng(0).normal(size=(2, 6, 16))


def test_a_boolean_attention_mask_is_refused_naming_both_conventions():
    with pytest.raises(InputTypeError, match=r"attention_mask is boolean.*1 = real token.*True = padding"):
        compare_with_torch(_layer(), _x(), attention_mask=PAD)


def test_an_integer_key_padding_mask_is_refused_with_the_hint():
    with pytest.raises(InputTypeError, match=r"src_key_padding_mask must be boolean.*pass it as attention_mask="):
        compare_with_torch(_layer(), _x(), src_key_padding_mask=(~PAD).astype(int))


def test_other_values_and_both_masks_are_refused():
    with pytest.raises(InputValueError, match=r"attention_mask must hold 1 \(real token\) and 0.*True = padding"):
        compare_with_torch(_layer(), _x(), attention_mask=np.full((2, 6), 2))
    with pytest.raises(InputValueError, match="not both"):
        compare_with_torch(_layer(), _x(), attention_mask=(~PAD).astype(int), src_key_padding_mask=PAD)
    with pytest.raises(InputValueError, match="src_key_padding_mask row 0 has no real token"):
        compare_with_torch(_layer(), _x(), src_key_padding_mask=np.ones((2, 6), dtype=bool))
    with pytest.raises(InputValueError, match=r"attention_mask row 1 .*pass it as src_key_padding_mask"):
        compare_with_torch(_layer(), _x(), attention_mask=np.array([[1] * 6, [0] * 6]))


def test_bad_attention_masks_are_refused_by_name():
    with pytest.raises(InputValueError, match=r"src_mask \(attn_mask\) must have shape \(n, n\) = \(6, 6\)"):
        compare_with_torch(_layer(), _x(), src_mask=np.zeros((5, 5), dtype=bool))
    with pytest.raises(InputTypeError, match="must be boolean .* or float"):
        compare_with_torch(_layer(), _x(), src_mask=np.zeros((6, 6), dtype=int))
    with pytest.raises(InputValueError, match="is_causal=True is torch's hint"):
        compare_with_torch(_layer(), _x(), src_mask=np.zeros((6, 6), dtype=bool), is_causal=True)
    with pytest.raises(InputValueError, match="not both"):
        compare_with_torch(_layer(), _x(), src_mask=np.zeros((6, 6), dtype=bool),
                           attn_mask=np.zeros((6, 6), dtype=bool))
    blind = np.zeros((6, 6), dtype=bool)
    blind[2] = True                                               # query 2, a real token, may attend to no key
    with pytest.raises(InputValueError, match="query 2 of sequence 0, a real token, may attend to no key"):
        compare_with_torch(_layer(), _x(), src_mask=blind)
    # (a padded query with no key — causal with left padding — is left out instead: tests/test_testing_rows.py)
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                          num_attention_heads=4, intermediate_size=32))
    with pytest.raises(InputValueError, match="apply to the torch modules"):
        compare_with_torch(bert, np.ones((2, 6), dtype=int), is_causal=True)
