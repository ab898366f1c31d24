r"""The anatomy of the encoder, computed: the numbers of notebooks 05a/05b (drawn by
:mod:`transformer_np.course.plots.anatomy`).

Every number comes from the library's own ops (no re-implementation of a sublayer here):

* :func:`worked_example_layer1` — the article's "the cat sat" attention step, n = 3, d = 4,
  W_Q = W_K = W_V = I (scores, softmax row, weighted sum, residual, its mean, LayerNorm).
* :func:`compare_norm_positions` — the same weights and input through Post-LN and Pre-LN
  (Figure 1 of the lesson): outputs and the residual-stream norm ‖H^(ℓ)_i‖ per layer.
* :func:`layer_shapes` — the shape at each step of one layer, read off a real forward cache.
* :func:`dependency_maps` — D[ℓ, i, j] = ‖∂H^(ℓ)_i / ∂H^(0)_j‖_F (Figure 2), for full
  attention and for a windowed (band-masked) contrast; :func:`reach` reads the reach off them.
* :func:`cls_attention`, :func:`cls_gradient_map` — Figure 3: attention from position 0 per
  layer, and how a classifier reading H^(N)_0 sends gradient to every input position.
* the pitfalls table: :func:`pitfall_causal_mask`, :func:`pitfall_no_positional`,
  :func:`pitfall_pe_every_layer`, :func:`pitfall_residual_width`, :func:`pitfall_no_layernorm`,
  :func:`pitfall_dropout_at_eval`.
* :func:`parameter_budget` — per-layer parameters (4d² + 4d attention, 2·d·d_ff + d_ff + d FFN,
  4d LayerNorm) against the seeds' 12d².
* :func:`layer_activation_floats` — what one layer's cache keeps for the backward (with the one cache
  walker, :func:`transformer_np.perf.memory.cache_arrays`).

The measured cost (time against the O(n²d + nd²) model) is the one complexity study,
:mod:`transformer_np.course.complexity`; the names ``time_layer``, ``fit_complexity``,
``measure_complexity`` that lived here until 0.2 resolve to it.
"""

from __future__ import annotations

import math

import numpy as np

from .._compat import forward_moved as _forward_moved
from .._validate import check_int, describe
from ..model.config import EncoderConfig, count_parameters
from ..model.heads import cls_classifier_backward, cls_classifier_forward
from ..model.params import init_params, layer_prefix, param_shapes, sub_params
from ..model.stack import encoder_backward, encoder_forward, encoder_layer_forward
from ..ops.attention import attention_forward, mha_forward
from ..ops.embeddings import sinusoidal_positional_encoding
from ..ops.feedforward import ffn_forward
from ..ops.layernorm import layernorm_forward
from ..ops.masks import causal_mask, mask_value
from ..ops.residual import residual_forward
from ..perf.memory import cache_arrays, is_param_ref, owner

__all__ = ["worked_example_layer1", "compare_norm_positions", "layer_shapes", "band_mask", "dependency_maps",
           "reach", "cls_attention", "cls_gradient_map", "pitfall_causal_mask", "pitfall_no_positional",
           "pitfall_pe_every_layer", "pitfall_residual_width", "pitfall_no_layernorm", "pitfall_dropout_at_eval",
           "parameter_budget", "layer_activation_floats", "residual_only_forward", "demo_config", "demo_params",
           "figure2_maps"]

# The article's H^(0) for "the", "cat", "sat".
CAT_SAT_TOKENS = ("the", "cat", "sat")
CAT_SAT_H0 = np.array([[1.0, 0.0, 1.0, 0.0],
                       [0.0, 1.0, 0.0, 1.0],
                       [1.0, 1.0, 0.0, 0.0]])


def _check_config(config) -> None:
    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config must be an EncoderConfig, got {describe(config)}")


