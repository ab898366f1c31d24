"""transformer_np.testing's defaults come from measurement (scripts/compare_tolerances.py, docs/guide/testing.md):
honest round-off passes them in float32 and float64 across every supported module and family, and planted bugs of
the size that matters fail them in float32 — an FFN output scaled by 1 + 1e-4 or 1 + 1e-5, tanh-GELU computed for
an exact GELU, LayerNorm eps 1e-12 for 1e-5 — on a BERT-base-sized layer (hidden 768, seq 128, batch 2).

The bugs are planted on the torch side with forward hooks: the module computes the bug while everything it
declares (its weights, its activation, its eps) is what transformer_np converts."""

from __future__ import annotations

import copy
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="transformer_np.testing compares with PyTorch: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="pip install transformers")
F = torch.nn.functional

from transformer_np.testing import NORM_TOLERANCES, TOLERANCES, compare_with_torch, default_tolerances  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.hf]


def randomise(model, seed: int) -> None:
    """Every weight random at unit gain: matrices N(0, 1/fan-in), biases 0.3·N(0, 1), LayerNorm γ = 1 + 0.3·N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if p.ndim == 2:
                p.copy_(z / p.shape[1] ** 0.5)
            elif "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1 + 0.3 * z)
            else:
                p.copy_(0.3 * z)


def padded(B=3, n=9, vocab=40, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, vocab, size=(B, n))
    am = np.ones((B, n), dtype=np.int64)
    am[-1, n - n // 3:] = 0
    ids[am == 0] = 1
    return ids, am


COMMON = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
              max_position_embeddings=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=1)
FAMILIES = {
    "bert": lambda: transformers.BertConfig(**COMMON), "ernie": lambda: transformers.ErnieConfig(**COMMON),
    "roberta": lambda: transformers.RobertaConfig(**COMMON),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(**COMMON),
    "camembert": lambda: transformers.CamembertConfig(**COMMON),
    "data2vec-text": lambda: transformers.Data2VecTextConfig(**COMMON),
    "distilbert": lambda: transformers.DistilBertConfig(vocab_size=40, dim=16, n_layers=2, n_heads=2, hidden_dim=32,
                                                        max_position_embeddings=24, dropout=0.0, attention_dropout=0.0,
                                                        pad_token_id=1),
    "albert": lambda: transformers.AlbertConfig(**COMMON, embedding_size=8),
    "electra": lambda: transformers.ElectraConfig(**COMMON, embedding_size=8)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("init", ["HF init", "random"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_honest_round_off_passes_every_family(family, init, dtype):
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(FAMILIES[family]())
    if init == "random":
        randomise(model, 1)
    ids, am = padded()
    report = compare_with_torch(model, ids, attention_mask=am, dtype=dtype)
    assert report.ok, str(report)
    assert 0 < report.max_norm_rel() <= NORM_TOLERANCES[np.dtype(dtype)]       # round-off, not equality


def torch_modules():
    for norm_first in (False, True):
        for act in ("relu", "gelu"):
            for batch_first in (True, False):
                yield (f"layer-{'pre' if norm_first else 'post'}-{act}-{'bf' if batch_first else 'sf'}",
                       lambda nf=norm_first, a=act, bf=batch_first: torch.nn.TransformerEncoderLayer(
                           32, 4, 64, dropout=0.0, activation=a, norm_first=nf, batch_first=bf), batch_first)
    for norm_first in (False, True):
        for final in (True, False):
            yield (f"encoder-{'pre' if norm_first else 'post'}-{'norm' if final else 'nonorm'}",
                   lambda nf=norm_first, fn=final: torch.nn.TransformerEncoder(
                       torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, norm_first=nf, batch_first=True), 3,
                       norm=torch.nn.LayerNorm(32) if fn else None, enable_nested_tensor=False), True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("label, make, batch_first", list(torch_modules()), ids=[m[0] for m in torch_modules()])
def test_honest_round_off_passes_every_torch_variant(label, make, batch_first, dtype):
    torch.manual_seed(0)
    module = make()
    randomise(module, 2)
    x = np.random.default_rng(0).standard_normal((3, 9, 32) if batch_first else (9, 3, 32))
    am = np.ones((3, 9), dtype=np.int64)
    am[-1, 6:] = 0
    report = compare_with_torch(module, x, attention_mask=am, dtype=dtype)
    assert report.ok, str(report)


# ----------------------------------------------------------------------------- planted bugs, BERT-base sized
def plant(layer, bug: str):
    m = copy.deepcopy(layer)
    if bug.startswith("ffn x"):
        factor = 1 + float(bug.split()[-1])
        m.linear2.register_forward_hook(lambda mod, inp, out: out * factor)
    elif bug == "tanh-GELU":                   # the activation's input, remembered; linear2 reads tanh-GELU of it
        seen = {}
        m.linear1.register_forward_hook(lambda mod, inp, out: seen.__setitem__("h", out))
        m.linear2.register_forward_pre_hook(lambda mod, inp: (F.gelu(seen["h"], approximate="tanh"),))
    elif bug == "eps 1e-12":                   # both LayerNorms with eps 1e-12; the module declares 1e-5
        for norm in (m.norm1, m.norm2):
            norm.register_forward_hook(
                lambda mod, inp, out: F.layer_norm(inp[0], mod.normalized_shape, mod.weight, mod.bias, 1e-12))
    return m


@pytest.fixture(scope="module")
def bert_base_layer():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True)
    x = np.random.default_rng(0).standard_normal((2, 128, 768)).astype(np.float32)
    return layer, x


@pytest.mark.slow
def test_planted_bugs_fail_at_the_float32_defaults(bert_base_layer):
    layer, x = bert_base_layer
    honest = compare_with_torch(layer, x)
    assert honest.dtype == np.float32 and (honest.rtol, honest.atol) == TOLERANCES[np.dtype(np.float32)]
    assert honest.ok, str(honest)
    caught = {}
    for bug in ("ffn x 1e-4", "ffn x 1e-5", "tanh-GELU", "eps 1e-12"):
        report = compare_with_torch(plant(layer, bug), x)
        caught[bug] = [(e.name, f"{ratio:.3g}") for e, ratio, _ in report.failures()]
        with pytest.raises(AssertionError, match="disagree on the"):
            report.check()
    # the honest run's worst norm-wise error is well inside the tolerance the 1e-5 bug exceeds
    worst_honest = max(e.norm_ratio(honest.norm_rtol) for e in honest.entries)
    assert worst_honest < 0.5, worst_honest
    assert all(caught.values()), caught


def test_a_systematic_error_is_named_by_the_norm_wise_criterion():
    """1 + 1e-5 on every FFN output: within the element-wise tolerance everywhere, caught by the norm."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, activation="gelu", batch_first=True)
    x = np.random.default_rng(0).standard_normal((2, 64, 256)).astype(np.float32)
    report = compare_with_torch(plant(layer, "ffn x 1e-5"), x)
    bad = report.failures()
    assert bad, str(report)
    e, ratio, idx = bad[0]
    assert e.elementwise_passes(report.rtol, report.atol) and e.norm_ratio(report.norm_rtol) > 1
    with pytest.raises(AssertionError, match=r"norm-wise: \|\|ours - torch\|\| = .* a systematic error"):
        report.check()


