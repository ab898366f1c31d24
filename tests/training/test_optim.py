"""Optimisers, clipping and schedules against PyTorch / Hugging Face, and state save/load."""

from __future__ import annotations

import math

import numpy as np
import pytest

from transformer_np.training.optim import (
    SGD,
    AdamW,
    InverseSqrtSchedule,
    WarmupCosineSchedule,
    WarmupLinearSchedule,
    clip_grad_norm,
    global_grad_norm,
    make_schedule,
    noam_schedule,
)

pytestmark = pytest.mark.torch  # test lane (pyproject.toml markers)
torch = pytest.importorskip("torch", reason="the reference tests need torch (pip install torch==2.13.0)")

SHAPES = {"layers.0.attn.W_Q": (4, 4), "layers.0.attn.b_Q": (4,), "embeddings.word": (7, 4)}


def _params(seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.normal(size=s) for k, s in SHAPES.items()}


def _grad_stream(seed, steps):
    rng = np.random.default_rng(seed + 100)
    return [{k: rng.normal(size=s) for k, s in SHAPES.items()} for _ in range(steps)]


def _torch_params(params):
    return {k: torch.tensor(v.copy(), dtype=torch.float64, requires_grad=True) for k, v in params.items()}


def _run_torch(tparams, topt, grads_seq, sched=None):
    for grads in grads_seq:
        for k, p in tparams.items():
            p.grad = torch.tensor(grads[k]) if k in grads else None
        topt.step()
        if sched is not None:
            sched.step()
    return {k: p.detach().numpy() for k, p in tparams.items()}


def _max_diff(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


@pytest.mark.parametrize("wd,betas,eps,lr", [(0.01, (0.9, 0.999), 1e-8, 1e-3),
                                             (0.1, (0.8, 0.95), 1e-6, 3e-2),
                                             (0.0, (0.9, 0.999), 1e-8, 1e-1)])
def test_adamw_matches_torch_over_10_steps(wd, betas, eps, lr):
    params = _params()
    tparams = _torch_params(params)
    grads = _grad_stream(0, 10)
    opt = AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    for g in grads:
        opt.step(g)
    ref = _run_torch(tparams, torch.optim.AdamW(list(tparams.values()), lr=lr, betas=betas, eps=eps,
                                                weight_decay=wd), grads)
    assert _max_diff(params, ref) < 1e-12
    assert _max_diff(params, _params()) > 1e-3          # and the parameters did move


def test_adamw_with_schedule_matches_torch_lambdalr():
    params = _params(1)
    tparams = _torch_params(params)
    grads = _grad_stream(1, 10)
    sched = WarmupCosineSchedule(1e-2, warmup_steps=3, total_steps=10)
    opt = AdamW(params, lr=sched, weight_decay=0.05)
    used = [opt.step(g) for g in grads]
    topt = torch.optim.AdamW(list(tparams.values()), lr=1e-2, weight_decay=0.05)
    tsched = torch.optim.lr_scheduler.LambdaLR(topt, sched.factor)
    ref = _run_torch(tparams, topt, grads, tsched)
    assert _max_diff(params, ref) < 1e-12
    assert used[0] == 0.0 and used[3] == pytest.approx(1e-2)


def test_parameters_without_gradient_are_skipped_like_torch():
    params = _params(2)
    params["pooler.W"] = np.ones((4, 4))
    tparams = _torch_params(params)
    grads = _grad_stream(2, 10)
    for t, g in enumerate(grads):           # embeddings.word only gets gradients on odd steps
        if t % 2 == 0:
            del g["embeddings.word"]
    opt = AdamW(params, lr=1e-2, weight_decay=0.1)
    for g in grads:
        opt.step(g)
    ref = _run_torch(tparams, torch.optim.AdamW(list(tparams.values()), lr=1e-2, weight_decay=0.1), grads)
    assert _max_diff(params, ref) < 1e-12
    assert np.array_equal(params["pooler.W"], np.ones((4, 4)))   # exact: never had a gradient: untouched
    assert opt.state["embeddings.word"]["step"] == 5


@pytest.mark.parametrize("kw", [dict(momentum=0.9), dict(momentum=0.9, nesterov=True, weight_decay=0.01),
                                dict(momentum=0.5, dampening=0.3), dict()])
def test_sgd_matches_torch(kw):
    params = _params(3)
    tparams = _torch_params(params)
    grads = _grad_stream(3, 10)
    opt = SGD(params, lr=0.05, **kw)
    for g in grads:
        opt.step(g)
    ref = _run_torch(tparams, torch.optim.SGD(list(tparams.values()), lr=0.05, **kw), grads)
    assert _max_diff(params, ref) < 1e-12


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(max_norm):
    grads = _grad_stream(4, 1)[0]
    tparams = _torch_params(grads)
    for k, p in tparams.items():
        p.grad = torch.tensor(grads[k].copy())
    expected = float(torch.nn.utils.clip_grad_norm_(list(tparams.values()), max_norm))
    before = {k: v.copy() for k, v in grads.items()}
    norm = clip_grad_norm(grads, max_norm)
    assert norm == pytest.approx(expected, rel=1e-12)
    assert _max_diff(grads, {k: p.grad.numpy() for k, p in tparams.items()}) < 1e-12
    if max_norm < norm:
        assert global_grad_norm(grads) == pytest.approx(max_norm, rel=1e-5)
    else:
        assert _max_diff(grads, before) == 0.0


def test_linear_and_cosine_schedules_match_transformers():
    tr = pytest.importorskip("transformers", reason="needs transformers (pip install transformers)")
    for ours, make in ((WarmupLinearSchedule(2e-3, 10, 50), tr.get_linear_schedule_with_warmup),
                       (WarmupCosineSchedule(2e-3, 10, 50), tr.get_cosine_schedule_with_warmup)):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=2e-3)
        sched = make(opt, num_warmup_steps=10, num_training_steps=50)
        for t in range(60):
            assert ours(t) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12, abs=1e-18), (type(ours), t)
            opt.step()
            sched.step()