# ----------------------------------------------------------------------------- the worked example
def worked_example_layer1() -> dict:
    r"""Layer 1's attention step of the article's trace, with W_Q = W_K = W_V = I, one head.

    S = H^(0) H^(0)ᵀ / √4, A = softmax(S), O = A H^(0), R = H^(0) + O, and LN(R) with γ = 1, β = 0.
    Returns a dict of arrays: ``scores`` (3, 3), ``weights`` (3, 3), ``attn_out`` (3, 4),
    ``residual`` (3, 4), ``residual_mean`` (3,), ``ln`` (3, 4), ``causal_weights`` (3, 3)
    (the same step under a decoder's causal mask), plus the article's own arithmetic
    redone from its printed weights (``article_*``).
    """
    H0 = CAT_SAT_H0[None, None]                                     # (1, 1, 3, 4): batch, head
    O, c = attention_forward(H0, H0, H0)                             # Q = K = V = H^(0)
    A = c["weights"][0, 0]                                           # (3, 3)
    S = (H0[0, 0] @ H0[0, 0].T) * c["scale"]                         # (3, 3) = QKᵀ/√d
    R, _ = residual_forward(CAT_SAT_H0, O[0, 0])                     # (3, 4)
    ln, _ = layernorm_forward(R, np.ones(4), np.zeros(4), 1e-12)     # (3, 4)
    _, cc = attention_forward(H0, H0, H0, causal_mask(3))
    article_w = np.array([0.44, 0.16, 0.40])                         # printed in the article
    article_out = article_w @ CAT_SAT_H0                             # its weighted sum
    article_res = article_out + CAT_SAT_H0[0]
    return {"tokens": CAT_SAT_TOKENS, "H0": CAT_SAT_H0.copy(), "scores": S, "weights": A,
            "attn_out": O[0, 0], "residual": R, "residual_mean": R.mean(axis=-1), "ln": ln,
            "causal_weights": cc["weights"][0, 0], "article_weights": article_w,
            "article_attn_out": article_out, "article_residual": article_res,
            "article_residual_mean": float(article_res.mean())}


# ----------------------------------------------------------------------------- small models
def demo_config(norm_position: str = "post", n_layers: int = 4, d_model: int = 16, n_heads: int = 2,
                **kw) -> EncoderConfig:
    """A small encoder fed with ``inputs_embeds`` (d_ff = 4d, GELU, no dropout)."""
    return EncoderConfig(n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_ff=4 * d_model,
                         norm_position=norm_position, dropout=kw.pop("dropout", 0.0), **kw)


def demo_params(config: EncoderConfig, seed: int = 0) -> dict:
    """Glorot-initialised weights: BERT's std 0.02 makes attention near-uniform and the
    sublayers near-silent, which hides every effect a figure is meant to show."""
    return init_params(config, seed=seed, init="xavier")


def _row_norms(H: np.ndarray) -> np.ndarray:
    return np.linalg.norm(H, axis=-1)                                # (B, n)


# ----------------------------------------------------------------------------- Figure 1
def compare_norm_positions(n_layers: int = 12, d_model: int = 16, n: int = 6, seed: int = 0) -> dict:
    r"""Post-LN and Pre-LN with the *same* weights (identical names; Pre-LN adds final_ln γ = 1, β = 0)
    and the same H^(0) ~ N(0, 1).

    Returns ``post_norms``, ``pre_norms``: mean ‖H^(ℓ)_i‖ over positions for ℓ = 0 … N (Pre-LN: the
    residual stream before the final LN), ``post_out``, ``pre_out`` (1, n, d) and ``rel_diff`` =
    ‖post − pre‖ / ‖post‖ of the outputs.
    """
    check_int(n_layers, "n_layers", minimum=1)
    post_cfg = demo_config("post", n_layers, d_model)
    pre_cfg = post_cfg.replace(norm_position="pre")
    params = demo_params(post_cfg, seed)
    pre_params = dict(params, **{"final_ln.gamma": np.ones(d_model), "final_ln.beta": np.zeros(d_model)})
    H0 = np.random.default_rng(seed + 1).normal(size=(1, n, d_model))
    post_out, pc = encoder_forward(params, post_cfg, inputs_embeds=H0)
    pre_out, qc = encoder_forward(pre_params, pre_cfg, inputs_embeds=H0)
    return {"post_norms": np.array([_row_norms(h).mean() for h in pc["hidden_states"]]),
            "pre_norms": np.array([_row_norms(h).mean() for h in qc["hidden_states"]]),
            "post_out": post_out, "pre_out": pre_out,
            "rel_diff": float(np.linalg.norm(post_out - pre_out) / np.linalg.norm(post_out)),
            "sqrt_d": math.sqrt(d_model)}


