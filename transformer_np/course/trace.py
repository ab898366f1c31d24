r"""The article's worked example ("the", "cat", "sat"), recomputed by the library.

The article "Transformer Encoder Stack" traces n = 3 tokens with d = 4 through N = 2
single-head Post-LN layers by hand. Here every number comes from the library's own ops —
``mha_forward``, ``residual_forward``, ``layernorm_forward``, ``ffn_forward`` — called in
the order ``encoder_layer_forward`` calls them, and the walk is checked to agree with
``encoder_forward`` (the stack, which runs the fast kernels) on the same input to round-off:
|walk − stack| ≤ rtol·(|stack| + max|stack|), rtol = 16·eps·√k with k the longest reduction
(two paths, two orders of summation: on some CPUs, BLAS kernels and thread counts they differ
in the last bits, so no bit-for-bit promise is made).

Set-up (the article's, made complete):
    H^(0)      the article's table (3, 4): the = [1,0,1,0], cat = [0,1,0,1], sat = [1,1,0,0]
    layer 1    W_Q = W_K = W_V = W_O = I, all biases 0, both LayerNorms γ = 1, β = 0,
               FFN 4 → 16 → 4 with exact (erf) GELU, W_1, W_2 Glorot-uniform from ``seed``
    layer 2    every weight matrix Glorot-uniform from the same seeded stream
               (``init_params(config, seed, init="xavier")``), biases 0, γ = 1, β = 0
    Post-LN    Z = LN_1(H + MHA(H)),  H^(ℓ) = LN_2(Z + FFN(Z)),  LN ε = 1e-12 (BERT's)

Layer 1, step by step (shapes for the batch of one sequence (1, n, d)):
    S = Q Kᵀ / √d          (n, n)   with Q = K = V = H^(0) because W_Q = W_K = W_V = I
    A = softmax(S) by row  (n, n)
    O = A V W_O = A H^(0)  (n, d)   the attention output
    R = H^(0) + O          (n, d)   the residual
    Z = LN(R)              (n, d)   γ = 1, β = 0
    F = FFN(Z)             (n, d)
    H^(1) = LN(Z + F)      (n, d)

Every figure the article prints is compared with the computation; a disagreement beyond
the article's own rounding (half a unit in its last printed decimal) becomes an erratum
``{"quantity", "article", "computed", "note"}`` whose note redoes the step in plain
arithmetic and says whether the article's figure follows from its own previous figure.

Run ``python -m transformer_np trace`` (``--json``, ``--precision N``, ``--full``).
"""

from __future__ import annotations

import math

import numpy as np

from .._compat import forward_moved as _forward_moved
from ..model.config import EncoderConfig
from ..model.params import init_params, layer_prefix, sub_params
from ..model.stack import encoder_backward, encoder_forward, encoder_layer_backward
from ..ops.attention import mha_forward
from ..ops.feedforward import ffn_forward
from ..ops.layernorm import layernorm_forward
from ..ops.masks import causal_mask, mask_value
from ..ops.residual import residual_forward

__all__ = ["CLAIMS_LEGEND", "TOKENS", "H0_TABLE", "LN_EPS", "SEED", "ARTICLE_FIGURES", "trace_config", "trace_params",
           "walk_layer", "window_mask", "format_matrix", "hidden_jacobian", "jacobian_norms",
           "compare_figure", "run_trace", "trace_to_json", "format_trace"]

TOKENS = ("the", "cat", "sat")
# H^(0) exactly as the article's table prints it: (n, d) = (3, 4).
H0_TABLE = ((1.0, 0.0, 1.0, 0.0),
            (0.0, 1.0, 0.0, 1.0),
            (1.0, 1.0, 0.0, 0.0))
D_MODEL, D_FF, N_LAYERS = 4, 16, 2
LN_EPS = 1e-12      # BERT's ε: the LayerNorm is then the hand formula (x − μ)/σ to ~1e-12
SEED = 0

# Every number the article prints in its worked example, with the decimals it prints.
# (key, human name, value, decimals). The weights, the mean and the softmax are printed with
# "≈"; the tolerance is half a unit in the last printed decimal either way.
ARTICLE_FIGURES = (
    ("sqrt_d", "sqrt(d) = sqrt(4)", 2.0, 0),
    ("scores", "raw scores Q K^T / sqrt(d) (3x3 table)",
     ((1.0, 0.0, 0.5), (0.0, 1.0, 0.5), (0.5, 0.5, 1.0)), 1),
    ("attention_weights[the]", "softmax row of 'the' = softmax(1.0, 0.0, 0.5)", (0.44, 0.16, 0.40), 2),
    ("attention_output[the]", "attention output of 'the' (weighted sum of H^(0) rows)",
     (0.84, 0.56, 0.44, 0.16), 2),
    ("residual[the]", "residual H^(0)_the + attention output", (1.84, 0.56, 1.44, 0.16), 2),
    ("mean(residual[the])", "mean of the residual of 'the' before LayerNorm", 0.75, 2),
)


