"""Bad input to the public API: every case raises a ``ValueError`` or ``TypeError`` whose message
names the offending argument (and so tells the user what to fix) — never a broadcasting
traceback from inside NumPy, never a silent NaN. From the core (ops, the encoder) the error is
one of :mod:`transformer_np.errors`' classes, so callers tell failures apart by class, never by
message text; from the CLI it is one line on stderr and exit status 2.

One file states the rule for the whole API (it used to be two, ``test_bad_input.py`` and
``test_api_audit.py``, each with part of it). Tables: each row is (call, exception type, a word
or pattern the message must contain). Rows for optional parts (interop, pretrained) need their
packages only where the call does.
"""

from __future__ import annotations

import numpy as np
import pytest

import transformer_np as tnp
from transformer_np.errors import InputTypeError, InputValueError, NonFiniteError, TransformerNPError

CFG = tnp.EncoderConfig(n_layers=1, d_model=4, n_heads=2, d_ff=8, vocab_size=10, max_len=8)
PARAMS = tnp.init_params(CFG)
H = np.zeros((2, 3, 4))
IDS = np.zeros((1, 3), dtype=int)


def _cache():
    return tnp.encoder_forward(PARAMS, CFG, input_ids=IDS)[1]


@pytest.fixture(scope="module")
def model():
    cfg = tnp.EncoderConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16, vocab_size=20, max_len=6,
                            type_vocab_size=2)
    return cfg, tnp.init_params(cfg, seed=0)


IDS2 = np.array([[1, 2, 3], [4, 5, 6]])


# ---------------------------------------------------------------- encoder_forward: the inputs
@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(input_ids=np.array([[1, 2, 20]])), ValueError, "input_ids"),            # outside the vocabulary
    (dict(input_ids=np.array([[1, -1, 2]])), ValueError, "input_ids"),
    (dict(input_ids=np.array([[1.0, 2.0]])), TypeError, "input_ids"),              # not integers
    (dict(input_ids=np.array([1, 2, 3])), ValueError, "input_ids"),                # wrong rank
    (dict(input_ids=np.ones((1, 7), dtype=int)), ValueError, "max_len"),           # too long
    (dict(input_ids=IDS2, attention_mask=np.ones((2, 4))), ValueError, "attention_mask"),
    (dict(input_ids=IDS2, attention_mask=np.full((2, 3), 2)), ValueError, "attention_mask"),
    (dict(input_ids=IDS2, attention_mask=np.full((2, 3), 0.5)), ValueError, "attention_mask"),
    (dict(input_ids=IDS2, token_type_ids=np.full((2, 3), 2)), ValueError, "token_type_ids"),
    (dict(input_ids=IDS2, token_type_ids=np.zeros((2, 2), dtype=int)), ValueError, "token_type_ids"),
    (dict(inputs_embeds=np.zeros((2, 3, 5))), ValueError, "inputs_embeds"),        # wrong width
    (dict(inputs_embeds=np.zeros((3, 8))), ValueError, "inputs_embeds"),           # wrong rank
    (dict(inputs_embeds=np.zeros((2, 3, 8), dtype=np.float32)), TypeError, "inputs_embeds"),
    (dict(inputs_embeds=np.full((1, 3, 8), np.nan)), ValueError, "inputs_embeds"),  # non-finite
    (dict(inputs_embeds=[[[0.0] * 8]]), TypeError, "inputs_embeds"),
    (dict(input_ids=IDS2, inputs_embeds=np.zeros((2, 3, 8))), ValueError, "exactly one"),
    (dict(), ValueError, "exactly one"),
    (dict(input_ids=IDS2, training=True), ValueError, "rng"),                       # dropout needs a generator
    (dict(input_ids=IDS2, training=True, rng=np.random.RandomState(0)), TypeError, "rng"),
    (dict(input_ids=IDS2, training=1), TypeError, "training"),
    (dict(input_ids=np.zeros((2, 0), dtype=int)), ValueError, "at least one"),
])
def test_encoder_forward_bad_inputs(model, kwargs, exc, match):
    cfg, params = model
    with pytest.raises(exc, match=match) as info:
        tnp.encoder_forward(params, cfg, **kwargs)
    assert isinstance(info.value, TransformerNPError)            # the core raises errors.py's classes



