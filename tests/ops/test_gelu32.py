"""The float32 GELU kernels (transformer_np/fast/ffn.py: _gelu32 with f', _gelu32_value without) at
the inputs their polynomial and exp2 do not see in the accuracy tests: huge, subnormal and non-finite z.
The accuracy against math.erfc is tested in tests/ops/test_fast_path.py (fused) and
tests/model/test_inference.py (value only)."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_np import fast


@pytest.mark.parametrize("for_backward", [True, False])
def test_huge_and_subnormal_inputs(for_backward):
    """z² overflows to inf past ~1.8e19 and exp2 of −inf is 0: f(z) is z for a huge positive z and 0 for a
    huge negative one (f' 1 and 0), with no inf·0 = NaN; a subnormal z gives z/2 rounded (|f| ≤ |z|)."""
    z = np.array([1e30, -1e30, 3e38, -3e38, 1e19, -1e19, 1e-45, -1e-45], dtype=np.float32)
    with np.errstate(over="ignore", under="ignore"):
        f, cache = fast.activation_forward(z, "gelu", for_backward=for_backward)
    np.testing.assert_array_equal(f[[0, 2, 4]], z[[0, 2, 4]])   # exact: relu(z) − 0, or z·Φ(z) with Φ(z) = 1
    np.testing.assert_array_equal(f[[1, 3, 5]], 0.0)            # exact: the Gaussian factor is 0
    assert np.all(np.abs(f[6:]) <= np.abs(z[6:]))
    if for_backward:
        np.testing.assert_array_equal(cache["grad"][:6], [1, 0, 1, 0, 1, 0])   # exact: Φ(z) is 1 or 0, z φ(z) is 0
        np.testing.assert_array_equal(cache["grad"][6:], 0.5)    # exact: Φ(±0) = M(0) = ½ and z φ(z) rounds to 0


@pytest.mark.parametrize("for_backward", [True, False])
def test_non_finite_inputs_give_nan(for_backward):
    """NaN and ±inf give NaN (|z|/(|z| + K) is inf/inf), as the kernels always have: never a finite number
    that would hide the bad input (the encoder's forward refuses non-finite activations before this)."""
    z = np.array([np.nan, np.inf, -np.inf, 1.0], dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        f, cache = fast.activation_forward(z, "gelu", for_backward=for_backward)
    assert np.all(np.isnan(f[:3])) and np.isfinite(f[3])
    if for_backward:
        assert np.all(np.isnan(cache["grad"][:3])) and np.isfinite(cache["grad"][3])
