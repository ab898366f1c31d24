"""The fast path's float64 exact GELU (``transformer_np/fast/gelu64.py``): against exact values, its
coefficients against their definition, non-finite and signed inputs as the plain op, blocks and
threads changing nothing, and the fast op against the plain op within the tolerance rule.

The exact values: Φ(z) = ½ erfc(−z/√2) with math.erfc (float64, ~1 ulp), corrected for the rounding
of y = −z/√2 itself (erfc's relative sensitivity to y is 2y² = z²: without the correction the
reference carries z²·eps/2, more than the kernel's own error below z = −3), and φ(z) from the exact
z²/2 (fractions) split into two floats. Measured against mpmath at 30 digits on 6,500 points: this
reference is within 4.3e-16 (relative) of Φ's exact values.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from helpers import assert_paths_close
from transformer_np import fast
from transformer_np.fast import gelu64 as _gelu64
from transformer_np.ops import kernels as plain
from transformer_np.ops.activations import _gelu

pytestmark = pytest.mark.usefixtures("fast_thread_defaults")   # (tests/conftest.py)

EPS = float(np.finfo(np.float64).eps)
TINY = 2.0 ** -1074                     # the smallest subnormal
NORMAL = float(np.finfo(np.float64).tiny)


def _exact_phi(z: float) -> float:
    """Φ(z) = ½ erfc(y), y = −z/√2 taken exactly: erfc(y + δ) = erfc(y) − δ·(2/√π)·exp(−y²)."""
    y = -z / math.sqrt(2.0)
    with localcontext() as ctx:
        ctx.prec = 40
        delta = float(Decimal(-z) / Decimal(2).sqrt() - Decimal(y))     # the rounding of y
    ec = math.erfc(y)
    if ec < NORMAL:                     # subnormal or 0 (z < −37.5): only absolute accuracy is asked there
        return 0.5 * ec
    return 0.5 * ec * (1.0 - delta * (2.0 / math.sqrt(math.pi)) * math.exp(-y * y) / ec)


def _exact_pdf(z: float) -> float:
    """φ(z) = exp(−z²/2)/√(2π) with z²/2 exact: exp(−h − l) = exp(−h)(1 − l), h + l = z²/2."""
    q = Fraction(z) ** 2 / 2
    h = float(q)
    return math.exp(-h) * (1.0 - float(q - Fraction(h))) / math.sqrt(2.0 * math.pi)


def _mills(a: float) -> float:
    """Φ(−a)/φ(a) for a ≥ 20, the continued fraction 1/(a + 1/(a + 2/(a + 3/(a + …)))) from depth 60 back."""
    r = a
    for k in range(60, 0, -1):
        r = a + k / r
    return 1.0 / r


def _exact_m(a: float) -> float:
    """M(a) = Φ(−a) exp(a²/2), a ≥ 0: from erfc and the exact a²/2 up to a = 20; past it by the Mills ratio
    (Φ(−a) is subnormal from a = 37.5 on)."""
    if a <= 20.0:
        q = Fraction(a) ** 2 / 2
        h = float(q)
        return _exact_phi(-a) * math.exp(h) * (1.0 + float(q - Fraction(h)))
    return _mills(a) / math.sqrt(2.0 * math.pi)


def _exact_one(z: float) -> tuple[float, float]:
    """(f(z), f'(z)); for z < −20 as φ(z)·(z R, R + z), R the Mills ratio, with φ(z) scaled by e¹⁰⁰ so that
    no intermediate is subnormal (Φ(z) is from z = −37.5 on; f(z) only from z = −38.4)."""
    if z >= -20.0:
        phi = _exact_phi(z)
        return z * phi, phi + z * _exact_pdf(z)
    q = Fraction(z) ** 2 / 2
    h = float(q)
    pdf_scaled = math.exp(100.0 - h) * (1.0 - float(q - Fraction(h))) / math.sqrt(2.0 * math.pi)
    r = _mills(-z)
    return z * r * pdf_scaled * math.exp(-100.0), (r + z) * pdf_scaled * math.exp(-100.0)


def _exact(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    f, g = zip(*(_exact_one(float(v)) for v in z))
    return np.array(f), np.array(g)


def _kernels(z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    f, g, v = np.empty_like(z), np.empty_like(z), np.empty_like(z)
    _gelu64._gelu64(z, f, g, *(np.empty_like(z) for _ in range(3)))
    _gelu64._gelu64_value(z, v, *(np.empty_like(z) for _ in range(3)))
    return f, g, v


def test_against_exact_values():
    """Relative error of f ≤ 1.5e-15 + eps·z²/2 (measured: ≤ 9.8e-16 for z ≥ −1, 1.5e-15 at z = −3, 5.8e-14
    near z = −37.5, and never more than 9.2e-16 + eps·z²/2): exp(−z²/2) carries z²'s half-ulp rounding times
    z²/2, the rest is M(t)'s float64 evaluation. Where Φ(z) is subnormal (z < −37.5), e's half-ulp times
    |z|. f' within 4 eps (absolute, |f'| ≤ 1.13; measured 2.5 eps) for z ≥ −3, and f's relative bound
    below (f' ≈ z φ(z) there). The value-only kernel's f is the fused kernel's f."""
    z = np.concatenate([np.linspace(-40, 40, 40_001), 3 * np.random.default_rng(0).standard_normal(20_000),
                        [1e-300, -1e-300, 1e-17, -1e-17, 3e-9, -3e-9, 1e-308, 5e-324, -5e-324]])
    f, g, v = _kernels(z)
    ef, eg = _exact(z)
    np.testing.assert_array_equal(v, f)          # exact: the same operations on the same values up to f = z Φ(z)
    near = z >= -3
    bound = 1.5e-15 + EPS * z * z / 2
    floor = (np.abs(z) + 1) * TINY               # subnormal Φ (z < −37.5) and f: e's half-ulp times |z|, f's own
    err_f = np.abs(f - ef)
    assert np.all(err_f <= bound * np.abs(ef) + floor), np.max(err_f / (bound * np.abs(ef) + floor))
    err_g = np.abs(g - eg)
    assert np.all(err_g[near] <= 4 * EPS), np.max(err_g[near]) / EPS
    assert np.all(err_g[~near] <= bound[~near] * np.abs(eg[~near]) + floor[~near])
    assert np.all(f[z > 38.6] == z[z > 38.6])    # exact: exp(−z²/2) = 0 there, Φ = |1 − 0| = 1


def test_special_values_as_the_plain_op():
    """NaN, ±inf, ±0 and tiny values: the plain op's results (it computes z Φ(z), Φ(z) + z φ(z) too),
    signs of zeros included; f(z) = z/2 and f'(z) = ½ exactly for |z| < 1e-17."""
    z = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 5e-324, -5e-324, 1e-300, -1e-300, 1e-18, -1e-18,
                  1e200, -1e200, 1e155, -1e155, 40.0, -40.0])
    with np.errstate(invalid="ignore", over="ignore"):   # ±inf·0 warns in both; the plain op's kernel (its
        f, g, v = _kernels(z)                            # public op refuses NaN/inf)
        pf, pg = _gelu(z)
    for ours, theirs in ((f, pf), (v, pf), (g, pg)):
        np.testing.assert_array_equal(ours, theirs)   # exact: z·½, z·1, z·0 and NaN are exact in both ops
        np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))   # exact: as above, signs too
    assert np.isnan(f[0]) and f[1] == np.inf and np.isnan(f[2]) and np.all(np.isnan(g[:3]))
    assert np.all(g[3:11] == 0.5) and np.all(f[3:11] == 0.5 * z[3:11])   # exact: t = 1, exp(0) = 1, M(1) = ½