# ----------------------------------------------------------------------------- the article's figure
def layer_shapes(config: EncoderConfig, batch: int = 2, n: int = 5) -> list[tuple[str, tuple]]:
    """(step, shape) for each step of one encoder layer, read off an actual forward cache."""
    _check_config(config)
    check_int(batch, "batch", minimum=1)
    check_int(n, "n", minimum=1)
    cfg = config.replace(n_layers=1, vocab_size=None, type_vocab_size=0, dropout=0.0)
    params = demo_params(cfg)
    x = np.random.default_rng(0).normal(size=(batch, n, cfg.d_model))
    out, c = encoder_layer_forward(x, sub_params(params, "layers.0."), cfg)
    a = c["attn"]["attn"]
    first, second = ("residual + LN", "residual + LN") if cfg.norm_position == "post" else ("residual", "residual")
    return [("H^(ℓ−1)", x.shape),
            ("Q, K, V per head", a["Q"].shape),
            ("scores QKᵀ/√d_k", a["weights"].shape),
            ("softmax A", a["weights"].shape),
            ("A V (per head)", (a["A_drop"] @ a["V"]).shape),
            ("concat heads", c["attn"]["o"]["x"].shape),
            ("· W_O → MHA", c["res1"]["shape"]),
            (first, c["res1"]["shape"]),
            ("· W_1 + b_1 → GELU", c["ffn"]["act"]["grad"].shape),
            ("· W_2 + b_2 → FFN", c["res2"]["shape"]),
            (second, out.shape)]


# ----------------------------------------------------------------------------- Figure 2
def band_mask(n: int, window: int, dtype=np.float64) -> np.ndarray:
    """(n, n) additive mask allowing |i − j| ≤ window: windowed attention, for contrast."""
    check_int(n, "n", minimum=1)
    check_int(window, "window", minimum=0)
    i = np.arange(n)
    far = np.abs(i[:, None] - i[None, :]) > window                  # (n, n)
    return np.where(far, mask_value(dtype), 0.0).astype(dtype)


def dependency_maps(config: EncoderConfig, params: dict, H0: np.ndarray,
                    extra_mask: np.ndarray | None = None) -> np.ndarray:
    r"""D[ℓ−1, i, j] = ‖∂H^(ℓ)_i / ∂H^(0)_j‖_F for ℓ = 1 … N: the exact Jacobian blocks.

    H0 is (n, d). Trick: the forward is run on B = n·d identical copies, and copy (i, k)
    is back-propagated from the one-hot e_{i,k} at H^(ℓ) — one backward per layer yields
    the whole (n·d) × (n·d) Jacobian. ``extra_mask`` (e.g. :func:`band_mask`) is passed to
    :func:`encoder_forward`. Returns (N, n, n).
    """
    _check_config(config)
    H0 = np.asarray(H0, dtype=np.float64)
    if H0.ndim != 2 or H0.shape[1] != config.d_model:
        raise ValueError(f"H0 must have shape (n, d_model) = (n, {config.d_model}), got shape {H0.shape}")
    n, d = H0.shape
    X = np.broadcast_to(H0, (n * d, n, d)).copy()                    # (n·d, n, d)
    _, cache = encoder_forward(params, config, inputs_embeds=X, extra_mask=extra_mask)
    from ..model.stack import encoder_layer_backward
    seeds = np.eye(n * d).reshape(n * d, n, d)                       # copy (i,k) ← e_{i,k}
    maps = []
    for ell in range(1, config.n_layers + 1):
        g = seeds
        for layer in reversed(range(ell)):
            g, _ = encoder_layer_backward(g, cache["layers"][layer])
        J = g.reshape(n, d, n, d)                                    # J[i, k, j, m] = ∂H^ℓ_ik/∂H^0_jm
        maps.append(np.sqrt((J ** 2).sum(axis=(1, 3))))              # (n, n)
    return np.stack(maps)


