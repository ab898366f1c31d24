"""The cache protocol of the stack (``transformer_np.ops.cache``): a backward with
``free_cache=True`` gives the same gradients and releases the cache as it goes; a cache that can
no longer be used — freed, or whose parameters changed since its forward — is refused with a
:class:`StaleCacheError` (a ``ValueError``) that names the reason, on both paths."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_np as tnp
from transformer_np.errors import StaleCacheError
from transformer_np.model.encoder import FREED_MESSAGE
from transformer_np.model.params import sub_params
from transformer_np.ops.cache import fingerprint
from transformer_np.perf.memory import cache_nbytes


def _cfg(**kw):
    base = dict(n_layers=2, d_model=16, n_heads=4, d_ff=32, vocab_size=50, max_len=12, dropout=0.0)
    base.update(kw)
    return tnp.EncoderConfig(**base)


def _run(cfg, training=False, ids=True, seed=0, fast=True, params=None):
    params = tnp.init_params(cfg, seed=seed, dtype="float64") if params is None else params
    rng = np.random.default_rng(seed)
    B, n = 3, 7
    mask = np.ones((B, n), dtype=np.int64)
    mask[1, 5:] = 0
    kw = dict(input_ids=rng.integers(0, cfg.vocab_size, (B, n))) if ids else \
        dict(inputs_embeds=rng.standard_normal((B, n, cfg.d_model)))
    H, cache = tnp.encoder_forward(params, cfg, attention_mask=mask, training=training,
                                   rng=np.random.default_rng(1), fast=fast, **kw)
    return H, cache, rng.standard_normal(H.shape)


# ----------------------------------------------------------------------------- freeing
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("training,ids", [(False, True), (True, True), (False, False)])
def test_free_cache_gives_the_same_gradients(norm, training, ids, fast):
    cfg = _cfg(norm_position=norm, dropout=0.1 if training else 0.0)
    _, cache_a, dH = _run(cfg, training, ids, fast=fast)
    _, cache_b, _ = _run(cfg, training, ids, fast=fast)
    ga, dh_a = tnp.encoder_backward(dH, cache_a, return_hidden_grads=True)
    gb, dh_b = tnp.encoder_backward(dH, cache_b, return_hidden_grads=True, free_cache=True)
    assert ga.keys() == gb.keys()
    for k in ga:   # exact: the same kernels on the same arrays; free_cache only drops references
        np.testing.assert_array_equal(ga[k], gb[k], err_msg=k)
    for a, b in zip(dh_a, dh_b):   # exact: as above
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fast", [True, False])
def test_free_cache_releases_the_layers_and_a_second_backward_errors(fast):
    cfg = _cfg()
    _, cache, dH = _run(cfg, fast=fast)
    before = cache_nbytes(cache)["total"]
    tnp.encoder_backward(dH, cache, free_cache=True)
    assert cache["layers"] == [None] * cfg.n_layers
    assert cache["attentions"] == [None] * cfg.n_layers
    assert cache["hidden_states"] == [None] * (cfg.n_layers + 1)
    assert "embeddings" not in cache
    assert cache_nbytes(cache)["total"] < before / 20      # only bookkeeping is left
    for free in (False, True):
        with pytest.raises(StaleCacheError, match="freed by a previous backward with free_cache=True"):
            tnp.encoder_backward(dH, cache, free_cache=free)


def test_default_backward_keeps_the_cache_reusable():
    cfg = _cfg()
    _, cache, dH = _run(cfg)
    g1 = tnp.encoder_backward(dH, cache)
    g2 = tnp.encoder_backward(dH, cache)
    for k in g1:   # exact: the same call twice on the same cache, one process
        np.testing.assert_array_equal(g1[k], g2[k])
    assert all(c is not None for c in cache["layers"])


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_layer_backward_free_cache(norm, fast):
    cfg = _cfg(norm_position=norm)
    p = sub_params(tnp.init_params(cfg, seed=0, dtype="float64"), "layers.0.")
    x = np.random.default_rng(0).standard_normal((2, 5, cfg.d_model))
    dy = np.random.default_rng(1).standard_normal(x.shape)
    _, c1 = tnp.encoder_layer_forward(x, p, cfg, fast=fast)
    _, c2 = tnp.encoder_layer_forward(x, p, cfg, fast=fast)
    dx1, g1 = tnp.encoder_layer_backward(dy, c1)
    dx2, g2 = tnp.encoder_layer_backward(dy, c2, free_cache=True)
    # exact: the same kernels on the same arrays; free_cache only drops references
    np.testing.assert_array_equal(dx1, dx2)
    for k in g1:   # exact: as above
        np.testing.assert_array_equal(g1[k], g2[k], err_msg=k)
    assert not ({"attn", "ffn", "ln1", "ln2"} & set(c2))    # every sublayer's cache was dropped
    with pytest.raises(StaleCacheError, match="freed by a previous backward"):
        tnp.encoder_layer_backward(dy, c2)


@pytest.mark.parametrize("fast", [True, False])
def test_op_level_free_cache_is_the_same_mechanism(fast):
    """mha_backward / ffn_backward with free_cache=True: same gradients, then StaleCacheError."""
    cfg = _cfg(n_layers=1)
    p = sub_params(tnp.init_params(cfg, seed=2, dtype="float64"), "layers.0.")
    x = np.random.default_rng(2).standard_normal((2, 5, cfg.d_model))
    dy = np.random.default_rng(3).standard_normal(x.shape)
    _, lc = tnp.encoder_layer_forward(x, p, cfg, fast=fast)
    for name, backward in (("attn", tnp.mha_backward), ("ffn", tnp.ffn_backward)):
        c = lc[name]
        dx1, g1 = backward(dy, c)
        dx2, g2 = backward(dy, c, free_cache=True)
        # exact: the same kernels on the same arrays; free_cache only drops references
        np.testing.assert_array_equal(dx1, dx2)
        for k in g1:   # exact: as above
            np.testing.assert_array_equal(g1[k], g2[k], err_msg=k)
        with pytest.raises(StaleCacheError, match="freed"):
            backward(dy, c)


def test_free_cache_must_be_a_bool():
    cfg = _cfg()
    _, cache, dH = _run(cfg)
    with pytest.raises(TypeError, match="free_cache"):
        tnp.encoder_backward(dH, cache, free_cache="yes")
    assert FREED_MESSAGE.startswith("this cache was freed")


# ----------------------------------------------------------------------------- stale parameters
def _change(params: dict, name: str, how: str) -> None:
    a = params[name]
    if how == "scale":
        a *= 3                                              # the reproducer
    elif how == "one element":
        a.reshape(-1)[5] *= 1 + 1e-9
    elif how == "swap rows":
        a[[0, 1]] = a[[1, 0]]
    elif how == "swap columns":
        a[:, [0, 1]] = a[:, [1, 0]]
    elif how == "zero a row":
        a[0] = 0
    elif how == "sign flip":
        a *= -1
    elif how == "replace":
        params[name] = a.copy()                             # equal values, another array
    elif how == "delete":
        del params[name]
    elif how == "optimiser step":
        a -= 1e-3 * np.ones_like(a)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("name", ["layers.1.ffn.W_2", "layers.0.attn.W_Q", "layers.0.ln1.gamma", "final_ln.beta",
                                  "embeddings.ln.gamma", "layers.1.attn.b_V"])
@pytest.mark.parametrize("how", ["scale", "one element", "swap rows", "swap columns", "zero a row", "sign flip",
                                 "replace", "delete", "optimiser step"])
def test_a_parameter_changed_between_forward_and_backward_is_refused(fast, name, how):
    cfg = _cfg(norm_position="pre", final_layer_norm=True)
    params = tnp.init_params(cfg, seed=0, dtype="float64")
    params[name] = params[name] + np.linspace(0.1, 1.0, params[name].size).reshape(params[name].shape)
    if how in ("swap rows", "swap columns", "zero a row") and params[name].ndim == 1:
        how = "one element"
    _, cache, dH = _run(cfg, fast=fast, params=params)
    _change(params, name, how)
    with pytest.raises(StaleCacheError, match=rf"params\['{name}'\]") as info:
        tnp.encoder_backward(dH, cache)
    assert isinstance(info.value, ValueError)               # what `except ValueError` always caught
    want = "no longer the array" if how in ("replace", "delete") else "changed in place"
    assert want in str(info.value)


def test_without_the_check_the_gradients_would_be_silently_wrong():
    """Why the check exists: the issue's reproducer gives a W_1 gradient error of order 1."""
    cfg = _cfg()
    params = tnp.init_params(cfg, seed=0, dtype="float64")
    _, cache, dH = _run(cfg, params=params)
    good = tnp.encoder_backward(dH, cache)["layers.1.ffn.W_1"]
    params["layers.1.ffn.W_2"] *= 3
    cache["guard"] = type("NoCheck", (), {"check": lambda self: None})()   # the check off, for this cache only
    stale = tnp.encoder_backward(dH, cache)["layers.1.ffn.W_1"]
    assert np.linalg.norm(stale - good) / np.linalg.norm(good) > 1.0