def test_schedule_values_at_chosen_steps():
    lin = WarmupLinearSchedule(1e-3, warmup_steps=10, total_steps=110)
    assert [lin(t) for t in (0, 5, 10, 60, 110, 200)] == pytest.approx([0, 5e-4, 1e-3, 5e-4, 0, 0])
    const = WarmupLinearSchedule(1e-3, warmup_steps=4)                       # warm-up, then constant
    assert [const(t) for t in (0, 2, 4, 1000)] == pytest.approx([0, 5e-4, 1e-3, 1e-3])
    cos = WarmupCosineSchedule(1e-3, warmup_steps=10, total_steps=110)
    assert [cos(t) for t in (5, 10, 60, 110)] == pytest.approx([5e-4, 1e-3, 5e-4, 0], abs=1e-15)
    assert cos(35) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 4)))
    inv = InverseSqrtSchedule(1e-3, warmup_steps=100)
    assert [inv(t) for t in (0, 49, 99, 399)] == pytest.approx([1e-5, 5e-4, 1e-3, 5e-4])


def test_noam_is_the_papers_formula():
    d, w = 512, 4000
    sched = noam_schedule(d, w)
    for s in (1, 100, 3999, 4000, 4001, 10000, 100000):                   # the paper counts from s = 1
        paper = d ** -0.5 * min(s ** -0.5, s * w ** -1.5)
        assert sched(s - 1) == pytest.approx(paper, rel=1e-12)
    peak = max(sched(t) for t in range(0, 8000))
    assert peak == pytest.approx(d ** -0.5 * w ** -0.5, rel=1e-12)
    assert make_schedule(sched.to_dict())(1234) == sched(1234)


@pytest.mark.parametrize("cls,kw", [(AdamW, dict(lr=WarmupLinearSchedule(1e-2, 3, 10), weight_decay=0.1)),
                                    (SGD, dict(lr=0.1, momentum=0.9))])
def test_state_save_load_resumes_exactly(tmp_path, cls, kw):
    grads = _grad_stream(5, 10)
    full = _params(5)
    opt = cls(full, **kw)
    for g in grads:
        opt.step(g)

    half = _params(5)
    opt1 = cls(half, **kw)
    for g in grads[:5]:
        opt1.step(g)
    np.savez(tmp_path / "state.npz", **opt1.state_dict())
    resumed = {k: v.copy() for k, v in half.items()}
    opt2 = cls(resumed, **kw)
    with np.load(tmp_path / "state.npz", allow_pickle=False) as z:
        opt2.load_state_dict({k: z[k] for k in z.files})
    assert opt2.t == 5 and opt2.lr == opt1.lr
    for g in grads[5:]:
        opt2.step(g)
    for k in full:
        assert np.array_equal(full[k], resumed[k]), k   # exact: restored state, the same steps


def test_bad_input_is_named():
    params = _params()
    with pytest.raises(ValueError, match="lr"):
        AdamW(params, lr=-1.0)
    with pytest.raises(ValueError, match="betas\\[1\\]"):
        AdamW(params, betas=(0.9, 1.0))
    with pytest.raises(TypeError, match="params"):
        AdamW([np.zeros(3)])
    opt = AdamW(params)
    with pytest.raises(ValueError, match="not parameters"):
        opt.step({"nope": np.zeros(3)})
    with pytest.raises(ValueError, match="shape"):
        opt.step({"embeddings.word": np.zeros(3)})
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm({"a": np.ones(2)}, 0.0)
    with pytest.raises(ValueError, match="nesterov"):
        SGD(params, momentum=0.0, nesterov=True)