def _recomputed_interpolant():
    """The degree-20 Chebyshev interpolant of M(a) = Φ(−a) exp(a²/2) in t = K/(a + K) on [K/(A + K), 1],
    from math.erfc and exact squares, its coefficients by math.fsum (no BLAS): returns (x(t), coefficients)."""
    K, A, deg = _gelu64._K, _gelu64._A, _gelu64._DEGREE
    tmin = K / (A + K)
    theta = [(2 * j + 1) * math.pi / (2 * deg + 2) for j in range(deg + 1)]

    def m(x: float) -> float:                           # x ∈ [−1, 1] ↦ t ↦ a
        t = tmin + (x + 1) / 2 * (1 - tmin)
        return _exact_m(K * (1 - t) / t)

    fx = [m(math.cos(th)) for th in theta]
    cheb = [(1 if k == 0 else 2) / (deg + 1) * math.fsum(fx[j] * math.cos(k * theta[j]) for j in range(deg + 1))
            for k in range(deg + 1)]
    return (lambda t: (2 * t - (1 + tmin)) / (1 - tmin)), cheb


def test_coefficients_are_the_interpolant_they_claim_to_be():
    """The constants (monomials in t, by Horner) against the interpolant recomputed here (evaluated in its
    Chebyshev form by Clenshaw's recurrence, stable), on the whole range of t: equal to rounding, which is
    how a monomial basis can be compared (its coefficients move more than its values); and the constants'
    float64 evaluation within 1.5e-15 of M itself (measured: 1.1e-15)."""
    from numpy.polynomial import chebyshev as C
    from numpy.polynomial import polynomial as P
    x_of, cheb = _recomputed_interpolant()
    K, A = _gelu64._K, _gelu64._A
    a = np.concatenate([np.linspace(0, 6, 2_001), np.linspace(6, A, 501)])
    t = K / (a + K)
    ours = P.polyval(t, _gelu64._M)
    assert_paths_close(ours, C.chebval(x_of(t), cheb), paths=("constants", "recomputed"), k=len(_gelu64._M))
    exact_m = np.array([_exact_m(v) for v in a])
    assert np.max(np.abs(ours - exact_m) / exact_m) <= 1.5e-15