def test_a_change_undone_exactly_is_not_stale_and_a_new_forward_is_fresh():
    cfg = _cfg()
    params = tnp.init_params(cfg, seed=0, dtype="float64")
    _, cache, dH = _run(cfg, params=params)
    expected = tnp.encoder_backward(dH, cache)
    old = params["layers.0.ffn.W_1"].copy()
    params["layers.0.ffn.W_1"] += 1.0
    params["layers.0.ffn.W_1"][...] = old                    # the same bits again
    got = tnp.encoder_backward(dH, cache)
    for k in expected:   # exact: the same call twice on the same cache and the same bits
        np.testing.assert_array_equal(got[k], expected[k])
    params["layers.0.ffn.W_1"] *= 2
    _, cache, dH = _run(cfg, params=params)                  # forward again: its cache is fresh
    tnp.encoder_backward(dH, cache)


def test_lookup_tables_are_checked_for_replacement_only():
    """A lookup's backward never reads its table: changing the values leaves every gradient
    exactly as it was (no stale gradient is possible); replacing the array is still refused."""
    cfg = _cfg()
    params = tnp.init_params(cfg, seed=0, dtype="float64")
    _, cache, dH = _run(cfg, params=params)
    expected = tnp.encoder_backward(dH, cache)
    params["embeddings.word"] *= 3
    got = tnp.encoder_backward(dH, cache)
    for k in expected:   # exact: the same call twice on the same cache; the lookups' backward never reads the table
        np.testing.assert_array_equal(got[k], expected[k])
    params["embeddings.word"] = params["embeddings.word"].copy()
    with pytest.raises(StaleCacheError, match=r"params\['embeddings\.word'\] is no longer the array"):
        tnp.encoder_backward(dH, cache)


