r"""Activations of the feed-forward sublayer: ReLU, exact GELU, tanh-approximate GELU.

Each is an elementwise map a = f(z), so the backward is dz = da ⊙ f'(z).

* ReLU:  f(z) = max(z, 0),          f'(z) = 1[z > 0]   (0 at the kink z = 0, as in PyTorch).
* GELU (exact, BERT's "gelu", PyTorch's ``approximate="none"``):
      f(z)  = z Φ(z) = ½ z (1 + erf(z/√2))
      f'(z) = Φ(z) + z φ(z),   φ(z) = exp(−z²/2)/√(2π)
* GELU (tanh approximation, HF's "gelu_new" / "gelu_pytorch_tanh", PyTorch's ``approximate="tanh"``):
      u = √(2/π) (z + 0.044715 z³),  t = tanh(u)
      f(z)  = ½ z (1 + t)
      f'(z) = ½ (1 + t) + ½ z (1 − t²) √(2/π) (1 + 3·0.044715 z²)

The derivative is computed in the forward pass and cached, so backward is a single
multiply (the forward already has erf/tanh in hand; recomputing them would double the
most expensive elementwise work of the layer).

This module is the plain path: f and f' on the whole array. The encoder stack evaluates the
same functions on blocks of the array that stay in the CPU cache
(:func:`transformer_np.fast.activation_forward`), bit for bit the same result.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import as_float_array, check_cache, check_choice, check_dout
from .erf import _erf

__all__ = ["ACTIVATIONS", "activation_forward", "activation_backward",
           "relu_forward", "relu_backward", "gelu_forward", "gelu_backward",
           "gelu_tanh_forward", "gelu_tanh_backward"]

ACTIVATIONS = ("gelu", "gelu_tanh", "relu")

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_C = 0.044715


def _relu(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mask = z > 0
    return z * mask, mask.astype(z.dtype)


def _gelu_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _erf(z * _INV_SQRT2))                 # Φ(z)


def _gelu(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cdf = _gelu_cdf(z)
    pdf = np.exp(-0.5 * z * z) * _INV_SQRT_2PI              # φ(z)
    return z * cdf, cdf + z * pdf


def _gelu_tanh_t(z: np.ndarray, z2: np.ndarray) -> np.ndarray:
    return np.tanh(_SQRT_2_OVER_PI * z * (1.0 + _C * z2))    # t = tanh(√(2/π) (z + C z³))


def _gelu_tanh(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z2 = z * z
    t = _gelu_tanh_t(z, z2)
    half_1pt = 0.5 * (1.0 + t)
    out = z * half_1pt
    grad = half_1pt + 0.5 * z * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _C * z2)
    return out, grad


_FUNCS = {"relu": _relu, "gelu": _gelu, "gelu_tanh": _gelu_tanh}

#: f(z) alone (inference), by the same operations as the value half of :data:`_FUNCS` (bit for bit).
_VALUE_FUNCS = {"relu": lambda z: z * (z > 0),
                "gelu": lambda z: z * _gelu_cdf(z),
                "gelu_tanh": lambda z: z * (0.5 * (1.0 + _gelu_tanh_t(z, z * z)))}


def _activation_forward(z: np.ndarray, activation: str = "gelu") -> tuple[np.ndarray, dict]:
    a, grad = _FUNCS[activation](z)                           # f(z), f'(z): each z's shape
    return a, {"kind": "activation", "activation": activation, "grad": grad}


def _activation_backward(da: np.ndarray, cache: dict) -> np.ndarray:
    return da * cache["grad"]                                 # dz = da ⊙ f'(z)


def activation_forward(z: np.ndarray, activation: str = "gelu") -> tuple[np.ndarray, dict]:
    """a = f(z) elementwise. ``activation`` is "gelu" (exact), "gelu_tanh" or "relu".

    Returns ``(a, cache)``; the cache holds f'(z) (same shape and dtype as z).
    """
    check_choice(activation, "activation", ACTIVATIONS)
    as_float_array(z, "z")
    return _activation_forward(z, activation)


def activation_backward(da: np.ndarray, cache: dict) -> np.ndarray:
    """dz = da ⊙ f'(z)."""
    check_cache(cache, "cache", "activation")
    check_dout(da, "da", cache["grad"].shape)
    return _activation_backward(da, cache)


def relu_forward(z):
    """ReLU: max(z, 0). See :func:`activation_forward`."""
    return activation_forward(z, "relu")


def gelu_forward(z):
    """Exact GELU z·Φ(z) with the erf of :mod:`transformer_np.ops.erf`."""
    return activation_forward(z, "gelu")


def gelu_tanh_forward(z):
    """Tanh-approximate GELU (HF "gelu_new")."""
    return activation_forward(z, "gelu_tanh")


relu_backward = gelu_backward = gelu_tanh_backward = activation_backward