def test_the_defaults_grow_with_the_square_root_of_the_depth():
    """Per-layer defaults times √L: measured, a 12-layer BERT-base's float32 gradients err 6.2 times one layer's."""
    f32 = np.dtype(np.float32)
    rtol, atol = TOLERANCES[f32]
    assert default_tolerances(np.float32) == (rtol, atol, NORM_TOLERANCES[f32])
    assert default_tolerances(torch.float32, 12) == pytest.approx((rtol * 12 ** 0.5, atol * 12 ** 0.5,
                                                                   NORM_TOLERANCES[f32] * 12 ** 0.5))
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True), 3,
                                      enable_nested_tensor=False)
    report = compare_with_torch(enc, np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32))
    assert (report.rtol, report.atol, report.norm_rtol) == default_tolerances(np.float32, 3)
    assert any("√3" in n for n in report.notes), report.notes


# ----------------------------------------------------------------------------- reports that read true
def test_an_exactly_zero_reference_is_read_by_its_absolute_error():
    from transformer_np.testing.criterion import ComparisonReport, _compare, _set_scales

    w = _compare("key.weight", "grad", np.array([[1.0, -2.0]]), np.array([[1.0, -2.0 + 1e-16]]))
    b = _compare("key.bias", "grad", np.array([1e-17, 0.0]), np.array([0.0, 0.0]))      # exactly 0 in torch
    _set_scales([w, b])
    report = ComparisonReport("Toy", "torch", np.dtype(np.float64), 1e-10, 1e-12, [w, b])
    assert b.ref_is_zero and b.max_rel is None and b.max_abs == 1e-17                  # no inf anywhere
    assert b.norm_rel == pytest.approx(1e-17 / (np.sqrt(2) * np.sqrt(5 / 4)))          # against its module
    assert report.ok and "ref = 0" in str(report) and "inf" not in str(report)


