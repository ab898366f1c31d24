"""The comparison rule's helper (tests/helpers.py): it passes on last-bit differences between two
paths and fails on a real difference, with a message naming the paths, the element and the tolerance."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import assert_paths_close, path_tolerance


def test_tolerance_is_c_eps_sqrt_k():
    assert path_tolerance(np.float64, 64, c=2.0) == 2.0 * np.finfo(np.float64).eps * 8.0
    assert path_tolerance(np.float32, 1, c=1.0) == float(np.finfo(np.float32).eps)
    with pytest.raises(TypeError, match="exact by construction"):
        path_tolerance(np.int64, 4)
    with pytest.raises(ValueError, match="k"):
        path_tolerance(np.float64, 0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_passes_on_last_bit_differences(dtype):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5, 7)).astype(dtype)
    y = np.nextafter(x, np.inf * np.sign(rng.normal(size=x.shape)).astype(dtype))   # every element one ulp away
    assert (x != y).all()
    assert_paths_close(y, x, k=1, c=1.0)
    z = np.nextafter(y, np.inf).astype(dtype)                                           # a few ulp
    assert_paths_close(z, x, k=16)


def test_passes_on_two_summation_orders():
    rng = np.random.default_rng(1)
    A, B = rng.normal(size=(40, 300)), rng.normal(size=(300, 30))
    one_call = A @ B
    by_blocks = sum(A[:, i:i + 7] @ B[i:i + 7] for i in range(0, 300, 7))   # another summation order
    assert not (one_call == by_blocks).all()
    assert_paths_close(by_blocks, one_call, paths=("blocked", "one call"), k=300)


def test_absolute_floor_lets_through_round_off_in_a_zero():
    x = np.array([1.0, 2.0, 0.0])
    y = np.array([1.0, 2.0, 4e-16])                     # zero in exact arithmetic, round-off on one path
    assert_paths_close(y, x, k=4)
    with pytest.raises(AssertionError):
        assert_paths_close(y, x, k=4, atol_scale=0.0)


def test_scale_for_an_array_that_is_zero_in_exact_arithmetic():
    noise_a, noise_b = np.array([3e-17, -1e-16]), np.array([-2e-17, 5e-17])   # e.g. two paths' d b_K
    with pytest.raises(AssertionError, match="max|"):
        assert_paths_close(noise_a, noise_b, k=16)            # its own max is noise: no floor to speak of
    assert_paths_close(noise_a, noise_b, k=16, scale=2.0)     # the backward's largest gradient is 2
    with pytest.raises(AssertionError, match=r"S = 2"):
        assert_paths_close(np.array([1e-3, 0.0]), noise_b, k=16, scale=2.0)


def test_fails_on_a_real_difference_in_float64():
    x = np.random.default_rng(2).normal(size=(4, 6))
    y = x.copy()
    y[2, 3] *= 1 + 1e-6
    with pytest.raises(AssertionError) as e:
        assert_paths_close(y, x, paths=("blocked", "unblocked"), k=64)
    msg = str(e.value)
    assert "blocked vs unblocked" in msg and "index (2, 3)" in msg
    assert repr(float(y[2, 3])) in msg and repr(float(x[2, 3])) in msg
    tol = path_tolerance(np.float64, 64)
    assert f"{tol:.3g}" in msg and "√64" in msg and "float64" in msg


def test_fails_on_a_real_difference_in_float32():
    x = np.random.default_rng(3).normal(size=50).astype(np.float32)
    y = x.copy()
    y[7] += np.float32(1e-3) * abs(x).max()
    with pytest.raises(AssertionError, match=r"index \(7,\)"):
        assert_paths_close(y, x, k=1024)


def test_float32_against_float64_uses_float32_eps():
    x = np.random.default_rng(4).normal(size=20)
    assert_paths_close(x.astype(np.float32), x, paths=("float32", "float64"), k=1)
    with pytest.raises(AssertionError, match="float64"):
        assert_paths_close(x.astype(np.float32), x, dtype=np.float64, k=1)


def test_scalars_shapes_and_non_finite_values():
    assert_paths_close(0.1 + 0.2, 0.3, paths=("summed", "literal"), k=2)
    with pytest.raises(AssertionError, match="the scalar"):
        assert_paths_close(0.3 * (1 + 1e-9), 0.3, k=2)
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_paths_close(np.zeros(3), np.zeros((3, 1)), k=1)
    assert_paths_close(np.array([np.inf, np.nan, 1.0]), np.array([np.inf, np.nan, 1.0]), k=1)
    with pytest.raises(AssertionError, match="non-finite"):
        assert_paths_close(np.array([np.nan, 1.0]), np.array([0.0, 1.0]), k=1)
    with pytest.raises(AssertionError, match="non-finite"):
        assert_paths_close(np.array([np.inf]), np.array([-np.inf]), k=1)
    with pytest.raises(TypeError, match="exact by construction"):
        assert_paths_close(np.arange(3), np.arange(3), k=1)
