r"""The fast path's exact GELU in float64: one range, one exp, no select, no gather.

GELU(z) = z Φ(z), f'(z) = Φ(z) + z φ(z), φ(z) = exp(−z²/2)/√(2π). With a = |z|:

    Φ(−a) = exp(−a²/2) · M(a),   M(a) = Φ(−a) exp(a²/2) = ½ erfcx(a/√2)

M is smooth and slowly varying (M(0) = ½, M(a) ~ 1/(a√(2π)) for large a), so it is a polynomial in
the bounded variable

    t = K / (a + K) ∈ (0, 1]       (t = 1 at z = 0, t → 0 as |z| → ∞; t = 0 exactly at |z| = inf)

on a ∈ [0, A]: :data:`_M` holds the degree-20 Chebyshev interpolant of M in t on [K/(A + K), 1],
converted to monomials in t (lowest degree first). How it was computed (scratch script, not shipped):
M(a) at the 21 Chebyshev nodes with mpmath at 40 digits (erfc and exp), the Chebyshev coefficients by
the discrete cosine sum, the conversion to monomials in t in mpmath, each coefficient then rounded to
float64; the top coefficient c_20 was then moved by 5e-17 (its effect c·t²⁰ is below 1e-17 away from
t = 1) so that Horner's float64 sum at t = 1 is ½ exactly: Φ(0) = ½, f'(0) = ½ and f(z) = z/2 exactly
for |z| < 1e-17, as in the plain op. tests/ops/test_gelu64.py recomputes the interpolant in float64
from math.erfc (without BLAS) and compares the values.

K = 5.5, degree 20: the smallest degree whose float64 evaluation stays at the rounding level, from a
scan of K ∈ [4, 12] and degrees 18–24 (a larger K needs a lower degree but amplifies the rounding of t
near z = 0, and past K ≈ 8 the monomials in t lose digits). The interpolant's own relative error is
below 1e-16; its float64 evaluation (coefficients rounded, Horner in float64, t rounded twice)
7.5e-16 for a ≤ 3 and 1.1e-15 on [0, A]. A = 38.6: exp(−a²/2) underflows to 0 past it, so the
polynomial, bounded on [0, 1], only ever multiplies 0 there.

Then, with e = Φ(−|z|) = exp(−z²/2) M(t):

    Φ(z) = |[z > 0] − e|           (1 − e for z > 0; e for z ≤ 0, exactly: |0 − e| = e)
    f(z) = z Φ(z),   f'(z) = Φ(z) + z φ(z)     (φ from the same exp)

one identity for both signs, no branch or select. Φ(z) keeps e's relative accuracy for z < 0 (the
plain op's ½(1 + erf) loses it to cancellation there).

Accuracy (tests/ops/test_gelu64.py, against math.erfc corrected for the rounding of z/√2, on a dense
grid of [−40, 40], N(0, 9) draws and special values): relative error of f ≤ 9.8e-16 for z ≥ −1,
1.5e-15 at z = −3, and in general ≤ 9.2e-16 + eps·z²/2: exp(−z²/2) carries z²'s rounding (half an
ulp) times z²/2 (the float32 kernels document the same effect) — 1.5e-14 at z = −20, 5.8e-14 near
z = −37.5, past which Φ(z) is subnormal and f is within |z|/2 subnormal ulps of the exact value.
f' is within 2.5 eps (absolute) for z ≥ −3 and has f's relative error below. For large z, f(z) = z
exactly (e = 0 past z ≈ 38.6; before that z Φ(z) rounds to z once e < eps/2).

Non-finite input behaves as the plain op (:func:`transformer_np.ops.activations._gelu`), which
computes z Φ(z) and Φ(z) + z φ(z) too: f(NaN) = NaN, f(+inf) = inf, f(−inf) = −inf · 0 = NaN,
f'(±inf) = ±inf · 0 + … = NaN. Signed zeros: f(±0) = ±0, f'(±0) = ½ (the plain op's values).
z² overflows for |z| > 1.3e154 (exp(−inf) = 0, the right factor): that overflow is not reported.
"""

from __future__ import annotations

import math

import numpy as np

