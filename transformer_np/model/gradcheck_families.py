r"""The gradient checks of the ops and stacks of the Hugging Face families beyond BERT's layer.

MPNet: the relative position bias (a lookup into a (K, h) table by bucket of j − i, long enough
that the logarithmic buckets are read), attention with that bias (whose gradient dP = Σ_batch dS),
one MPNet layer and the stack, where every layer reads one shared table.

ModernBERT: rotary embeddings, the GLU (GeGLU) and the gated sublayer with and without biases,
local sliding-window attention with padding, a first layer (no attention norm) and a later one, and
the whole model from ids (biases or none, full and sliding layers, padding, dropout).

DeBERTa-v2: :mod:`transformer_np.model.gradcheck_deberta`.

Same method as :mod:`transformer_np.model.gradcheck` (which runs these cases in its suite): central
differences of Σ R ⊙ F against the analytic backward, random R, dropout with a fixed mask.
"""

from __future__ import annotations

import numpy as np

from ..ops.attention_bias import biased_mha_backward, biased_mha_forward
from ..ops.glu import glu_backward, glu_ffn_backward, glu_ffn_forward, glu_forward
from ..ops.local_attention import local_attention_backward, local_attention_forward
from ..ops.masks import padding_mask
from ..ops.relative_position import relative_position_bias_backward, relative_position_bias_forward
from ..ops.rotary import rotary_backward, rotary_forward, rotary_tables
from .config import EncoderConfig
from .gradcheck_deberta import deberta_cases
from .modernbert import (
    ModernBertArch,
    modernbert_backward,
    modernbert_forward,
    modernbert_layer_backward,
    modernbert_layer_forward,
    modernbert_param_shapes,
)
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
    _modernbert_op_cases(rng, add)
    _modernbert_model_cases(rng, add)
    deberta_cases(rng, add)
    return cases


def _modernbert_op_cases(rng, add) -> None:
    B, h, n, dk, d, f = 2, 2, 12, 6, 8, 5
    C, S = rotary_tables(n, dk, 10_000.0)
    add("rotary position embedding (RoPE, half split)", lambda a: rotary_forward(a["x"], C, S),
        lambda R, c: {"x": rotary_backward(R, c)}, {"x": rng.standard_normal((B, h, n, dk))})
    add("GeGLU (GELU(input) ⊙ gate)", lambda a: glu_forward(a["u"]), lambda R, c: {"u": glu_backward(R, c)},
        {"u": 2.0 * rng.standard_normal((B, n, 2 * f))})
    for bias in (False, True):
        arrays = {"z": rng.standard_normal((B, n, d)), "W_1": rng.standard_normal((d, 2 * f)) / np.sqrt(d),
                  "W_2": rng.standard_normal((f, d)) / np.sqrt(f)}
        if bias:
            arrays.update(b_1=0.3 * rng.standard_normal(2 * f), b_2=0.3 * rng.standard_normal(d))

        def ffn_back(R, c):
            dz, g = glu_ffn_backward(R, c)
            return {"z": dz, **g}

        add(f"gated feed-forward ({'biases' if bias else 'no biases'}, dropout)",
            lambda a: glu_ffn_forward(a["z"], a, "gelu", 0.3, True, np.random.default_rng(8)), ffn_back, arrays)
    am = np.ones((B, n), dtype=np.int64)
    am[1, 10:] = 0      # every window holds a real key (a row of padding only is constant: no derivative)
    add("local sliding-window attention (window 2, padding mask)",
        lambda a: local_attention_forward(a["Q"], a["K"], a["V"], 2, padding_mask(am)),
        lambda R, c: dict(zip(("Q", "K", "V"), local_attention_backward(R, c))),
        {k: rng.standard_normal((B, h, n, dk)) for k in ("Q", "K", "V")})


def _modernbert_arrays(rng, shapes: dict) -> dict:
    out = {}
    for k, shape in shapes.items():
        if k.endswith("gamma"):
            out[k] = 1.0 + 0.3 * rng.standard_normal(shape)
        elif len(shape) == 2 and not k.startswith("embeddings."):
            out[k] = rng.standard_normal(shape) / np.sqrt(shape[0])
        else:
            out[k] = 0.5 * rng.standard_normal(shape) if k.startswith("embeddings.") else 0.3 * rng.standard_normal(
                shape)
    return out


def _modernbert_model_cases(rng, add) -> None:
    B, n, d, h, f, V = 2, 9, 8, 2, 6, 11
    am = np.ones((B, n), dtype=np.int64)
    am[1, 7:] = 0       # shorter than the window (w = 2): every local row holds a real key
    mask = padding_mask(am)
    arch = ModernBertArch(layer_types=("full", "sliding", "full"), local_attention=4, attention_bias=True,
                          mlp_bias=True, norm_bias=True)
    cfg = EncoderConfig(n_layers=3, d_model=d, n_heads=h, d_ff=f, norm_position="pre", layer_norm_eps=1e-5,
                        dropout=0.2, vocab_size=V, max_len=32, positional="none", final_layer_norm=True)
    shapes = modernbert_param_shapes(cfg, arch)
    rope = rotary_tables(n, d // h, 10_000.0)
    for layer in (0, 1):
        p = {k.split(".", 2)[2]: v for k, v in _modernbert_arrays(rng, shapes).items()
             if k.startswith(f"layers.{layer}.")}

        def run(a, layer=layer):
            return modernbert_layer_forward(a["x"], {k: v for k, v in a.items() if k != "x"}, cfg, rope, mask, True,
                                            np.random.default_rng(9))

        def back(R, c):
            dx, g = modernbert_layer_backward(R, c)
            return {"x": dx, **g}

        label = "first, no attention norm" if layer == 0 else "attention norm"
        add(f"ModernBERT layer ({label}, biases, RoPE, padding, dropout)", run, back,
            {"x": rng.standard_normal((B, n, d)), **p})
    ids = rng.integers(0, V, size=(B, n))
    for biased in (False, True):
        a = arch if biased else ModernBertArch(layer_types=arch.layer_types, local_attention=4)
        arrays = _modernbert_arrays(rng, modernbert_param_shapes(cfg, a))
        add(f"ModernBERT model ({'biases' if biased else 'no biases'}; full and sliding layers, padding, dropout)",
            lambda p, a=a: modernbert_forward(p, cfg, a, ids, am, True, np.random.default_rng(10)),
            lambda R, c: modernbert_backward(R, c), arrays)
