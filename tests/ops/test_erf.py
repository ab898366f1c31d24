"""The float32 coefficient set of :func:`transformer_np.ops.erf.erf` (see erf.py's module doc):
accuracy against math.erf on a dense grid, specials, and the coefficients recomputed."""

import importlib
import math

import numpy as np
import pytest
from numpy.polynomial import chebyshev, polynomial

from transformer_np.ops.erf import _erf, erf

erf_module = importlib.import_module("transformer_np.ops.erf")   # the module (transformer_np.erf is the function)

ULP1 = 2.0 ** -23   # spacing of float32 just above 1: the "ulp" unit of the relative bound


def _reference(x32: np.ndarray) -> np.ndarray:
    return np.array([math.erf(float(v)) for v in x32])


def test_float32_erf_absolute_error_on_a_dense_grid():
    x = np.linspace(-6.0, 6.0, 400_001, dtype=np.float32)   # spacing 3e-5, every range and both boundaries
    got = erf(x)
    assert got.dtype == np.float32
    err = np.abs(got.astype(np.float64) - _reference(x))
    assert err.max() <= 2e-7, f"max |error| {err.max():.3g} at x = {x[err.argmax()]}"


def test_float32_erf_relative_error_where_erf_is_small():
    # |x| <= 1 (erf(x) ~ 1.13 x): the error must scale with |erf|, a few ulp at most.
    x = np.concatenate([np.linspace(-1.0, 1.0, 200_001, dtype=np.float32),
                        np.float32([1e-38, -1e-30, 1e-20, 1e-10, -1e-7, 3e-5, -1e-3])])
    x = x[x != 0]
    ref = _reference(x)
    rel = np.abs(erf(x).astype(np.float64) - ref) / np.abs(ref)
    assert rel.max() <= 3 * ULP1, f"max relative error {rel.max() / ULP1:.2f} ulp at x = {x[rel.argmax()]}"


def test_float32_erf_specials_and_saturation():
    # the kernel (_erf) maps ±inf and NaN as math does; the public erf refuses them (issue 26's one rule)
    x = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 4.0, -4.5, 9.0, 3e38])
    got = _erf(x)
    assert got[0] == 0.0 and not np.signbit(got[0]) and got[1] == 0.0 and np.signbit(got[1])
    assert got[2] == 1.0 and got[3] == -1.0 and np.isnan(got[4])
    # exact: |erf| > 1 − 2⁻²⁵ here, which rounds to ±1 in float32 on any CPU (one correctly rounded constant)
    assert np.array_equal(got[5:], np.float32([1.0, -1.0, 1.0, 1.0]))


def test_float32_erf_is_odd_and_monotone():
    x = np.linspace(0.0, 4.5, 50_001, dtype=np.float32)
    y = erf(x)
    assert np.array_equal(erf(-x), -y)      # exact: odd by construction (x·S(x²), or the sign copied)
    assert np.all(np.diff(y) >= 0)


def test_float64_still_uses_codys_ranges():
    x = np.linspace(-5.0, 5.0, 20_001)
    ref = np.array([math.erf(v) for v in x])
    assert np.max(np.abs(erf(x) - ref)) <= 1e-15


def test_float32_coefficients_are_the_stated_chebyshev_interpolants():
    """Recompute S and M as erf.py's docstring says and compare with the stored coefficients."""
    def erf_over_x(s):                                       # erf(x)/x as a function of s = x²
        return np.array([math.erf(math.sqrt(v)) / math.sqrt(v) if v > 0 else 2 / math.sqrt(math.pi) for v in s])

    def scaled_erfc(t):                                      # erfc(y)·exp(y²) with y = 2(1/t − 1)
        y = 2.0 * (1.0 / t - 1.0)
        return np.array([math.erfc(v) * math.exp(v * v) for v in y])

    S = chebyshev.Chebyshev.interpolate(erf_over_x, 6, domain=[0.0, 1.0]).convert(kind=polynomial.Polynomial)
    M = chebyshev.Chebyshev.interpolate(scaled_erfc, 6, domain=[1 / 3, 2 / 3]).convert(kind=polynomial.Polynomial)
    # Compared where it matters: the polynomials' values over their intervals, not the coefficients. The
    # coefficients come from a linear solve on Chebyshev nodes (np.cos), and np.sin/np.cos are not correctly
    # rounded on every NumPy and CPU (NumPy 1.24 with AVX-512): a node one ulp off moves a power-basis coefficient
    # by ~5e-8 relative while the interpolant's values move by ~1e-15. Values are used in float32, so the
    # stored and the recomputed fit must agree far inside float32's half ulp (eps32 / 16 ≈ 7.5e-9 relative).
    tol = float(np.finfo(np.float32).eps) / 16
    stored_S = polynomial.Polynomial(erf_module._S32)
    stored_M = polynomial.Polynomial(erf_module._M32)
    s = np.linspace(0.0, 1.0, 2001)
    t = 1.0 / (1.0 + 0.5 * np.linspace(1.0, 4.0, 2001))          # t over [1/3, 2/3]
    assert np.max(np.abs(stored_S(s) / S(s) - 1)) < tol
    assert np.max(np.abs(stored_M(t) / M(t) - 1)) < tol
    # and the fits' own (float64) accuracy against math.erf, as documented: 1.3e-9 and 4.8e-8 relative — both
    # under float32's half ulp (6.0e-8), which is what makes them good enough for float32
    assert np.max(np.abs(stored_S(s) / erf_over_x(s) - 1)) < 2e-9
    assert np.max(np.abs(stored_M(t) / scaled_erfc(t) - 1)) < 6e-8


@pytest.mark.parametrize("shape", [(3, 5, 7), (0,), ()])
def test_float32_erf_keeps_shape(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = erf(x)
    assert got.shape == np.shape(x) and got.dtype == np.float32
    np.testing.assert_allclose(got, _reference(np.ravel(x)).reshape(shape), atol=2e-7, rtol=0)