def reach(maps: np.ndarray, rel_tol: float = 0.0) -> list[int]:
    """For each layer, the largest |i − j| with D[i, j] > rel_tol · max D (0 = exact zeros only)."""
    maps = np.asarray(maps)
    n = maps.shape[-1]
    dist = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    return [int(dist[m > rel_tol * m.max()].max()) for m in maps]


def figure2_maps(n: int = 9, window: int = 1, n_layers: int = 4, d_model: int = 8, seed: int = 0) -> dict:
    """Dependency maps of the same small Post-LN stack with full and with windowed attention."""
    cfg = demo_config("post", n_layers, d_model, n_heads=2)
    params = demo_params(cfg, seed)
    H0 = np.random.default_rng(seed + 1).normal(size=(n, d_model))
    full = dependency_maps(cfg, params, H0)
    windowed = dependency_maps(cfg, params, H0, extra_mask=band_mask(n, window))
    return {"full": full, "windowed": windowed, "window": window,
            "reach_full": reach(full), "reach_windowed": reach(windowed)}


# ----------------------------------------------------------------------------- Figure 3
def _cls_model(n_layers: int = 4, d_model: int = 16, seed: int = 0):
    cfg = demo_config("post", n_layers, d_model, n_heads=2, vocab_size=20, max_len=16)
    params = demo_params(cfg, seed)
    ids = np.array([[1, 5, 9, 3, 12, 7, 2, 0, 0]])                  # [CLS]=1 … [SEP]=2, then padding 0
    mask = (ids != 0).astype(np.int64)
    return cfg, params, ids, mask


def cls_attention(n_layers: int = 4, d_model: int = 16, seed: int = 0) -> dict:
    """Attention from position 0 ([CLS]) to every position, per layer, averaged over heads.

    Returns ``weights`` (N, n), ``attention_mask`` (n,), ``ids`` (n,).
    """
    cfg, params, ids, mask = _cls_model(n_layers, d_model, seed)
    _, cache = encoder_forward(params, cfg, input_ids=ids, attention_mask=mask)
    w = np.stack([a[0, :, 0, :].mean(axis=0) for a in cache["attentions"]])   # (N, n)
    return {"weights": w, "attention_mask": mask[0], "ids": ids[0]}


def cls_gradient_map(n_layers: int = 4, d_model: int = 16, n_classes: int = 3, seed: int = 0) -> dict:
    r"""A linear classifier on H^(N)_0; G[ℓ, j] = ‖∂logit_0 / ∂H^(ℓ)_j‖ for ℓ = 0 … N.

    Row N is nonzero only at j = 0 (the head reads position 0); rows below spread to every
    real token through attention; padding positions get exactly 0.
    """
    cfg, params, ids, mask = _cls_model(n_layers, d_model, seed)
    H, cache = encoder_forward(params, cfg, input_ids=ids, attention_mask=mask)
    rng = np.random.default_rng(seed + 7)
    W, b = rng.normal(size=(d_model, n_classes)) / math.sqrt(d_model), np.zeros(n_classes)
    logits, hc = cls_classifier_forward(H, W, b)                    # (1, C)
    dlogits = np.zeros_like(logits)
    dlogits[0, 0] = 1.0                                              # ∂ logit_0
    dH, _, _ = cls_classifier_backward(dlogits, hc)                  # (1, n, d), only row 0 nonzero
    _, dhidden = encoder_backward(dH, cache, return_hidden_grads=True)
    G = np.stack([np.linalg.norm(g[0], axis=-1) for g in dhidden])  # (N+1, n)
    return {"grad_norms": G, "attention_mask": mask[0], "logits": logits[0]}


