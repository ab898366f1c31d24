"""``compare_with_torch`` on DeBERTa-v2 (issue 45 item 5), as an engineer calls it: small random DebertaV2Models,
float64 and float32, padded; the sublayer table runs DeBERTa's disentangled attention (not BERT's); a bug planted in
layer 1's position terms is caught and named at its layer and sublayer; a config that differs is named."""

from __future__ import annotations

import os

import numpy as np
import pytest

from helpers import randomise_

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.torch, pytest.mark.hf]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers.models.deberta_v2 import modeling_deberta_v2 as MD  # noqa: E402

from transformer_np.io.interop import from_hf  # noqa: E402
from transformer_np.testing import compare_with_torch  # noqa: E402

V3 = dict(position_biased_input=False, relative_attention=True, pos_att_type=["p2c", "c2p"], share_att_key=True,
          position_buckets=8, max_relative_positions=20, norm_rel_ebd="layer_norm")
V2 = dict(position_biased_input=True, relative_attention=True, pos_att_type=["p2c", "c2p"], share_att_key=False,
          max_relative_positions=6, type_vocab_size=2)


def _deberta(dtype=torch.float64, **kw):
    """float64: every weight random (N(0, 0.5²)); float32: transformers' own initialisation (as the other families'
    float32 cases). With N(0, 0.5²) weights both sides' float32 gradients are ~5e-6 (norm-relative) from the
    float64 truth and up to ~2e-5 from each other, past the float32 default — round-off of scores of size ~10,
    reported to the precision work, not hidden by a looser tolerance here."""
    torch.manual_seed(0)
    cfg = transformers.DebertaV2Config(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=24, max_position_embeddings=40, pad_token_id=0, **kw)
    model = transformers.DebertaV2Model(cfg).to(dtype).eval()
    if dtype == torch.float64:
        randomise_(model, 3)
    return model


def _ids():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 50, size=(3, 14))
    am = np.ones((3, 14), dtype=np.int64)
    am[1, 10:] = 0
    am[2, 12:] = 0
    ids[am == 0] = 0                                   # the padding token under the mask
    return ids, am


# float32 v2 (own position projections, unnormalised relative table): the gradient of pos_key_proj.bias is zero in
# exact arithmetic (q_i·b_PK is constant along a softmax row); measured against its own sibling weight's gradient it
# failed at 1.9 times the tolerance with neither side wrong. Issue 45 item 3's rule measures it at its layer's scale.
@pytest.mark.parametrize("kw, dtype", [(V3, torch.float64), (V2, torch.float64),
                                       (V3, torch.float32), (V2, torch.float32)],
                         ids=["v3-float64", "v2-float64", "v3-float32", "v2-float32"])
def test_honest_deberta_passes_and_every_sublayer_agrees(kw, dtype):
    ids, am = _ids()
    report = compare_with_torch(_deberta(dtype, **kw), ids, attention_mask=am)
    report.check()
    grads = [e for e in report.entries if e.kind == "grad"]
    assert len(grads) == len(list(_deberta(dtype, **kw).parameters()))      # every parameter's gradient compared
    rows = report.sublayers
    assert {r.prefix for r in rows} >= {"layers.0.attn", "layers.1.attn", "layers.1.ffn", "layers.1.ln2"}
    assert all(r.ok for r in rows), [r.line() for r in rows if not r.ok]    # DeBERTa's attention, not BERT's
    if kw is V2 and dtype == torch.float32:    # the zero-in-exact bias is the one measured at its layer's scale
        assert any(e.source and "pos_key_proj.bias" in e.name for e in grads), [e.name for e in grads if e.source]


@pytest.fixture
def planted(monkeypatch):
    """A bug in the position terms of one layer: its c2p + p2c scores scaled by 1 + 1e-6 (HF's own function)."""
    honest = MD.DisentangledSelfAttention.disentangled_attention_bias

    def buggy(self, *args):
        score = honest(self, *args)
        return score * (1 + 1e-6) if getattr(self, "planted", False) else score

    monkeypatch.setattr(MD.DisentangledSelfAttention, "disentangled_attention_bias", buggy)


@pytest.mark.parametrize("kw", [V3, V2], ids=["v3", "v2"])
def test_a_bug_in_layer_1s_position_terms_is_named(planted, kw):
    model = _deberta(**kw)
    model.encoder.layer[1].attention.self.planted = True
    ids, am = _ids()
    report = compare_with_torch(model, ids, attention_mask=am)
    assert not report.ok
    with pytest.raises(AssertionError) as info:
        report.check()
    first = str(info.value).splitlines()[0]
    assert first.startswith("first sublayer that differs: layer 1, attention (encoder.layer.1.attention.self"), first
    model.encoder.layer[1].attention.self.planted = False
    compare_with_torch(model, ids, attention_mask=am).check()          # the same model, honest: passes


def test_your_config_is_compared_with_the_modules():
    model = _deberta(**V3)
    config, params = from_hf(model)
    theirs = from_hf(_deberta(**dict(V3, max_relative_positions=30)))[0]   # same shapes, other log buckets
    ids, am = _ids()
    report = compare_with_torch(model, ids, attention_mask=am, params=(theirs, params))
    bad = [e.name for e in report.entries if e.kind == "config" and e.max_abs]
    assert bad == ["deberta buckets"] and not report.ok
    other = from_hf(_deberta(**dict(V3, share_att_key=False)))[0]      # other shapes: nothing to compare but the config
    report = compare_with_torch(model, ids, attention_mask=am, params=(other, params))
    assert [e.name for e in report.entries if e.max_abs] == ["deberta layout"]
    assert "no tensor compared" in report.notes[-1]
    compare_with_torch(model, ids, attention_mask=am, params=(config, params)).check()
