"""``compare_with_torch`` on the families added in issue 40 (MPNet, ModernBERT), as an engineer calls it: small random
models, both dtypes, with padding. MPNet agrees at the float64 defaults; transformers computes parts of ModernBERT
in float32 even in a float64 model, so its float64 comparison uses float32's defaults and the report says why."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.hf]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformer_np.testing import compare_with_torch  # noqa: E402


def _ids():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 99, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    ids[1, 5:] = 1                                     # the padding token under the mask
    return ids, mask


def _mpnet():
    torch.manual_seed(0)
    cfg = transformers.MPNetConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=64)
    return transformers.MPNetModel(cfg).eval()


def _modernbert():
    torch.manual_seed(0)
    cfg = transformers.ModernBertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=64, max_position_embeddings=64, local_attention=4,
                                        global_attn_every_n_layers=2, pad_token_id=1, attn_implementation="eager")
    return transformers.ModernBertModel(cfg).eval()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_mpnet_agrees_at_the_defaults(dtype):
    ids, mask = _ids()
    report = compare_with_torch(_mpnet().to(dtype), ids, attention_mask=mask)
    assert report.ok, report
    assert not any("ModernBERT" in n for n in report.notes)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_modernbert_agrees_and_a_float64_run_says_why_its_tolerance_is_float32s(dtype):
    ids, mask = _ids()
    report = compare_with_torch(_modernbert().to(dtype), ids, attention_mask=mask)
    assert report.ok, report
    said = [n for n in report.notes if n.startswith("ModernBERT in float64")]
    assert len(said) == (1 if dtype == torch.float64 else 0), report.notes


def test_a_visible_padding_token_is_refused_with_the_reason_for_modernbert_too():
    from transformer_np.errors import InputValueError

    ids, _ = _ids()                                     # row 1 ends in the padding token (id 1) …
    with pytest.raises(InputValueError, match=r"(?s)padding token 1 at position \(1, 5\).*tok_embeddings"):
        compare_with_torch(_modernbert().double(), ids, attention_mask=torch.ones(2, 7, dtype=torch.long))
