"""Parity with ``torch.nn.TransformerEncoder`` through :func:`from_torch` / :func:`to_torch_state_dict`.

Grid: norm_first × activation × batch_first × padding, 2 layers, float64, every weight
randomised (LayerNorm γ/β and biases included), a random upstream gradient R.
Checked: the output, the gradient of every torch parameter (our grads mapped back with
``to_torch_state_dict``), the gradient of the input. Criterion ‖ours − torch‖/‖torch‖ ≤ 1e-10.

What each side computes at padded positions (tested below):
* transformer_np: a padded *query* still attends, over the real keys only; its output is
  finite and ordinary. Padded keys get weight exactly 0.
* torch in training mode, or with autograd recording (the "slow path"): the same.
* torch's eval "fast path" (``model.eval()`` under ``torch.no_grad()``, Post-LN,
  ``batch_first=True``, ``enable_nested_tensor``): the batch becomes a nested tensor
  without the padded positions, and they come back as exactly 0.0. Real positions agree.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from helpers import nrel, randomise_

pytestmark = pytest.mark.torch  # test lane (pyproject.toml markers)

torch = pytest.importorskip("torch", reason="parity tests need PyTorch: pip install torch==2.13.0 "
                                            "(or pip install -e '.[test]')")

from transformer_np import (  # noqa: E402
    EncoderConfig,
    encoder_backward,
    encoder_forward,
)
from transformer_np.io.interop import (  # noqa: E402
    from_torch,
    params_from_torch_state_dict,
    to_torch_state_dict,
    torch_state_dict_from_params,
)
from transformer_np.model.gradcheck import random_params  # noqa: E402

pytestmark = pytest.mark.torch
TOL64, TOL32 = 1e-10, 1e-5
B, N_POS, D, N_HEADS, D_FF, EPS = 3, 5, 8, 2, 16, 1e-6






def build(norm_first, activation, batch_first, final_norm=None, n_layers=2, dtype=torch.float64, seed=0):
    layer = torch.nn.TransformerEncoderLayer(D, N_HEADS, D_FF, dropout=0.0, activation=activation,
                                             layer_norm_eps=EPS, batch_first=batch_first,
                                             norm_first=norm_first, dtype=dtype)
    if final_norm is None:
        final_norm = norm_first                  # the usual pairing: Pre-LN ends with a LayerNorm
    norm = torch.nn.LayerNorm(D, eps=EPS, dtype=dtype) if final_norm else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # "enable_nested_tensor is True, but ..." for norm_first
        enc = torch.nn.TransformerEncoder(layer, n_layers, norm=norm)
    randomise_(enc, seed)
    return enc


def inputs(padding: bool, dtype=np.float64, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, N_POS, D)).astype(dtype)                  # H^(0): (B, n, d)
    am = np.ones((B, N_POS), dtype=np.int64)
    if padding:
        am[1, 3:] = 0
        am[2, 1:] = 0                                                 # a single real token
    return x, am


def run_torch(enc, x, am, batch_first, R=None, padding=True):
    """Torch forward (+ backward with upstream R); inputs/outputs in our (B, n, d) layout."""
    def to_t(a):
        return torch.tensor(a if batch_first else a.transpose(1, 0, 2).copy())

    def from_t(t):
        a = t.detach().numpy()
        return a if batch_first else a.transpose(1, 0, 2)

    xt = to_t(x).requires_grad_(R is not None)
    kpm = torch.tensor(am == 0) if padding else None
    out = enc(xt, src_key_padding_mask=kpm)
    if R is None:
        return from_t(out), None
    out.backward(to_t(R))
    return from_t(out), from_t(xt.grad)


GRID = [(nf, act, bf, pad) for nf in (False, True) for act in ("relu", "gelu")
        for bf in (False, True) for pad in (False, True)]


@pytest.mark.parametrize("norm_first, activation, batch_first, padding", GRID,
                         ids=[f"{'pre' if nf else 'post'}-{a}-{'bf' if bf else 'sf'}-{'pad' if p else 'nopad'}"
                              for nf, a, bf, p in GRID])
def test_transformer_encoder_output_and_every_gradient(norm_first, activation, batch_first, padding):
    enc = build(norm_first, activation, batch_first)
    enc.train()                                   # dropout is 0; train() keeps torch on the slow path
    config, params = from_torch(enc)
    assert config.norm_position == ("pre" if norm_first else "post")
    assert config.activation == activation and config.use_final_layer_norm == norm_first
    x, am = inputs(padding)
    R = np.random.default_rng(2).normal(size=x.shape)                 # random upstream gradient

    H, cache = encoder_forward(params, config, inputs_embeds=x, attention_mask=am if padding else None)
    grads = encoder_backward(R, cache)
    out_t, dx_t = run_torch(enc, x, am, batch_first, R, padding)

    real = am.astype(bool)
    assert nrel(H[real], out_t[real]) <= TOL64
    if padding:                                   # slow path: padded positions are computed alike
        assert nrel(H[~real], out_t[~real]) <= TOL64
    assert nrel(grads["inputs_embeds"], dx_t) <= TOL64
    mapped = to_torch_state_dict(grads, config)
    torch_params = dict(enc.named_parameters())
    assert set(mapped) == set(torch_params)
    for name, p in torch_params.items():
        assert nrel(mapped[name].numpy(), p.grad) <= TOL64, name


@pytest.mark.parametrize("norm_first, final_norm", [(False, True), (True, False)],
                         ids=["post-with-final-norm", "pre-without-final-norm"])
def test_unusual_final_norm_pairings(norm_first, final_norm):
    enc = build(norm_first, "gelu", True, final_norm=final_norm, seed=3)
    enc.train()
    config, params = from_torch(enc)
    assert config.use_final_layer_norm is final_norm
    assert ("final_ln.gamma" in params) is final_norm
    x, am = inputs(True)
    R = np.random.default_rng(4).normal(size=x.shape)
    H, cache = encoder_forward(params, config, inputs_embeds=x, attention_mask=am)
    grads = encoder_backward(R, cache)
    out_t, dx_t = run_torch(enc, x, am, True, R)
    assert nrel(H, out_t) <= TOL64
    assert nrel(grads["inputs_embeds"], dx_t) <= TOL64
    mapped = to_torch_state_dict(grads, config)
    for name, p in enc.named_parameters():
        assert nrel(mapped[name].numpy(), p.grad) <= TOL64, name


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_eval_fast_path_zeros_padded_positions():
    """Post-LN, batch_first, eval, no_grad: torch's nested-tensor fast path returns 0.0 at
    padded positions; real positions still match ours to 1e-10."""
    enc = build(False, "relu", True, seed=5)
    enc.eval()
    config, params = from_torch(enc)
    x, am = inputs(True)
    H, _ = encoder_forward(params, config, inputs_embeds=x, attention_mask=am)
    # the fast path is a global torch switch (the benchmark turns it off to time the eager
    # layer): make sure it is on here, and leave it as we found it
    was_enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(True)
    try:
        with torch.no_grad():
            out_t, _ = run_torch(enc, x, am, True)
    finally:
        torch.backends.mha.set_fastpath_enabled(was_enabled)
    real = am.astype(bool)
    assert nrel(H[real], out_t[real]) <= TOL64
    assert np.all(out_t[~real] == 0.0)                    # the fast path's zeros …
    assert np.all(np.isfinite(H[~real])) and np.abs(H[~real]).min() > 0   # … ours: ordinary values


def test_single_encoder_layer():
    layer = torch.nn.TransformerEncoderLayer(D, N_HEADS, D_FF, dropout=0.0, activation=torch.nn.functional.gelu,
                                             layer_norm_eps=EPS, batch_first=True, norm_first=True,
                                             dtype=torch.float64)
    randomise_(layer, 6)
    layer.train()
    config, params = from_torch(layer)
    assert config.n_layers == 1 and not config.use_final_layer_norm and config.activation == "gelu"
    x, am = inputs(True)
    R = np.random.default_rng(7).normal(size=x.shape)
    H, cache = encoder_forward(params, config, inputs_embeds=x, attention_mask=am)
    grads = encoder_backward(R, cache)
    out_t, dx_t = run_torch(layer, x, am, True, R)
    assert nrel(H, out_t) <= TOL64
    assert nrel(grads["inputs_embeds"], dx_t) <= TOL64
    mapped = to_torch_state_dict(grads, config)            # a bare layer in, the bare layer's names out
    assert set(mapped) == {name for name, _ in layer.named_parameters()}
    for name, p in layer.named_parameters():
        assert nrel(mapped[name].numpy(), p.grad) <= TOL64, name
    explicit = to_torch_state_dict(grads, config, single_layer=True)   # the old spelling still works
    assert all(torch.equal(explicit[k], mapped[k]) for k in mapped)


# activation modules: the name each maps to, and the layer's output against torch's (an exact GELU read as the
# tanh approximation, or the reverse, differs by ~1e-4 relative: far outside TOL64). Against torch's op-by-op
# path: its eval fast path (the fused encoder-layer kernel under no_grad) computes the EXACT GELU for
# nn.GELU(approximate="tanh") — it only asks whether the activation is a GELU — 4e-5 relative away from what
# the same layer computes in training (torch 2.13; found here). The module's own function is the tanh one.
@pytest.mark.parametrize("module,name", [(torch.nn.GELU(), "gelu"), (torch.nn.GELU(approximate="tanh"), "gelu_tanh"),
                                         (torch.nn.ReLU(), "relu"), ("gelu", "gelu"), ("relu", "relu")])
def test_activation_modules_map_to_their_function(module, name):
    layer = torch.nn.TransformerEncoderLayer(D, N_HEADS, D_FF, dropout=0.0, activation=module, layer_norm_eps=EPS,
                                             batch_first=True, dtype=torch.float64)
    randomise_(layer, 8)
    layer.eval()
    config, params = from_torch(layer)
    assert config.activation == name
    x, _ = inputs(False)
    H, _ = encoder_forward(params, config, inputs_embeds=x)
    was = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)         # op by op (see above); the switch is global
    try:
        with torch.no_grad():
            out_t = layer(torch.from_numpy(x)).numpy()
    finally:
        torch.backends.mha.set_fastpath_enabled(was)
    assert nrel(H, out_t) <= TOL64


def test_bare_layer_config_equals_the_plain_one_and_round_trips():
    """from_torch(layer) gives a TorchLayerConfig: equal to the plain EncoderConfig, hashable the same, and
    every export / import defaults to the layer's own names; single_layer=False still forces layers.0.*."""
    layer = _layer(norm_first=True, dtype=torch.float64)
    config, params = from_torch(layer)
    plain = EncoderConfig(**config.to_dict())
    assert config == plain and plain == config and hash(config) == hash(plain)
    assert type(config).__name__ == "TorchLayerConfig" and type(plain) is EncoderConfig
    sd = torch_state_dict_from_params(params, config)
    assert set(sd) == set(layer.state_dict())
    for name, t in layer.state_dict().items():
        assert np.array_equal(sd[name], t.numpy()), name   # exact: copied
    again = params_from_torch_state_dict(layer.state_dict(), config)
    assert all(np.array_equal(again[k], params[k]) for k in params)   # exact: copied back
    assert set(to_torch_state_dict(params, config, single_layer=False)) == {"layers.0." + k for k in sd}
    assert set(to_torch_state_dict(params, plain)) == {"layers.0." + k for k in sd}    # a plain config: the stack
    two = config.replace(n_layers=2)                                                # no longer a single layer
    assert set(torch_state_dict_from_params(random_params(two), two)) >= {"layers.1.linear1.weight"}