_K = 5.5            # t = K / (|z| + K)
_A = 38.6           # the interpolation range a ∈ [0, A]: exp(−a²/2) underflows to 0 past it
_DEGREE = 20
# M(t), monomials in t, lowest degree first (see the module doc for how they were computed)
_M = (1.6103614642217095e-11, 0.07253495918541984, 0.07253498225291147, 0.07013677825703436,
      0.06534470866117353, 0.058362997698506475, 0.04985226623866361, 0.03978663296056524,
      0.03040408325371001, 0.02427451238801397, -0.007179338597901302, 0.07650614518892691,
      -0.16902454707247905, 0.3159424290008892, -0.44441620045106567, 0.4709974254477446,
      -0.37340806624709455, 0.2094932872254791, -0.0772614607831315, 0.016734280025577117,
      -0.0016158746490469711)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _phi_minus_abs(z: np.ndarray, t: np.ndarray, e: np.ndarray, E: np.ndarray) -> None:
    """e = Φ(−|z|) and E = exp(−z²/2) of a float64 block z; t is left holding K/(|z| + K).
    2·20 + 7 in-place passes (one of them the exp, one a division)."""
    np.abs(z, out=t)                                        # |z|
    t += _K
    np.divide(_K, t, out=t)                                 # t = K / (|z| + K) ∈ [0, 1]
    np.multiply(t, _M[-1], out=e)                           # Horner, in place: e = M(t)
    e += _M[-2]
    for c in _M[-3::-1]:
        e *= t
        e += c
    np.square(z, out=E)                                     # z² (inf past 1.3e154: exp gives 0)
    E *= -0.5
    np.exp(E, out=E)                                        # exp(−z²/2)
    e *= E                                                  # e = Φ(−|z|)


def _phi(z: np.ndarray, t: np.ndarray, e: np.ndarray, E: np.ndarray) -> None:
    """t = Φ(z) = |[z > 0] − e| (e = Φ(−|z|): e for z ≤ 0, 1 − e for z > 0) and E = exp(−z²/2) of a float64
    block z, for both kernels; e is left holding Φ(−|z|)."""
    with np.errstate(over="ignore"):                        # z² past 1.3e154: exp(−inf) = 0 is right
        _phi_minus_abs(z, t, e, E)
    np.greater(z, 0.0, out=t)                               # [z > 0] as 0.0 / 1.0
    t -= e
    np.abs(t, out=t)                                        # Φ(z)


def _gelu64(z: np.ndarray, out: np.ndarray, grad: np.ndarray, t: np.ndarray, e: np.ndarray,
            E: np.ndarray) -> None:
    """GELU and its derivative of a float64 block z into ``out`` (which may be z itself) and ``grad``;
    t, e, E are float64 scratch arrays of z's size. 54 in-place passes (the Horner steps 40 of them),
    one exp:

        e     = Φ(−|z|) = exp(−z²/2) M(t)
        Φ(z)  = |[z > 0] − e|
        f(z)  = z Φ(z),   f'(z) = Φ(z) + z φ(z),  φ(z) = exp(−z²/2)/√(2π)   (the same exp)
    """
    _phi(z, t, e, E)                                        # t = Φ(z), E = exp(−z²/2)
    E *= z
    E *= _INV_SQRT_2PI                                      # z φ(z)
    np.add(t, E, out=grad)                                  # f'(z) = Φ(z) + z φ(z)
    np.multiply(z, t, out=out)                              # f(z) = z Φ(z), last: out may be z itself


def _gelu64_value(z: np.ndarray, out: np.ndarray, t: np.ndarray, e: np.ndarray, E: np.ndarray) -> None:
    """GELU of a float64 block z into ``out`` (which may be z itself), value only (inference); t, e, E
    are float64 scratch arrays of z's size. 51 in-place passes: :func:`_gelu64` without z φ(z) and f'.

        e = Φ(−|z|) = exp(−z²/2) M(t),   f(z) = z |[z > 0] − e|
    """
    _phi(z, t, e, E)                                        # t = Φ(z)
    np.multiply(z, t, out=out)                              # f(z) = z Φ(z)
