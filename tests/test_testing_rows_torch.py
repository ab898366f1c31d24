"""No false failures on real batches (issue 45 item 3), against torch and transformers:

* ModernBERT with ModernBERT-base's window (local_attention = 128) and 100 pads at the tail of a 228-token sequence
  (a small random config otherwise; nothing downloaded), sdpa and eager, float32 and float64: the 36 padded query rows
  whose window holds only padding are left out and named in the notes; every other row and every gradient agree —
  transformers' eager float64 returns NaN in those rows, which reaches every gradient and, through a later layer,
  the real tokens: the report says so. A bug planted on a real token next to them is still caught.
* a causal mask over left padding (nn.TransformerEncoderLayer / Encoder): the padded head is left out, not refused.
* BertLayer and BertModel with n = 1 and with one real token per sequence: the query and key gradients are zero in
  exact arithmetic (softmax over one key), measured at their layer's gradient scale; a wrong nonzero query gradient
  beyond it still fails.

The NumPy-only parts of these rules are in tests/test_testing_rows.py."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="transformer_np.testing compares with PyTorch: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="pip install transformers")

from transformer_np.testing import compare_with_torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.hf]
DTYPES = {"float32": torch.float32, "float64": torch.float64}
LEFT_OUT = "sequence 1: positions 192–227 (36 rows)"


# ----------------------------------------------------------------------------- ModernBERT's window
def _modernbert(impl: str, dtype):
    torch.manual_seed(0)
    cfg = transformers.ModernBertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                        intermediate_size=64, max_position_embeddings=256, local_attention=128,
                                        global_attn_every_n_layers=3, pad_token_id=1, bos_token_id=2,
                                        eos_token_id=2, cls_token_id=2, sep_token_id=2, attn_implementation=impl)
    return transformers.ModernBertModel(cfg).eval().to(dtype)        # layers: full, sliding, sliding


def _padded_ids():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 99, (2, 228), generator=g)
    mask = torch.ones(2, 228, dtype=torch.long)
    mask[1, 128:] = 0                                                # 100 pads at the tail of sequence 1
    ids[1, 128:] = 1                                                 # the padding token
    return ids, mask


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_modernbert_bases_window_with_100_pads_passes_with_the_rows_left_out_named(impl, dtype):
    ids, mask = _padded_ids()
    report = compare_with_torch(_modernbert(impl, DTYPES[dtype]), ids, attention_mask=mask)
    assert report.ok, report
    left = [n for n in report.notes if n.startswith("left out of the comparison")]
    assert len(left) == 1 and LEFT_OUT in left[0] and "local_attention = 128" in left[0], report.notes
    assert not report["output"].ref[1, 192:].any()                   # exact: left-out rows read 0 on both sides
    rerun = [n for n in report.notes if n.startswith("the framework's own run was not finite")]
    if impl == "eager" and dtype == "float64":                       # its float32 softmax of a float64 −inf row
        assert len(rerun) == 1, rerun                                # layer 2's Q Kᵀ reads layer 1's NaN rows:
        assert "the output (on other rows too), 20 of 20 parameter gradients" in rerun[0], rerun   # real tokens too
    else:
        assert not rerun, rerun


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_a_bug_on_the_last_real_token_next_to_the_left_out_rows_is_still_caught(impl):
    model = _modernbert(impl, torch.float64)

    def bug(_m, _args, out):                                         # layer 2's FFN, at the last real token only
        out = out.clone()
        out[1, 127] = out[1, 127] * (1 + 1e-3)
        return out

    model.layers[2].mlp.register_forward_hook(bug)
    ids, mask = _padded_ids()
    report = compare_with_torch(model, ids, attention_mask=mask)
    assert not report.ok, report
    assert report["output"].where[:2] == (1, 127), report            # the output's largest error is at the bug


# ----------------------------------------------------------------------------- causal over left padding
@pytest.mark.parametrize("stack", [False, True])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_causal_mask_over_left_padding_leaves_the_padded_head_out(stack, dtype):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, dtype=DTYPES[dtype])
    module = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False) if stack else layer
    x = np.random.default_rng(0).normal(size=(2, 6, 16))
    pad = np.array([[False] * 6, [True, True] + [False] * 4])        # torch's convention: the first two are padding
    report = compare_with_torch(module.eval(), x, src_key_padding_mask=pad, is_causal=True)
    assert report.ok, report
    assert any("sequence 1: positions 0–1 (2 rows)" in n for n in report.notes), report.notes


# ----------------------------------------------------------------------------- zero in exact arithmetic
def _bert(impl: str, dtype):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64, attn_implementation=impl)
    return transformers.BertModel(cfg, add_pooling_layer=False).eval().to(dtype)


def _case(which: str, dtype):
    """(module, inputs, attention_mask) of a batch where every query has one key: n = 1, or one real token."""
    g = torch.Generator().manual_seed(0)
    model = _bert("sdpa", dtype)
    if which == "n = 1":
        am = None
        ids, x = torch.randint(3, 99, (3, 1), generator=g), torch.randn(3, 1, 32, dtype=dtype, generator=g)
    else:
        am = torch.zeros(3, 6, dtype=torch.long)
        am[:, 0] = 1
        ids = torch.randint(3, 99, (3, 6), generator=g)
        ids[:, 1:] = 0                                               # BERT's padding token under the mask
        x = torch.randn(3, 6, 32, dtype=dtype, generator=g)
    return model, ids, x, am


@pytest.mark.parametrize("module", ["BertLayer", "BertModel"])
@pytest.mark.parametrize("which", ["n = 1", "one real token"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_query_and_key_gradients_zero_in_exact_arithmetic_pass_at_their_layers_scale(module, which, dtype):
    model, ids, x, am = _case(which, DTYPES[dtype])
    mod, inputs = (model, ids) if module == "BertModel" else (model.encoder.layer[0], x)
    report = compare_with_torch(mod, inputs, attention_mask=am)
    assert report.ok, report
    zero = [e for e in report.grads if e.source is not None]
    assert {e.name.split("attention.self.")[-1] for e in zero} >= {"query.weight", "query.bias", "key.weight"}, \
        [e.name for e in zero]
    for e in zero:                                                   # measured at the layer's scale, not their own
        assert e.scale > e.ref_absmax / report.atol and e.norm_rel <= report.norm_rtol
    assert any(n.startswith("zero in exact arithmetic") for n in report.notes)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_wrong_nonzero_query_gradient_beyond_the_layers_scale_fails(dtype):
    """The forward is untouched (q − q.detach() is 0), the backward gives the query a gradient 1e-3 times the
    layer's output gradient: zero in exact arithmetic for the stock layer, so a bug the comparison must report."""
    model, _, x, _ = _case("n = 1", DTYPES[dtype])
    layer = model.encoder.layer[0]
    seen = {}
    layer.attention.self.query.register_forward_hook(lambda _m, _a, out: seen.__setitem__("q", out))

    def bug(_m, _args, out):
        q = seen["q"]
        return out + 1e-3 * (q - q.detach())

    layer.attention.output.dense.register_forward_hook(bug)
    report = compare_with_torch(layer, x)
    failing = {e.name: ratio for e, ratio, _ in report.failures()}
    for name in ("attention.self.query.weight", "attention.self.query.bias"):
        assert failing.get(name, 0) > 1, report                     # beyond atol times the layer's scale: fails
        assert report[name].max_abs > report.atol * report[name].scale
    assert "output" not in failing and "attention.self.key.weight" not in failing, report   # the forward agrees
    assert "input" in failing                                        # q depends on x: its gradient carries the bug


@pytest.mark.parametrize("which", ["n = 1", "one real token"])
def test_a_bug_in_the_ffn_is_still_caught_when_every_query_has_one_key(which):
    model, ids, _, am = _case(which, torch.float64)
    model.encoder.layer[1].output.dense.register_forward_hook(lambda _m, _a, out: out * (1 + 1e-6))
    report = compare_with_torch(model, ids, attention_mask=am)
    assert not report.ok and report.failures()[0][0].name == "output", report