# ----------------------------------------------------------------------------- pitfalls
def pitfall_causal_mask() -> dict:
    """A causal mask in an encoder: on the worked example "the" can no longer see "cat", "sat".

    Also on a small stack: ∂H^(N)_0/∂H^(0)_j for j > 0 is exactly 0 with the mask.
    """
    ex = worked_example_layer1()
    cfg = demo_config("post", 2, 8)
    params = demo_params(cfg)
    H0 = np.random.default_rng(1).normal(size=(5, 8))
    causal = dependency_maps(cfg, params, H0, extra_mask=causal_mask(5))
    full = dependency_maps(cfg, params, H0)
    return {"encoder_row_the": ex["weights"][0], "causal_row_the": ex["causal_weights"][0],
            "causal_dep_row0": causal[-1, 0], "full_dep_row0": full[-1, 0],
            "future_dependence_causal": float(causal[-1][np.triu_indices(5, 1)].max()),
            "future_dependence_full": float(full[-1][np.triu_indices(5, 1)].min())}


def _perm_error(cfg: EncoderConfig, params: dict, ids: np.ndarray, perm: np.ndarray) -> list[float]:
    """‖f(P x) − P f(x)‖ / ‖f(x)‖ for every H^(ℓ), ℓ = 0 … N."""
    _, c = encoder_forward(params, cfg, input_ids=ids)
    _, cp = encoder_forward(params, cfg, input_ids=ids[:, perm])
    return [float(np.linalg.norm(hp - h[:, perm]) / np.linalg.norm(h))
            for h, hp in zip(c["hidden_states"], cp["hidden_states"])]


def pitfall_no_positional(seed: int = 0) -> dict:
    """Without positional encodings the stack is a bag of words: permuted inputs give permuted
    outputs (error at round-off). With learned positions it is not (error of order 1)."""
    ids = np.array([[3, 7, 1, 9, 4, 6]])
    perm = np.array([2, 0, 5, 1, 4, 3])
    base = demo_config("post", 3, 16, vocab_size=12, max_len=8)
    no_pe = base.replace(positional="none")
    err_none = _perm_error(no_pe, demo_params(no_pe, seed), ids, perm)
    err_learned = _perm_error(base, demo_params(base, seed), ids, perm)
    return {"perm": perm, "equivariance_error_no_pe": err_none, "equivariance_error_learned": err_learned}


def pitfall_pe_every_layer(seed: int = 0) -> dict:
    """Re-adding the (sinusoidal) PE before every layer versus once at the input.

    ``order_sensitivity_once``: per layer ℓ = 0 … N, ‖f(Px) − P f(x)‖/‖f(x)‖ with PE added once —
    nonzero at every depth, so position information survives the layers without being re-added.
    ``rel_change``: ‖H_every − H_once‖/‖H_once‖ — re-adding changes the function computed.
    """
    cfg = demo_config("post", 3, 16, vocab_size=12, max_len=8, positional="sinusoidal",
                      embedding_layer_norm=False)
    params = demo_params(cfg, seed)
    ids = np.array([[3, 7, 1, 9, 4, 6]])
    H_once, c = encoder_forward(params, cfg, input_ids=ids)
    pe = sinusoidal_positional_encoding(ids.shape[1], cfg.d_model)  # (n, d)
    H = c["hidden_states"][0]                                        # H^(0) = E[x] + PE, added once
    for layer in range(cfg.n_layers):
        x = H if layer == 0 else H + pe                              # the pitfall: add it again
        H, _ = encoder_layer_forward(x, sub_params(params, layer_prefix(cfg, layer)), cfg)
    perm = np.array([2, 0, 5, 1, 4, 3])
    return {"order_sensitivity_once": _perm_error(cfg, params, ids, perm),
            "rel_change": float(np.linalg.norm(H - H_once) / np.linalg.norm(H_once))}