def test_a_passing_bert_reads_as_passing():
    """The key-bias gradient is round-off on both sides: its max rel is not reported (below (atol/rtol)·S) and its
    norm_rel is measured against the key weight's gradient, so the summary obeys the criterion it summarises."""
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**COMMON)).eval()
    ids, am = padded()
    for dtype in (np.float32, np.float64):
        report = compare_with_torch(model, ids, attention_mask=am, dtype=dtype)
        assert report.ok
        assert report.max_norm_rel("grad") <= report.norm_rtol, report.max_norm_rel("grad")
        kb = report["encoder.layer.0.attention.self.key.bias"]
        assert kb.max_rel is None and kb.norm_rel <= report.norm_rtol
        assert all(e.max_rel is None or e.max_rel < 1e-3 for e in report.entries), str(report)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_statistics_of_a_transposed_weight_are_the_same_on_every_path(dtype, monkeypatch):
    """max |ref|, Σ ref², max |ours − ref| and Σ (ours − ref)² for an nn.Linear gradient (ours a transposed view),
    by blocks of columns: torch's transpose when torch is loaded, NumPy's otherwise. A transpose moves values
    without rounding and both paths then reduce the same blocks in the same order, so they agree bit for bit (exact
    equality); the maxima equal NumPy's whole-array ones exactly (a max does not round), the sums agree to the
    dtype's round-off of a sum of 210 000 squares."""
    from transformer_np.testing import criterion

    rng = np.random.default_rng(0)
    ours = rng.standard_normal((300, 700)).astype(dtype).T                  # (700, 300), a transposed view
    ref = (ours + dtype(1e-3) * rng.standard_normal(ours.shape)).astype(dtype)   # C-contiguous
    monkeypatch.setattr(criterion, "_BLOCK", 8192)        # 28 blocks of 11 columns, the last of 3 (below torch's
    copies = []                                           # fast path's 3600 elements: NumPy's copy, even with torch)
    real_copy = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda t, src: copies.append(src.shape) or real_copy(t, src))
    with_torch = criterion._stats(ours, ref)
    assert len(copies) == 27 and copies[0] == (700, 11)                     # the torch path was taken
    monkeypatch.delitem(sys.modules, "torch")                                # the NumPy-only path
    numpy_only = criterion._stats(ours, ref)
    assert with_torch == numpy_only
    d = np.subtract(ours, ref)
    assert with_torch[0] == float(np.max(np.abs(ref))) and with_torch[2] == float(np.max(np.abs(d)))
    sums = [float(np.sum(a.astype(np.float64) ** 2)) for a in (ref, d)]
    np.testing.assert_allclose([with_torch[1], with_torch[3]], sums, rtol=100 * np.finfo(dtype).eps)


def test_the_statistics_propagate_a_nan_and_an_inf():
    """A NaN anywhere (in a later block too) makes both maxima NaN, as np.max does; an inf in ours makes the
    difference's max inf."""
    from transformer_np.testing.criterion import _stats

    ref = np.random.default_rng(1).standard_normal(200_000)
    ours = ref.copy()
    ours[150_000] = np.inf
    assert _stats(ours, ref)[2] == math.inf
    ref[190_000] = np.nan
    assert all(math.isnan(v) for v in _stats(ours, ref))
