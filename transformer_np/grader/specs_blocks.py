"""The exercises on blocks: multi-head attention, GELU, the position-wise FFN and the encoder layer (their
cases, reference, known mistakes; see :mod:`transformer_np.grader.specs`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..model.config import EncoderConfig
from ..model.gradcheck import random_params
from ..model.params import sub_params
from ..model.stack import encoder_layer_backward, encoder_layer_forward
from ..ops import attention  # attention.mha_forward & co.: the reference's ops, by their module
from ..ops.activations import activation_forward
from ..ops.erf import erf
from ..ops.feedforward import FFN_PARAM_NAMES, ffn_backward, ffn_forward
from ..ops.layernorm import layernorm_backward, layernorm_forward
from ..ops.linear import linear_backward
from ..ops.masks import mask_value
from .exercise_base import (
    Case,
    Exercise,
    Mistake,
    _dx_grads,
    _Phi,
    _rows,
    copy_inputs,
)

__all__ = ["FFN", "GELU", "MHA", "layer_exercise"]


# ============================================================================= multi-head attention
def _mha_arrays(rng: np.random.Generator, B: int, n: int, d: int) -> dict:
    a = {"x": rng.standard_normal((B, n, d))}
    for name in attention.MHA_PARAM_NAMES:
        a[name] = rng.standard_normal((d, d)) / math.sqrt(d) if name.startswith("W") else 0.3 * rng.standard_normal(d)
    return a


def _mha_cases() -> list[Case]:
    rng = np.random.default_rng(3)
    mask = np.zeros((2, 1, 1, 5))
    mask[1, ..., 4] = mask_value(np.float64)
    return [Case("x of shape (1, 4, 6), 2 heads (d_k = 3), no mask", _mha_arrays(rng, 1, 4, 6),
                 {"n_heads": 2, "mask": None}, dims={"d_k": 3, "d_model": 6}),
            Case("x of shape (2, 5, 6), 3 heads (d_k = 2), a padding mask of shape (2, 1, 1, 5) hiding the last "
                 "key of batch item 2", _mha_arrays(rng, 2, 5, 6), {"n_heads": 3, "mask": mask},
                 dims={"d_k": 2, "d_model": 6}, gradcheck=True)]


def _mha_params(a: dict) -> dict:
    return {k: a[k] for k in attention.MHA_PARAM_NAMES}


def _mha_variant(split: str = "ok", merge: str = "ok", scale: str = "d_k", heads: int | None = None,
                 out_proj: bool = True, no_bias: tuple[str, ...] = ()) -> Callable:
    def compute(a: dict, s: dict) -> np.ndarray:
        x = a["x"]
        B, n, d = x.shape
        h = heads or s["n_heads"]
        dk = d // h
        b = {k: (0.0 if k in no_bias else a[k]) for k in ("b_Q", "b_K", "b_V", "b_O")}

        def heads_of(t):                                            # (B, n, d) → (B, h, n, d_k)
            return t.reshape(B, h, n, dk) if split == "plain" else attention.split_heads(t, h)

        Q, K, V = (heads_of(x @ a["W_" + c] + b["b_" + c]) for c in "QKV")
        if scale == "d_model":
            Q = Q * math.sqrt(dk) / math.sqrt(d)                    # the scores become Q Kᵀ/√d_model
        O, _ = attention.attention_forward(Q, K, V, s["mask"])                # (B, h, n, d_k)
        ctx = O.reshape(B, n, d) if merge == "plain" else attention.merge_heads(O)
        return ctx @ a["W_O"] + b["b_O"] if out_proj else ctx
    return compute


def _mha_bwd_variant(drop: tuple[str, ...] = (), split: str = "ok", merge: str = "ok") -> Callable:
    def compute(a: dict, s: dict, dout: np.ndarray) -> dict:
        x, h = a["x"], s["n_heads"]
        B, n, d = x.shape
        _, c = attention.mha_forward(x, _mha_params(a), h, s["mask"])
        dctx, dW_O, db_O = linear_backward(dout, c["o"])            # (B, n, d)
        dO = dctx.reshape(B, h, n, d // h) if split == "plain" else attention.split_heads(dctx, h)
        dQKV = attention.attention_backward(dO, c["attn"])                    # 3 × (B, h, n, d_k)
        g = {"W_O": dW_O, "b_O": db_O, "x": np.zeros_like(x)}
        for name, dh in zip("QKV", dQKV):
            dP = dh.reshape(B, n, d) if merge == "plain" else attention.merge_heads(dh)   # (B, n, d)
            g["W_" + name] = _rows(x).T @ _rows(dP)
            g["b_" + name] = _rows(dP).sum(axis=0)
            if name not in drop:
                g["x"] = g["x"] + dP @ a["W_" + name].T
        return g
    return compute


_MHA_ORDER = ("W_O", "b_O", "W_V", "b_V", "W_K", "b_K", "W_Q", "b_Q", "x")
_PATH_MSG = "x feeds Q, K and V, so its gradient has a contribution from each projection; yours {what}"
_PATH_FIX = "dx = dQ W_Qᵀ + dK W_Kᵀ + dV W_Vᵀ (each head gradient merged back to (B, n, d_model))"

MHA = Exercise(
    name="mha", forward="mha_forward", backward="mha_backward",
    signature="mha_forward(x, p, n_heads, mask) -> (out, cache)",
    backward_signature="mha_backward(dout, cache) -> (dx, grads)",
    cases=_mha_cases,
    call=lambda fn, a, s: fn(a["x"], _mha_params(a), s["n_heads"], s["mask"]),
    reference=lambda a, s: attention.mha_forward(a["x"], _mha_params(a), s["n_heads"], s["mask"]),
    reference_backward=lambda d, c: _dx_grads(attention.mha_backward(d, c)),
    returns="dx_grads", grad_names=_MHA_ORDER,
    forward_hint=("Q = x W_Q + b_Q (same for K, V); split each (B, n, d) → (B, n, h, d_k) → (B, h, n, d_k); "
                  "O = attention(Q, K, V, mask); merge (B, h, n, d_k) → (B, n, h, d_k) → (B, n, d); "
                  "out = O W_O + b_O."),
    backward_hint="see the equations above the exercise.",
    backward_hints={
        "x": "dx = dQ W_Qᵀ + dK W_Kᵀ + dV W_Vᵀ, the head gradients merged back to (B, n, d_model).",
        **{f"W_{c}": f"dW_{c} = Σ xᵀ d{c} over batch and positions: x.reshape(-1, d).T @ d{c}.reshape(-1, d)."
           for c in "QKV"},
        **{f"b_{c}": f"db_{c} = d{c} summed over batch and positions." for c in "QKVO"},
        "W_O": "dW_O = Σ ctxᵀ dout over batch and positions, ctx = the merged heads (the input of W_O).",
    },
    nonfinite_hint="look at where the mask enters the attention (the given attention function adds it correctly).",
    answers=("dQ W_Qᵀ + dK W_Kᵀ + dV W_Vᵀ", "transpose(0, 2, 1, 3)"),
    allowed=("transformer_np.ops.attention.attention_forward", "transformer_np.ops.attention.attention_backward"),
    forward_mistakes=(
        Mistake("head_split", "splits the heads with a plain reshape, which mixes positions and features",
                _mha_variant(split="plain"), "reshape to (B, n, h, d_k), then transpose(0, 2, 1, 3)"),
        Mistake("head_merge", "merges the heads with a plain reshape, which mixes positions and features",
                _mha_variant(merge="plain"), "transpose(0, 2, 1, 3) back to (B, n, h, d_k) first, then reshape"),
        Mistake("head_split", "splits and merges the heads with plain reshapes, which mix positions and features",
                _mha_variant(split="plain", merge="plain"),
                "(B, n, d) → (B, n, h, d_k) → transpose → (B, h, n, d_k), and back the same way"),
        Mistake("wrong_scale", "scales the scores by the model width instead of the head width (each head has "
                "width d_model / n_heads)", _mha_variant(scale="d_model"), "1/√d_k"),
        Mistake("single_head", "ignores n_heads: it computes one head of width d_model", _mha_variant(heads=1),
                "split Q, K, V into n_heads heads of width d_k = d_model / n_heads"),
        Mistake("missing_output_projection", "leaves out the output projection", _mha_variant(out_proj=False),
                "out = Concat(heads) W_O + b_O"),
        Mistake("missing_bias", "leaves out the biases b_Q, b_K, b_V, b_O", _mha_variant(no_bias=("b_Q", "b_K", "b_V",
                                                                                                   "b_O"))),
        Mistake("missing_bias", "leaves out the output bias b_O", _mha_variant(no_bias=("b_O",))),
        Mistake("missing_bias", "leaves out the biases b_Q, b_K, b_V", _mha_variant(no_bias=("b_Q", "b_K", "b_V"))),
    ),
    backward_mistakes=(
        Mistake("missing_path", _PATH_MSG.format(what="keeps only the query path"), _mha_bwd_variant(drop=("K", "V")),
                _PATH_FIX),
        Mistake("missing_path", _PATH_MSG.format(what="leaves out the query path"), _mha_bwd_variant(drop=("Q",)),
                _PATH_FIX),
        Mistake("missing_path", _PATH_MSG.format(what="leaves out the key path"), _mha_bwd_variant(drop=("K",)),
                _PATH_FIX),
        Mistake("missing_path", _PATH_MSG.format(what="leaves out the value path"), _mha_bwd_variant(drop=("V",)),
                _PATH_FIX),
        Mistake("head_split", "splits the gradient of the merged heads with a plain reshape, which mixes positions "
                "and features (the backward must undo the forward's merge exactly)", _mha_bwd_variant(split="plain"),
                "(B, n, d) → (B, n, h, d_k) → transpose(0, 2, 1, 3)"),
        Mistake("head_merge", "merges the heads' gradients with a plain reshape, which mixes positions and features",
                _mha_bwd_variant(merge="plain"), "transpose(0, 2, 1, 3) back to (B, n, h, d_k) first"),
    ),
)


# ============================================================================= GELU
def _gelu_cases() -> list[Case]:
    rng = np.random.default_rng(4)
    return [Case("z of shape (3, 5) with values in [−3, 3]", {"z": rng.uniform(-3, 3, (3, 5))}),
            Case("z of shape (2, 4, 6), some |z| up to 6", {"z": 2.0 * rng.standard_normal((2, 4, 6))},
                 gradcheck=True)]


def _act(z: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    out, cache = activation_forward(z, kind)
    return out, cache["grad"]


_EXACT = "the exact GELU is z Φ(z) = ½ z (1 + erf(z/√2))"

GELU = Exercise(
    name="gelu", forward="gelu_forward", backward="gelu_backward",
    signature="gelu_forward(z) -> (out, cache)", backward_signature="gelu_backward(dout, cache) -> dz",
    cases=_gelu_cases,
    call=lambda fn, a, s: fn(a["z"]),
    reference=lambda a, s: activation_forward(a["z"], "gelu"),
    reference_backward=lambda d, c: {"z": d * c["grad"]},
    returns="array", grad_names=("z",),
    forward_hint=_EXACT + "; erf comes from transformer_np.ops.erf (NumPy has none).",
    backward_hint="dz = dout ⊙ (Φ(z) + z φ(z)), Φ(z) = ½(1 + erf(z/√2)), φ(z) = exp(−z²/2)/√(2π).",
    nonfinite_hint="GELU and its derivative are finite for every finite z: look at the sign of an exponent.",
    answers=("Φ(z) + z φ(z)", "dout ⊙ (Φ(z) + z φ(z))", "exp(−z²/2)/√(2π)"),
    allowed=("transformer_np.ops.erf.erf",),
    forward_mistakes=(
        Mistake("wrong_activation", "uses the tanh approximation of GELU; this exercise asks for the exact one, "
                "built on the Gaussian CDF", lambda a, s: _act(a["z"], "gelu_tanh")[0], _EXACT),
        Mistake("wrong_activation", "computes ReLU; this exercise asks for the exact GELU",
                lambda a, s: _act(a["z"], "relu")[0], _EXACT),
        Mistake("wrong_activation", "uses the sigmoid approximation of GELU; this exercise asks for the exact one",
                lambda a, s: a["z"] / (1 + np.exp(-1.702 * a["z"])), _EXACT),
        Mistake("gelu_missing_z", "returns the Gaussian CDF alone, without the factor that multiplies it",
                lambda a, s: _Phi(a["z"]), "GELU(z) = z Φ(z)"),
        Mistake("gelu_erf_argument", "feeds erf the wrong argument (the standard normal CDF rescales z first)",
                lambda a, s: 0.5 * a["z"] * (1 + erf(a["z"])), "Φ(z) = ½(1 + erf(z/√2))"),
    ),
    backward_mistakes=(
        Mistake("gelu_derivative", "has only one of the two terms of a product's derivative",
                lambda a, s, d: {"z": d * _Phi(a["z"])}, "Φ(z) + z φ(z), φ(z) = exp(−z²/2)/√(2π)"),
        Mistake("gelu_derivative", "leaves out the normalising constant of the Gaussian density",
                lambda a, s, d: {"z": d * (_Phi(a["z"]) + a["z"] * np.exp(-0.5 * a["z"] ** 2))},
                "φ(z) = exp(−z²/2)/√(2π)"),
        Mistake("wrong_activation", "uses the derivative of the tanh approximation; differentiate the exact GELU",
                lambda a, s, d: {"z": d * _act(a["z"], "gelu_tanh")[1]}, "Φ(z) + z φ(z)"),
        Mistake("wrong_activation", "uses ReLU's derivative (a step); GELU's derivative is smooth",
                lambda a, s, d: {"z": d * _act(a["z"], "relu")[1]}, "Φ(z) + z φ(z)"),
        Mistake("missing_upstream", "returns GELU's derivative without multiplying by the upstream gradient",
                lambda a, s, d: {"z": _act(a["z"], "gelu")[1]}, "dz = dout ⊙ GELU'(z)"),
    ),
)


# ============================================================================= position-wise FFN
def _ffn_arrays(rng: np.random.Generator, shape: tuple, d_ff: int) -> dict:
    d = shape[-1]
    return {"x": rng.standard_normal(shape), "W_1": rng.standard_normal((d, d_ff)) / math.sqrt(d),
            "b_1": 0.3 * rng.standard_normal(d_ff), "W_2": rng.standard_normal((d_ff, d)) / math.sqrt(d_ff),
            "b_2": 0.3 * rng.standard_normal(d)}


def _ffn_cases() -> list[Case]:
    rng = np.random.default_rng(5)
    return [Case("x of shape (4, 6), d_ff = 10", _ffn_arrays(rng, (4, 6), 10), dims={"d_model": 6, "d_ff": 10}),
            Case("a batch, x of shape (2, 3, 6), d_ff = 10", _ffn_arrays(rng, (2, 3, 6), 10),
                 dims={"d_model": 6, "d_ff": 10}, gradcheck=True)]


def _ffn_params(a: dict) -> dict:
    return {k: a[k] for k in FFN_PARAM_NAMES}


def _ffn_variant(act: str | None = "gelu", b1: str = "inside", b2: bool = True) -> Callable:
    def compute(a: dict, s: dict) -> np.ndarray:
        h = a["x"] @ a["W_1"] + (a["b_1"] if b1 == "inside" else 0.0)    # (..., d_ff)
        f = h if act is None else _act(h, act)[0]
        if b1 == "after":
            f = f + a["b_1"]
        return f @ a["W_2"] + (a["b_2"] if b2 else 0.0)                  # (..., d_model)
    return compute


def _ffn_bwd_variant(kind: str) -> Callable:
    def compute(a: dict, s: dict, dout: np.ndarray) -> dict:
        x, W_1, W_2 = a["x"], a["W_1"], a["W_2"]
        h = x @ W_1 + a["b_1"]                                           # (..., d_ff)
        f, fprime = _act(h, "gelu")
        dact = dout @ W_2.T                                              # (..., d_ff)
        dh = dact if kind == "no_act_grad" else dact * fprime
        g = {"W_2": _rows(h if kind == "dW2_pre" else f).T @ _rows(dout), "b_2": _rows(dout).sum(axis=0),
             "W_1": _rows(x).T @ _rows(dh), "b_1": _rows(dact if kind == "db1_before" else dh).sum(axis=0),
             "x": dh @ W_1.T}
        return g
    return compute


FFN = Exercise(
    name="ffn", forward="ffn_forward", backward="ffn_backward",
    signature="ffn_forward(x, p) -> (out, cache)", backward_signature="ffn_backward(dout, cache) -> (dx, grads)",
    cases=_ffn_cases,
    call=lambda fn, a, s: fn(a["x"], _ffn_params(a)),
    reference=lambda a, s: ffn_forward(a["x"], _ffn_params(a), "gelu"),
    reference_backward=lambda d, c: _dx_grads(ffn_backward(d, c)),
    returns="dx_grads", grad_names=("W_2", "b_2", "W_1", "b_1", "x"),
    forward_hint="FFN(x) = GELU(x W_1 + b_1) W_2 + b_2 (row vectors: W_1 is (d_model, d_ff), W_2 is (d_ff, d_model)).",
    backward_hint="see the equations above the exercise.",
    backward_hints={
        "x": "dx = dh W_1ᵀ with dh = (dout W_2ᵀ) ⊙ GELU'(h), h = x W_1 + b_1.",
        "W_1": "dW_1 = xᵀ dh over all rows: x.reshape(-1, d_model).T @ dh.reshape(-1, d_ff).",
        "b_1": "db_1 = dh summed over every axis but the last.",
        "W_2": "dW_2 = aᵀ dout over all rows, a = GELU(h).",
        "b_2": "db_2 = dout summed over every axis but the last.",
    },
    nonfinite_hint="check your GELU: it is finite for every finite input.",
    answers=("dh = (dout W_2ᵀ) ⊙ GELU'(h)", "dW_2 = aᵀ dout", "dW_1 = xᵀ dh", "dx = dh W_1ᵀ"),
    allowed=("transformer_np.ops.erf.erf",),
    forward_mistakes=(
        Mistake("missing_activation", "leaves out the activation between the two linear maps", _ffn_variant(act=None),
                "FFN(x) = GELU(x W_1 + b_1) W_2 + b_2"),
        Mistake("wrong_activation", "uses ReLU; this FFN uses the exact GELU", _ffn_variant(act="relu"), _EXACT),
        Mistake("wrong_activation", "uses the tanh approximation of GELU; this FFN uses the exact one",
                _ffn_variant(act="gelu_tanh"), _EXACT),
        Mistake("bias_after_activation", "adds b_1 after the activation instead of before it",
                _ffn_variant(b1="after"), "GELU(x W_1 + b_1)"),
        Mistake("missing_bias", "leaves out b_1", _ffn_variant(b1="none"), "GELU(x W_1 + b_1)"),
        Mistake("missing_bias", "leaves out b_2", _ffn_variant(b2=False), "… W_2 + b_2"),
    ),
    backward_mistakes=(
        Mistake("missing_activation_backward", "skips the activation's backward on the way from the output to the "
                "first linear map", _ffn_bwd_variant("no_act_grad"), "dh = (dout W_2ᵀ) ⊙ GELU'(h)"),
        Mistake("dW2_preactivation", "uses the pre-activation where the activation's output belongs (W_2 multiplies "
                "what GELU returned)", _ffn_bwd_variant("dW2_pre"), "dW_2 = aᵀ dout, a = GELU(h)"),
        Mistake("missing_activation_backward", "sums the gradient for b_1 before the activation's backward",
                _ffn_bwd_variant("db1_before"), "db_1 = Σ dh with dh = (dout W_2ᵀ) ⊙ GELU'(h)"),
    ),
)


# ============================================================================= encoder layer
_LAYER_D, _LAYER_H, _LAYER_FF, _LAYER_EPS = 6, 2, 10, 1e-5


def _layer_config(norm: str, d: int = _LAYER_D, h: int = _LAYER_H, d_ff: int = _LAYER_FF,
                  eps: float = _LAYER_EPS) -> EncoderConfig:
    return EncoderConfig(n_layers=1, d_model=d, n_heads=h, d_ff=d_ff, activation="gelu",
                         norm_position=norm, layer_norm_eps=eps, dropout=0.0)


def _layer_cases(norm: str) -> Callable[[], list[Case]]:
    title = "Post-LN" if norm == "post" else "Pre-LN"

    def cases() -> list[Case]:
        rng = np.random.default_rng(6 if norm == "post" else 7)
        params = sub_params(random_params(_layer_config(norm), seed=8), "layers.0.")
        mask = np.zeros((2, 1, 1, 4))
        mask[1, ..., 3] = mask_value(np.float64)
        static = {"norm": norm, "n_heads": _LAYER_H, "eps": _LAYER_EPS}
        return [Case(f"{title}, x of shape (1, 4, 6), 2 heads, no mask",
                     {"x": rng.standard_normal((1, 4, 6)), **copy_inputs(params)}, {**static, "mask": None}),
                Case(f"{title}, x of shape (2, 4, 6), 2 heads, a padding mask of shape (2, 1, 1, 4) hiding the last "
                     "key of batch item 2", {"x": rng.standard_normal((2, 4, 6)), **copy_inputs(params)},
                     {**static, "mask": mask}, gradcheck=True)]
    return cases


def _layer_params(a: dict) -> dict:
    return {k: v for k, v in a.items() if k != "x"}


def _layer_reference(a: dict, s: dict) -> tuple:
    cfg = _layer_config(s["norm"], a["x"].shape[-1], s["n_heads"], a["ffn.W_1"].shape[-1], s["eps"])
    return encoder_layer_forward(a["x"], _layer_params(a), cfg, s["mask"])


def _layer_variant(wiring: str) -> Callable:
    """The layer wired differently: "post" / "pre" (the placements), "post_no_res1", "post_no_res2",
    "post_ln_before_residual", "pre_no_res1", "pre_no_res2", "pre_skip_normed", "<norm>_ln_swapped"."""
    def compute(a: dict, s: dict) -> np.ndarray:
        x, p, h, mask, eps = a["x"], _layer_params(a), s["n_heads"], s["mask"], s["eps"]
        ln = {k: (p[f"ln{k}.gamma"], p[f"ln{k}.beta"]) for k in (1, 2)}
        if wiring.endswith("ln_swapped"):
            ln = {1: ln[2], 2: ln[1]}

        def attn(y): return attention.mha_forward(y, sub_params(p, "attn."), h, mask)[0]
        def ffn(y): return ffn_forward(y, sub_params(p, "ffn."), "gelu")[0]
        def LN(y, k): return layernorm_forward(y, *ln[k], eps)[0]

        if wiring.startswith("post"):
            if wiring == "post_ln_before_residual":
                z = x + LN(attn(x), 1)
                return z + LN(ffn(z), 2)
            z = LN(attn(x) if wiring == "post_no_res1" else x + attn(x), 1)
            return LN(ffn(z) if wiring == "post_no_res2" else z + ffn(z), 2)
        if wiring == "pre_skip_normed":
            y = LN(x, 1)
            z = y + attn(y)
            y2 = LN(z, 2)
            return y2 + ffn(y2)
        z = attn(LN(x, 1)) if wiring == "pre_no_res1" else x + attn(LN(x, 1))
        return ffn(LN(z, 2)) if wiring == "pre_no_res2" else z + ffn(LN(z, 2))
    return compute


def _layer_bwd_variant(drop: tuple[str, ...]) -> Callable:
    """The library's layer backward with the gradient of a skip path left out ("attn" and/or "ffn")."""
    def compute(a: dict, s: dict, dout: np.ndarray) -> dict:
        _, c = _layer_reference(a, s)
        g: dict = {}
        if s["norm"] == "post":
            dr, g["ln2.gamma"], g["ln2.beta"] = layernorm_backward(dout, c["ln2"])
            dz_f, gf = ffn_backward(dr, c["ffn"])
            dz = dz_f if "ffn" in drop else dr + dz_f
            dr1, g["ln1.gamma"], g["ln1.beta"] = layernorm_backward(dz, c["ln1"])
            dx_a, ga = attention.mha_backward(dr1, c["attn"])
            g["x"] = dx_a if "attn" in drop else dr1 + dx_a
        else:
            dy, gf = ffn_backward(dout, c["ffn"])
            dz_l, g["ln2.gamma"], g["ln2.beta"] = layernorm_backward(dy, c["ln2"])
            dz = dz_l if "ffn" in drop else dout + dz_l
            dy1, ga = attention.mha_backward(dz, c["attn"])
            dx_l, g["ln1.gamma"], g["ln1.beta"] = layernorm_backward(dy1, c["ln1"])
            g["x"] = dx_l if "attn" in drop else dz + dx_l
        g.update({"ffn." + k: v for k, v in gf.items()})
        g.update({"attn." + k: v for k, v in ga.items()})
        return g
    return compute