@pytest.mark.parametrize("size", [1, 5, 16_383, 16_384, 16_385, 70_001])
@pytest.mark.parametrize("threads", [1, 2])
def test_blocks_and_threads_are_the_one_block_kernel(size, threads):
    z = 3 * np.random.default_rng(size).standard_normal(size)
    f1, g1, v1 = _kernels(z)
    fast.set_num_threads(threads)
    f, c = fast.activation_forward(z, "gelu")
    v, _ = fast.activation_forward(z, "gelu", for_backward=False)
    np.testing.assert_array_equal(f, f1)          # exact: elementwise, the same kernel on the same values
    np.testing.assert_array_equal(c["grad"], g1)  # exact: as above
    np.testing.assert_array_equal(v, v1)          # exact: as above


@pytest.mark.parametrize("shape", [(7,), (64, 256), (3, 5, 3072)])
@pytest.mark.parametrize("scale", [1.0, 3.0, 12.0])
def test_the_fast_op_is_the_plain_op_to_rounding(shape, scale):
    """The fast op against the plain op (Cody's erf), elementwise, k = 1 (the plain op's 1 + erf loses
    Φ's relative accuracy for z < 0: the absolute floor of the rule covers it)."""
    z = scale * np.random.default_rng(len(shape)).standard_normal(shape)
    (f, c), (pf, pc) = fast.activation_forward(z, "gelu"), plain.activation_forward(z, "gelu")
    v, _ = fast.activation_forward(z, "gelu", for_backward=False)
    assert_paths_close(f, pf, k=1)
    assert_paths_close(v, pf, paths=("value-only", "plain"), k=1)
    assert_paths_close(c["grad"], pc["grad"], k=1)
