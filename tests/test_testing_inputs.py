"""transformer_np.testing changes nothing silently and answers bad input with a library error naming the argument.

Nothing silent: a module in training mode with dropout > 0 is refused unless ``dropout_off=True`` says so (then the
report notes it); every dtype conversion is listed in ``report.conversions``; ``params=(config, params)`` compares
every configuration value the output depends on (eps, activation, norm placement, ...), and an attention scale
other than 1/√d_k is refused.
Input errors: ids outside the vocabulary, sequences longer than the position table, unsupported modules (the
message lists the torch modules and the Hugging Face families), and what a gradient at padded positions does."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="transformer_np.testing compares with PyTorch: pip install torch==2.13.0")
transformers = pytest.importorskip("transformers", reason="pip install transformers")

from transformer_np.errors import InputTypeError, InputValueError  # noqa: E402
from transformer_np.io.interop import from_torch  # noqa: E402
from transformer_np.testing import assert_matches_torch, compare_with_torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.hf]
F64 = torch.float64
SMALL = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
             max_position_embeddings=12)


def x_input(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


# ----------------------------------------------------------------------------- training mode, dropout
def test_training_mode_with_dropout_is_refused_naming_where():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True, dtype=F64)   # train() mode
    with pytest.raises(InputValueError, match=r"training mode with dropout > 0 in .*dropout .*p = 0.1.*dropout_off"):
        compare_with_torch(layer, x_input((2, 5, 16)))
    bert = transformers.BertModel(transformers.BertConfig(**SMALL)).double()       # transformers: training mode
    with pytest.raises(InputValueError, match=r"embeddings.dropout \(p = 0.1\)"):
        compare_with_torch(bert, np.ones((2, 5), dtype=int))


def test_dropout_off_compares_and_says_so():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True, dtype=F64)
    report = assert_matches_torch(layer, x_input((2, 5, 16)), dropout_off=True)
    assert any("dropout_off=True" in n for n in report.notes), report.notes
    assert layer.training                                                       # the module itself is untouched
    with pytest.raises(InputTypeError, match="dropout_off must be a bool"):
        compare_with_torch(layer, x_input((2, 5, 16)), dropout_off="yes")


def test_training_mode_without_dropout_is_noted():
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True, dtype=F64)       # dropout 0, training mode
    report = assert_matches_torch(mha, x_input((2, 5, 16)))
    assert any("training mode with no dropout" in n for n in report.notes), report.notes


# ----------------------------------------------------------------------------- dtype conversions
def test_every_dtype_conversion_is_in_the_report():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()     # float32
    same = compare_with_torch(layer, x_input((2, 5, 16)).astype(np.float32))
    assert same.conversions == []                                               # nothing converted, nothing said
    report = compare_with_torch(layer, x_input((2, 5, 16)))                     # float64 input, float32 module
    assert report.conversions == ["inputs (float64) cast to float32"], report.conversions
    half = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, dtype=torch.float16).eval()
    report = compare_with_torch(half, x_input((2, 5, 16)).astype(np.float32))
    assert report.dtype == np.float32
    assert report.conversions == ["the module's parameters (float16) run as a float32 copy"], report.conversions
    assert "converted: the module's parameters (float16)" in str(report)
    config, params = from_torch(layer)
    report = compare_with_torch(layer, x_input((2, 5, 16)), dtype=np.float64,
                                params={k: v.astype(np.float32) for k, v in params.items()},
                                grad_output=np.ones((2, 5, 16), dtype=np.float16))
    assert report.conversions == ["the module's parameters (float32) run as a float64 copy (dtype=)",
                                  "params (float32) cast to float64", "grad_output (float16) cast to float64"]


# ----------------------------------------------------------------------------- params with their config
def test_params_with_their_config_compare_every_configuration_value():
    theirs = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, layer_norm_eps=0.1,
                                              dtype=F64)
    config, params = from_torch(theirs)
    mine = config.replace(layer_norm_eps=1e-12)                                   # "my model": the same weights
    report = compare_with_torch(theirs, x_input((2, 5, 16)), params=(mine, params))
    assert report["config:layer_norm_eps"].ref.item() == 0.1 and not report.ok
    with pytest.raises(AssertionError, match=r"disagree on the configuration value 'layer_norm_eps' "
                                             r"\[TransformerEncoderLayer, float64\]:\n  ours = 1e-12, torch = 0.1"):
        report.check()
    assert report.failures()[1][0].kind == "output"                              # ours ran with my config
    for change, field in ((dict(activation="gelu"), "activation"), (dict(norm_position="pre"), "norm_position")):
        bad = compare_with_torch(theirs, x_input((2, 5, 16)), params=params, config=config.replace(**change))
        assert bad.failures()[0][0].name == field, str(bad)
    assert compare_with_torch(theirs, x_input((2, 5, 16)), params=(config, params)).ok


def test_a_structural_difference_compares_no_tensor():
    theirs = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, dtype=F64)
    config, params = from_torch(theirs)
    report = compare_with_torch(theirs, x_input((2, 5, 16)), params=(config.replace(n_heads=2), params))
    assert [e.name for e in report.failures()[0][:1]] == ["n_heads"] and "no tensor compared" in report.notes[-1]
    assert all(e.kind == "config" for e in report.entries)


def test_params_without_their_config_run_with_the_modules_and_say_so():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, dtype=F64)
    config, params = from_torch(layer)
    report = compare_with_torch(layer, x_input((2, 5, 16)), params=params)
    assert any("params= without its config" in n for n in report.notes), report.notes
    with pytest.raises(InputValueError, match="give them with it"):
        compare_with_torch(layer, x_input((2, 5, 16)), config=config)


def test_an_attention_scale_other_than_one_over_root_dk_is_refused():
    bert = transformers.BertModel(transformers.BertConfig(**SMALL)).double().eval()
    bert.encoder.layer[1].attention.self.scaling = 0.3
    with pytest.raises(InputValueError, match=r"module.encoder.layer.1.attention.self.scaling = 0.3.*1/√d_k = 0.5"):
        compare_with_torch(bert, np.ones((2, 5), dtype=int))
