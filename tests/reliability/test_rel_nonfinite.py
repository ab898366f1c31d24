"""Issue 26, non-finite values named at their source: one rule for every public op (NaN/±inf in an input or a
parameter is a NonFiniteError naming the argument, as softmax always did), the encoder names the parameter
(not "the variance of x is not finite"), lookup tables are checked on the rows read; empty dimensions and a huge
positional table are library errors, not raw NumPy ones."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_np as tnp
from transformer_np.errors import InputValueError, NonFiniteError, ResourceLimitError
from transformer_np.model.config import EncoderConfig
from transformer_np.model.params import init_params, sub_params

CFG = EncoderConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, vocab_size=30, max_len=16)
IDS = np.array([[1, 2, 3], [4, 5, 6]])


def _params():
    return init_params(CFG, seed=0)


NAMES = [n for n in _params() if not n.startswith("embeddings.") or n.startswith("embeddings.ln")]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["layers.0.ln1.gamma", "layers.1.ffn.W_1", "layers.0.attn.b_V", "embeddings.ln.beta",
                                  "layers.1.ln2.beta"])
def test_encoder_forward_names_the_non_finite_parameter(name, bad):
    p = _params()
    p[name].flat[p[name].size // 2] = bad
    with pytest.raises(NonFiniteError) as info:
        tnp.encoder_forward(p, CFG, input_ids=IDS)
    msg = str(info.value)
    assert msg.startswith(f"params['{name}'] must contain only finite values, got 1 NaN/inf entries"), msg
    assert "variance" not in msg


def test_every_parameter_is_checked():
    # property over all parameters: whichever one holds a NaN is the one named
    for name in NAMES:
        p = _params()
        p[name].flat[0] = np.nan
        with pytest.raises(NonFiniteError, match=rf"^params\['{name}'\]"):
            tnp.encoder_forward(p, CFG, input_ids=IDS)


@pytest.mark.parametrize("table, row, ids_name", [("embeddings.word", 5, "input_ids"),
                                                  ("embeddings.position", 2, "the positions"),
                                                  ("embeddings.token_type", 0, "token_type_ids")])
def test_a_lookup_row_that_is_read_is_named(table, row, ids_name):
    cfg = EncoderConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, vocab_size=30, max_len=16, type_vocab_size=2)
    p = init_params(cfg, seed=0)
    p[table][row, 3] = np.nan
    with pytest.raises(NonFiniteError) as info:
        tnp.encoder_forward(p, cfg, input_ids=IDS, token_type_ids=np.zeros_like(IDS))
    assert str(info.value) == (f"params['{table}'] must contain only finite values in the rows {ids_name} looks up, "
                               f"got NaN/inf in row {row}")


def test_a_lookup_row_that_is_not_read_changes_nothing():
    clean = tnp.encoder_forward(_params(), CFG, input_ids=IDS)[0]
    p = _params()
    p["embeddings.word"][29] = np.nan                 # token 29 is not in IDS
    H = tnp.encoder_forward(p, CFG, input_ids=IDS)[0]
    assert np.array_equal(H, clean)                   # exact: the same operations on the same numbers


def test_inputs_embeds_and_a_single_layer_name_their_argument():
    p = _params()
    x = np.random.default_rng(0).standard_normal((1, 3, 16))
    x[0, 1, 2] = np.inf
    with pytest.raises(NonFiniteError, match="^inputs_embeds must contain only finite values"):
        tnp.encoder_forward(p, CFG, inputs_embeds=x)
    layer = sub_params(p, "layers.0.")
    with pytest.raises(NonFiniteError, match="^x must contain only finite values"):
        tnp.encoder_layer_forward(x, layer, CFG)
    x[0, 1, 2] = 0.0
    layer["ln1.gamma"][0] = np.nan
    with pytest.raises(NonFiniteError, match=r"^p\['ln1.gamma'\] must contain only finite values"):
        tnp.encoder_layer_forward(x, layer, CFG)


def test_an_overflow_with_finite_parameters_is_still_reported_as_an_overflow():
    p = {k: v.astype(np.float32) for k, v in _params().items()}
    x = np.full((1, 3, 16), 3e38, np.float32)
    x[0, :, ::2] = -3e38
    with pytest.raises(NonFiniteError, match="overflow|variance"):
        tnp.encoder_forward(p, CFG, inputs_embeds=x)


# ----------------------------------------------------------------------------- the single ops: one rule
def _x(*shape):
    return np.random.default_rng(1).standard_normal(shape)


MHA = {k: _x(4, 4) if k.startswith("W") else _x(4) for k in ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O")}
FFN = {"W_1": _x(4, 8), "b_1": _x(8), "W_2": _x(8, 4), "b_2": _x(4)}
EMB = {"word": _x(10, 4), "position": _x(6, 4), "ln.gamma": np.ones(4), "ln.beta": np.zeros(4)}


def _ops():
    """(label, argument name, the arrays, a call taking them): each op with each of its float arguments."""
    rng = np.random.default_rng(0)
    return [
        ("softmax", "x", {"x": _x(2, 3)}, lambda a: tnp.softmax(a["x"])),
        ("attention", "Q", {"Q": _x(1, 2, 4), "K": _x(1, 3, 4), "V": _x(1, 3, 4)},
         lambda a: tnp.attention_forward(a["Q"], a["K"], a["V"])),
        ("attention", "K", {"Q": _x(1, 2, 4), "K": _x(1, 3, 4), "V": _x(1, 3, 4)},
         lambda a: tnp.attention_forward(a["Q"], a["K"], a["V"])),
        ("attention", "V", {"Q": _x(1, 2, 4), "K": _x(1, 3, 4), "V": _x(1, 3, 4)},
         lambda a: tnp.attention_forward(a["Q"], a["K"], a["V"])),
        ("mha", "x", {"x": _x(1, 3, 4), **{k: v.copy() for k, v in MHA.items()}},
         lambda a: tnp.mha_forward(a["x"], {k: a[k] for k in MHA}, 2)),
        ("mha", "W_Q", {"x": _x(1, 3, 4), **{k: v.copy() for k, v in MHA.items()}},
         lambda a: tnp.mha_forward(a["x"], {k: a[k] for k in MHA}, 2)),
        ("mha", "b_O", {"x": _x(1, 3, 4), **{k: v.copy() for k, v in MHA.items()}},
         lambda a: tnp.mha_forward(a["x"], {k: a[k] for k in MHA}, 2)),
        ("linear", "x", {"x": _x(2, 4), "W": _x(4, 3), "b": _x(3)},
         lambda a: tnp.linear_forward(a["x"], a["W"], a["b"])),
        ("linear", "W", {"x": _x(2, 4), "W": _x(4, 3), "b": _x(3)},
         lambda a: tnp.linear_forward(a["x"], a["W"], a["b"])),
        ("linear", "b", {"x": _x(2, 4), "W": _x(4, 3), "b": _x(3)},
         lambda a: tnp.linear_forward(a["x"], a["W"], a["b"])),
        ("gelu", "z", {"z": _x(5)}, lambda a: tnp.gelu_forward(a["z"])),
        ("relu", "z", {"z": _x(5)}, lambda a: tnp.relu_forward(a["z"])),
        ("erf", "x", {"x": _x(5)}, lambda a: tnp.erf(a["x"])),
        ("layernorm", "x", {"x": _x(2, 4), "gamma": np.ones(4), "beta": np.zeros(4)},
         lambda a: tnp.layernorm_forward(a["x"], a["gamma"], a["beta"])),
        ("layernorm", "gamma", {"x": _x(2, 4), "gamma": np.ones(4), "beta": np.zeros(4)},
         lambda a: tnp.layernorm_forward(a["x"], a["gamma"], a["beta"])),
        ("layernorm", "beta", {"x": _x(2, 4), "gamma": np.ones(4), "beta": np.zeros(4)},
         lambda a: tnp.layernorm_forward(a["x"], a["gamma"], a["beta"])),
        ("ffn", "z", {"z": _x(1, 2, 4), **{k: v.copy() for k, v in FFN.items()}},
         lambda a: tnp.ffn_forward(a["z"], {k: a[k] for k in FFN})),
        ("ffn", "W_2", {"z": _x(1, 2, 4), **{k: v.copy() for k, v in FFN.items()}},
         lambda a: tnp.ffn_forward(a["z"], {k: a[k] for k in FFN})),
        ("ffn", "b_1", {"z": _x(1, 2, 4), **{k: v.copy() for k, v in FFN.items()}},
         lambda a: tnp.ffn_forward(a["z"], {k: a[k] for k in FFN})),
        ("residual", "fx", {"x": _x(2, 4), "fx": _x(2, 4)}, lambda a: tnp.residual_forward(a["x"], a["fx"])),
        ("dropout", "x", {"x": _x(2, 4)}, lambda a: tnp.dropout_forward(a["x"], 0.5, True, rng)),
    ]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("i", range(len(_ops())), ids=[f"{c[0]}-{c[1]}" for c in _ops()])
def test_every_public_op_refuses_a_non_finite_argument_naming_it(i, bad):
    _, arg, arrays, call = _ops()[i]                          # fresh arrays for every case
    call(arrays)                                              # finite: it runs
    arrays[arg].flat[-1] = bad
    with pytest.raises(NonFiniteError) as info:
        call(arrays)
    assert str(info.value).startswith(f"{arg} must contain only finite values"), str(info.value)


def test_lookup_ops_name_the_row_they_read():
    table = _x(10, 4)
    table[7, 1] = np.nan
    assert tnp.embedding_forward(np.array([1, 2]), table)[0].shape == (2, 4)   # row 7 not read
    with pytest.raises(NonFiniteError, match=r"^table must contain only finite values in the rows ids looks up, got "
                                             r"NaN/inf in row 7"):
        tnp.embedding_forward(np.array([1, 7]), table)
    p = {k: v.copy() for k, v in EMB.items()}
    p["position"][1, 0] = np.inf
    with pytest.raises(NonFiniteError, match=r"^p\['position'\] must contain only finite values .* row 1"):
        tnp.embeddings_forward(p, np.array([[1, 2]]), None, "learned", 1e-12)


def test_masks_may_block_with_minus_inf_but_not_hold_nan_or_plus_inf():
    Q, K, V = _x(1, 2, 4), _x(1, 3, 4), _x(1, 3, 4)
    mask = np.zeros((1, 2, 3))
    mask[..., 2] = -np.inf
    O, cache = tnp.attention_forward(Q, K, V, mask)
    assert np.isfinite(O).all() and np.all(cache["weights"][..., 2] == 0)    # exact: exp(-inf) is 0
    for bad in (np.nan, np.inf):
        mask[0, 0, 0] = bad
        with pytest.raises(NonFiniteError, match="^mask must hold finite numbers or -inf"):
            tnp.attention_forward(Q, K, V, mask)


# ----------------------------------------------------------------------------- empty dimensions, huge tables
@pytest.mark.parametrize("call, name", [
    (lambda: tnp.layernorm_forward(np.zeros((2, 0)), np.zeros(0), np.zeros(0)), "x"),
    (lambda: tnp.attention_forward(np.zeros((1, 2, 4)), np.zeros((1, 0, 4)), np.zeros((1, 0, 4))), "K"),
    (lambda: tnp.attention_forward(np.zeros((1, 2, 0)), np.zeros((1, 2, 0)), np.zeros((1, 2, 3))), "d_k"),
    (lambda: tnp.mha_forward(np.zeros((1, 0, 4)), MHA, 2), "x"),
    (lambda: tnp.mha_forward(np.zeros((1, 3, 0)), {k: np.zeros((0, 0)) if k[0] == "W" else np.zeros(0) for k in MHA},
                             1), "x"),
])
def test_empty_dimensions_are_library_errors_naming_the_argument(call, name):
    with pytest.raises(InputValueError, match=name):
        call()


def test_a_huge_positional_table_is_refused_before_allocating(probe):
    rep = probe("""
        import transformer_np as tnp
        tnp.sinusoidal_positional_encoding(10**5, 10**5)
    """)
    assert rep["error"] == "ResourceLimitError", rep
    assert "sinusoidal_positional_encoding(100000, 100000)" in rep["message"] and "nothing was allocated" in rep[
        "message"]
    assert rep["max_rss_mb"] < 500 and rep["seconds"] < 1.0, rep
    with pytest.raises(ResourceLimitError):
        tnp.sinusoidal_positional_encoding(10**5, 10**5)
    assert tnp.sinusoidal_positional_encoding(3, 4, np.float32).dtype == np.float32
