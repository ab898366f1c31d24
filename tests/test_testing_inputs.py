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


def test_the_true_reason_comes_before_training_mode():
    # issue 45 item 6: an unsupported activation or family in a module that is also in training mode with dropout
    # is refused for what it is, not as a dropout problem (which eval() would not fix)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True, dtype=F64,
                                             activation=torch.nn.functional.silu)       # train() mode, dropout 0.1
    with pytest.raises(InputValueError, match="unsupported activation") as err:
        compare_with_torch(layer, x_input((2, 5, 16)))
    assert "training mode" not in str(err.value)
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=4,
                                                          n_positions=12))            # training mode, dropout 0.1
    with pytest.raises((InputTypeError, InputValueError)) as err:
        compare_with_torch(gpt2, np.ones((2, 5), dtype=int))
    assert "training mode" not in str(err.value) and "gpt2" in str(err.value).lower(), str(err.value)


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
    with pytest.warns(UserWarning, match="compared as a float32 copy"):             # not silent: see test_testing_modes
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


# ----------------------------------------------------------------------------- input errors, by name
def _bert(**kw):
    return transformers.BertModel(transformers.BertConfig(**{**SMALL, **kw})).double().eval()


def test_ids_out_of_the_vocabulary_are_a_library_error():
    ids = np.array([[2, 3, 4], [5, 57, 6]])
    with pytest.raises(InputValueError, match=r"inputs \(input_ids\) must be token ids in \[0, vocab_size\) = "
                                              r"\[0, 50\) for BertModel, got 57 at index \(1, 1\)"):
        compare_with_torch(_bert(), ids)
    with pytest.raises(InputValueError, match="got -1"):
        compare_with_torch(_bert(), np.array([[2, -1, 4]]))
    with pytest.raises(InputValueError, match=r"token_type_ids must be in \[0, type_vocab_size\) = \[0, 2\)"):
        compare_with_torch(_bert(), np.array([[2, 3, 4]]), token_type_ids=np.array([[0, 1, 2]]))
    distil = transformers.DistilBertModel(transformers.DistilBertConfig(vocab_size=50, dim=16, n_layers=1, n_heads=4,
                                                                        hidden_dim=32)).eval()
    with pytest.raises(InputValueError, match="DistilBertModel has no token-type embedding"):
        compare_with_torch(distil, np.array([[2, 3, 4]]), token_type_ids=np.zeros((1, 3), dtype=int))


def test_a_sequence_past_the_position_table_is_a_library_error():
    with pytest.raises(InputValueError, match=r"sequences of 13 tokens.*position table has 12 rows.*at most 12"):
        compare_with_torch(_bert(), np.full((1, 13), 3))
    roberta = transformers.RobertaModel(transformers.RobertaConfig(**SMALL)).double().eval()     # rows 0, 1: p + 1
    with pytest.raises(InputValueError, match=r"sequences of 11 tokens.*up to 12.*12 rows.*at most 10 tokens"):
        compare_with_torch(roberta, np.full((1, 11), 3))
    assert compare_with_torch(roberta, np.full((1, 10), 3)).ok


@pytest.mark.parametrize("module", [torch.nn.Linear(4, 4), torch.nn.TransformerDecoderLayer(16, 4, 32),
                                    "not a module"], ids=["Linear", "TransformerDecoderLayer", "str"])
def test_an_unsupported_module_lists_the_torch_modules_and_the_families(module):
    with pytest.raises(InputTypeError) as info:
        compare_with_torch(module, x_input((2, 5, 16)))
    msg = str(info.value)
    assert msg.startswith("module must be") and "nn.TransformerEncoderLayer, nn.TransformerEncoder, " \
                                                "nn.MultiheadAttention" in msg and "roberta (RobertaModel)" in msg, msg


def test_unsupported_multihead_attention_options_are_named():
    with pytest.raises(InputValueError, match="kdim = 8"):
        compare_with_torch(torch.nn.MultiheadAttention(16, 4, kdim=8, vdim=8).eval(), x_input((5, 2, 16)))
    with pytest.raises(InputValueError, match="add_bias_kv"):
        compare_with_torch(torch.nn.MultiheadAttention(16, 4, add_bias_kv=True).eval(), x_input((5, 2, 16)))


def test_a_gradient_at_padding_rows_is_explained():
    """HF's nn.Embedding(padding_idx) row gets gradient 0 by definition, ours the true derivative: a grad_output
    nonzero where a token reads that row is refused with the reason; the default grad_output is 0 there."""
    model = _bert(pad_token_id=0)
    ids = np.array([[2, 3, 4, 0, 0], [5, 6, 7, 8, 9]])
    am = (ids != 0).astype(int)
    R = np.random.default_rng(0).normal(size=(2, 5, 16))
    with pytest.raises(InputValueError, match=r"grad_output is nonzero at the padded position \(0, 3\), whose token 0 "
                                              r"reads the padding row: .*embeddings.word_embeddings \(padding_idx = 0\)"
                                              r".*true derivative"):
        compare_with_torch(model, ids, attention_mask=am, grad_output=R)
    R[0, 3:] = 0
    assert compare_with_torch(model, ids, attention_mask=am, grad_output=R).ok
    with pytest.raises(InputValueError, match=r"padding token 0 at position \(0, 1\), which attention_mask does not "
                                              r"mask out"):
        compare_with_torch(model, np.array([[2, 0, 4]]))
