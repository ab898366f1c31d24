"""The memory estimates of transformer_np.model.budget against what the work really allocates
(tracemalloc peaks): an estimate must not be below the measured peak (it decides whether to start)
nor wildly above it (it would refuse work that fits). Measured ratios: 1.1–2.1."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from transformer_np.course.gradflow import measure, measure_estimate
from transformer_np.model.budget import MemoryEstimate, estimate_encoder, format_bytes
from transformer_np.model.config import EncoderConfig
from transformer_np.model.encoder import encoder_backward, encoder_forward
from transformer_np.model.params import init_params
from transformer_np.training.loop import RunConfig, build, estimate_run, train_step

LOW, HIGH = 1.0, 3.0


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("N, d, h, f, B, n, dtype, training", [
    (2, 32, 4, 128, 16, 9, np.float32, True),
    (2, 64, 4, 256, 8, 64, np.float64, False),
    (3, 16, 2, 64, 4, 256, np.float64, True),
    (1, 256, 4, 1024, 2, 16, np.float32, False),
])
def test_encoder_forward_backward_estimate(N, d, h, f, B, n, dtype, training):
    cfg = EncoderConfig(N, d, h, f, vocab_size=50, max_len=max(n, 8), dropout=0.1)
    params = init_params(cfg, dtype=dtype)
    ids = np.random.default_rng(0).integers(0, 50, (B, n))

    def work():
        H, cache = encoder_forward(params, cfg, input_ids=ids, training=training, rng=np.random.default_rng(1))
        encoder_backward(np.ones_like(H), cache)

    est = estimate_encoder(cfg, dtype, B, n, backward=True)
    without_params = est.total - est.parts["parameters"] - est.parts["parameter table"]
    ratio = without_params / _peak(work)
    assert LOW <= ratio <= HIGH, ratio


@pytest.mark.parametrize("kw", [dict(), dict(task="mlm", layers=2, d_model=64),
                                dict(layers=4, d_model=64, batch_size=32, dtype="float64"),
                                dict(task="tag", seq_len=65, batch_size=8)])
def test_training_run_estimate(kw):
    cfg = RunConfig(steps=2, **kw)

    def work():
        state = build(cfg)
        train_step(state)
        train_step(state)

    ratio = estimate_run(cfg).total / _peak(work)
    assert LOW <= ratio <= HIGH, ratio


@pytest.mark.parametrize("args", [(12, 64, 4, 256, 16, 8), (24, 32, 4, 128, 32, 4)])
def test_gradflow_estimate(args):
    depth, d, h, f, n, B = args
    ratio = measure_estimate(*args).total / _peak(lambda: measure("pre", depth, d_model=d, n_heads=h, d_ff=f, n=n,
                                                                     batch=B))
    assert LOW <= ratio <= HIGH, ratio


def test_parameters_estimate_is_exact():
    cfg = EncoderConfig.bert_base(n_layers=2)
    params = init_params(cfg, dtype=np.float32)
    assert estimate_encoder(cfg, np.float32).parts["parameters"] == sum(a.nbytes for a in params.values())


def test_estimate_description():
    est = MemoryEstimate({"parameters": 3 * 2**30, "activations": 2**20, "gradients": 0})
    assert est.total == 3 * 2**30 + 2**20
    assert est.describe() == "3 GiB (parameters 3 GiB, activations 1 MiB)"
    assert format_bytes(512) == "512 B" and format_bytes(1536) == "1.5 KiB"