# ---------------------------------------------------------------- params, backward, config, op-level
def test_bad_params(model):
    cfg, params = model
    missing = {k: v for k, v in params.items() if k != "layers.1.ffn.b_1"}
    with pytest.raises(ValueError, match=r"missing.*layers\.1\.ffn\.b_1"):
        tnp.encoder_forward(missing, cfg, input_ids=IDS2)
    extra = {**params, "layers.2.ffn.b_1": np.zeros(16)}
    with pytest.raises(ValueError, match=r"unexpected.*layers\.2\.ffn\.b_1"):
        tnp.encoder_forward(extra, cfg, input_ids=IDS2)
    wrong = {**params, "layers.0.attn.W_Q": np.zeros((8, 4))}
    with pytest.raises(ValueError, match=r"layers\.0\.attn\.W_Q.*\(8, 8\).*\(8, 4\)"):
        tnp.encoder_forward(wrong, cfg, input_ids=IDS2)
    mixed = {**params, "layers.0.attn.W_Q": params["layers.0.attn.W_Q"].astype(np.float32)}
    with pytest.raises(TypeError, match="dtype"):
        tnp.encoder_forward(mixed, cfg, input_ids=IDS2)
    with pytest.raises(TypeError, match="params"):
        tnp.encoder_forward(list(params.values()), cfg, input_ids=IDS2)
    with pytest.raises(TypeError, match="config"):
        tnp.encoder_forward(params, {"n_layers": 2}, input_ids=IDS2)


def test_bad_backward(model):
    cfg, params = model
    H, cache = tnp.encoder_forward(params, cfg, input_ids=IDS2)
    with pytest.raises(ValueError, match=r"dH.*\(2, 3, 8\)"):
        tnp.encoder_backward(np.ones((2, 3, 4)), cache)
    with pytest.raises(TypeError, match="dH"):
        tnp.encoder_backward(np.ones((2, 3, 8), dtype=np.float32), cache)
    with pytest.raises(ValueError, match="dH"):
        tnp.encoder_backward(np.full((2, 3, 8), np.inf), cache)
    with pytest.raises(TypeError, match="cache"):
        tnp.encoder_backward(np.ones_like(H), {"kind": "mha"})


def test_config_without_embeddings_rejects_ids():
    cfg = tnp.EncoderConfig(n_layers=1, d_model=4, n_heads=1, d_ff=8)
    params = tnp.init_params(cfg)
    with pytest.raises(ValueError, match="inputs_embeds"):
        tnp.encoder_forward(params, cfg, input_ids=np.array([[0, 1]]))


