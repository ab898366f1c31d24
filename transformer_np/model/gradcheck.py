r"""Finite-difference gradient checks of every op, both layer placements, the stack and the heads.

For an op y = F(x, θ) and a *random* upstream gradient R (all-ones would hide bugs: a
LayerNorm's output sums to a constant along features, so Σ y is blind to most errors),
the scalar f = Σ R ⊙ F(x, θ) has gradient ∂f/∂x = backward(R). Each sampled
coordinate x_i is checked against the central difference
    (f(x + h e_i) − f(x − h e_i)) / 2h,
computed in float64 as Σ R ⊙ (F(x + h e_i) − F(x − h e_i)) / 2h (differencing the
outputs before reducing them loses less precision). The error of a tensor is
    max_i |a_i − n_i| / max(ε, max_i (|a_i| + |n_i|))
(a tensor-level relative error: element-wise ratios are dominated by round-off where
the gradient is ~0), with ε the largest |analytic gradient| entry of the whole op. The
floor matters for gradients that are exactly zero: ∂/∂b_K of attention is 0 (softmax
ignores a constant added to a row of scores, and q·b_K is such a constant), and its
finite difference is pure round-off (~1e-10); measured against 0 that would read as
100 % error, measured against the op's gradient scale it reads as what it is. A check
passes below 1e-7.

Kinks are avoided: ReLU inputs are kept away from 0 (by more than 1000·h), and the
stacks use GELU. Dropout is checked with a fixed mask (a freshly seeded generator on
every call).

``python -m transformer_np gradcheck [--json]`` runs :func:`run_all`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._compat import forward_moved as _forward_moved
from .._validate import check_int, describe
from ..errors import InputTypeError
from ..ops import activations as act
from ..ops.attention import attention_backward, attention_forward, mha_backward, mha_forward
from ..ops.dropout import dropout_backward, dropout_forward
from ..ops.embeddings import embedding_backward, embedding_forward, embeddings_backward, embeddings_forward
from ..ops.feedforward import ffn_backward, ffn_forward
from ..ops.layernorm import layernorm_backward, layernorm_forward
from ..ops.linear import linear_backward, linear_forward
from ..ops.masks import padding_mask
from ..ops.residual import residual_backward, residual_forward
from ..ops.softmax import softmax_backward, softmax_forward
from . import heads
from .config import EncoderConfig
from .gradcheck_families import family_cases
from .losses import cross_entropy_backward, cross_entropy_forward
from .params import init_params, sub_params
from .stack import encoder_backward, encoder_forward, encoder_layer_backward, encoder_layer_forward

__all__ = ["rel_error", "numerical_gradient", "check_op", "run_all", "random_params", "TOLERANCE", "FD_STEP"]

TOLERANCE = 1e-7
FD_STEP = 1e-6   # h of the central differences (the grader's and the CLI's too)


def rel_error(a: np.ndarray, n: np.ndarray, eps: float = 1e-12) -> float:
    """max|a − n| / max(ε, max(|a| + |n|)): the tensor-level relative error."""
    a = np.asarray(a, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    if a.shape != n.shape:
        raise ValueError(f"rel_error: shapes differ, {a.shape} vs {n.shape}")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - n)) / max(eps, float(np.max(np.abs(a) + np.abs(n)))))


def numerical_gradient(fn: Callable[[], np.ndarray], x: np.ndarray, R: np.ndarray,
                       indices: np.ndarray, h: float = FD_STEP) -> np.ndarray:
    """Central differences of Σ R ⊙ fn() with respect to ``x`` at flat ``indices``.

    ``fn`` reads ``x`` (perturbed in place and restored) and returns the op's output.
    """
    out = np.empty(len(indices))
    for k, i in enumerate(indices):
        at = np.unravel_index(int(i), x.shape)  # x itself, C-order position i: x may be a strided view
        old = x[at]                             # (a loaded model's W_Q is one), whose reshape(-1) is a copy
        x[at] = old + h
        plus = np.asarray(fn(), dtype=np.float64)
        x[at] = old - h
        minus = np.asarray(fn(), dtype=np.float64)
        x[at] = old
        out[k] = float(np.sum(R * (plus - minus))) / (2.0 * h)
    return out


@dataclass
class CheckResult:
    name: str
    max_rel_error: float
    checked: int
    per_tensor: dict

    def to_json(self) -> dict:
        return {"name": self.name, "max_rel_error": self.max_rel_error, "checked": self.checked,
                "per_tensor": self.per_tensor}


def check_op(name: str, run: Callable[[dict], tuple], back: Callable[[np.ndarray, object], dict],
             arrays: dict, seed: int = 0, max_coords: int = 24, h: float = FD_STEP) -> CheckResult:
    """Check ``back`` against finite differences of ``run`` for every array in ``arrays``.

    ``run(arrays) -> (out, cache)``; ``back(R, cache) -> {name: grad}`` (a subset of
    ``arrays``' names; names absent from the result are not differentiated).
    The error floor ε is the op's largest analytic gradient entry (see the module doc).
    Tensors with more than ``max_coords`` entries are checked at that many random
    coordinates (always including the largest-gradient entry).
    """
    rng = np.random.default_rng(seed)
    out, cache = run(arrays)
    out = np.asarray(out, dtype=np.float64)
    R = rng.standard_normal(out.shape)
    analytic = back(R.astype(np.float64) if out.ndim else float(R), cache)
    scale = max([float(np.max(np.abs(g))) for g in analytic.values() if np.size(g)] + [1e-12])
    per, total = {}, 0
    for key, grad in analytic.items():
        x = arrays[key]
        grad = np.asarray(grad, dtype=np.float64)
        if grad.shape != x.shape:
            raise AssertionError(f"{name}: gradient of {key} has shape {grad.shape}, expected {x.shape}")
        if x.size <= max_coords:
            idx = np.arange(x.size)
        else:
            idx = rng.choice(x.size, size=max_coords - 1, replace=False)
            idx = np.unique(np.append(idx, int(np.argmax(np.abs(grad)))))
        num = numerical_gradient(lambda: run(arrays)[0], x, R, idx, h)
        per[key] = rel_error(grad.reshape(-1)[idx], num, eps=scale)
        total += len(idx)
    return CheckResult(name, max(per.values()) if per else 0.0, total, per)


# ----------------------------------------------------------------------------- helpers
def random_params(config: EncoderConfig, seed: int = 0) -> dict:
    """Xavier weights with *non-trivial* LayerNorm γ/β and biases (γ = 1, β = 0 would hide
    bugs in their gradients), float64."""
    rng = np.random.default_rng(seed + 1000)
    params = init_params(config, seed=seed, init="xavier", std=0.5)
    for k, v in params.items():
        leaf = k.rsplit(".", 1)[-1]
        if leaf == "gamma":
            params[k] = 1.0 + 0.3 * rng.standard_normal(v.shape)
        elif leaf == "beta" or leaf.startswith("b_"):
            params[k] = 0.3 * rng.standard_normal(v.shape)
    return params


def _away_from_zero(rng, shape, margin=0.05):
    """Values |x| ≥ margin: keeps ReLU's kink out of the finite-difference stencil."""
    x = rng.standard_normal(shape)
    return np.sign(x) * (margin + np.abs(x))


def _grads_subset(grads: dict, names) -> dict:
    return {k: grads[k] for k in names}


# ----------------------------------------------------------------------------- the suite
def _cases(seed: int):
    rng = np.random.default_rng(seed)
    B, n, d, h, f = 2, 5, 8, 2, 12
    cases = []

    def add(name, run, back, arrays):
        cases.append((name, run, back, arrays))

    x = rng.standard_normal((B, n, d))
    add("linear", lambda a: linear_forward(a["x"], a["W"], a["b"]),
        lambda R, c: dict(zip(("x", "W", "b"), linear_backward(R, c))),
        {"x": x.copy(), "W": rng.standard_normal((d, 6)), "b": rng.standard_normal(6)})
    add("softmax", lambda a: softmax_forward(a["x"]), lambda R, c: {"x": softmax_backward(R, c)},
        {"x": 2.0 * rng.standard_normal((B, n, 7))})
    mask = padding_mask(np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))
    add("attention (scaled dot-product, padding mask)",
        lambda a: attention_forward(a["Q"], a["K"], a["V"], mask),
        lambda R, c: dict(zip(("Q", "K", "V"), attention_backward(R, c))),
        {"Q": rng.standard_normal((B, h, n, 4)), "K": rng.standard_normal((B, h, n, 4)),
         "V": rng.standard_normal((B, h, n, 3))})

    def mha_arrays():
        a = {"x": rng.standard_normal((B, n, d))}
        for nm in ("W_Q", "W_K", "W_V", "W_O"):
            a[nm] = rng.standard_normal((d, d)) / np.sqrt(d)
        for nm in ("b_Q", "b_K", "b_V", "b_O"):
            a[nm] = 0.3 * rng.standard_normal(d)
        return a

    def mha_back(R, c):
        dx, g = mha_backward(R, c)
        return {"x": dx, **g}

    add("multi-head attention", lambda a: mha_forward(a["x"], a, h), mha_back, mha_arrays())
    add("multi-head attention (padding mask, attention dropout)",
        lambda a: mha_forward(a["x"], a, h, mask, 0.3, True, np.random.default_rng(7)), mha_back, mha_arrays())
    add("layernorm", lambda a: layernorm_forward(a["x"], a["gamma"], a["beta"], 1e-5),
        lambda R, c: dict(zip(("x", "gamma", "beta"), layernorm_backward(R, c))),
        {"x": rng.standard_normal((B, n, d)), "gamma": 1 + 0.3 * rng.standard_normal(d),
         "beta": 0.3 * rng.standard_normal(d)})
    for nm in ("relu", "gelu", "gelu_tanh"):
        add(nm, lambda a, nm=nm: act.activation_forward(a["z"], nm),
            lambda R, c: {"z": act.activation_backward(R, c)},
            {"z": 2.0 * _away_from_zero(rng, (B, n, f))})

    def ffn_arrays():
        return {"z": rng.standard_normal((B, n, d)), "W_1": rng.standard_normal((d, f)) / np.sqrt(d),
                "b_1": 0.3 * rng.standard_normal(f), "W_2": rng.standard_normal((f, d)) / np.sqrt(f),
                "b_2": 0.3 * rng.standard_normal(d)}

    def ffn_back(R, c):
        dz, g = ffn_backward(R, c)
        return {"z": dz, **g}

    for nm in ("gelu", "gelu_tanh", "relu"):
        arrays = ffn_arrays()
        if nm == "relu":  # resample until no hidden pre-activation is near the kink
            while np.min(np.abs(arrays["z"] @ arrays["W_1"] + arrays["b_1"])) < 1e-3:
                arrays = ffn_arrays()
        add(f"feed-forward ({nm})", lambda a, nm=nm: ffn_forward(a["z"], a, nm), ffn_back, arrays)
    add("residual", lambda a: residual_forward(a["x"], a["fx"]),
        lambda R, c: dict(zip(("x", "fx"), residual_backward(R, c))),
        {"x": rng.standard_normal((B, n, d)), "fx": rng.standard_normal((B, n, d))})
    add("dropout (training, fixed mask)",
        lambda a: dropout_forward(a["x"], 0.4, True, np.random.default_rng(3)),
        lambda R, c: {"x": dropout_backward(R, c)}, {"x": rng.standard_normal((B, n, d))})
    ids = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])  # repeated ids exercise the scatter-add
    add("token embedding (lookup, repeated ids)", lambda a: embedding_forward(ids, a["table"]),
        lambda R, c: {"table": embedding_backward(R, c)}, {"table": rng.standard_normal((10, d))})

    def emb_arrays(positional):
        a = {"word": rng.standard_normal((10, d)), "token_type": rng.standard_normal((2, d)),
             "ln.gamma": 1 + 0.3 * rng.standard_normal(d), "ln.beta": 0.3 * rng.standard_normal(d)}
        if positional == "learned":
            a["position"] = rng.standard_normal((8, d))
        return a

    tt = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])
    for pos in ("learned", "sinusoidal"):
        add(f"embeddings ({pos} positions, token types, embedding LayerNorm)",
            lambda a, pos=pos: embeddings_forward(a, ids, tt, pos, 1e-12),
            lambda R, c: embeddings_backward(R, c), emb_arrays(pos))

    # ---- layers and stacks
    attn_mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    for placement in ("post", "pre"):
        cfg = EncoderConfig(n_layers=1, d_model=d, n_heads=h, d_ff=f, norm_position=placement,
                            layer_norm_eps=1e-5, dropout=0.0)
        lp = sub_params(random_params(cfg, seed), "layers.0.")
        arrays = {"x": rng.standard_normal((B, n, d)), **lp}
        madd = padding_mask(attn_mask)

        def run(a, cfg=cfg, madd=madd):
            return encoder_layer_forward(a["x"], {k: v for k, v in a.items() if k != "x"}, cfg, madd)

        def back(R, c):
            dx, g = encoder_layer_backward(R, c)
            return {"x": dx, **g}

        add(f"encoder layer ({placement}-LN, padding mask)", run, back, arrays)

    def stack_case(label, cfg, use_ids, dropout_training):
        params = random_params(cfg, seed)
        arrays = dict(params)
        if not use_ids:
            arrays["inputs_embeds"] = rng.standard_normal((B, n, d))

        def run(a):
            p = {k: v for k, v in a.items() if k != "inputs_embeds"}
            kw = dict(attention_mask=attn_mask, training=dropout_training,
                      rng=np.random.default_rng(11) if dropout_training else None)
            if use_ids:
                return encoder_forward(p, cfg, input_ids=ids, token_type_ids=tt if cfg.type_vocab_size else None, **kw)
            return encoder_forward(p, cfg, inputs_embeds=a["inputs_embeds"], **kw)

        add(label, run, lambda R, c: encoder_backward(R, c), arrays)

    base = dict(n_layers=2, d_model=d, n_heads=h, d_ff=f, layer_norm_eps=1e-5)
    stack_case("encoder stack (post-LN, ids + token types, padding, dropout)",
               EncoderConfig(**base, norm_position="post", dropout=0.2, vocab_size=10, max_len=8,
                             type_vocab_size=2), True, True)
    stack_case("encoder stack (pre-LN + final LN, inputs_embeds, padding, dropout)",
               EncoderConfig(**base, norm_position="pre", dropout=0.2), False, True)
    stack_case("encoder stack (pre-LN, sinusoidal positions, gelu_tanh)",
               EncoderConfig(**base, norm_position="pre", dropout=0.0, vocab_size=10, max_len=8,
                             positional="sinusoidal", activation="gelu_tanh"), True, False)
    stack_case("encoder stack (weight sharing across 3 layers, ALBERT)",
               EncoderConfig(**{**base, "n_layers": 3}, norm_position="post", dropout=0.0, share_layers=True),
               False, False)

    # ---- heads and losses
    Hx = rng.standard_normal((B, n, d))
    add("mean pooling (attention mask)", lambda a: heads.mean_pool_forward(a["H"], attn_mask),
        lambda R, c: {"H": heads.mean_pool_backward(R, c)}, {"H": Hx.copy()})
    for label, fwd, bwd, C in (("[CLS] sequence classifier", heads.cls_classifier_forward,
                                heads.cls_classifier_backward, 3),
                               ("BERT pooler (tanh)", heads.pooler_forward, heads.pooler_backward, d),
                               ("per-token tagger", heads.tagger_forward, heads.tagger_backward, 4)):
        add(label, lambda a, fwd=fwd: fwd(a["H"], a["W"], a["b"]),
            lambda R, c, bwd=bwd: dict(zip(("H", "W", "b"), bwd(R, c))),
            {"H": Hx.copy(), "W": rng.standard_normal((d, C)) / np.sqrt(d), "b": 0.3 * rng.standard_normal(C)})
    labels = np.array([[0, 2, -100, 1, 3], [3, -100, 1, -100, -100]])
    add("softmax cross-entropy (ignore_index)", lambda a: cross_entropy_forward(a["logits"], labels),
        lambda R, c: {"logits": cross_entropy_backward(R, c)}, {"logits": 2.0 * rng.standard_normal((B, n, 4))})

    # ---- end to end: stack → head → loss
    cfg = EncoderConfig(**base, norm_position="post", dropout=0.0, vocab_size=10, max_len=8)
    arrays = {**random_params(cfg, seed), "head.W": rng.standard_normal((d, 3)) / np.sqrt(d),
              "head.b": 0.3 * rng.standard_normal(3)}
    y = np.array([2, 0])

    def e2e_run(a):
        p = {k: v for k, v in a.items() if not k.startswith("head.")}
        H, c1 = encoder_forward(p, cfg, input_ids=ids, attention_mask=attn_mask)
        logits, c2 = heads.cls_classifier_forward(H, a["head.W"], a["head.b"])
        loss, c3 = cross_entropy_forward(logits, y)
        return np.float64(loss), (c1, c2, c3)

    def e2e_back(R, caches):
        c1, c2, c3 = caches
        dlogits = cross_entropy_backward(R, c3)
        dH, dW, db = heads.cls_classifier_backward(dlogits, c2)
        return {**encoder_backward(dH, c1), "head.W": dW, "head.b": db}

    add("stack + [CLS] classifier + cross-entropy (end to end)", e2e_run, e2e_back, arrays)
    cases += family_cases(rng)       # MPNet's (and further families') own ops and stacks
    return cases


def run_all(seed: int = 0, max_coords: int = 24,
            progress: Callable[[int, int, str], None] | None = None) -> list[CheckResult]:
    """Run every check of the suite (float64); returns one result per case.

    ``progress(i, total, name)``, if given, is called as case ``i`` of ``total`` (1-based) starts — the
    command line passes a printer; the function itself prints nothing.
    """
    check_int(seed, "seed", minimum=0)
    check_int(max_coords, "max_coords", minimum=1)
    if progress is not None and not callable(progress):
        raise InputTypeError(f"progress must be a callable (i, total, name) or None, got {describe(progress)}")
    cases = _cases(seed)
    results = []
    for i, (name, run, back, arrays) in enumerate(cases):
        if progress is not None:
            progress(i + 1, len(cases), name)
        results.append(check_op(name, run, back, arrays, seed=seed + i, max_coords=max_coords))
    return results

# Moved in 0.2 (study code to transformer_np.course, the command line to transformer_np.cli);
# the old names keep resolving.
__getattr__ = _forward_moved(__name__, {
    "add_arguments": "transformer_np.cli.gradcheck",
    "run": "transformer_np.cli.gradcheck",
})