def test_float32_outputs():
    enc = build(True, "gelu", True, dtype=torch.float32, seed=8)
    enc.train()
    config, params = from_torch(enc)
    assert params["layers.0.attn.W_Q"].dtype == np.float32
    x, am = inputs(True, dtype=np.float32)
    H, _ = encoder_forward(params, config, inputs_embeds=x, attention_mask=am)
    with torch.no_grad():
        out_t, _ = run_torch(enc, x, am, True)
    assert H.dtype == np.float32
    assert nrel(H, out_t) <= TOL32


# ----------------------------------------------------------------------------- round trips / export
@pytest.mark.parametrize("norm_first", [False, True])
def test_round_trip_is_exact(norm_first):
    enc = build(norm_first, "relu", False, seed=9)
    config, params = from_torch(enc)
    sd = to_torch_state_dict(params, config)
    for name, t in enc.state_dict().items():
        assert torch.equal(sd[name], t), name                      # torch → ours → torch: bit for bit
    again = params_from_torch_state_dict(torch_state_dict_from_params(params, config), config)
    assert list(again) == list(params)
    for k in params:
        # exact: the round trip copies values
        assert np.array_equal(again[k], params[k]), k              # ours → torch → ours: bit for bit


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_model_built_here_runs_in_torch(norm_position):
    """A model initialised in transformer_np, exported, gives torch's output."""
    config = EncoderConfig(n_layers=2, d_model=D, n_heads=N_HEADS, d_ff=D_FF, activation="gelu",
                           norm_position=norm_position, layer_norm_eps=EPS, dropout=0.0, vocab_size=None)
    params = random_params(config, seed=10)
    enc = build(norm_position == "pre", "gelu", True, final_norm=config.use_final_layer_norm)
    enc.load_state_dict(to_torch_state_dict(params, config), strict=True)
    enc.train()
    x, am = inputs(True)
    H_ours, _ = encoder_forward(params, config, inputs_embeds=x, attention_mask=am)
    with torch.no_grad():
        out_t, _ = run_torch(enc, x, am, True)
    assert nrel(H_ours, out_t) <= TOL64