def test_op_level_errors():
    x = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="x must have last dimension"):
        tnp.linear_forward(x, np.zeros((5, 2)), np.zeros(2))
    with pytest.raises(ValueError, match="b must have shape"):
        tnp.linear_forward(x, np.zeros((4, 2)), np.zeros(3))
    with pytest.raises(TypeError, match="W must have dtype float64"):
        tnp.linear_forward(x, np.zeros((4, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="gamma"):
        tnp.layernorm_forward(x, np.ones(3), np.zeros(4))
    with pytest.raises(ValueError, match="residual"):
        tnp.residual_forward(x, np.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match="activation"):
        tnp.activation_forward(x, "swish")
    with pytest.raises(ValueError, match="dropout probability"):
        tnp.dropout_forward(x, 1.0, True, np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        tnp.dropout_forward(x, 0.5, True, None)
    with pytest.raises(ValueError, match="divisible"):
        tnp.mha_forward(np.zeros((1, 2, 6)), {}, 4)
    with pytest.raises(ValueError, match="W_Q"):
        tnp.mha_forward(np.zeros((1, 2, 4)), {}, 2)
    with pytest.raises(ValueError, match="ids must lie"):
        tnp.embedding_forward(np.array([5]), np.zeros((5, 2)))
    with pytest.raises(ValueError, match="labels"):
        tnp.cross_entropy_forward(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="labels must have shape"):
        tnp.cross_entropy_forward(np.zeros((2, 3)), np.array([0, 1, 2]))
    _, c = tnp.linear_forward(x, np.zeros((4, 2)))
    with pytest.raises(ValueError, match="dy must have the shape"):
        tnp.linear_backward(np.zeros((2, 3, 3)), c)
    with pytest.raises(TypeError, match="layernorm_forward, got the cache of linear_forward"):
        tnp.layernorm_backward(np.zeros((2, 3, 2)), c)
    with pytest.raises(ValueError, match="mask"):
        tnp.attention_forward(np.zeros((1, 3, 2)), np.zeros((1, 3, 2)), np.zeros((1, 3, 2)), np.zeros((1, 4, 4)))
    with pytest.raises(ValueError, match="attention_mask"):
        tnp.padding_mask(np.array([1, 0]))


# ---------------------------------------------------------------- the audit table: config, forward, heads, ops
CASES = {
    # config and init
    "config d_ff str": (lambda: tnp.EncoderConfig(1, 4, 2, "8"), TypeError, "d_ff"),
    "config eps nan": (lambda: tnp.EncoderConfig(1, 4, 2, 8, layer_norm_eps=float("nan")), ValueError,
                       "layer_norm_eps"),
    "config max_len 0": (lambda: tnp.EncoderConfig(1, 4, 2, 8, max_len=0), ValueError, "max_len"),
    "config final_layer_norm str": (lambda: tnp.EncoderConfig(1, 4, 2, 8, final_layer_norm="yes"), TypeError,
                                    "final_layer_norm"),
    "config type vocab without vocab": (lambda: tnp.EncoderConfig(1, 4, 2, 8, type_vocab_size=2), ValueError,
                                        "vocab_size"),
    "config from_dict unknown": (lambda: tnp.EncoderConfig.from_dict({"n_layer": 1}), ValueError, "n_layer"),
    "init seed -1": (lambda: tnp.init_params(CFG, seed=-1), ValueError, "seed"),
    "init seed float": (lambda: tnp.init_params(CFG, seed=1.5), TypeError, "seed"),
    "init dtype int": (lambda: tnp.init_params(CFG, dtype=np.int32), TypeError, "dtype"),
    "init config dict": (lambda: tnp.init_params({"n_layers": 1}), TypeError, "config"),
    "init unknown scheme": (lambda: tnp.init_params(CFG, init="he"), ValueError, "init"),
    "init std negative": (lambda: tnp.init_params(CFG, std=-1), ValueError, "std"),
    "count_parameters str": (lambda: tnp.count_parameters("bert"), TypeError, "config"),
    # forward / backward
    "extra_mask wrong shape": (lambda: tnp.encoder_forward(PARAMS, CFG, input_ids=IDS, extra_mask=np.zeros((5, 5))),
                               ValueError, "mask"),
    "ids bool": (lambda: tnp.encoder_forward(PARAMS, CFG, input_ids=np.ones((1, 2), bool)), TypeError, "input_ids"),
    "ids huge unsigned": (lambda: tnp.encoder_forward(PARAMS, CFG, input_ids=np.array([[2**63]], dtype=np.uint64)),
                          ValueError, "input_ids"),
    "backward flag str": (lambda: tnp.encoder_backward(np.zeros((1, 3, 4)), _cache(), return_hidden_grads="y"),
                          TypeError, "return_hidden_grads"),
    # heads and losses
    "mean_pool mask shape": (lambda: tnp.mean_pool_forward(H, np.ones((2, 4))), ValueError, "attention_mask"),
    "mean_pool 2-D H": (lambda: tnp.mean_pool_forward(np.zeros((3, 4))), ValueError, "H"),
    "classifier W width": (lambda: tnp.cls_classifier_forward(H, np.zeros((5, 2)), np.zeros(2)), ValueError, "W"),
    "tagger b": (lambda: tnp.tagger_forward(H, np.zeros((4, 2)), np.zeros(3)), ValueError, "b"),
    "pooler W not square": (lambda: tnp.pooler_forward(H, np.zeros((4, 2)), np.zeros(2)), ValueError, "W"),
    "ce labels float": (lambda: tnp.cross_entropy_forward(np.zeros((2, 3)), np.array([0.0, 1.0])), TypeError, "labels"),
    "ce logits NaN": (lambda: tnp.cross_entropy_forward(np.array([[np.nan, 0.0]]), np.array([0])), ValueError,
                      "logits"),
    "ce ignore_index str": (lambda: tnp.cross_entropy_forward(np.zeros((1, 2)), np.array([0]), ignore_index="x"),
                            TypeError, "ignore_index"),
    "ce dloss str": (lambda: tnp.cross_entropy_backward("a", tnp.cross_entropy_forward(np.zeros((1, 2)),
                                                                                       np.array([0]))[1]),
                     TypeError, "dloss"),
    # ops
    "softmax int": (lambda: tnp.softmax_forward(np.array([1, 2, 3])), TypeError, "x"),
    "layernorm eps 0": (lambda: tnp.layernorm_forward(H, np.ones(4), np.zeros(4), eps=0), ValueError, "eps"),
    "erf int": (lambda: tnp.erf(np.array([1, 2])), TypeError, "x"),
    "mha n_heads 0": (lambda: tnp.mha_forward(H, {}, 0), ValueError, "n_heads"),
    "attention rank 1": (lambda: tnp.attention_forward(np.zeros(3), np.zeros(3), np.zeros(3)), ValueError, "Q, K, V"),
    "padding_mask int dtype": (lambda: tnp.padding_mask(np.ones((1, 2)), dtype=np.int32), TypeError, "dtype"),
    "causal_mask n 0": (lambda: tnp.causal_mask(0), ValueError, "n"),
    "combine_masks list": (lambda: tnp.combine_masks([1, 2]), TypeError, "masks"),
    "embedding float ids": (lambda: tnp.embedding_forward(np.array([0.5]), np.zeros((3, 2))), TypeError, "ids"),
    "sinusoidal negative n": (lambda: tnp.sinusoidal_positional_encoding(-1, 4), ValueError, "n"),
    "dropout p str": (lambda: tnp.dropout_forward(H, "0.1", True, np.random.default_rng()), TypeError, "p"),
    "dropout training str": (lambda: tnp.dropout_forward(H, 0.1, "yes", np.random.default_rng()), TypeError,
                             "training"),
}




@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_names_the_argument(name):
    call, exc, word = CASES[name]
    with pytest.raises(exc) as info:
        call()
    assert word in str(info.value), str(info.value)


#: rows of CASES raised by the core (ops, masks, the encoder): they must be errors.py classes
CORE = [name for name in CASES if name.split()[0] in ("extra_mask", "ids", "backward", "softmax",
                                                        "layernorm", "erf", "mha", "attention", "padding_mask",
                                                        "causal_mask", "combine_masks", "embedding", "sinusoidal",
                                                        "dropout")]


@pytest.mark.parametrize("name", CORE)
def test_the_core_raises_the_error_classes(name):
    call, exc, _ = CASES[name]
    with pytest.raises(exc) as info:
        call()
    assert isinstance(info.value, TransformerNPError), type(info.value)


# ---------------------------------------------------------------- softmax and layernorm (issue 16)
X64 = np.array([[0.5, -1.0, 2.0]])
READ_ONLY = np.zeros((1, 3))
READ_ONLY.flags.writeable = False

OPS_CASES = {
    "softmax int array": (lambda: tnp.softmax(np.array([1, 2, 3])), InputTypeError, "x"),
    "softmax list": (lambda: tnp.softmax([1.0, 2.0]), InputTypeError, "x"),
    "softmax 0-d": (lambda: tnp.softmax(np.array(1.0)), InputValueError, "x"),
    "softmax empty last axis": (lambda: tnp.softmax(np.zeros((2, 0))), InputValueError, "x"),
    "softmax +inf": (lambda: tnp.softmax(np.array([[1.0, np.inf]])), NonFiniteError, "x"),
    "softmax -inf": (lambda: tnp.softmax(np.array([[1.0, -np.inf]])), NonFiniteError, "x"),
    "softmax nan": (lambda: tnp.softmax(np.array([[np.nan, 0.0]])), NonFiniteError, "x"),
    "softmax_forward inf": (lambda: tnp.softmax_forward(np.array([[np.inf, 0.0]])), NonFiniteError, "x"),
    "softmax out float32 for float64": (lambda: tnp.softmax(X64, out=np.zeros((1, 3), np.float32)), InputTypeError,
                                        "out"),
    "softmax out shape": (lambda: tnp.softmax(X64, out=np.zeros((3,))), InputValueError, "out"),
    "softmax out list": (lambda: tnp.softmax(X64, out=[0.0, 0.0, 0.0]), InputTypeError, "out"),
    "softmax out read-only": (lambda: tnp.softmax(X64, out=READ_ONLY), InputValueError, "out"),
    "layernorm eps inf": (lambda: tnp.layernorm_forward(H, np.ones(4), np.zeros(4), eps=np.inf), NonFiniteError,
                          "eps"),
    "layernorm eps nan": (lambda: tnp.layernorm_forward(H, np.ones(4), np.zeros(4), eps=float("nan")),
                          NonFiniteError, "eps"),
    "layernorm eps True": (lambda: tnp.layernorm_forward(H, np.ones(4), np.zeros(4), eps=True), InputTypeError,
                           "eps"),
    "layernorm eps str": (lambda: tnp.layernorm_forward(H, np.ones(4), np.zeros(4), eps="1e-5"), InputTypeError,
                          "eps"),
    "layernorm eps negative": (lambda: tnp.layernorm_forward(H, np.ones(4), np.zeros(4), eps=-1e-5),
                               InputValueError, "eps"),
    "layernorm variance overflow": (lambda: tnp.layernorm_forward(np.array([[3e38, -3e38]], np.float32),
                                                                  np.ones(2, np.float32), np.zeros(2, np.float32)),
                                    NonFiniteError, "variance"),
    "attention leading axes": (lambda: tnp.attention_forward(np.zeros((2, 3, 4)), np.zeros((1, 3, 4)),
                                                             np.zeros((1, 3, 4))), InputValueError, "leading"),
    "attention dropout without rng": (lambda: tnp.attention_forward(np.zeros((1, 3, 4)), np.zeros((1, 3, 4)),
                                                                    np.zeros((1, 3, 4)), None, 0.5, True),
                                      InputTypeError, "rng"),
    "mha p not a dict": (lambda: tnp.mha_forward(H, [1, 2], 2), InputTypeError, "p"),
    "mha mask too big": (lambda: tnp.mha_forward(H, tnp.model.params.sub_params(PARAMS, "layers.0.attn."), 2,
                                                 np.zeros((2, 2, 3, 5))), InputValueError, "mask"),
    "mha_backward dout shape": (lambda: tnp.mha_backward(np.zeros((2, 3, 5)), tnp.mha_forward(
        H, tnp.model.params.sub_params(PARAMS, "layers.0.attn."), 2)[1]), InputValueError, "dout"),
    "ffn p not a dict": (lambda: tnp.ffn_forward(H, None), InputTypeError, "p"),
    "ffn W_2 rows": (lambda: tnp.ffn_forward(H, {"W_1": np.zeros((4, 8)), "b_1": np.zeros(8),
                                                 "W_2": np.zeros((7, 4)), "b_2": np.zeros(4)}), InputValueError, "W_2"),
    "ffn_backward free_cache str": (lambda: tnp.ffn_backward(H, tnp.ffn_forward(
        H, tnp.model.params.sub_params(PARAMS, "layers.0.ffn."))[1], free_cache="y"), InputTypeError, "free_cache"),
    "layer p missing": (lambda: tnp.encoder_layer_forward(H, {}, CFG), InputValueError, "p"),
    "layer p shape": (lambda: tnp.encoder_layer_forward(H, {**tnp.model.params.sub_params(PARAMS, "layers.0."),
                                                            "ffn.W_1": np.zeros((4, 9))}, CFG), InputValueError,
                      "p['ffn.W_1']"),
    "layer x width": (lambda: tnp.encoder_layer_forward(np.zeros((2, 3, 5)), tnp.model.params.sub_params(
        PARAMS, "layers.0."), CFG), InputValueError, "x"),
    "layer config": (lambda: tnp.encoder_layer_forward(H, {}, "cfg"), InputTypeError, "config"),
    "layer_backward dout shape": (lambda: tnp.encoder_layer_backward(np.zeros((2, 3, 5)), tnp.encoder_layer_forward(
        H, tnp.model.params.sub_params(PARAMS, "layers.0."), CFG)[1]), InputValueError, "dout"),
    "embeddings_forward positional": (lambda: tnp.embeddings_forward({"word": np.zeros((5, 2))}, np.zeros((1, 2), int),
                                                                     None, "rotary", 1e-5), InputValueError,
                                      "positional"),
    "embeddings_forward ids range": (lambda: tnp.embeddings_forward({"word": np.zeros((5, 2))}, np.full((1, 2), 5),
                                                                    None, "none", 1e-5, False), InputValueError,
                                     "input_ids"),
}


@pytest.mark.parametrize("name", list(OPS_CASES))
def test_ops_bad_input_raises_the_class_and_names_the_argument(name):
    call, cls, word = OPS_CASES[name]
    with pytest.raises(cls) as info:
        call()
    assert word in str(info.value), str(info.value)


def test_softmax_of_finite_extremes_is_never_nan():
    for dtype in (np.float32, np.float64):
        big = np.finfo(dtype).max
        x = np.array([[big, -big, 0.0], [-big, -big, -big], [big, big, big]], dtype=dtype)
        s = tnp.softmax(x)
        assert s.dtype == dtype and np.all(np.isfinite(s))
        np.testing.assert_allclose(s.sum(axis=-1), 1.0, rtol=1e-6)
        out = x.copy()
        assert tnp.softmax(out, out=out) is out                  # in place
        np.testing.assert_array_equal(out, s)   # exact: the same computation, copied into out


# ---------------------------------------------------------------- interop (pure NumPy part)
def test_interop_numpy_mapping_errors():
    from transformer_np.io import interop

    with pytest.raises(ValueError, match="hidden_size"):
        interop.config_from_hf_dict({})
    with pytest.raises(ValueError, match="position_embedding_type"):
        interop.config_from_hf_dict({"hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2,
                                     "intermediate_size": 8, "vocab_size": 10,
                                     "position_embedding_type": "relative_key"})
    with pytest.raises(ValueError, match="missing"):
        interop.params_from_hf_state_dict({}, CFG)
    sd = interop.hf_state_dict_from_params(PARAMS, CFG)
    bad = dict(sd)
    bad["encoder.layer.0.intermediate.dense.weight"] = np.zeros((3, 3), dtype=np.float64)
    with pytest.raises(ValueError, match=r"encoder\.layer\.0\.intermediate\.dense\.weight"):
        interop.params_from_hf_state_dict(bad, CFG)
    with pytest.raises(TypeError, match="tree"):
        interop.hf_state_dict_from_params([], CFG)


def test_interop_torch_module_errors():
    torch = pytest.importorskip("torch", reason="pip install torch==2.13.0 (CPU wheel)")
    from transformer_np.io import interop

    with pytest.raises(TypeError, match="module"):
        interop.from_torch("not a module")
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, bias=False)
    with pytest.raises(ValueError, match="bias"):
        interop.from_torch(layer)
    with pytest.raises(TypeError, match="model"):
        interop.from_hf_bert(None)


# ---------------------------------------------------------------- pretrained
def test_pretrained_errors(tmp_path):
    from transformer_np.io import pretrained

    with pytest.raises(ValueError, match="path_or_name"):
        pretrained.load_pretrained(str(tmp_path / "nope"))
    with pytest.raises(TypeError, match="path_or_name"):
        pretrained.load_pretrained(3)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        pretrained.load_pretrained(str(tmp_path))


# ---------------------------------------------------------------- optimisers
def test_optimiser_errors():
    from transformer_np.training import optim

    p = {"w": np.zeros((2, 2)), "b": np.zeros(2)}
    with pytest.raises(TypeError, match="params"):
        optim.AdamW([np.zeros(2)], lr=1e-3)
    with pytest.raises(ValueError, match="lr"):
        optim.AdamW(p, lr=-1)
    with pytest.raises(ValueError, match="betas"):
        optim.AdamW(p, lr=1e-3, betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="weight_decay"):
        optim.AdamW(p, lr=1e-3, weight_decay=-1)
    opt = optim.AdamW(p, lr=1e-3)
    with pytest.raises(ValueError, match=r"grads\['w'\]"):
        opt.step({"w": np.zeros(3)})
    with pytest.raises(ValueError, match="zz"):
        opt.step({"zz": np.zeros(3)})
    before = p["w"].copy()
    with pytest.raises(ValueError, match=r"grads\['w'\].*NaN"):
        opt.step({"w": np.full((2, 2), np.nan)})
    np.testing.assert_array_equal(p["w"], before)          # exact: nothing was updated
    with pytest.raises(ValueError, match="max_norm"):
        optim.clip_grad_norm({"w": np.ones(2)}, 0)
    with pytest.raises(ValueError, match="warmup_steps"):
        optim.WarmupLinearSchedule(1e-3, -1, 10)
    with pytest.raises(ValueError, match="step"):
        optim.WarmupLinearSchedule(1e-3, 1, 10)(-1)


# ---------------------------------------------------------------- the CLI: one line, exit status 2
@pytest.mark.parametrize("argv", [
    ["train", "--layers", "0"], ["train", "--task", "nope"], ["trace", "--precision", "-3"],
    ["gradflow", "--depth", "0"], ["gradflow", "--variant", "pre", "--depth", "4", "--probe-layer", "5"],
    ["embed", "--model", "/nonexistent", "x"], ["figures", "--out", "/proc/not-writable"],
    ["gradcheck", "--max-coords", "0"], ["bench", "--shape", "nope"],
])
def test_cli_errors_are_one_line_with_status_2(argv):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "transformer_np", *argv], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, (argv, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in r.stderr, r.stderr