def pitfall_residual_width() -> dict:
    """Mismatched residual widths: the error messages the library gives (not a silent broadcast)."""
    msgs = {}
    try:
        residual_forward(np.zeros((1, 3, 4)), np.zeros((1, 3, 6)))
    except ValueError as e:
        msgs["residual_forward"] = str(e)
    cfg = demo_config("post", 1, 8)
    try:
        encoder_forward(demo_params(cfg), cfg, inputs_embeds=np.zeros((1, 3, 6)))
    except ValueError as e:
        msgs["encoder_forward"] = str(e)
    try:
        p = sub_params(demo_params(cfg), "layers.0.ffn.")
        p = dict(p, W_2=np.zeros((32, 6)), b_2=np.zeros(6))          # FFN mapping d_ff → 6 ≠ 8
        ffn_forward(np.zeros((1, 3, 8)), p)
    except ValueError as e:
        msgs["ffn_forward"] = str(e)
    return msgs


def residual_only_forward(params: dict, config: EncoderConfig, H0: np.ndarray) -> list[np.ndarray]:
    """The pitfall "no normalisation": H ← H + MHA(H); H ← H + FFN(H), with no LayerNorm at all.

    Built from the library's own mha/ffn/residual ops and the config's layer weights
    (LayerNorm parameters unused). Returns H^(0) … H^(N).
    """
    _check_config(config)
    hs = [H0]
    H = H0
    for layer in range(config.n_layers):
        p = sub_params(params, layer_prefix(config, layer))
        a, _ = mha_forward(H, sub_params(p, "attn."), config.n_heads)
        H, _ = residual_forward(H, a)
        f, _ = ffn_forward(H, sub_params(p, "ffn."), config.activation)
        H, _ = residual_forward(H, f)
        hs.append(H)
    return hs


def pitfall_no_layernorm(n_layers: int = 24, d_model: int = 16, n: int = 6, seed: int = 0) -> dict:
    """Mean ‖H^(ℓ)_i‖ per layer: residual-only (no LN), Pre-LN residual stream, Post-LN (= √d)."""
    cfg = demo_config("pre", n_layers, d_model)
    params = demo_params(cfg, seed)
    H0 = np.random.default_rng(seed + 1).normal(size=(1, n, d_model))
    no_ln = [float(_row_norms(h).mean()) for h in residual_only_forward(params, cfg, H0)]
    _, pre = encoder_forward(params, cfg, inputs_embeds=H0)
    post_cfg = cfg.replace(norm_position="post")
    post_params = {k: v for k, v in params.items() if not k.startswith("final_ln")}
    _, post = encoder_forward(post_params, post_cfg, inputs_embeds=H0)
    return {"no_ln": np.array(no_ln),
            "pre_ln": np.array([_row_norms(h).mean() for h in pre["hidden_states"]]),
            "post_ln": np.array([_row_norms(h).mean() for h in post["hidden_states"]])}


def pitfall_dropout_at_eval(seed: int = 0) -> dict:
    """Dropout left on at inference: two "predictions" of one input disagree; eval mode is exact."""
    cfg = demo_config("post", 2, 16, dropout=0.1)
    params = demo_params(cfg, seed)
    H0 = np.random.default_rng(seed + 1).normal(size=(1, 5, 16))
    a, _ = encoder_forward(params, cfg, inputs_embeds=H0, training=True, rng=np.random.default_rng(1))
    b, _ = encoder_forward(params, cfg, inputs_embeds=H0, training=True, rng=np.random.default_rng(2))
    e1, _ = encoder_forward(params, cfg, inputs_embeds=H0)
    e2, _ = encoder_forward(params, cfg, inputs_embeds=H0)
    return {"train_mode_rel_diff": float(np.linalg.norm(a - b) / np.linalg.norm(e1)),
            "eval_mode_max_diff": float(np.abs(e1 - e2).max())}


