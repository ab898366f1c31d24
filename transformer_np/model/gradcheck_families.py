r"""The gradient checks of the ops and stacks of the Hugging Face families beyond BERT's layer.

MPNet: the relative position bias (a lookup into a (K, h) table by bucket of j − i, long enough
that the logarithmic buckets are read), attention with that bias (whose gradient dP = Σ_batch dS),
one MPNet layer and the stack, where every layer reads one shared table.

Same method as :mod:`transformer_np.model.gradcheck` (which runs these cases in its suite): central
differences of Σ R ⊙ F against the analytic backward, random R, dropout with a fixed mask.
"""

from __future__ import annotations

import numpy as np

from ..ops.attention_bias import biased_mha_backward, biased_mha_forward
from ..ops.masks import padding_mask
from ..ops.relative_position import relative_position_bias_backward, relative_position_bias_forward
from .config import EncoderConfig
from .mpnet import mpnet_layer_backward, mpnet_layer_forward, mpnet_stack_backward, mpnet_stack_forward

__all__ = ["family_cases"]


def _mha_arrays(rng, d: int, x_shape: tuple) -> dict:
    a = {"x": rng.standard_normal(x_shape)}
    for nm in ("W_Q", "W_K", "W_V", "W_O"):
        a[nm] = rng.standard_normal((d, d)) / np.sqrt(d)
    for nm in ("b_Q", "b_K", "b_V", "b_O"):
        a[nm] = 0.3 * rng.standard_normal(d)
    return a


def _layer_arrays(rng, d: int, f: int) -> dict:
    a = {f"attn.{k}": v for k, v in _mha_arrays(rng, d, (1,)).items() if k != "x"}
    a.update({"ffn.W_1": rng.standard_normal((d, f)) / np.sqrt(d), "ffn.b_1": 0.3 * rng.standard_normal(f),
              "ffn.W_2": rng.standard_normal((f, d)) / np.sqrt(f), "ffn.b_2": 0.3 * rng.standard_normal(d)})
    for ln in ("ln1", "ln2"):
        a[ln + ".gamma"], a[ln + ".beta"] = 1 + 0.3 * rng.standard_normal(d), 0.3 * rng.standard_normal(d)
    return a


def _mpnet_cases(rng, add) -> None:
    B, n, d, h, f, K = 2, 20, 8, 2, 12, 32          # n = 20: distances beyond the 8 exact buckets
    add("relative position bias (MPNet buckets, 20 tokens)",
        lambda a: relative_position_bias_forward(a["table"], n),
        lambda R, c: {"table": relative_position_bias_backward(R, c)}, {"table": rng.standard_normal((K, h))})
    am = np.ones((B, n), dtype=np.int64)
    am[1, 14:] = 0
    mask = padding_mask(am)
    arrays = {**_mha_arrays(rng, d, (B, n, d)), "P": rng.standard_normal((1, h, n, n))}

    def mha_back(R, c):
        dx, g, dP = biased_mha_backward(R, c)
        return {"x": dx, **g, "P": dP}

    add("multi-head attention with a score bias (padding mask, attention dropout)",
        lambda a: biased_mha_forward(a["x"], a, h, a["P"], mask, 0.3, True, np.random.default_rng(5)),
        mha_back, arrays)
    cfg = EncoderConfig(n_layers=2, d_model=d, n_heads=h, d_ff=f, layer_norm_eps=1e-5, dropout=0.2)
    arrays = {"x": rng.standard_normal((B, n, d)), "P": rng.standard_normal((1, h, n, n)), **_layer_arrays(rng, d, f)}

    def layer_run(a):
        p = {k: v for k, v in a.items() if k not in ("x", "P")}
        return mpnet_layer_forward(a["x"], p, cfg, a["P"], mask, True, np.random.default_rng(6))

    def layer_back(R, c):
        dx, g, dP = mpnet_layer_backward(R, c)
        return {"x": dx, **g, "P": dP}

    add("MPNet layer (relative bias, padding mask, dropout)", layer_run, layer_back, arrays)
    arrays = {"inputs_embeds": rng.standard_normal((B, n, d)), "relative_bias": rng.standard_normal((K, h))}
    for i in range(cfg.n_layers):
        arrays.update({f"layers.{i}.{k}": v for k, v in _layer_arrays(rng, d, f).items()})

    def stack_run(a):
        p = {k: v for k, v in a.items() if k != "inputs_embeds"}
        return mpnet_stack_forward(p, cfg, a["inputs_embeds"], K, mask, True, np.random.default_rng(7))

    add("MPNet stack (2 layers, one shared relative table, padding, dropout)", stack_run,
        lambda R, c: mpnet_stack_backward(R, c), arrays)


def family_cases(rng: np.random.Generator) -> list[tuple]:
    """``(name, run, back, arrays)`` for every family case, drawn from ``rng``."""
    cases: list[tuple] = []

    def add(name, run, back, arrays):
        cases.append((name, run, back, arrays))

    _mpnet_cases(rng, add)
    return cases
