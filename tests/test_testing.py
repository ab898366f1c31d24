"""transformer_np.testing: a user's test of a torch / Hugging Face encoder is three lines, and a disagreement
is an AssertionError that names the tensor (under the framework's own name, with ours alongside), the index,
the error and the tolerance.

Planted disagreements: a weight perturbed in the torch module after conversion, a weight perturbed in ours, a
torch-side forward hook (the output disagrees first), a gradient hook (one parameter's gradient disagrees).
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="transformer_np.testing compares with PyTorch: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="pip install transformers")

from transformer_np.errors import InputTypeError, InputValueError  # noqa: E402
from transformer_np.io.interop import from_hf, from_torch  # noqa: E402
from transformer_np.testing import TOLERANCES, assert_matches_torch, compare_with_torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.hf]
ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64


def x_input(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


def ids_input(vocab=50, shape=(2, 6), seed=0):
    return np.random.default_rng(seed).integers(2, vocab, size=shape)


SMALL = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
             max_position_embeddings=32)


# ----------------------------------------------------------------------------- three lines each
def test_bare_layer_in_three_lines():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 64, dropout=0.0, batch_first=True, dtype=F64)
    x = np.random.default_rng(0).normal(size=(2, 5, 16))
    assert_matches_torch(layer, x)


@pytest.mark.parametrize("final_norm", [True, False])
@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_in_three_lines(final_norm, norm_first):
    enc = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(16, 4, 64, dropout=0.0, norm_first=norm_first, dtype=F64), num_layers=3,
        norm=torch.nn.LayerNorm(16, dtype=F64) if final_norm else None, enable_nested_tensor=False)
    report = assert_matches_torch(enc, x_input((5, 2, 16)), attention_mask=np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))
    assert ("norm.weight" in {e.name for e in report.grads}) == final_norm


@pytest.mark.parametrize("make", [
    lambda: transformers.BertModel(transformers.BertConfig(**SMALL)),
    lambda: transformers.DistilBertModel(transformers.DistilBertConfig(vocab_size=50, dim=16, n_layers=2, n_heads=4,
                                                                       hidden_dim=32, max_position_embeddings=32)),
    lambda: transformers.RobertaModel(transformers.RobertaConfig(**SMALL)),
    lambda: transformers.AlbertModel(transformers.AlbertConfig(**SMALL, embedding_size=8)),
    lambda: transformers.ElectraModel(transformers.ElectraConfig(**SMALL, embedding_size=8)),
], ids=["BertModel", "DistilBertModel", "RobertaModel", "AlbertModel", "ElectraModel"])
def test_hf_models_in_three_lines(make):
    model = make().double().eval()        # transformers builds a model in training mode
    ids = np.random.default_rng(0).integers(2, 50, size=(2, 6))
    assert_matches_torch(model, ids, attention_mask=np.array([[1] * 6, [1, 1, 1, 1, 0, 0]]))


def test_hf_layer_in_three_lines():
    layer = transformers.BertModel(transformers.BertConfig(**SMALL)).double().eval().encoder.layer[1]
    x = np.random.default_rng(0).normal(size=(2, 6, 16))
    assert_matches_torch(layer, x)


def test_float32_with_the_default_tolerances():
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    report = assert_matches_torch(layer, x_input((4, 9, 32)).astype(np.float32))
    assert report.dtype == np.float32 and (report.rtol, report.atol) == TOLERANCES[np.dtype(np.float32)]
    assert 0 < report.max_norm_rel("output") < 1e-5            # float32 round-off, not float64 agreement
    assert report.failures(rtol=1e-10, atol=1e-12)             # …which float64 tolerances reject
    report64 = assert_matches_torch(layer, x_input((4, 9, 32)), dtype=torch.float64)   # a float64 copy runs
    assert report64.max_norm_rel("output") < 1e-13


# ----------------------------------------------------------------------------- planted disagreements
def _message(fn) -> str:
    with pytest.raises(AssertionError) as info:
        fn()
    return str(info.value)


def test_torch_weight_perturbed_after_conversion_is_named():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 64, dropout=0.0, batch_first=True, dtype=F64)
    config, params = from_torch(layer)
    with torch.no_grad():
        layer.linear2.weight[3, 17] += 1e-7
    msg = _message(lambda: assert_matches_torch(layer, x_input((2, 5, 16)), params=params))
    assert "weight 'linear2.weight' (ours: layers.0.ffn.W_2[17, 3])" in msg.splitlines()[0], msg
    assert "at index (3, 17)" in msg and "|ours - torch| = 1e-07" in msg
    assert re.search(r"rtol = 1e-10, atol = 1e-12, S = [\d.]+", msg), msg


def test_in_proj_perturbation_names_our_split_tensor():
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 4, 64, dropout=0.0, dtype=F64), 2,
                                      enable_nested_tensor=False)
    config, params = from_torch(enc)
    with torch.no_grad():
        enc.layers[1].self_attn.in_proj_weight[16 + 5, 2] -= 1e-6             # a row of W_Kᵀ
    msg = _message(lambda: assert_matches_torch(enc, x_input((5, 2, 16)), params=params))
    assert "weight 'layers.1.self_attn.in_proj_weight' (ours: layers.1.attn.W_K[2, 5])" in msg, msg
    assert "at index (21, 2)" in msg


def test_our_weight_perturbed_is_named_under_the_framework_name():
    model = transformers.AlbertModel(transformers.AlbertConfig(**SMALL, embedding_size=8)).double().eval()
    config, params = from_hf(model)
    params = dict(params)
    params["embeddings.project.W"] = params["embeddings.project.W"].copy()
    params["embeddings.project.W"][5, 11] *= 1.001
    msg = _message(lambda: assert_matches_torch(model, ids_input(), params=params))
    first = msg.splitlines()[0]
    assert "weight 'encoder.embedding_hidden_mapping_in.weight' (ours: embeddings.project.W[5, 11])" in first, msg
    assert "at index (11, 5)" in msg and "tensors disagree" in msg


def test_a_forward_difference_names_the_output_first():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 64, dropout=0.0, batch_first=True, dtype=F64)
    layer.linear2.register_forward_hook(lambda mod, inp, out: out * 1.0000001)   # a framework "bug"
    msg = _message(lambda: assert_matches_torch(layer, x_input((2, 5, 16))))
    first, second = msg.splitlines()[:2]                  # issue 45: the first line names the sublayer (layer 0's FFN)
    assert first.startswith("first sublayer that differs: layer 0, FFN (linear1 → linear2"), msg
    assert second.startswith("transformer_np and torch disagree on the output [TransformerEncoderLayer, float64]:"), msg


def test_a_behaviour_bug_in_bert_is_named_by_layer_and_sublayer():
    # issue 45 item 2: layer 1's FFN output scaled by 1 + 1e-3 in a BertModel; each reference sublayer runs on
    # transformers' own input to it, so the error does not spread to the sublayers after it
    model = transformers.BertModel(transformers.BertConfig(**SMALL)).double().eval()
    model.encoder.layer[1].output.dense.register_forward_hook(lambda mod, inp, out: out * (1 + 1e-3))
    report = compare_with_torch(model, ids_input())
    msg = _message(report.check)
    assert msg.splitlines()[0].startswith("first sublayer that differs: layer 1, FFN "
                                          "(encoder.layer.1.intermediate.dense → encoder.layer.1.output.dense"), msg
    bad = [(r.layer, r.sublayer, r.what) for r in report.sublayers if not r.ok]
    assert bad == [(1, "FFN", "output")], bad                 # the bug alone: nothing before or after it is blamed
    assert {(r.layer, r.sublayer) for r in report.sublayers} == {(i, s) for i in range(2)
                                                                 for s in ("attention", "FFN", "norm")}


def test_a_gradient_difference_names_that_gradient():
    model = transformers.BertModel(transformers.BertConfig(**SMALL)).double().eval()
    name = "encoder.layer.1.intermediate.dense.bias"
    # a backward-only "bug": adds exactly 0 to the output, and 1e-8·(Σ upstream) to this bias's gradient alone
    model.encoder.layer[1].intermediate.dense.register_forward_hook(
        lambda mod, inp, out: out + (mod.bias - mod.bias.detach()) * 1e-8)
    msg = _message(lambda: assert_matches_torch(model, ids_input()))
    assert msg.startswith(f"transformer_np and transformers disagree on the gradient of '{name}' "
                          f"(ours: layers.1.ffn.b_1["), msg
    assert "1 of" not in msg                                    # only that tensor


def test_report_lists_every_tensor_and_can_be_rechecked():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 64, dropout=0.0, batch_first=True, dtype=F64)
    report = compare_with_torch(layer, x_input((2, 5, 16)), attention_mask=np.array([[1] * 5, [1, 1, 0, 0, 0]]))
    names = [e.name for e in report.entries]
    n_params = len(list(layer.parameters()))
    assert names[:n_params] == [n for n, _ in layer.named_parameters()]                 # weights first
    assert names[n_params:n_params + 2] == ["output", "input"]
    assert names[n_params + 2:] == [n for n, _ in layer.named_parameters()]             # then every gradient
    e = report["self_attn.out_proj.weight"]
    assert e.kind == "grad" and e.max_abs < 1e-13 and e.norm_rel < 1e-13 and len(e.where) == 2
    assert "gradient of 'linear1.weight'" in str(report) and report.ok
    assert report.failures(rtol=0, atol=0)                      # exact equality is not what float64 gives
    with pytest.raises(AssertionError, match="rtol = 0, atol = 0"):
        report.check(rtol=0, atol=0)


def test_the_key_bias_gradient_is_round_off_and_passes_against_its_weight():
    """∂L/∂b_K = 0 in exact arithmetic; both sides return round-off, which the module-scaled atol accepts."""
    model = transformers.BertModel(transformers.BertConfig(**SMALL)).double().eval()
    report = assert_matches_torch(model, ids_input())
    kb, kw = report["encoder.layer.0.attention.self.key.bias"], report["encoder.layer.0.attention.self.key.weight"]
    assert np.abs(kb.ref).max() < 1e-12 * np.abs(kw.ref).max()
    assert kb.scale == np.abs(kw.ref).max()                     # S of the bias is its weight's


@pytest.mark.parametrize("dtype", [np.float64, None], ids=["converted copy", "same dtype: storage shared"])
def test_the_module_is_not_modified(dtype):
    # float32 compared in float32: the copy's parameters are new leaves on the module's own storage (no data copied);
    # compared in float64, the copy converts. Either way the module's flags, gradients and values stay as they were.
    layer = torch.nn.TransformerEncoderLayer(16, 4, 64, dropout=0.1, batch_first=True)
    layer.linear1.bias.requires_grad_(False)                                  # a frozen parameter stays frozen
    before = copy.deepcopy(layer.state_dict())
    layer.train()
    report = compare_with_torch(layer, x_input((2, 5, 16)), dtype=dtype, dropout_off=True)
    assert report.ok and report["linear1.bias"].kind == "grad"                # its gradient was compared
    assert layer.training and all(p.grad is None for p in layer.parameters())
    assert [p.requires_grad for p in layer.parameters()] == [n != "linear1.bias" for n, _ in layer.named_parameters()]
    assert all(torch.equal(before[k], v) and v.dtype == torch.float32 for k, v in layer.state_dict().items())


def test_numpy_s_huge_page_advice_is_off_during_a_comparison_and_restored_after(monkeypatch):
    """A speed setting (docs/bench_notes.md, "Comparisons"): off for the call's own allocations, then put back as it
    was, also when the call raises."""
    from transformer_np.testing import sides

    assert sides._madvise_setter() is not None             # NumPy still has the switch: the setting is not dead
    state, calls = {"on": True}, []

    def setter(on):
        calls.append(on)
        previous, state["on"] = state["on"], on
        return previous

    monkeypatch.setattr(sides, "_madvise_setter", lambda: setter)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 64, dropout=0.0, batch_first=True, dtype=F64)
    assert compare_with_torch(layer, x_input((2, 5, 16))).ok
    assert calls == [False, True] and state["on"]
    with pytest.raises(TypeError, match="seed must be an int >= 0"):
        compare_with_torch(layer, x_input((2, 5, 16)), seed=-1)
    assert calls == [False, True, False, True] and state["on"]
    with sides.small_pages():                              # overlapping calls (threads): the last one restores
        with sides.small_pages():
            assert not state["on"]
        assert not state["on"]
    assert state["on"] and calls[4:] == [False, True]


# ----------------------------------------------------------------------------- bad input
def test_bad_arguments_are_named():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 64, dropout=0.0, batch_first=True, dtype=F64)
    with pytest.raises(InputTypeError, match="module must be"):
        compare_with_torch(torch.nn.Linear(3, 3), x_input((2, 5, 3)))
    with pytest.raises(InputValueError, match="attention_mask row 1 has no real token"):
        compare_with_torch(layer, x_input((2, 5, 16)), attention_mask=np.array([[1] * 5, [0] * 5]))
    with pytest.raises(InputValueError, match="attention_mask must have shape"):
        compare_with_torch(layer, x_input((2, 5, 16)), attention_mask=np.ones((5, 2)))
    with pytest.raises(InputValueError, match="grad_output must have the output's shape"):
        compare_with_torch(layer, x_input((2, 5, 16)), grad_output=np.ones((2, 5, 15)))
    with pytest.raises(InputTypeError, match="dtype must be float32, float64, float16 or bfloat16, got int32"):
        compare_with_torch(layer, x_input((2, 5, 16)), dtype=np.int32)
    with pytest.raises(InputValueError, match="rtol must be a finite number"):
        compare_with_torch(layer, x_input((2, 5, 16)), rtol=float("nan"))
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(**SMALL)).eval()
    with pytest.raises(InputValueError, match="module.bert"):
        compare_with_torch(bert, ids_input())
    with pytest.raises(InputTypeError, match="input_ids"):
        compare_with_torch(bert.bert, x_input((2, 6, 16)))


# ----------------------------------------------------------------------------- the docs page's test file runs
def test_the_docs_example_file_passes(tmp_path):
    text = (ROOT / "docs" / "guide" / "testing.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(# test_against_pytorch\.py\n.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "docs/guide/testing.md must hold exactly one block starting '# test_against_pytorch.py'"
    path = tmp_path / "test_against_pytorch.py"
    path.write_text(blocks[0], encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    run = subprocess.run([sys.executable, "-m", "pytest", str(path), "-q", "-p", "no:cacheprovider",
                          "-W", "ignore::pytest.PytestUnknownMarkWarning"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"\b(\d+) passed", run.stdout) and int(re.search(r"(\d+) passed", run.stdout).group(1)) >= 5


# ----------------------------------------------------------------------------- the message, under pytest
def test_the_message_names_one_element_the_one_furthest_outside_the_tolerance():
    """Three planted errors, each the worst by another measure: C has the largest |ours − ref| but is within its
    tolerance, A the largest ratio to its tolerance, B the largest excess |ours − ref| − (atol·S + rtol·|ref|).
    The message names B alone, with B's values, error and tolerance."""
    from transformer_np.testing.criterion import ComparisonReport, _compare, _set_scales

    ref = np.array([[0.0, 1.0, 1e4, 2.0]])
    ours = ref + np.array([[1e-3, 1.0, 9.0, 0.0]])               # A = (0, 0), B = (0, 1), C = (0, 2)
    entry = _compare("linear1.weight", "weight", ours, ref, "layers.0.ffn.W_1", transposed=True)
    _set_scales([entry])
    rtol, atol = 0.5, 1e-16                                     # allowed: A ≈ 1e-12, B = 0.5, C = 5000
    assert entry.where == (0, 2) and entry.violation(rtol, atol)[1] == (0, 0)   # C: max abs; A: max ratio
    assert entry.worst_element(rtol, atol) == ((0, 1), pytest.approx(0.5))      # B: max excess
    report = ComparisonReport("Toy", "torch", np.dtype(np.float64), rtol, atol, [entry])
    msg = _message(report.check)
    assert "(ours: layers.0.ffn.W_1[1, 0])" in msg.splitlines()[0], msg          # B, in our (transposed) layout
    assert "at index (0, 1) " in msg and "ours = 2, torch = 1, |ours - torch| = 1 > " in msg, msg
    allowed = atol * entry.scale + rtol * 1.0
    assert f"= {allowed:.3g} (rtol = 0.5, atol = 1e-16, S = 1e+04)" in msg, msg
    assert re.findall(r"\(\d+, \d+\)", msg) == ["(0, 1)"], msg   # one index: no second one for the max abs error
    assert report.failures()[0][2] == (0, 1)