# ----------------------------------------------------------------------------- set-up
def trace_config(eps: float = LN_EPS) -> EncoderConfig:
    """N = 2 Post-LN layers, d_model = 4, h = 1, d_ff = 16, exact GELU, no dropout, no embeddings."""
    return EncoderConfig(n_layers=N_LAYERS, d_model=D_MODEL, n_heads=1, d_ff=D_FF, activation="gelu",
                         norm_position="post", layer_norm_eps=eps, dropout=0.0, vocab_size=None)


def trace_params(config: EncoderConfig | None = None, seed: int = SEED) -> dict[str, np.ndarray]:
    """The trace's parameters (float64): Glorot-uniform from ``seed``, then layer 1's
    attention set to the article's identities W_Q = W_K = W_V = W_O = I (biases stay 0).

    Biases are 0 and LayerNorm γ = 1, β = 0 everywhere (``init_params`` does that).
    """
    config = trace_config() if config is None else config
    params = init_params(config, seed=seed, dtype=np.float64, init="xavier")
    pre = layer_prefix(config, 0) + "attn."
    for w in ("W_Q", "W_K", "W_V", "W_O"):
        params[pre + w] = np.eye(config.d_model)                 # (d, d) identity
    return params


def window_mask(n: int, width: int = 1, dtype=np.float64) -> np.ndarray:
    """(n, n) additive mask letting position i see only |i − j| ≤ ``width`` (a local window).

    Not an encoder mask: used only to show how depth widens the receptive field when one
    layer cannot see everything.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if not isinstance(width, int) or width < 0:
        raise ValueError(f"width must be a non-negative int, got {width!r}")
    i = np.arange(n)
    far = np.abs(i[:, None] - i[None, :]) > width             # (n, n)
    return np.where(far, mask_value(dtype), 0.0).astype(dtype)


# ----------------------------------------------------------------------------- the walk
def walk_layer(x: np.ndarray, p: dict, config: EncoderConfig, mask: np.ndarray | None = None) -> dict:
    """One encoder layer, sublayer by sublayer, with the library's ops in the order
    ``encoder_layer_forward`` uses them (inference: no dropout), Post-LN or Pre-LN.

    Args:
        x: H^(ℓ−1) of shape (B, n, d_model) — every batch item is walked.
        p: the layer's parameters without the "layers.ℓ." prefix (``sub_params``).
        config: the stack's config (``norm_position``, ``n_heads``, ``activation``, ε).
        mask: an additive mask broadcastable to (B, h, n, n), or None.

    Returns:
        a dict with every batch item and every head: ``scores`` S = Q_h K_hᵀ/√d_k (+ mask) and
        ``attention_weights`` A, both (B, h, n, n); ``attention_output`` MHA(·), ``residual`` (the first
        residual sum), ``layer_norm`` (the first LayerNorm's output), ``ffn_output``, ``ffn_residual``
        (the second residual sum) and ``H`` (the layer's output), all (B, n, d); and for Pre-LN also
        ``layer_norm2`` (the FFN's input). Post-LN: residual = x + MHA(x), layer_norm = LN_1(residual),
        ffn_residual = layer_norm + FFN(layer_norm), H = LN_2(ffn_residual). Pre-LN: layer_norm = LN_1(x),
        residual = x + MHA(layer_norm), layer_norm2 = LN_2(residual), ffn_residual = H =
        residual + FFN(layer_norm2).
    """
    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config must be an EncoderConfig, got {type(config).__name__}")
    if not isinstance(x, np.ndarray) or x.ndim != 3 or x.shape[-1] != config.d_model:
        shape = getattr(x, "shape", type(x).__name__)
        raise ValueError(f"x must be H^(l-1) of shape (B, n, d_model) = (B, n, {config.d_model}); got {shape}")
    eps, post = config.layer_norm_eps, config.norm_position == "post"
    out = {}
    if post:
        a_in = x
    else:
        a_in, _ = layernorm_forward(x, p["ln1.gamma"], p["ln1.beta"], eps)                 # LN_1(H)
        out["layer_norm"] = a_in
    a, mc = mha_forward(a_in, sub_params(p, "attn."), config.n_heads, mask)                # (B, n, d)
    ac = mc["attn"]
    # The attention op keeps Q, K and 1/√d_k; S is their product (plus the mask), every head.
    scores = (ac["Q"] @ ac["K"].swapaxes(-1, -2)) * ac["scale"]                            # (B, h, n, n)
    if mask is not None:
        scores = scores + mask
    r, _ = residual_forward(x, a)                                                          # H + MHA(·)
    if post:
        z, _ = layernorm_forward(r, p["ln1.gamma"], p["ln1.beta"], eps)                    # Z = LN_1(R)
        out["layer_norm"], f_in, base = z, z, z
    else:
        f_in, _ = layernorm_forward(r, p["ln2.gamma"], p["ln2.beta"], eps)                 # LN_2(R)
        out["layer_norm2"], base = f_in, r
    f, _ = ffn_forward(f_in, sub_params(p, "ffn."), config.activation)                    # (B, n, d)
    r2, _ = residual_forward(base, f)
    H = layernorm_forward(r2, p["ln2.gamma"], p["ln2.beta"], eps)[0] if post else r2      # H^(ℓ)
    out.update(scores=np.broadcast_to(scores, ac["weights"].shape).copy(), attention_weights=ac["weights"],
               attention_output=a, residual=r, ffn_output=f, ffn_residual=r2, H=H)
    return out


def _walk_stack(params, config, H0, mask=None) -> tuple[list[dict], dict]:
    """Walk every layer and check the walk against ``encoder_forward`` to round-off (:func:`_paths_agree`)."""
    if config.n_heads != 1:
        raise ValueError(f"the article's trace has one head; got n_heads = {config.n_heads} "
                         "(walk_layer shows every head)")
    H = H0[None]                                                                  # (1, n, d)
    layers = []
    for layer in range(config.n_layers):
        w = walk_layer(H, sub_params(params, layer_prefix(config, layer)), config, mask)
        H = w["H"]
        # the trace's tables: batch item 0 (the only one) and head 0 (the only one)
        layers.append({k: (v[0, 0] if v.ndim == 4 else v[0]) for k, v in w.items()})
    _, cache = encoder_forward(params, config, inputs_embeds=H0[None], extra_mask=mask)
    k = max(config.d_model, config.d_ff, H0.shape[0])                            # the longest reduction
    for layer, w in enumerate(layers):
        stack = cache["hidden_states"][layer + 1][0]
        ok, err, tol = _paths_agree(w["H"], stack, k)
        if not ok:
            raise RuntimeError(f"the step-by-step walk of layer {layer + 1} differs from encoder_forward "
                               f"beyond round-off: its worst element differs by {err:.3g} > tolerance {tol:.3g}")
    return layers, cache


def _paths_agree(a: np.ndarray, b: np.ndarray, k: int, c: float = 16.0) -> tuple[bool, float, float]:
    """(ok, max |a − b|, the tolerance at the worst element): two paths agree when every element has
    |a − b| ≤ rtol·(|b| + max|b|), rtol = c·eps·√k (CONTRIBUTING.md, "Comparing numbers in tests")."""
    rtol = c * float(np.finfo(b.dtype).eps) * math.sqrt(k)
    err = np.abs(a - b)
    tol = rtol * (np.abs(b) + np.abs(b).max())
    i = int(np.argmax(err - tol))
    return bool((err <= tol).all()), float(err.flat[i]), float(tol.flat[i])


# ----------------------------------------------------------------------------- sensitivity
def hidden_jacobian(cache: dict, layer: int, position: int = 0) -> np.ndarray:
    """J of shape (d, n, d): J[k, j, i] = ∂H^(layer)_{position, k} / ∂H^(0)_{j, i}.

    One backward pass per output component k with a one-hot upstream gradient: for the
    last layer through :func:`encoder_backward` (its ``inputs_embeds`` gradient), for an
    earlier one through :func:`encoder_layer_backward` on the same forward cache.
    """
    N = len(cache["layers"])
    if not (isinstance(layer, int) and 1 <= layer <= N):
        raise ValueError(f"layer must be an int in [1, {N}], got {layer!r}")
    B, n, d = cache["out_shape"]
    if not (isinstance(position, int) and 0 <= position < n):
        raise ValueError(f"position must be an int in [0, {n - 1}], got {position!r}")
    J = np.zeros((d, n, d))
    for k in range(d):
        dH = np.zeros((B, n, d))
        dH[0, position, k] = 1.0                                      # picks H^(layer)_{position,k}
        if layer == N:
            dx = encoder_backward(dH, cache)["inputs_embeds"]
        else:
            dx = dH
            for l in reversed(range(layer)):
                dx, _ = encoder_layer_backward(dx, cache["layers"][l])
        J[k] = dx[0]                                                  # (n, d)
    return J


def jacobian_norms(J: np.ndarray) -> np.ndarray:
    """Frobenius norm of each (d × d) block ∂H_pos/∂H^(0)_j: shape (n,)."""
    return np.sqrt((J ** 2).sum(axis=(0, 2)))


# ----------------------------------------------------------------------------- errata
def compare_figure(article, computed, decimals: int) -> dict:
    """Does ``computed`` round to the article's printed figure?

    Agreement means |article − computed| ≤ ½·10^(−decimals) elementwise (plus 1e-9 for
    binary floating point), i.e. the article's figure is a correct rounding.
    """
    a = np.asarray(article, dtype=float)
    c = np.asarray(computed, dtype=float)
    if a.shape != c.shape:
        raise ValueError(f"article figure has shape {a.shape} but computed value has shape {c.shape}")
    if not (isinstance(decimals, int) and decimals >= 0):
        raise ValueError(f"decimals must be a non-negative int, got {decimals!r}")
    tol = 0.5 * 10.0 ** (-decimals)
    diff = float(np.max(np.abs(a - c))) if a.size else 0.0
    return {"agrees": bool(diff <= tol + 1e-9), "max_abs_diff": diff, "tolerance": tol}


def _fmt(v, decimals: int = 4) -> str:
    a = np.asarray(v, dtype=float)
    if a.ndim == 0:
        return f"{float(a):.{decimals}f}"
    return "[" + ", ".join(f"{x:.{decimals}f}" for x in a.ravel()) + "]"


def _notes(H0: np.ndarray, layer1: dict) -> dict[str, tuple[str, bool | None]]:
    """Plain-arithmetic explanation of each printed figure: key -> (note, premise_consistent).

    premise_consistent says whether the article's figure follows correctly from the
    article's own previous figure (None when there is no previous figure).
    """
    figs = {key: np.asarray(val, dtype=float) for key, _, val, _ in ARTICLE_FIGURES}
    s = layer1["scores"][0]                                           # scores of "the"
    e = np.exp(s)
    w = e / e.sum()
    wa = figs["attention_weights[the]"]
    implied = np.log(wa / wa[1])                                      # scores the article's row implies
    sum_via_article = wa @ H0                                         # its weighted sum, redone
    res_via_article = figs["attention_output[the]"] + H0[0]
    mean_of_article_res = float(figs["residual[the]"].mean())
    ok_sum = compare_figure(figs["attention_output[the]"], sum_via_article, 2)["agrees"]
    ok_res = compare_figure(figs["residual[the]"], res_via_article, 2)["agrees"]
    ok_mean = compare_figure(figs["mean(residual[the])"], mean_of_article_res, 2)["agrees"]
    rowsum = H0.sum(axis=1)
    sum_wa = float(wa.sum())
    premise_sum = ("The article's arithmetic is right from a wrong premise: its own weights give"
                   if ok_sum else "The article's figure does not follow even from its own weights, which give")
    premise_res = ("The article's addition is right from its wrong attention output:"
                   if ok_res else "The article's figure does not follow even from its own attention output:")
    notes = {
        "sqrt_d": ("d_k = d = 4 for one head, so the scale is 1/sqrt(4) = 1/2.", None),
        "scores": ("Each entry is a dot product of two H^(0) rows divided by 2; all nine agree.", None),
        "attention_weights[the]": (
            f"softmax(1.0, 0.0, 0.5) = (e^1, e^0, e^0.5) / (e^1 + e^0 + e^0.5) = "
            f"({e[0]:.4f}, {e[1]:.4f}, {e[2]:.4f}) / {e.sum():.4f} = {_fmt(w)}. "
            f"The article's ({wa[0]:.2f}, {wa[1]:.2f}, {wa[2]:.2f}) sums to {sum_wa:.2f} but its ratios are wrong: "
            f"the/cat should be e^1 = {math.e:.4f} (article {wa[0] / wa[1]:.4f}) and sat/cat e^0.5 = "
            f"{math.exp(0.5):.4f} (article {wa[2] / wa[1]:.4f}). Its log-ratios to 'cat' are "
            f"({implied[0]:.2f}, 0, {implied[2]:.2f}): the 'the' entry fits the score 1.0, but the 'sat' entry "
            f"would need a score of ~{implied[2]:.2f}, not the 0.5 of the article's own score table. The prose "
            f"percentages ({100 * wa[0]:.0f}% / {100 * wa[1]:.0f}% / {100 * wa[2]:.0f}%) inherit the error: the "
            f"computed split is {100 * w[0]:.1f}% / {100 * w[1]:.1f}% / {100 * w[2]:.1f}%. The qualitative point "
            f"stands: 'the' gives 'sat' a non-zero weight.", None),
        "attention_output[the]": (
            f"With the correct weights: {w[0]:.4f}*[1,0,1,0] + {w[1]:.4f}*[0,1,0,1] + {w[2]:.4f}*[1,1,0,0] "
            f"= {_fmt(w @ H0)}. {premise_sum} "
            f"{wa[0]:.2f}*[1,0,1,0] + {wa[1]:.2f}*[0,1,0,1] + {wa[2]:.2f}*[1,1,0,0] = {_fmt(sum_via_article, 2)}"
            f"{' (its printed figure)' if ok_sum else ''}.", ok_sum),
        "residual[the]": (
            f"H^(0)_the + attention output = [1,0,1,0] + {_fmt(w @ H0)} = {_fmt(w @ H0 + H0[0])}. "
            f"{premise_res} [1,0,1,0] + {_fmt(figs['attention_output[the]'], 2)} = {_fmt(res_via_article, 2)}"
            f"{' (its printed figure)' if ok_res else ''}.", ok_res),
        "mean(residual[the])": (
            f"Every H^(0) row sums to {rowsum[0]:g} and the weights sum to 1, so every attention output "
            f"sums to {rowsum[0]:g} and every residual to {2 * rowsum[0]:g}: the mean is "
            f"{2 * rowsum[0]:g}/{H0.shape[1]} = {2 * rowsum[0] / H0.shape[1]:g} for all three tokens, whatever "
            f"the weights. "
            + ("The article's 0.75 is wrong even from its own residual, whose mean is "
               if not ok_mean else "The article's figure does follow from its own residual, whose mean is ")
            + f"({' + '.join(f'{v:.2f}' for v in figs['residual[the]'])})/4 = {mean_of_article_res:.2f}.",
            ok_mean),
    }
    return notes


def _computed_figure(key: str, layer1: dict, config: EncoderConfig):
    if key == "sqrt_d":
        return math.sqrt(config.d_k)
    if key == "scores":
        return layer1["scores"]
    if key == "attention_weights[the]":
        return layer1["attention_weights"][0]
    if key == "attention_output[the]":
        return layer1["attention_output"][0]
    if key == "residual[the]":
        return layer1["residual"][0]
    if key == "mean(residual[the])":
        return float(layer1["residual"][0].mean())
    raise KeyError(key)


def _comparisons(H0, layer1, config) -> list[dict]:
    notes = _notes(H0, layer1)
    out = []
    for key, name, article, decimals in ARTICLE_FIGURES:
        computed = _computed_figure(key, layer1, config)
        cmp = compare_figure(article, computed, decimals)
        note, consistent = notes[key]
        out.append({"quantity": key, "description": name, "article": _tolist(article),
                    "computed": _tolist(computed), "decimals": decimals, **cmp,
                    "consistent_with_article_premise": consistent, "note": note})
    return out


#: The one-line legend printed above the checked claims (and in ``trace --help``): what an id like A13 is.
CLAIMS_LEGEND = ("ids (A13, L14, …) = rows of the claims ledger, A = article, L = lesson: docs/claims.md "
                 "(data: transformer_np/data/claims.json)")


def _claims(layer1, causal1, window_norms, full_norms) -> list[dict]:
    """The seeds' qualitative statements the worked example can check, each with a number.

    Each names its row of the claims ledger (``ledger``) and carries the ledger's verdict (``verdict``, read
    from transformer_np/data/claims.json, the one source of truth); ``holds`` is what this computation finds,
    and tests/course/test_claims_ledger.py asserts that the two agree for every claim.
    """
    from .ledger import verdict

    z = layer1["layer_norm"]
    r = layer1["residual"]
    var = z.var(axis=1)
    same_order = all(np.array_equal(np.argsort(r[t], kind="stable"), np.argsort(z[t], kind="stable"))
                     for t in range(len(r)))
    checks = [
        ("A26", "'the' attends forward to 'sat' (bidirectional)",
         bool(layer1["attention_weights"][0, 2] > 0), f"A[the, sat] = {layer1['attention_weights'][0, 2]:.4f}"),
        ("A26", "a causal mask forbids it",
         bool(causal1["attention_weights"][0, 2] == 0.0),
         f"causal A[the, :] = {_fmt(causal1['attention_weights'][0])}"),
        ("A13", "LayerNorm gives unit variance (gamma = 1, beta = 0; exactly sigma^2/(sigma^2 + eps))",
         bool(np.allclose(var, 1.0, atol=1e-9)), f"row variances of Z = {_fmt(var, 12)}"),
        ("A25", "LayerNorm keeps the relative ordering of the entries",
         bool(same_order), "argsort of every row of the residual equals that of Z"),
        ("L14", "with a +/-1 window mask, depth widens the receptive field",
         bool(window_norms["H1"][2] == 0.0 and window_norms["H2"][2] > 0),
         f"window: |dH1_the/dH0_sat| = {window_norms['H1'][2]:.4g}, |dH2_the/dH0_sat| = {window_norms['H2'][2]:.4g}"),
        ("L12", "with full attention one layer already reaches every token (A28, 'depth extends the "
                f"receptive field': {verdict('A28')})",
         bool(np.all(full_norms["H1"] > 0)), f"|dH1_the/dH0_j| = {_fmt(full_norms['H1'])}"),
    ]
    return [{"claim": f"{cid} [ledger: {verdict(cid)}] {text}", "ledger": cid, "verdict": verdict(cid),
             "holds": holds, "evidence": evidence} for cid, text, holds, evidence in checks]


def _tolist(v):
    a = np.asarray(v, dtype=float)
    return float(a) if a.ndim == 0 else a.tolist()


# ----------------------------------------------------------------------------- the trace
def run_trace(seed: int = SEED, eps: float = LN_EPS) -> dict:
    """The whole worked example. Returns numpy arrays and plain Python values:

    ``tokens``, ``H0`` (3, 4), ``config``, ``params``, ``layers`` (two dicts of
    :func:`walk_layer`), ``H1``, ``H2`` (3, 4), ``causal`` (the same walk with a causal
    mask), ``jacobian`` ({"full"|"causal"|"window": {"H1"|"H2": (d, n, d)}}) and
    ``jacobian_norms`` (same keys, (n,) norms of ∂H^(ℓ)_the/∂H^(0)_j), ``comparisons``
    (every printed figure vs the computation), ``errata`` (the disagreeing ones) and
    ``claims`` (the qualitative statements, checked).
    """
    config = trace_config(eps)
    params = trace_params(config, seed)
    H0 = np.array(H0_TABLE, dtype=np.float64)                                     # (n, d)
    n = H0.shape[0]
    masks = {"full": None, "causal": causal_mask(n), "window": window_mask(n, 1)}
    walks, jac, norms = {}, {}, {}
    for name, mask in masks.items():
        walks[name], cache = _walk_stack(params, config, H0, mask)
        jac[name] = {f"H{l}": hidden_jacobian(cache, l, position=0) for l in (1, 2)}
        norms[name] = {k: jacobian_norms(J) for k, J in jac[name].items()}
    layers = walks["full"]
    comparisons = _comparisons(H0, layers[0], config)
    errata = [{k: c[k] for k in ("quantity", "article", "computed", "note", "consistent_with_article_premise")}
              for c in comparisons if not c["agrees"]]
    return {
        "tokens": list(TOKENS), "H0": H0, "config": config, "params": params, "seed": seed, "eps": eps,
        "layers": layers, "H1": layers[0]["H"], "H2": layers[1]["H"],
        "causal": {"layers": walks["causal"], "H1": walks["causal"][0]["H"], "H2": walks["causal"][1]["H"]},
        "window": {"layers": walks["window"]},
        "jacobian": jac, "jacobian_norms": norms,
        "comparisons": comparisons, "errata": errata,
        "claims": _claims(layers[0], walks["causal"][0], norms["window"], norms["full"]),
    }


_LAYER_KEYS = ("scores", "attention_weights", "attention_output", "residual", "layer_norm", "ffn_output")


def trace_to_json(trace: dict) -> dict:
    """A JSON-ready dict: the required top-level keys hold layer 1's matrices."""
    l1, l2 = trace["layers"]
    out = {"tokens": trace["tokens"], "H0": _tolist(trace["H0"])}
    out.update({k: _tolist(l1[k]) for k in _LAYER_KEYS})
    out["ffn_residual"] = _tolist(l1["ffn_residual"])
    out["H1"] = _tolist(trace["H1"])
    out["H2"] = _tolist(trace["H2"])
    out["layer2"] = {k: _tolist(l2[k]) for k in _LAYER_KEYS + ("ffn_residual", "H")}
    out["causal"] = {"attention_weights": [_tolist(w["attention_weights"]) for w in trace["causal"]["layers"]],
                     "H1": _tolist(trace["causal"]["H1"]), "H2": _tolist(trace["causal"]["H2"])}
    out["jacobian_norms"] = {
        "description": "Frobenius norm of dH^(l)_the / dH^(0)_j for j = the, cat, sat",
        **{mask: {k: _tolist(v) for k, v in d.items()} for mask, d in trace["jacobian_norms"].items()}}
    out["errata"] = trace["errata"]
    out["comparisons"] = trace["comparisons"]
    out["claims"] = trace["claims"]
    cfg = trace["config"]
    out["setup"] = {"n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_heads": cfg.n_heads, "d_ff": cfg.d_ff,
                    "activation": cfg.activation, "norm_position": cfg.norm_position,
                    "layer_norm_eps": cfg.layer_norm_eps, "seed": trace["seed"], "init": "xavier",
                    "layer1_attention": "W_Q = W_K = W_V = W_O = I, biases 0",
                    "layer_norm": "gamma = 1, beta = 0", "dtype": "float64"}
    return out


# ----------------------------------------------------------------------------- text output
def _num(x: float, decimals: int | None) -> str:
    if decimals is None:
        return repr(float(x))
    s = f"{x:.{decimals}f}"
    return "0." + "0" * decimals if decimals and float(s) == 0 else s   # no "-0.00"


def _table(M: np.ndarray, rows, cols, decimals: int | None, indent: str = "  ") -> list[str]:
    cells = [[_num(v, decimals) for v in row] for row in np.atleast_2d(M)]
    width = max([len(c) for row in cells for c in row] + [len(str(c)) for c in cols] + [3])
    rw = max(len(str(r)) for r in rows)
    lines = [indent + " " * rw + "  " + "  ".join(str(c).rjust(width) for c in cols)]
    for r, row in zip(rows, cells):
        lines.append(indent + str(r).ljust(rw) + "  " + "  ".join(c.rjust(width) for c in row))
    return lines


def format_matrix(M, rows, cols, decimals: int | None = 2) -> str:
    """A labelled text table of the 2-D array ``M`` (``decimals=None``: full precision)."""
    M = np.atleast_2d(np.asarray(M, dtype=float))
    if M.shape != (len(rows), len(cols)):
        raise ValueError(f"M must have shape (len(rows), len(cols)) = {(len(rows), len(cols))}, got shape {M.shape}")
    return "\n".join(_table(M, rows, cols, decimals, indent=""))


def _article_line(trace, key, decimals) -> list[str]:
    c = next(c for c in trace["comparisons"] if c["quantity"] == key)
    art = c["article"]
    art_s = _num(art, c["decimals"]) if isinstance(art, float) else \
        "(" + ", ".join(_num(v, c["decimals"]) for v in np.ravel(art)) + ")"
    verdict = "agrees" if c["agrees"] else "DIFFERS (erratum below)"
    return [f"  article prints {c['quantity']}: {art_s}  -> {verdict}"]


def format_trace(trace: dict, precision: int | None = None, full: bool = False) -> str:
    """The trace as readable text tables.

    Default rounding is the article's: scores to 1 decimal, everything else to 2
    (Jacobian norms to 4); ``precision`` overrides every table, ``full`` prints repr().
    """
    if precision is not None and not (isinstance(precision, int) and 0 <= precision <= 17):
        raise ValueError(f"precision must be an int in [0, 17], got {precision!r}")

    def dec(default):
        return None if full else (default if precision is None else precision)

    tok, dims = trace["tokens"], [f"x{i}" for i in range(trace["H0"].shape[1])]
    cfg = trace["config"]
    l1, l2 = trace["layers"]
    L = ["The article's worked example, recomputed by transformer_np",
         f"tokens {tok}; d = {cfg.d_model}, N = {cfg.n_layers}, h = {cfg.n_heads}, d_ff = {cfg.d_ff}, "
         f"{cfg.activation.upper()}, Post-LN, LayerNorm eps = {cfg.layer_norm_eps:g}, float64, seed {trace['seed']}",
         "", "H^(0) (the article's table)"]
    L += _table(trace["H0"], tok, dims, dec(1))
    L += ["", "LAYER 1  (W_Q = W_K = W_V = W_O = I, biases 0, LN gamma = 1, beta = 0)", "",
          "Scores S = Q K^T / sqrt(d), sqrt(4) = 2"]
    L += _table(l1["scores"], tok, tok, dec(1)) + _article_line(trace, "scores", 1)
    L += ["", "Attention weights A = softmax(S) by row (row = query, column = key)"]
    L += _table(l1["attention_weights"], tok, tok, dec(2)) + _article_line(trace, "attention_weights[the]", 2)
    L += ["", "Attention output O = A H^(0) W_O"]
    L += _table(l1["attention_output"], tok, dims, dec(2)) + _article_line(trace, "attention_output[the]", 2)
    L += ["", "Residual R = H^(0) + O   (row means: "
          + ", ".join(_num(m, dec(2)) for m in l1["residual"].mean(axis=1)) + ")"]
    L += _table(l1["residual"], tok, dims, dec(2)) + _article_line(trace, "residual[the]", 2)
    L += _article_line(trace, "mean(residual[the])", 2)
    L += ["", "Z = LayerNorm(R)"] + _table(l1["layer_norm"], tok, dims, dec(2))
    L += ["", "FFN(Z) = GELU(Z W_1 + b_1) W_2 + b_2   (4 -> 16 -> 4, seeded weights)"]
    L += _table(l1["ffn_output"], tok, dims, dec(2))
    L += ["", "H^(1) = LayerNorm(Z + FFN(Z))"] + _table(trace["H1"], tok, dims, dec(2))
    L += ["", "LAYER 2  (its own seeded W_Q, W_K, W_V, W_O, W_1, W_2)", "", "Attention weights"]
    L += _table(l2["attention_weights"], tok, tok, dec(2))
    L += ["", "H^(2) = output of the stack"] + _table(trace["H2"], tok, dims, dec(2))
    L += ["", "BIDIRECTIONAL vs CAUSAL (layer 1 attention weights; a decoder's causal mask hides j > i)"]
    L += ["  bidirectional (the encoder):"] + _table(l1["attention_weights"], tok, tok, dec(2), "    ")
    L += ["  causal (a decoder):"] + _table(trace["causal"]["layers"][0]["attention_weights"], tok, tok,
                                           dec(2), "    ")
    L += ["", "SENSITIVITY of 'the': Frobenius norm of dH^(l)_the / dH^(0)_j (library backward)"]
    rows, M = [], []
    for mask in ("full", "causal", "window"):
        for k in ("H1", "H2"):
            rows.append(f"{mask:6s} {k}")
            M.append(trace["jacobian_norms"][mask][k])
    L += _table(np.array(M), rows, tok, dec(4))
    L += ["  full = encoder (no mask); causal = decoder mask; window = each token sees only +/-1 neighbour.",
          "  With full attention layer 1 already depends on every token: depth adds composition (paths",
          "  through other tokens' updated vectors), not reach. Reach grows with depth only when one layer",
          "  cannot see everything: with the window, 'sat' reaches 'the' at layer 2 but not at layer 1."]
    L += ["", "CLAIMS of the article, checked", f"  {CLAIMS_LEGEND}"]
    for c in trace["claims"]:
        L.append(f"  [{'holds' if c['holds'] else 'FAILS'}] {c['claim']}: {c['evidence']}")
    L += ["", f"ERRATA ({len(trace['errata'])} printed figures differ beyond the article's rounding)"]
    for i, e in enumerate(trace["errata"], 1):
        d_art = next(c["decimals"] for c in trace["comparisons"] if c["quantity"] == e["quantity"])
        art = _num(e["article"], d_art) if isinstance(e["article"], float) else \
            "(" + ", ".join(_num(v, d_art) for v in e["article"]) + ")"
        comp = _num(e["computed"], dec(4)) if isinstance(e["computed"], float) else \
            "(" + ", ".join(_num(v, dec(4)) for v in e["computed"]) + ")"
        L += [f"  {i}. {e['quantity']}: article {art}, computed {comp}", f"     {e['note']}"]
    return "\n".join(L)


# Moved in 0.2 (study code to transformer_np.course, the command line to transformer_np.cli);
# the old names keep resolving.
__getattr__ = _forward_moved(__name__, {
    "plot_attention": "transformer_np.course.plots.trace",
    "plot_jacobian_norms": "transformer_np.course.plots.trace",
    "save_figures": "transformer_np.course.plots.trace",
    "add_arguments": "transformer_np.cli.trace",
    "run": "transformer_np.cli.trace",
})
