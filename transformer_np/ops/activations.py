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

Speed: f and f' are a chain of ~80 elementwise NumPy passes for exact GELU (erf is a
degree-8 rational function plus two exps). On a (B, n, d_ff) tensor of 12 MB every pass
streams through main memory; evaluated on blocks of 16 Ki elements all the temporaries
stay in the L2 cache, which measured ~2.7× faster here (see docs/bench_notes.md). The
math is the same per element, so the result is bit-for-bit the same.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import as_float_array, check_cache, check_choice, check_dout
from .erf import erf

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


def _gelu(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cdf = 0.5 * (1.0 + erf(z * _INV_SQRT2))                 # Φ(z)
    pdf = np.exp(-0.5 * z * z) * _INV_SQRT_2PI              # φ(z)
    return z * cdf, cdf + z * pdf


def _gelu_tanh(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z2 = z * z
    t = np.tanh(_SQRT_2_OVER_PI * z * (1.0 + _C * z2))
    half_1pt = 0.5 * (1.0 + t)
    out = z * half_1pt
    grad = half_1pt + 0.5 * z * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _C * z2)
    return out, grad


_FUNCS = {"relu": _relu, "gelu": _gelu, "gelu_tanh": _gelu_tanh}
_BLOCK = 16384   # elements per block: ~64 KB in float32, so f's ~10 live temporaries fit in L2


def _blockwise(f, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f(z), f'(z)) for an elementwise f, evaluated on consecutive blocks of the flattened z."""
    out, grad = np.empty_like(z), np.empty_like(z)
    z_flat, out_flat, grad_flat = z.reshape(-1), out.reshape(-1), grad.reshape(-1)   # (size,)
    for start in range(0, z_flat.size, _BLOCK):
        block = slice(start, start + _BLOCK)
        out_flat[block], grad_flat[block] = f(z_flat[block])
    return out, grad


def activation_forward(z: np.ndarray, activation: str = "gelu") -> tuple[np.ndarray, dict]:
    """a = f(z) elementwise. ``activation`` is "gelu" (exact), "gelu_tanh" or "relu".

    Returns ``(a, cache)``; the cache holds f'(z) (same shape and dtype as z).
    """
    check_choice(activation, "activation", ACTIVATIONS)
    as_float_array(z, "z", finite=False)
    out, grad = _blockwise(_FUNCS[activation], z)
    return out, {"kind": "activation", "activation": activation, "grad": grad}


def activation_backward(da: np.ndarray, cache: dict) -> np.ndarray:
    """dz = da ⊙ f'(z)."""
    check_cache(cache, "cache", "activation")
    check_dout(da, "da", cache["grad"].shape)
    return da * cache["grad"]


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