FAILING_TEST = '''
import numpy as np
import torch

from transformer_np.io.interop import from_torch
from transformer_np.testing import assert_matches_torch


def test_planted_difference():
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, dtype=torch.float64)
    config, params = from_torch(layer)
    with torch.no_grad():
        layer.linear2.weight[3, 5] += 1e-6
    assert_matches_torch(layer, np.random.default_rng(0).normal(size=(2, 3, 8)), params=params)
'''


def test_pytest_shows_the_message_without_the_librarys_source(tmp_path):
    """A real pytest run of a failing comparison: the traceback ends at the user's line; none of the library's
    frames (their source lines, their file names) is printed above the message."""
    path = tmp_path / "test_planted.py"
    path.write_text(FAILING_TEST, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    run = subprocess.run([sys.executable, "-m", "pytest", str(path), "-p", "no:cacheprovider", "-p", "no:randomly",
                          "-W", "ignore::pytest.PytestUnknownMarkWarning"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = run.stdout
    assert run.returncode == 1 and "1 failed" in out, out[-3000:] + run.stderr[-2000:]
    assert "E       AssertionError: transformer_np and torch disagree on the weight 'linear2.weight' " \
           "(ours: layers.0.ffn.W_2[5, 3])" in out, out
    assert "E         at index (3, 5) (the element furthest outside the tolerance)" in out, out
    assert ">       assert_matches_torch(layer" in out, out                  # the user's line is the last frame
    for library_frame in ("testing/criterion.py", "transformer_np/testing/", "__tracebackhide__",
                          "raise AssertionError", "def check(", "report.check()", "lines = ["):
        assert library_frame not in out, (library_frame, out)
    failure = out[out.index("test_planted_difference ___"):out.index("short test summary")]
    assert len(failure.splitlines()) < 25, failure                       # the test's source and the message only