@pytest.mark.parametrize("fast", [True, False])
def test_layer_api_refuses_a_stale_cache_naming_the_parameter(fast):
    cfg = _cfg()
    params = tnp.init_params(cfg, seed=0, dtype="float64")
    p = sub_params(params, "layers.1.")
    x = np.random.default_rng(0).standard_normal((2, 5, cfg.d_model))
    y, c = tnp.encoder_layer_forward(x, p, cfg, fast=fast)
    params["layers.1.ffn.W_2"] *= 3                          # the same array as p["ffn.W_2"]
    with pytest.raises(StaleCacheError, match=r"p\['ffn\.W_2'\] was changed in place"):
        tnp.encoder_layer_backward(np.ones_like(y), c)


def test_a_layer_cache_of_the_stack_checks_the_models_parameters():
    cfg = _cfg()
    params = tnp.init_params(cfg, seed=0, dtype="float64")
    H, cache, _ = _run(cfg, params=params)
    tnp.encoder_layer_backward(np.ones_like(H), cache["layers"][1])
    params["layers.1.attn.W_O"] *= 3
    with pytest.raises(StaleCacheError, match=r"params\['layers\.1\.attn\.W_O'\]"):
        tnp.encoder_layer_backward(np.ones_like(H), cache["layers"][1])


