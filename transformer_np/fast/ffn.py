"""The fast path's position-wise ops: linear, LayerNorm, activation and FFN.

See :mod:`transformer_np.fast` for the tricks and the tests that hold them; the plain kernels are in
:mod:`transformer_np.ops.linear`, :mod:`~transformer_np.ops.layernorm`, :mod:`~transformer_np.ops.activations`
and :mod:`~transformer_np.ops.feedforward`."""

from __future__ import annotations

import math

import numpy as np

from ..ops.cache import check_for_backward, reader
from ..ops.kernels import ACTIVATION_FUNCS as _ACTIVATION_FUNCS
from ..ops.kernels import ACTIVATION_VALUES as _ACTIVATION_VALUES
from ..ops.layernorm import check_variance
from .gelu64 import _gelu64, _gelu64_value
from .threads import _parallel, _row_slices, _rows_parallel, get_num_threads

__all__ = ["linear_forward", "linear_backward", "layernorm_forward", "layernorm_backward", "activation_forward",
           "activation_backward", "ffn_forward", "ffn_backward", "lin1_from_layernorm"]


# ----------------------------------------------------------------------------- linear
def linear_forward(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """y = x W + b as one (M, d_in) @ (d_in, d_out) product, M = every leading position."""
    y2 = x.reshape(-1, W.shape[0]) @ W                      # (M, d_out)
    if b is not None:
        _rows_parallel(lambda r: y2[r].__iadd__(b), y2.shape[0])
    y = y2.reshape(x.shape[:-1] + (W.shape[1],))            # (..., d_out)
    return y, {"kind": "linear", "x": x, "W": W, "has_bias": b is not None}


def linear_backward(dy: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    x, W = cache["x"], cache["W"]
    x2 = x.reshape(-1, x.shape[-1])                         # (M, d_in)
    dy2 = dy.reshape(-1, dy.shape[-1])                      # (M, d_out)
    dx = (dy2 @ W.T).reshape(x.shape)                       # (M, d_in) → (..., d_in)
    dW = x2.T @ dy2                                         # (d_in, d_out); x2.T is a view BLAS reads as is
    db = dy2.sum(axis=0) if cache["has_bias"] else None     # (d_out,)
    return dx, dW, db


# ----------------------------------------------------------------------------- layernorm
def layernorm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> tuple[np.ndarray, dict]:
    """LayerNorm with x − μ turned into x̂ in place and y built in the γ-product's buffer."""
    return _layernorm_forward(x, gamma, beta, eps)


def _layernorm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float,
                       overwrite: bool = False) -> tuple[np.ndarray, dict]:
    """:func:`layernorm_forward`; ``overwrite=True`` writes x − μ (then x̂) over x, which the caller must
    own and not need again (the training layer's residual sums), so the op allocates only y. The
    variance's (x − μ)² goes by blocks of rows (:data:`_ROW_BLOCK` elements), not as a whole (..., d)
    temporary; each row's mean is the same reduction as before: the same bits."""
    mu = x.mean(axis=-1, keepdims=True)                     # (..., 1)
    xc = np.subtract(x, mu, out=x if overwrite else None)   # (..., d)
    d = xc.shape[-1]
    xc2 = xc.reshape(-1, d)                                 # (M, d) view
    var = np.empty(xc2.shape[0], dtype=xc.dtype)            # (M,)
    for r in _row_slices(xc2.shape[0], d, _ROW_BLOCK):
        var[r] = np.mean(xc2[r] * xc2[r], axis=-1)          # Σ (x − μ)²/d per row: a block's temporary
    var = var.reshape(mu.shape)                             # (..., 1)
    check_variance(var, xc)
    rstd = 1.0 / np.sqrt(var + eps)                         # (..., 1)
    xhat = xc
    xhat *= rstd                                            # (..., d) in place: xc is not needed again
    y = xhat * gamma
    y += beta
    return y, {"kind": "layernorm", "xhat": xhat, "rstd": rstd, "gamma": gamma}


def layernorm_backward(dy: np.ndarray, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dx = r (g − mean(g) − x̂ mean(g x̂)), g = dy γ, by blocks of rows (:data:`_ROW_BLOCK` elements): the
    one new (..., d) array is dx; dy ⊙ x̂ (for dγ), g and g ⊙ x̂ exist one block at a time, in cache."""
    return _layernorm_backward(dy, cache, False)


def _layernorm_backward(dy: np.ndarray, cache: dict, overwrite: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`layernorm_backward`; ``overwrite=True`` writes dx over the cache's x̂ (each block's x̂ is
    read for the last time just before), for a backward that frees the cache and owns x̂ (the training
    layer's, ``free_cache=True``): no new (..., d) array at all. Both give the same bits: dγ is summed
    block by block (Σ over the blocks of each block's column sums, in row order), every other number as
    in the unblocked formula (each row's sums are the same reductions)."""
    xhat, rstd, gamma = cache["xhat"], cache["rstd"], cache["gamma"]
    d = xhat.shape[-1]
    lead = tuple(range(xhat.ndim - 1))
    x2, dy2, r2 = xhat.reshape(-1, d), dy.reshape(-1, d), rstd.reshape(-1, 1)   # (M, d), (M, d), (M, 1)
    dx = xhat if overwrite else np.empty(xhat.shape, dtype=xhat.dtype)          # (..., d) C order
    dx2 = dx.reshape(-1, d)                                 # (M, d) view
    dbeta = dy.sum(axis=lead)                               # (d,)
    dgamma = np.zeros(d, dtype=xhat.dtype)                  # (d,)
    for r in _row_slices(x2.shape[0], d, _ROW_BLOCK):
        t = dy2[r] * x2[r]                                  # (rows, d) dy ⊙ x̂
        dgamma += t.sum(axis=0)
        g = np.multiply(dy2[r], gamma, out=t)               # g = dy γ
        mean_g = g.sum(axis=-1, keepdims=True) / d          # (rows, 1)
        mean_gx = (g * x2[r]).sum(axis=-1, keepdims=True) / d   # (rows, 1)
        g -= mean_g
        o = np.multiply(x2[r], mean_gx, out=dx2[r])         # x̂ mean(g x̂): x̂'s last read (o may be x̂)
        np.subtract(g, o, out=o)
        o *= r2[r]                                          # dx = r (g − mean(g) − x̂ mean(g x̂))
    return dx, dgamma, dbeta


_ROW_BLOCK = 1 << 16   # elements per block of rows for a row-wise temporary (256 KiB in float32: in L2)


_ONES: dict = {}   # (d, dtype) -> a vector of d ones: row sums as one matrix-vector product


def _ones(d: int, dtype) -> np.ndarray:
    """A cached vector of ``d`` ones of ``dtype`` (x·1 sums x's rows in one BLAS call; never written)."""
    key = (d, np.dtype(dtype))
    if key not in _ONES:
        ones = np.ones(d, dtype=dtype)
        ones.flags.writeable = False                        # shared by every caller and thread
        _ONES[key] = ones
    return _ONES[key]


def _layernorm_value(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float,
                     out: np.ndarray | None = None) -> np.ndarray:
    """LayerNorm's value alone (inference: nothing kept for a backward), y = γ (x − μ)/√(σ² + eps) + β,
    into ``out`` (default a new array; ``out=x`` overwrites x, which the caller must own). x contiguous.

    Six passes over (M, d), M = every leading position: μ as one matrix-vector product x·1/d (a BLAS
    call instead of NumPy's per-row reduction), x − μ into out, σ² = Σ (x − μ)²/d by ``einsum`` (a
    row dot product, no (M, d) square), then × r, × γ, + β in place (r = 1/√(σ² + eps), per row).
    The rows' sums are summed in another order than the plain op's (within the rounding of
    :func:`layernorm_forward`). A row whose variance is not finite (NaN/inf in x, or (x − μ)²
    overflowing) raises :class:`~transformer_np.errors.NonFiniteError` as the plain op does — without
    the check, r = 1/√inf = 0 would turn an overflowed row into a finite β."""
    d = x.shape[-1]
    x2 = x.reshape(-1, d)                                   # (M, d) view
    y = np.empty(x.shape, dtype=x.dtype) if out is None else out   # C-contiguous
    y2 = y.reshape(-1, d)                                   # (M, d) view
    mu = x2 @ _ones(d, x.dtype)                             # (M,) row sums
    mu /= d                                                 # μ
    rstd = np.empty_like(mu)                                # (M,)

    def rows(r: slice) -> None:
        yr = np.subtract(x2[r], mu[r, None], out=y2[r])     # x − μ
        var = np.einsum("ij,ij->i", yr, yr)                 # (r,) Σ (x − μ)²
        var /= d
        check_variance(var, yr)                             # an overflowed row is refused, not turned into β
        var += eps
        np.sqrt(var, out=var)
        np.divide(1.0, var, out=rstd[r])                    # r = 1/√(σ² + eps)
        yr *= rstd[r, None]
        yr *= gamma
        yr += beta

    _rows_parallel(rows, x2.shape[0])
    return y


# ----------------------------------------------------------------------------- activation and FFN
_BLOCK = 16384   # elements per block: ~64 KB in float32, so f's ~10 live temporaries fit in L2
# The GELU kernels' blocks, each the fastest measured (docs/bench_notes.md, "The GELU block sizes"); the value-only
# (inference) ones are larger: fewer NumPy calls, so less waiting for the GIL when batch shards run at once.
_GELU32_BLOCK = 32768   # float32 GELU with f': 3–4 scratch arrays of 128 KB
_GELU32_VALUE_BLOCK = 131072   # float32 GELU, value only (inference): 3 scratch arrays of 512 KB
_GELU64_BLOCK = 32768   # the float64 GELU (fast/gelu64.py): 3 scratch arrays of 256 KB
_GELU64_VALUE_BLOCK = 65536   # float64 GELU, value only (inference): 3 scratch arrays of 512 KB

# Exact GELU in float32 with one range and one exp2 (see _gelu32): Φ(−|z|) = 2^(C z²) M(s), C = −log₂e/2
# (the float32 number the kernel multiplies by), s = |z|/(|z| + K), K = 4; M is the degree-7 polynomial
# in s that interpolates Φ(−a)·2^(−C a²) at the 8 points a = _GELU32_NODES, computed in float64 from
# math.erfc and converted to monomial form (tests/ops/test_fast_path.py recomputes it). The nodes are the
# zeros (to 6 digits) of the error of the best weighted fit on a ∈ [0, 13.2] (past 13.2, exp(−z²/2)
# underflows float32), found by a linear program whose weight is the room the tests' bounds leave after
# the exp2 argument's two roundings (≤ 1.2e-7·z²/2 relative): ≤ 6e-8 absolute for Φ near 0 (for f'),
# ~3e-7 relative at |z| = 3, looser below −3; a = 0 is a node, so M(0) = Φ(0) = ½ exactly and
# f'(±0) = ½. K = 4 was the best of a scan of [2.5, 4.5]. Measured in round 5 against math.erfc (float64)
# on [−14, 14] (2,000,001 points) plus 10⁶ N(0, 9) draws: relative error of f 8.0e-7 for z ≥ −3, 1.0e-5
# below (bounds 1e-6, 1.7e-5), |f' − exact| 1.37e-7 (bound 1.5e-7); the degree-7 Chebyshev interpolant
# with exp it replaces: 9.7e-7, 9.7e-6 and 1.52e-7 — above the f' bound on that denser grid.
_GELU32_K = 4.0
_GELU32_NODES = (0.0, 0.160719, 0.489783, 1.03497, 2.13206, 2.89794, 6.87245, 11.1545)
_GELU32_M = (0.5, -1.5957674162081517, 2.4041470169737913, -2.1051593391741132, 0.8612612280787815,
             0.1492450741882827, -0.310016700702036, 0.09646997738262186)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _gelu32(z: np.ndarray, out: np.ndarray, grad: np.ndarray, a, s, e, E) -> None:
    """GELU and its derivative of a float32 block z into ``out`` (which may be z itself) and ``grad``;
    a, s, e, E are float32 scratch arrays of z's size. 29
    in-place passes, none of them a gather, a select, a boolean product or a second exp2:

        e     = Φ(−|z|) = exp(−z²/2) M(s)                  (exp(−z²/2) as an exp2)
        Φ(z)  = min(max(z + e, e), 1 − e)                   (e for z ≤ 0, 1 − e for z > 0: no branch)
        f(z)  = z Φ(z),   f'(z) = Φ(z) + z φ(z),  φ(z) = exp(−z²/2)/√(2π)   (the same exp2)

    Φ(z) without a select: for z ≤ 0, z + e ≤ e, so max(z + e, e) = e ≤ ½ ≤ 1 − e; for z > 0,
    z + e ≥ 1 − e because 1 − 2e = erf(z/√2) < z (erf(x/√2) has slope ≤ √(2/π) < 1), so the min is
    1 − e (below z ≈ 1e-7, rounding may pick z + e instead: both are ½ within 1e-7)."""
    np.abs(z, out=a)                                        # |z|
    np.add(a, _GELU32_K, out=e)
    np.divide(a, e, out=s)                                  # s = |z| / (|z| + K) ∈ [0, 1)
    np.multiply(s, _GELU32_M[-1], out=e)                    # Horner, in place: e = M(s)
    e += _GELU32_M[-2]
    for c in _GELU32_M[-3::-1]:
        e *= s
        e += c
    np.square(z, out=E)
    E *= _GELU32V_C
    np.exp2(E, out=E)                                       # exp(−z²/2) = 2^(−z² log₂e / 2)
    e *= E                                                  # e = Φ(−|z|)
    np.add(z, e, out=a)
    np.maximum(a, e, out=a)                                 # e for z ≤ 0, z + e for z > 0
    np.subtract(1.0, e, out=s)
    np.minimum(a, s, out=a)                                 # Φ(z)
    E *= z
    E *= _INV_SQRT_2PI                                      # z φ(z)
    np.add(a, E, out=grad)                                  # f'(z) = Φ(z) + z φ(z)
    np.multiply(z, a, out=out)                              # f(z) = z Φ(z), last: out may be z itself


# The value-only float32 GELU (inference, :func:`_gelu32_value`): |z| Φ(−|z|) = 2^(C z²) N(s) with
# s = |z|/(|z| + K) ∈ [0, 1), K = 3.875, and N(s) = s·g(s), g the degree-6 polynomial in s that
# interpolates N/s, N = a Φ(−a)·2^(−C a²), a = K s/(1 − s), at the 7 points a = _GELU32V_NODES, computed
# in float64 from math.erfc and converted to monomial form (tests/model/test_inference.py recomputes
# it). The nodes are the zeros (to 6 digits) of the error of the best fit of N on a ∈ [0, 13.2] weighted
# by the room the tests' bounds leave after the exp2 argument's two roundings (as for _GELU32_M, without
# the f' part); K = 3.875 was the best of a scan of [2.5, 5]. The Gaussian factor is taken as
# exp2(−z² log₂e / 2): NumPy's float32 exp2 costs half its exp here (docs/bench_notes.md, "exp2 for …");
# C is the float32 number the kernel multiplies by, and the interpolated function carries it.
# Measured in round 5 against math.erfc on [−14, 14] (2,000,001 points) plus 10⁶ N(0, 9) draws:
# relative error 7.3e-7 for z ≥ −3 and 9.2e-6 below (bounds 1e-6, 1.7e-5; the degree-7 Chebyshev
# interpolant it replaces, two passes more: 5.9e-7 and 7.6e-6).
_GELU32V_C = -0.5 / math.log(2.0)
_GELU32V_K = 3.875
_GELU32V_NODES = (0.232245, 0.77037, 1.63324, 2.70648, 3.50696, 9.18283, 12.7459)
_GELU32V_G = (1.9375002139272772, -4.052838462722506, 4.501992412549534, -2.3636334103330796,
              -0.1484039502140604, 0.8234660703807322, -0.3004218939687462)


def _gelu32_value(z: np.ndarray, out: np.ndarray, a, s, e) -> None:
    """GELU of a float32 block z into ``out`` (which may be z itself), value only (inference);
    a, s, e are float32 scratch arrays of z's size. 22 in-place passes (:func:`_gelu32`: 29, counted
    alike), three scratch arrays instead of four:

        s      = |z| / (|z| + K)                         (two passes: no separate u = |z|/K)
        e      = |z| Φ(−|z|) = exp(−z²/2) N(s),   N(s) = s g(s)   (the factor |z| is inside N;
                                                               exp(−z²/2) as an exp2)
        f(z)   = max(z, 0) − e

    one identity for both signs, no select: for z > 0, z Φ(z) = z − z Φ(−z) = relu(z) − |z| Φ(−|z|)
    (Φ(z) = 1 − Φ(−z)); for z ≤ 0, z Φ(z) = −|z| Φ(−|z|) = relu(z) − |z| Φ(−|z|).
    No derivative is formed (nothing keeps f'(z) for inference)."""
    np.abs(z, out=a)                                        # |z|
    np.add(a, _GELU32V_K, out=e)
    np.divide(a, e, out=s)                                  # s = |z| / (|z| + K) ∈ [0, 1)
    np.multiply(s, _GELU32V_G[-1], out=e)                   # Horner, in place: e = N(s) = s g(s)
    for c in _GELU32V_G[-2::-1]:
        e += c
        e *= s
    np.square(z, out=a)                                     # z² (out of place: 0.10 ns against 0.12 in place)
    a *= _GELU32V_C
    np.exp2(a, out=a)                                       # exp(−z²/2) = 2^(−z² log₂e / 2)
    e *= a                                                  # |z| Φ(−|z|)
    np.maximum(z, 0.0, out=out)                             # relu(z), the last read of z: out may be z itself
    out -= e


def activation_forward(z: np.ndarray, activation: str = "gelu", *,
                       for_backward: bool = True) -> tuple[np.ndarray, dict]:
    """(f(z), f'(z)) evaluated on consecutive blocks of the flattened z (same cache as the plain op).

    Exact GELU in float32 runs the fused single-range kernel :func:`_gelu32` (same maths, different
    rounding: within 1e-7 of the plain op's erf-based values), in float64 the single-range kernel of
    :mod:`transformer_np.fast.gelu64` (one exp, relative error ~1e-15 for |z| ≤ 3: within the rounding
    of the plain op's values); everything else the plain kernel's arithmetic per element, bit for bit.

    ``for_backward=False`` (inference): f(z) only, no derivative — exact GELU by :func:`_gelu32_value`
    (float32: the same exp2 and mapping as :func:`_gelu32`, its own polynomial, fewer passes) or
    ``_gelu64_value`` (float64), the others by the plain kernel's value arithmetic; the cache is
    ``{"kind": "activation", "for_backward": False}`` and :func:`activation_backward` refuses it."""
    return _activation(z, activation, for_backward=for_backward)


def _activation(z: np.ndarray, activation: str, in_place: bool = False, for_backward: bool = True,
                bias: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """:func:`activation_forward`; ``in_place=True`` writes f(z) over z (contiguous, and the caller's
    own: :func:`ffn_forward` does not keep U = z W_1 + b_1), saving one (…, d_ff) array.

    ``bias`` (d,), with ``in_place``: f(z + b), the bias added to each block of whole rows just before
    its activation, while the block is in cache (the same z + b as a separate pass, one pass over the
    (…, d_ff) array fewer: :func:`ffn_forward` hands U = z W_1 here without b_1)."""
    if bias is not None and not (in_place and z.flags.c_contiguous):
        z = z + bias                                       # a copy of ours: the bias goes in first
        bias, in_place = None, True
    # C order: the flat views below must be views (np.empty_like keeps a transposed z's F order, whose
    # reshape(-1) is a copy — the results would be written into it and lost)
    out = z if in_place and z.flags.c_contiguous else np.empty(z.shape, dtype=z.dtype)
    grad = np.empty(z.shape, dtype=z.dtype) if for_backward else None
    z_flat, out_flat = z.reshape(-1), out.reshape(-1)                                 # (size,)
    grad_flat = grad.reshape(-1) if for_backward else None
    if activation == "gelu" and z.dtype in (np.float32, np.float64):
        f64 = z.dtype == np.float64
        per = ((_GELU64_BLOCK if for_backward else _GELU64_VALUE_BLOCK) if f64
               else (_GELU32_BLOCK if for_backward else _GELU32_VALUE_BLOCK))
        d = z.shape[-1] if z.ndim else 1
        step = per if bias is None else max(1, per // d) * d       # whole rows with a bias
        starts = range(0, z_flat.size, step)
        workers = min(get_num_threads(), len(starts))

        def run(w: int) -> None:                            # every workers-th block, own scratch arrays
            size = min(step, z_flat.size)
            kinds = 4 if for_backward and not f64 else 3     # _gelu32 takes four scratch arrays, the others three
            scratch = [np.empty(size, dtype=z.dtype) for _ in range(kinds)]
            for start in starts[w::workers]:
                block = slice(start, start + step)
                m = min(step, z_flat.size - start)
                zb = z_flat[block]
                if bias is not None:
                    zb.reshape(-1, d).__iadd__(bias)        # z + b, rows of this block (in place: z is ours)
                if for_backward:
                    (_gelu64 if f64 else _gelu32)(zb, out_flat[block], grad_flat[block], *(x[:m] for x in scratch))
                else:
                    (_gelu64_value if f64 else _gelu32_value)(zb, out_flat[block], *(x[:m] for x in scratch))

        _parallel(run, workers)
    else:
        if bias is not None:
            z2 = z.reshape(-1, z.shape[-1])
            _rows_parallel(lambda r: z2[r].__iadd__(bias), z2.shape[0])   # z + b (z is ours)
        f = _ACTIVATION_FUNCS[activation]
        for start in range(0, z_flat.size, _BLOCK):
            block = slice(start, start + _BLOCK)
            if for_backward:
                out_flat[block], grad_flat[block] = f(z_flat[block])
            else:
                out_flat[block] = _ACTIVATION_VALUES[activation](z_flat[block])
    if not for_backward:
        return out, {"kind": "activation", "activation": activation, "for_backward": False}
    return out, {"kind": "activation", "activation": activation, "grad": grad}


def activation_backward(da: np.ndarray, cache: dict) -> np.ndarray:
    """dz = da ⊙ f'(z), by row chunks in parallel."""
    check_for_backward(cache, "activation_forward")
    return _activation_backward_into(da, cache, np.empty_like(da))


def _activation_backward_into(da: np.ndarray, cache: dict, dz: np.ndarray | None = None) -> np.ndarray:
    """dz = da ⊙ f'(z) into ``dz`` (default: into da itself, which the caller must own)."""
    grad = cache["grad"]
    dz = da if dz is None else dz
    d2, g2, o2 = (a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1) for a in (da, grad, dz))
    _rows_parallel(lambda r: np.multiply(d2[r], g2[r], out=o2[r]), o2.shape[0])
    return dz


def ffn_forward(z: np.ndarray, p: dict, activation: str = "gelu", *,
                for_backward: bool = True) -> tuple[np.ndarray, dict]:
    """FFN(z) = f(z W_1 + b_1) W_2 + b_2 with f(U) written over U (U is ours and not kept), b_1 added
    to each block of rows of z W_1 just before its activation (one pass over (…, d_ff) fewer).

    ``for_backward=False`` (inference): the same products, f(U) by the value-only kernel (no f'(U),
    see :func:`activation_forward`), and a cache ``{"kind": "ffn", "for_backward": False}`` that keeps
    nothing — :func:`ffn_backward` refuses it."""
    hidden, c1 = linear_forward(z, p["W_1"])                 # (..., d_ff): z W_1, b_1 added by blocks below
    c1["has_bias"] = True                                    # the backward's db_1 = Σ dU (b_1 is not read)
    act, ca = _activation(hidden, activation, in_place=True, for_backward=for_backward,
                          bias=p["b_1"])                     # f(U) in U's buffer, U = z W_1 + b_1
    del hidden
    out, c2 = linear_forward(act, p["W_2"], p["b_2"])        # (..., d_model)
    if not for_backward:
        return out, {"kind": "ffn", "for_backward": False}
    return out, {"kind": "ffn", "lin1": c1, "act": ca, "lin2": c2}


def ffn_backward(dout: np.ndarray, cache: dict, free_cache: bool = False) -> tuple[np.ndarray, dict]:
    """Backward of :func:`ffn_forward`; ``free_cache`` releases f(z) and f'(z) (each (..., d_ff),
    the largest arrays of the layer) as soon as they are used — and, theirs being the backward's own
    then, reuses their buffers: ∂L/∂f(U) and dU are written over f(U), and dz's product over f'(U) when
    the training layer adds it into its skip gradient (an array taken out of the cache beforehand is
    overwritten).

    Order, for the peak memory: dW₂ = f(U)ᵀ dY while f(U) is alive, then ∂L/∂f(U) = dY W₂ᵀ in its place,
    dU = ∂L/∂f(U) ⊙ f'(U); dz = dU W₁ᵀ; then f'(U) goes before dW₁ = zᵀ dU is made. A layer's cache may
    keep, instead of z, the LayerNorm that made it (``lin1["x"]`` None, ``lin1["ln"]``: x̂, γ, β — see
    :func:`lin1_from_layernorm`): dW₁ is then made by blocks of z's columns, each rebuilt as x̂ γ + β
    (the forward's operations) — z is never whole again."""
    return _ffn_backward(dout, cache, free_cache)


# Elements of one block of z's columns rebuilt for dW₁ (:func:`_ffn_backward`): 2 MiB in float32. Each block
# repacks dU (M, d_ff) for its product, so fewer blocks are faster (docs/bench_notes.md, "_GEMM_BLOCK"); the
# blocks go in the hole f'(U) leaves beside dW₁.
_GEMM_BLOCK = 1 << 19


def _ffn_backward(dout: np.ndarray, cache: dict, free_cache: bool, acc: np.ndarray | None = None
                  ) -> tuple[np.ndarray, dict]:
    """:func:`ffn_backward`; with ``acc`` (…, d_model), a gradient the caller owns (the training layer's
    skip path), dz is added into acc (with ``free_cache``, the product made in f'(U)'s buffer: no
    (…, d_model) array allocated) and acc is returned as dz."""
    check_for_backward(cache, "ffn_forward")
    take = reader(cache, free_cache)
    c2 = take("lin2")
    W_2, act = c2["W"], c2["x"]                              # f(U): (..., d_ff)
    del c2
    act2 = act.reshape(-1, act.shape[-1])                    # (M, d_ff)
    dout2 = dout.reshape(-1, dout.shape[-1])                 # (M, d)
    dW_2 = act2.T @ dout2                                    # (d_ff, d), while f(U) is alive …
    db_2 = dout2.sum(axis=0)                                 # (d,)
    own = free_cache and act2.flags.writeable and act2.dtype == np.result_type(dout2, W_2)   # f(U) is ours
    dact2 = np.matmul(dout2, W_2.T, out=act2 if own else None)   # … ∂L/∂f(U): (M, d_ff), over f(U) if ours
    del act, act2
    dact = dact2.reshape(dout.shape[:-1] + (W_2.shape[0],))  # (..., d_ff)
    ca = take("act")
    dhidden = _activation_backward_into(dact, ca)            # (..., d_ff), in dact's buffer (ours)
    spare = ca["grad"] if free_cache else None               # f'(U), read for the last time above
    del dact, ca
    c1 = take("lin1")
    W_1 = c1["W"]
    dh2 = dhidden.reshape(-1, dhidden.shape[-1])             # (M, d_ff)
    if acc is None:                                          # dW₁ before the returned dz: one fewer
        del spare                                            # (…, d_model) array beside the blocks of z
        dW_1 = _lin1_dW(c1, dh2)                             # (d, d_ff)
        dz = (dh2 @ W_1.T).reshape(dout.shape[:-1] + (W_1.shape[0],))   # (..., d_model), returned
    else:
        M, d = dh2.shape[0], W_1.shape[0]
        fits = spare is not None and spare.size >= M * d and spare.flags.c_contiguous and spare.flags.writeable \
            and spare.dtype == np.result_type(dh2, W_1)
        into = spare.reshape(-1)[:M * d].reshape(M, d) if fits else None
        acc.reshape(-1, d).__iadd__(np.matmul(dh2, W_1.T, out=into))   # acc + dU W₁ᵀ (made in f'(U) if ours)
        dz = acc
        del into, spare                                      # f'(U) goes before dW₁ is made
        dW_1 = _lin1_dW(c1, dh2)                             # (d, d_ff)
    db_1 = dh2.sum(axis=0)                                   # (d_ff,)
    return dz, {"W_1": dW_1, "b_1": db_1, "W_2": dW_2, "b_2": db_2}


def _lin1_dW(c1: dict, dh2: np.ndarray) -> np.ndarray:
    """dW₁ = zᵀ dU (d, d_ff) from the first linear's cache: z itself, or (``lin1["x"]`` None) by blocks of
    z's columns rebuilt from its LayerNorm as x̂ γ + β, each block's product writing its rows of dW₁."""
    z = c1["x"]
    if z is not None:
        return z.reshape(-1, z.shape[-1]).T @ dh2
    ln = c1["ln"]
    xhat, gamma, beta = ln["xhat"], ln["gamma"], ln["beta"]
    x2 = xhat.reshape(-1, xhat.shape[-1])                    # (M, d)
    d = x2.shape[1]
    dW = np.empty((d, dh2.shape[1]), dtype=dh2.dtype)        # (d, d_ff)
    step = max(1, _GEMM_BLOCK // max(1, x2.shape[0]))
    for j in range(0, d, step):
        cols = slice(j, min(j + step, d))
        zb = x2[:, cols] * gamma[cols]                       # (M, cols) z's columns, as the forward made them
        zb += beta[cols]
        np.matmul(zb.T, dh2, out=dW[cols])                   # rows of dW₁ = z[:, cols]ᵀ dU
    return dW


def lin1_from_layernorm(ffn_cache: dict, ln_cache: dict, beta: np.ndarray) -> None:
    """Make an FFN cache keep the LayerNorm that computed its input z instead of z: ``lin1["x"]`` becomes
    None and ``lin1["ln"]`` holds that LayerNorm's x̂ and γ (the arrays its own cache keeps) and β, from
    which :func:`ffn_backward` rebuilds z = x̂ γ + β for dW₁ — the forward's operations, so the same z bit
    for bit. The training layer does this for the LayerNorm in front of its FFN: one (..., d_model) array
    fewer in the cache until the FFN backward, and none while f(U) and f'(U) are alive."""
    lin1 = ffn_cache["lin1"]
    lin1["x"] = None
    lin1["ln"] = {"xhat": ln_cache["xhat"], "gamma": ln_cache["gamma"], "beta": beta}
