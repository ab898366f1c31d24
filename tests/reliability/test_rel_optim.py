"""Issue 16, optimisers and schedules: every value checked at use, state dicts checked on load, and a
refusal leaves parameters and state exactly as they were."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_np.errors import InputTypeError, InputValueError, NonFiniteError
from transformer_np.training.optim import SGD, AdamW, clip_grad_norm


def _params():
    rng = np.random.default_rng(0)
    return {"a.W": rng.standard_normal((3, 4)), "a.b": rng.standard_normal(4)}


def _grads(params):
    return {k: np.ones_like(v) for k, v in params.items()}


@pytest.mark.parametrize("value, cls, match", [
    (float("nan"), NonFiniteError, r"schedule returned nan at step 1; a learning rate must be finite"),
    (float("inf"), NonFiniteError, r"returned inf at step 1"),
    (-1.0, InputValueError, r"returned -1.0 at step 1; a learning rate must be >= 0 \(a negative one is gradient"),
    ("0.1", InputTypeError, r"must return a number at step 1"),
    (None, InputTypeError, r"must return a number at step 1"),
])
@pytest.mark.parametrize("opt_cls", [AdamW, SGD])
def test_a_bad_schedule_value_stops_the_step_before_any_change(opt_cls, value, cls, match):
    params = _params()
    opt = opt_cls(params, lr=lambda t: 1e-2 if t == 0 else value)
    opt.step(_grads(params))                                      # step 0 is fine
    before = {k: v.copy() for k, v in params.items()}
    state_before = opt.state_dict()
    with pytest.raises(cls, match=match):
        opt.step(_grads(params))
    for k in params:
        np.testing.assert_array_equal(params[k], before[k])   # exact: a refused step changes nothing
    after = opt.state_dict()
    # exact: a refused step changes nothing
    assert after.keys() == state_before.keys() and all(np.array_equal(after[k], state_before[k]) for k in after)
    with pytest.raises(cls):
        _ = opt.lr


def _trained_adamw():
    params = _params()
    opt = AdamW(params, lr=1e-2)
    for _ in range(3):
        opt.step(_grads(params))
    return params, opt


@pytest.mark.parametrize("change, cls, match", [
    (lambda d: d.update(t=np.array(-3)), InputValueError, r"state\['t'\] must be >= 0, got -3"),
    (lambda d: d.update(t=np.array(2.5)), InputTypeError, r"state\['t'\] must be an integer scalar"),
    (lambda d: d.update({"step.a.W": np.array(-1)}), InputValueError, r"'step.a.W' must be >= 0, got -1"),
    (lambda d: d.update({"step.a.W": np.array(4)}), InputValueError, r"'step.a.W' must be <= t = 3, got 4"),
    (lambda d: d.update({"step.a.W": np.array(12.7)}), InputTypeError, r"'step.a.W' must be an integer scalar"),
    (lambda d: d.update({"exp_avg_sq.a.W": -np.ones((3, 4))}), InputValueError, r"'exp_avg_sq.a.W' must be >= 0"),
    (lambda d: d.update({"exp_avg.a.b": np.full(4, np.nan)}), NonFiniteError, r"'exp_avg.a.b' contains NaN/inf"),
    (lambda d: d.update({"exp_avg.a.b": np.zeros(5)}), InputValueError, r"'exp_avg.a.b' must have shape \(4,\)"),
    (lambda d: d.update({"nodot": np.zeros(1)}), InputValueError, r"key 'nodot' must be 't', 'step.<param>'"),
    (lambda d: d.update({"momentum_buffer.a.W": np.zeros((3, 4))}), InputValueError,
     r"unknown optimizer state entry 'momentum_buffer.a.W'"),
    (lambda d: d.update({"step.z": np.array(1)}), InputValueError, r"names a parameter that does not exist: 'z'"),
    (lambda d: d.pop("exp_avg_sq.a.W"), InputValueError, r"'a.W' at step 3 must have the entries"),
    (lambda d: d.pop("step.a.b"), InputValueError, r"has \['exp_avg', 'exp_avg_sq'\] for 'a.b' but no 'step.a.b'"),
])
def test_adamw_state_dict_is_checked_in_full(change, cls, match):
    params, opt = _trained_adamw()
    d = opt.state_dict()
    change(d)
    fresh = AdamW(_params(), lr=1e-2)
    with pytest.raises(cls, match=match):
        fresh.load_state_dict(d)
    assert fresh.t == 0 and fresh.state == {}                     # nothing was restored


def test_a_valid_state_dict_resumes_exactly():
    params, opt = _trained_adamw()
    p2 = {k: v.copy() for k, v in params.items()}
    opt2 = AdamW(p2, lr=1e-2)
    opt2.load_state_dict(opt.state_dict())
    opt.step(_grads(params))
    opt2.step(_grads(p2))
    for k in params:
        np.testing.assert_array_equal(params[k], p2[k])   # exact: restored state, the same step


def test_sgd_state_needs_its_momentum_buffer():
    params = _params()
    opt = SGD(params, lr=0.1, momentum=0.9)
    opt.step(_grads(params))
    d = opt.state_dict()
    d.pop("momentum_buffer.a.W")
    with pytest.raises(InputValueError, match=r"'a.W' at step 1 must have the entries \['momentum_buffer'\]"):
        SGD(_params(), lr=0.1, momentum=0.9).load_state_dict(d)


def test_clip_grad_norm_refuses_non_finite_gradients():
    g = {"a": np.array([1.0, np.nan])}
    with pytest.raises(NonFiniteError, match="grads contain NaN/inf"):
        clip_grad_norm(g, 1.0)


def test_adamw_eps_zero_is_refused():
    with pytest.raises(ValueError, match="eps must be > 0"):
        AdamW(_params(), eps=0.0)