# ----------------------------------------------------------------------------- parameters
def parameter_budget(config: EncoderConfig) -> dict:
    """Per-layer parameter budget, computed from :func:`param_shapes` (not from a formula).

    Keys: ``attn_weights`` (4d²), ``attn_biases`` (4d), ``ffn_weights`` (2·d·d_ff), ``ffn_biases``
    (d_ff + d), ``layernorm`` (4d), ``per_layer``, ``twelve_d2`` (12d²), ``per_layer_over_12d2``,
    ``layers`` (all N layers), ``embeddings``, ``final_ln``, ``total`` (= count_parameters).
    """
    _check_config(config)
    shapes = param_shapes(config)
    pre = "layers.0."
    size = lambda names: sum(int(np.prod(shapes[pre + k])) for k in names)   # noqa: E731
    out = {"attn_weights": size(["attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O"]),
           "attn_biases": size(["attn.b_Q", "attn.b_K", "attn.b_V", "attn.b_O"]),
           "ffn_weights": size(["ffn.W_1", "ffn.W_2"]),
           "ffn_biases": size(["ffn.b_1", "ffn.b_2"]),
           "layernorm": size(["ln1.gamma", "ln1.beta", "ln2.gamma", "ln2.beta"])}
    out["per_layer"] = sum(out.values())
    d = config.d_model
    out["twelve_d2"] = 12 * d * d
    out["per_layer_over_12d2"] = out["per_layer"] / out["twelve_d2"]
    n_distinct = 1 if config.share_layers else config.n_layers
    out["layers"] = n_distinct * out["per_layer"]
    out["embeddings"] = sum(int(np.prod(s)) for k, s in shapes.items() if k.startswith("embeddings."))
    out["final_ln"] = sum(int(np.prod(s)) for k, s in shapes.items() if k.startswith("final_ln."))
    out["total"] = count_parameters(config)
    return out


# ----------------------------------------------------------------------------- memory
def layer_activation_floats(config: EncoderConfig, batch: int, n: int) -> dict:
    r"""Floats one layer's forward cache keeps for the backward (parameters — including the fused
    [W_Q|W_K|W_V] copy — excluded, shared memory counted once), split into the n × n attention maps
    and everything else (activations of O(n·d) and O(n·d_ff)).

    Measured on a real float32 forward, not from a formula. Returns ``attention_maps`` (arrays whose
    last two axes are (n, n): B·h·n² each), ``other`` and ``total``.
    """
    _check_config(config)
    check_int(batch, "batch", minimum=1)
    check_int(n, "n", minimum=2)
    cfg = config.replace(n_layers=1, vocab_size=None, type_vocab_size=0, dropout=0.0, max_len=max(n, 1))
    p = {k[len("layers.0."):]: np.zeros(s, dtype=np.float32)         # values are irrelevant to sizes
         for k, s in param_shapes(cfg).items() if k.startswith("layers.0.")}
    x = np.zeros((batch, n, cfg.d_model), dtype=np.float32)
    _, cache = encoder_layer_forward(x, p, cfg)
    params = {id(owner(a)) for a in p.values()}
    seen, out = set(), {"attention_maps": 0, "other": 0}
    for path, a in cache_arrays(cache):
        if is_param_ref(path):             # W, γ: parameters (the fused [W_Q|W_K|W_V] copy included)
            continue
        o = owner(a)
        if id(o) in seen or id(o) in params or o is x:
            continue
        seen.add(id(o))
        key = "attention_maps" if o.ndim >= 2 and o.shape[-2:] == (n, n) else "other"
        out[key] += int(o.size)
    out["total"] = out["attention_maps"] + out["other"]
    return out


# Moved in 0.2: the figures to transformer_np.course.plots.anatomy; the timing and fit of the cost to the one
# complexity study (transformer_np.course.complexity: CPU time of forward + backward, non-negative fit).
__getattr__ = _forward_moved(__name__, {
    **{n: "transformer_np.course.plots.anatomy" for n in (
        "save_figures", "draw_wiring", "draw_norm_comparison", "draw_layer_dataflow", "draw_dependency_maps",
        "draw_cls", "draw_no_layernorm", "draw_param_budget", "draw_complexity_model")},
    "time_layer": "transformer_np.course.complexity",
    "fit_complexity": "transformer_np.course.complexity",
    "measure_complexity": "transformer_np.course.complexity",
    "draw_complexity_measured": "transformer_np.course.plots.complexity",
})