_ATTN_ORDER = tuple("attn." + k for k in _MHA_ORDER[:-1])
_FFN_ORDER = ("ffn.W_2", "ffn.b_2", "ffn.W_1", "ffn.b_1")
_SKIP_MSG = "leaves out the gradient of the skip path around the {what}: a residual has two paths back to its input"
_SKIP_FIX = "a residual x + F(x) sends its upstream gradient to x unchanged AND through F's backward, and the two add"
_POST_EQ = "Post-LN: Z = LN₁(H + MHA(H)), H' = LN₂(Z + FFN(Z))"
_PRE_EQ = "Pre-LN: Z = H + MHA(LN₁(H)), H' = Z + FFN(LN₂(Z)) (no LayerNorm after the last add)"


def layer_exercise(norm: str) -> Exercise:
    post = norm == "post"
    eq = _POST_EQ if post else _PRE_EQ
    other = _PRE_EQ if post else _POST_EQ
    common = (
        Mistake("no_residual", "leaves out the residual around attention", _layer_variant(f"{norm}_no_res1"), eq),
        Mistake("no_residual", "leaves out the residual around the FFN", _layer_variant(f"{norm}_no_res2"), eq),
        Mistake("swapped_parameters", "swaps the two LayerNorms' parameters: ln1 belongs to the attention sublayer, "
                "ln2 to the FFN", _layer_variant(f"{norm}_ln_swapped")),
    )
    specific = (
        (Mistake("ln_before_residual", "normalises each sublayer's output before the residual add instead of the "
                 "sum", _layer_variant("post_ln_before_residual"), eq),) if post else
        (Mistake("skip_from_normalised", "adds the sublayer to the normalised input instead of the un-normalised "
                 "stream", _layer_variant("pre_skip_normed"), eq),))
    order = (("ln2.gamma", "ln2.beta") + _FFN_ORDER + ("ln1.gamma", "ln1.beta") + _ATTN_ORDER + ("x",) if post else
             _FFN_ORDER + ("ln2.gamma", "ln2.beta") + _ATTN_ORDER + ("ln1.gamma", "ln1.beta", "x"))
    return Exercise(
        name=f"encoder_layer_{norm}", forward="encoder_layer_forward", backward="encoder_layer_backward",
        signature="encoder_layer_forward(x, p, norm, n_heads, mask, eps) -> (out, cache)",
        backward_signature="encoder_layer_backward(dout, cache) -> (dx, grads)",
        cases=_layer_cases(norm),
        call=lambda fn, a, s: fn(a["x"], _layer_params(a), s["norm"], s["n_heads"], s["mask"], s["eps"]),
        reference=_layer_reference,
        reference_backward=lambda d, c: _dx_grads(encoder_layer_backward(d, c)),
        returns="dx_grads", grad_names=order,
        forward_hint=eq + ".",
        backward_hint=("go through the forward in reverse; at each residual add the gradient is copied to both "
                       "operands, and where two paths meet their gradients add."),
        nonfinite_hint="check each sublayer on its own (mha_forward, layernorm_forward, ffn_forward).",
        forward_mistakes=(Mistake("wrong_norm_position", f"computes the other placement ({'Pre' if post else 'Post'}"
                                  f"-LN) where this check asks for {'Post' if post else 'Pre'}-LN",
                                  _layer_variant("pre" if post else "post"), f"{eq}, not {other}"),)
        + common + specific,
        backward_mistakes=(
            Mistake("missing_skip_gradient", _SKIP_MSG.format(what="FFN"), _layer_bwd_variant(("ffn",)), _SKIP_FIX),
            Mistake("missing_skip_gradient", _SKIP_MSG.format(what="attention sublayer"),
                    _layer_bwd_variant(("attn",)), _SKIP_FIX),
            Mistake("missing_skip_gradient", _SKIP_MSG.format(what="both sublayers"),
                    _layer_bwd_variant(("attn", "ffn")), _SKIP_FIX),
        ),
        answers=(_POST_EQ, _PRE_EQ),
        allowed=("transformer_np.model.params.sub_params", "transformer_np.ops.attention.mha_forward",
                 "transformer_np.ops.attention.mha_backward", "transformer_np.ops.feedforward.ffn_forward",
                 "transformer_np.ops.feedforward.ffn_backward", "transformer_np.ops.layernorm.layernorm_forward",
                 "transformer_np.ops.layernorm.layernorm_backward"),
        gradcheck_directions=2,
    )