def test_shared_layers_are_checked_once_under_their_one_name():
    cfg = _cfg(n_layers=3, share_layers=True)
    params = tnp.init_params(cfg, seed=0, dtype="float64")
    _, cache, dH = _run(cfg, params=params)
    params["layers.0.ln2.gamma"][3] += 0.5
    with pytest.raises(StaleCacheError, match=r"params\['layers\.0\.ln2\.gamma'\]"):
        tnp.encoder_backward(dH, cache)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(5,), (3, 4), (3, 5), (1, 1), (0,), (4, 0), (2, 3, 3), (64, 48)])
def test_fingerprint_sees_a_change_of_any_one_element(dtype, shape):
    """A vector's fingerprint is a copy (any change); a matrix's sees any entry moved by more than
    its rounding: here by 1e-4 (float32) or 1e-12 (float64) times the entries' size, at every position."""
    a = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    before = fingerprint(a)
    step = (1e-4 if dtype == np.float32 else 1e-12) * float(np.sqrt(np.mean(a.astype(np.float64) ** 2))) \
        if a.ndim > 1 and a.size else 0.0
    for i in range(a.size):
        b = a.copy()
        x = b.reshape(-1)
        # one ulp in the array's own dtype (np.inf as a dtype scalar: under NumPy 1.x promotion a Python
        # float would make nextafter compute in float64, and the step would round away on assignment)
        x[i] = x[i] + step if b.ndim > 1 else np.nextafter(x[i], x.dtype.type(np.inf))
        assert x[i] != a.reshape(-1)[i], i                              # the element really changed
        assert not np.array_equal(fingerprint(b), before), i          # exact: fingerprints are compared bit for bit
    assert np.array_equal(fingerprint(a.copy()), before)   # exact: the same function on equal arrays, one process
    if a.ndim == 2 and min(a.shape) > 1:        # exact comparisons below: fingerprints are compared bit for bit
        assert not np.array_equal(fingerprint(a[[1, 0] + list(range(2, a.shape[0]))]), before)   # rows swapped
        assert not np.array_equal(fingerprint(a[:, [1, 0] + list(range(2, a.shape[1]))]), before)   # exact: columns
        assert not np.array_equal(fingerprint(-a), before)             # exact: negated
        t = a.T                                                         # a non-contiguous view
        np.testing.assert_array_equal(fingerprint(t), fingerprint(t))    # exact: deterministic on a strided view too
        np.testing.assert_allclose(fingerprint(t), fingerprint(np.ascontiguousarray(t)), rtol=0,
                                   atol=1e-5 * float(np.abs(fingerprint(t)).max()))


def test_the_documented_blind_spot_changes_nothing_that_matters():
    """One ulp of one matrix entry may go unseen (module docstring); the gradients of the stale
    cache then differ from a fresh forward's by no more than rounding."""
    cfg = _cfg()
    params = tnp.init_params(cfg, seed=0, dtype="float64")
    _, cache, dH = _run(cfg, params=params)
    W = params["layers.1.ffn.W_1"]
    before = fingerprint(W)
    W[2, 3] = np.nextafter(W[2, 3], np.inf)
    assert np.array_equal(fingerprint(W), before)                # exact: the blind spot, as documented
    stale = tnp.encoder_backward(dH, cache)                      # so no error
    _, fresh_cache, _ = _run(cfg, params=params)
    fresh = tnp.encoder_backward(dH, fresh_cache)
    for k in fresh:
        assert np.linalg.norm(stale[k] - fresh[k]) <= 1e-12 * max(np.linalg.norm(fresh[k]), 1e-300), k
