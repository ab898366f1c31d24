r"""The gradient checks of DeBERTa-v2's ops and model (:mod:`transformer_np.ops.disentangled`,
:mod:`transformer_np.model.deberta`).

The disentangled scores with both position terms (log buckets read and distances clipped to the table),
with c2p only and p2c only; attention with DeBERTa's replacing mask (a padded query row included: its
scores do not reach the output's gradient) and dropout; the attention sublayer with shared and with own
position projections; one layer; the whole model from ids (v3-like: shared keys, buckets, relative
LayerNorm; v2-like: own projections, absolute positions, token types, a factorised embedding), with
padding and dropout.

Same method as :mod:`transformer_np.model.gradcheck` (which runs these cases in its suite): central
differences of Σ R ⊙ F against the analytic backward, random R, dropout with a fixed mask.
"""

from __future__ import annotations

import numpy as np

from ..ops.disentangled import (
    disentangled_scores_backward,
    disentangled_scores_forward,
    position_indices,
    relative_position_ids,
    replace_masked_attention_backward,
    replace_masked_attention_forward,
)
from .config import EncoderConfig
from .deberta import (
    DebertaArch,
    deberta_attention_backward,
    deberta_attention_forward,
    deberta_backward,
    deberta_forward,
    deberta_layer_backward,
    deberta_layer_forward,
    deberta_param_shapes,
)

__all__ = ["deberta_cases"]


def _arrays(rng, shapes: dict) -> dict:
    out = {}
    for k, shape in shapes.items():
        if k.endswith("gamma"):
            out[k] = 1.0 + 0.3 * rng.standard_normal(shape)
        elif len(shape) == 2 and k.startswith("layers."):
            out[k] = rng.standard_normal(shape) / np.sqrt(shape[0])
        else:
            out[k] = 0.5 * rng.standard_normal(shape)
    return out


def _keep(am: np.ndarray) -> np.ndarray:
    return (am[:, None, :, None] * am[:, None, None, :]) > 0                 # (B, 1, n, n)


def _score_cases(rng, add) -> None:
    B, h, n, dk, span = 2, 2, 14, 4, 4
    idx = position_indices(relative_position_ids(n, 2 * span, 10), span)   # log buckets past 4, clipped at ±4
    base = {"Q": rng.standard_normal((B, h, n, dk)), "K": rng.standard_normal((B, h, n, dk))}
    for label, c2p, p2c in (("c2p and p2c", True, True), ("c2p only", True, False), ("p2c only", False, True)):
        arrays = dict(base)
        if c2p:
            arrays["PK"] = rng.standard_normal((1, h, 2 * span, dk))
        if p2c:
            arrays["PQ"] = rng.standard_normal((1, h, 2 * span, dk))

        def run(a):
            return disentangled_scores_forward(a["Q"], a["K"], 3.0, idx[0], a.get("PK"), idx[1], a.get("PQ"))

        def back(R, c):
            dQ, dK, dPK, dPQ = disentangled_scores_backward(R, c)
            g = {"Q": dQ, "K": dK}
            g.update({k: v for k, v in (("PK", dPK), ("PQ", dPQ)) if v is not None})
            return g

        add(f"DeBERTa disentangled scores ({label}; log buckets, clipped distances)", run, back, arrays)
    am = np.ones((B, n), dtype=np.int64)
    am[1, 10:] = 0

    def att_back(R, c):
        dS, dV = replace_masked_attention_backward(R, c)
        return {"S": dS, "V": dV}

    add("attention with DeBERTa's replacing mask (padded query rows, dropout)",
        lambda a: replace_masked_attention_forward(a["S"], a["V"], _keep(am), 0.3, True, np.random.default_rng(3)),
        att_back, {"S": rng.standard_normal((B, h, n, n)), "V": rng.standard_normal((B, h, n, dk))})


def _layer_cases(rng, add) -> None:
    B, n, d, h, f, V = 2, 12, 8, 2, 10, 13
    am = np.ones((B, n), dtype=np.int64)
    am[1, 9:] = 0
    cfg = EncoderConfig(n_layers=2, d_model=d, n_heads=h, d_ff=f, layer_norm_eps=1e-6, dropout=0.2, vocab_size=V,
                        max_len=16, type_vocab_size=2)
    v3 = DebertaArch(max_relative_positions=10, position_buckets=6, share_att_key=True)
    v2 = DebertaArch(max_relative_positions=4, share_att_key=False, norm_rel_ebd=False, position_biased_input=True,
                     max_position_embeddings=16, embedding_size=6)
    for label, arch in (("shared keys, buckets", v3), ("own position projections", v2)):
        idx = position_indices(relative_position_ids(n, arch.position_buckets, arch.max_relative_positions),
                               arch.span)
        p = {k.split(".", 2)[2]: v for k, v in _arrays(rng, deberta_param_shapes(cfg, arch)).items()
             if k.startswith("layers.0.")}
        attn = {k[5:]: v for k, v in p.items() if k.startswith("attn.")}

        def a_run(a, arch=arch, idx=idx):
            q = {k: v for k, v in a.items() if k not in ("x", "rel")}
            return deberta_attention_forward(a["x"], q, cfg, arch, a["rel"], idx, _keep(am), True,
                                             np.random.default_rng(4))

        def a_back(R, c):
            dx, g, dR = deberta_attention_backward(R, c)
            return {"x": dx, "rel": dR, **g}

        add(f"DeBERTa attention ({label}, padding, dropout)", a_run, a_back,
            {"x": rng.standard_normal((B, n, d)), "rel": rng.standard_normal((2 * arch.span, d)), **attn})
    idx = position_indices(relative_position_ids(n, v3.position_buckets, v3.max_relative_positions), v3.span)

    def l_run(a):
        q = {k: v for k, v in a.items() if k not in ("x", "rel")}
        return deberta_layer_forward(a["x"], q, cfg, v3, a["rel"], idx, _keep(am), True, np.random.default_rng(5))

    def l_back(R, c):
        dx, g, dR = deberta_layer_backward(R, c)
        return {"x": dx, "rel": dR, **g}

    p = {k.split(".", 2)[2]: v for k, v in _arrays(rng, deberta_param_shapes(cfg, v3)).items()
         if k.startswith("layers.0.")}
    add("DeBERTa layer (shared keys, buckets, padding, dropout)", l_run, l_back,
        {"x": rng.standard_normal((B, n, d)), "rel": rng.standard_normal((2 * v3.span, d)), **p})
    ids = rng.integers(0, V, size=(B, n))
    tt = rng.integers(0, 2, size=(B, n))
    for label, arch in (("v3-like: shared keys, buckets, relative LayerNorm", v3),
                        ("v2-like: own projections, absolute positions, token types, E = 6", v2)):
        add(f"DeBERTa model ({label}; padding, dropout)",
            lambda p, arch=arch: deberta_forward(p, cfg, arch, ids, am, tt, True, np.random.default_rng(6)),
            lambda R, c: deberta_backward(R, c), _arrays(rng, deberta_param_shapes(cfg, arch)))


def deberta_cases(rng: np.random.Generator, add) -> None:
    """Adds every DeBERTa case through ``add(name, run, back, arrays)``."""
    _score_cases(rng, add)
    _layer_cases(rng, add)
