r"""The gated feed-forward sublayer (GLU family; ModernBERT's GeGLU), with optional biases.

    U = Z W_1 (+ b_1)                    (..., 2f)    W_1 (d, 2f): HF's ``Wi`` (its weight transposed)
    A, G = U[..., :f], U[..., f:]        (..., f)     "input" and "gate" (HF: ``Wi(x).chunk(2, dim=-1)``)
    Y = act(A) ⊙ G                       (..., f)     GeGLU when act = GELU
    out = Dropout(Y) W_2 (+ b_2)         (..., d)     W_2 (f, d): HF's ``Wo``

Backward, with dY the gradient of Y (after the dropout mask and the output projection):
    dG = dY ⊙ act(A)
    dA = dY ⊙ G ⊙ act'(A)
    dU = [dA, dG]                        (..., 2f)    the two halves back side by side
and the two projections as in :mod:`transformer_np.ops.linear` (dZ = dU W_1ᵀ, dW_1 = Zᵀ dU, db_1 = Σ dU).
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, check_cache, check_choice, check_dout
from ..errors import InputValueError
from .activations import ACTIVATIONS, _activation_backward, _activation_forward
from .dropout import _dropout_backward, _dropout_forward
from .linear import _linear_backward, _linear_forward

__all__ = ["glu_forward", "glu_backward", "glu_ffn_forward", "glu_ffn_backward"]


# ----------------------------------------------------------------------------- the computation
def _glu_forward(u: np.ndarray, activation: str) -> tuple[np.ndarray, dict]:
    f = u.shape[-1] // 2
    A, G = u[..., :f], u[..., f:]                            # (..., f) each
    actA, c_act = _activation_forward(A, activation)         # act(A), act'(A) kept in c_act
    return actA * G, {"kind": "glu", "G": G, "actA": actA, "act": c_act}   # (..., f)


def _glu_backward(dy: np.ndarray, cache: dict) -> np.ndarray:
    dG = dy * cache["actA"]                                  # dG = dY ⊙ act(A)
    dA = _activation_backward(dy * cache["G"], cache["act"])  # dA = dY ⊙ G ⊙ act'(A)
    return np.concatenate([dA, dG], axis=-1)                 # (..., 2f)


def _glu_ffn_forward(z: np.ndarray, p: dict, activation: str, dropout_p: float = 0.0, training: bool = False,
                     rng=None) -> tuple[np.ndarray, dict]:
    """``p`` holds W_1 (d, 2f), W_2 (f, d) and, when the sublayer has biases, b_1 (2f,) and b_2 (d,)."""
    u, c1 = _linear_forward(z, p["W_1"], p.get("b_1"))       # (..., 2f)
    y, cg = _glu_forward(u, activation)                      # (..., f)
    y, cd = _dropout_forward(y, dropout_p, training, rng)
    out, c2 = _linear_forward(y, p["W_2"], p.get("b_2"))     # (..., d)
    return out, {"kind": "glu_ffn", "lin1": c1, "glu": cg, "drop": cd, "lin2": c2}


def _glu_ffn_backward(dout: np.ndarray, cache: dict) -> tuple[np.ndarray, dict]:
    g: dict = {}
    dy, g["W_2"], db_2 = _linear_backward(dout, cache["lin2"])   # (..., f)
    du = _glu_backward(_dropout_backward(dy, cache["drop"]), cache["glu"])   # (..., 2f)
    dz, g["W_1"], db_1 = _linear_backward(du, cache["lin1"])     # (..., d)
    if db_1 is not None:
        g["b_1"], g["b_2"] = db_1, db_2
    return dz, g


# ----------------------------------------------------------------------------- the public API
def glu_forward(u: np.ndarray, activation: str = "gelu") -> tuple[np.ndarray, dict]:
    """act(U[..., :f]) ⊙ U[..., f:] for U (..., 2f) → (..., f); GeGLU with the default GELU."""
    as_float_array(u, "u")
    check_choice(activation, "activation", ACTIVATIONS)
    if u.ndim == 0 or u.shape[-1] % 2:
        raise InputValueError(f"u must have an even last axis (input and gate halves), got shape {u.shape}")
    return _glu_forward(u, activation)


def glu_backward(dy: np.ndarray, cache: dict) -> np.ndarray:
    """dU = [dY ⊙ G ⊙ act'(A), dY ⊙ act(A)]."""
    check_cache(cache, "cache", "glu")
    check_dout(dy, "dy", cache["G"].shape)
    return _glu_backward(dy, cache)


def glu_ffn_forward(z: np.ndarray, p: dict, activation: str = "gelu", dropout_p: float = 0.0,
                    training: bool = False, rng=None) -> tuple[np.ndarray, dict]:
    """The gated sublayer on Z (..., d): W_1 (d, 2f), W_2 (f, d), biases b_1, b_2 both or neither."""
    as_float_array(z, "z")
    check_choice(activation, "activation", ACTIVATIONS)
    W_1, W_2 = as_float_array(p.get("W_1"), "p['W_1']", ndim=2), as_float_array(p.get("W_2"), "p['W_2']", ndim=2)
    if W_1.shape != (z.shape[-1], 2 * W_2.shape[0]) or W_2.shape[1] != z.shape[-1]:
        raise InputValueError(f"p['W_1'] must be (d, 2f) and p['W_2'] (f, d) for z of width d = {z.shape[-1]}, got "
                              f"{W_1.shape} and {W_2.shape}")
    if ("b_1" in p) != ("b_2" in p):
        raise InputValueError("p must hold both biases b_1 and b_2 or neither")
    return _glu_ffn_forward(z, p, activation, dropout_p, training, rng)


def glu_ffn_backward(dout: np.ndarray, cache: dict) -> tuple[np.ndarray, dict]:
    """``(dz, grads)``: grads keyed W_1, W_2 (and b_1, b_2 when the sublayer has biases)."""
    check_cache(cache, "cache", "glu_ffn")
    check_dout(dout, "dout", cache["lin1"]["x"].shape)
    return _glu_ffn_backward(dout, cache)
