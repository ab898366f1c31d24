"""An audit of the public API for bad input: every case must raise ValueError or TypeError
whose message names the offending argument (and so tells the user what to fix).

Each row is (call, exception type, a word the message must contain). Rows for optional
parts (interop, pretrained) need their packages only where the call does.
"""

from __future__ import annotations

import numpy as np
import pytest

import transformer_np as tnp

CFG = tnp.EncoderConfig(n_layers=1, d_model=4, n_heads=2, d_ff=8, vocab_size=10, max_len=8)
PARAMS = tnp.init_params(CFG)
H = np.zeros((2, 3, 4))
IDS = np.zeros((1, 3), dtype=int)


def _cache():
    return tnp.encoder_forward(PARAMS, CFG, input_ids=IDS)[1]


CASES = {
    # config and init
    "config d_ff str": (lambda: tnp.EncoderConfig(1, 4, 2, "8"), TypeError, "d_ff"),
    "config eps nan": (lambda: tnp.EncoderConfig(1, 4, 2, 8, layer_norm_eps=float("nan")), ValueError, "layer_norm_eps"),
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
    "ce logits NaN": (lambda: tnp.cross_entropy_forward(np.array([[np.nan, 0.0]]), np.array([0])), ValueError, "logits"),
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
    np.testing.assert_array_equal(p["w"], before)          # nothing was updated
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