# ----------------------------------------------------------------------------- unsupported options
def _layer(**kw):
    base = dict(d_model=D, nhead=N_HEADS, dim_feedforward=D_FF, dropout=0.0, batch_first=True)
    base.update(kw)
    return torch.nn.TransformerEncoderLayer(**base)


def test_rejects_bias_false():
    with pytest.raises(ValueError, match="bias=False"):
        from_torch(_layer(bias=False))


def test_rejects_custom_activation():
    with pytest.raises(ValueError, match="activation"):
        from_torch(_layer(activation=lambda t: torch.tanh(t)))


def test_rejects_kdim_vdim():
    layer = _layer()
    layer.self_attn = torch.nn.MultiheadAttention(D, N_HEADS, kdim=4, vdim=4, batch_first=True)
    with pytest.raises(ValueError, match="kdim"):
        from_torch(layer)


def test_rejects_add_bias_kv():
    layer = _layer()
    layer.self_attn = torch.nn.MultiheadAttention(D, N_HEADS, add_bias_kv=True, batch_first=True)
    with pytest.raises(ValueError, match="add_bias_kv"):
        from_torch(layer)


def test_rejects_layers_that_differ():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = torch.nn.TransformerEncoder(_layer(), 2)
    enc.layers[1].norm1.eps = 1e-3
    enc.layers[1].norm2.eps = 1e-3
    with pytest.raises(ValueError, match=r"layers\[1\] differs.*layer_norm_eps"):
        from_torch(enc)


def test_rejects_final_norm_with_other_eps_or_kind():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = torch.nn.TransformerEncoder(_layer(layer_norm_eps=1e-5), 2, norm=torch.nn.LayerNorm(D, eps=1e-6))
    with pytest.raises(ValueError, match="norm.eps"):
        from_torch(enc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = torch.nn.TransformerEncoder(_layer(), 2, norm=torch.nn.RMSNorm(D))
    with pytest.raises(ValueError, match="module.norm must be an nn.LayerNorm"):
        from_torch(enc)


def test_rejects_non_encoder_module():
    with pytest.raises(TypeError, match="TransformerEncoderLayer"):
        from_torch(torch.nn.Linear(3, 3))


def test_export_rejects_embeddings_config():
    config = EncoderConfig(n_layers=1, d_model=D, n_heads=N_HEADS, d_ff=D_FF, vocab_size=11)
    with pytest.raises(ValueError, match="vocab_size"):
        to_torch_state_dict(random_params(config), config)
