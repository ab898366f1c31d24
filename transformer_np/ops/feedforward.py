r"""The position-wise feed-forward sublayer (the lesson's "MLP").

    FFN(Z) = f(Z W_1 + b_1) W_2 + b_2,     f ∈ {GELU, GELU-tanh, ReLU}
    Z (B, n, d_model) → (B, n, d_ff) → (B, n, d_model)

Row-vector convention: W_1 is (d_model, d_ff) and W_2 is (d_ff, d_model) — the
transposes of the lesson's column-vector W_1 ∈ ℝ^{d_ff×d}, W_2 ∈ ℝ^{d×d_ff}.
"Position-wise": the same weights act on every row, with no mixing across positions
(only attention mixes positions). Backward is the chain of the three ops in reverse.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, check_cache
from .activations import activation_backward, activation_forward
from .linear import linear_backward, linear_forward

__all__ = ["ffn_forward", "ffn_backward", "FFN_PARAM_NAMES"]

FFN_PARAM_NAMES = ("W_1", "b_1", "W_2", "b_2")


def ffn_forward(z: np.ndarray, p: dict, activation: str = "gelu") -> tuple[np.ndarray, dict]:
    """FFN(z) = f(z W_1 + b_1) W_2 + b_2. ``p`` holds W_1, b_1, W_2, b_2."""
    as_float_array(z, "z", finite=False)
    for name in FFN_PARAM_NAMES:
        if name not in p:
            raise ValueError(f"params is missing the feed-forward parameter {name!r}")
    hidden, c1 = linear_forward(z, p["W_1"], p["b_1"])       # (..., d_ff)
    act, ca = activation_forward(hidden, activation)         # (..., d_ff)
    out, c2 = linear_forward(act, p["W_2"], p["b_2"])        # (..., d_model)
    if out.shape != z.shape:
        raise ValueError(f"the feed-forward output must have the input's shape {z.shape} so the residual "
                         f"type-checks; W_2 maps to width {out.shape[-1]}")
    return out, {"kind": "ffn", "lin1": c1, "act": ca, "lin2": c2}


def ffn_backward(dout: np.ndarray, cache: dict, free_cache: bool = False) -> tuple[np.ndarray, dict]:
    """Returns ``(dz, grads)`` with grads keyed W_1, b_1, W_2, b_2.

    ``free_cache=True`` removes each op's entry from ``cache`` as it is used, so f(z) and
    f'(z) (each (..., d_ff), the largest arrays of the layer) are released mid-backward.
    """
    check_cache(cache, "cache", "ffn")
    take = cache.pop if free_cache else cache.__getitem__
    dact, dW_2, db_2 = linear_backward(dout, take("lin2"))   # (..., d_ff)
    dhidden = activation_backward(dact, take("act"))         # (..., d_ff)
    del dact                                                 # release it before the next product
    dz, dW_1, db_1 = linear_backward(dhidden, take("lin1"))  # (..., d_model)
    return dz, {"W_1": dW_1, "b_1": db_1, "W_2": dW_2, "b_2": db_2}
