r"""The tolerance band: what honest rounding can do to each entry of each step.

An honest student works to the sheet's ``decimals`` = D: every number they produce — each answer,
each quantity the sheet does not ask for, and each sub-step of a formula they work by hand — is
rounded to D places, so it is off by at most u = ½·10^(−D). The band of an entry is

    band = u + C_BAND · σ,

u for the answer's own rounding, and σ the standard deviation of what the rounding of every earlier
number (written or not, sub-steps included) does to the entry.

σ is measured, not guessed: the chain is worked ``SAMPLES`` times by hand-work formulas (below),
each time with every rounded number off by an independent uniform error in [−u, u] — the error of
rounding a number that is not already exact to D places; a number that is exact to D places (the
sheet's data, or e.g. 0.5 · 2) is left exact — and σ² is the mean square of the deviation of each
entry from the exact chain. The samples run side by side (a leading axis of length ``SAMPLES``), so
the whole chain is worked once. The seed is fixed: marking is deterministic.

The hand-work formulas are the textbook ones, written here in plain NumPy apart from the library's
ops (which compute the truth): the sub-steps a student rounds are

* LayerNorm: the mean; each squared deviation and the variance; √(σ² + ε); each x̂ = (x − μ)/σ;
* attention: Q Kᵀ before it is divided by √d_k, and √d_k itself when it is not a round number;
  each exponential of a softmax row and the row sum (the exponentials of s − max(s, 0): a student
  who does not subtract the row maximum and one who does are both covered);
* activations: Φ(z) (and φ(z) for the derivative) of GELU, tanh(·) of tanh-GELU, the derivative;
* backward: the row sum ⟨dA, A⟩ of the softmax backward; γ ⊙ dy, the two means and x̂ of the
  LayerNorm backward; each term of a sum of gradients (d_Q W_Qᵀ + d_K W_Kᵀ + …).

Why a standard deviation and not the worst case: the worst case adds every rounding error with the
worst sign, |∂y/∂x| u summed over everything before — for a 64-wide dot product about eight times what
independent roundings ever produce, and compounding from step to step. Rounding errors of different
numbers are independent, so the deviation of an entry is close to normal with deviation σ; C_BAND = 6
keeps far clear of every honest result (see the tests, which work the sheets with a separate
rounding simulator) while a real mistake — a wrong formula — is off by many σ.
"""

from __future__ import annotations

import math

import numpy as np

from ..ops.kernels import erf as _erf  # the kernel, without erf's argument check

__all__ = ["SAMPLES", "C_BAND", "Rounder", "hand", "sample_chain", "local_band", "local_sigma", "input_worst_case"]

SAMPLES = 32          # samples of honest rounding, worked side by side
C_BAND = 6.0          # band = u + C_BAND · σ
_SEED = 20231


class Rounder:
    """``rd(a)``: ``a`` as a student who rounds it to D places may have it (a + a uniform error in [−u, u],
    or ``a`` itself where ``a`` is exact to D places). ``exact=True``: no error (the plain formulas)."""

    def __init__(self, decimals: int, exact: bool = False, seed: int = _SEED):
        self.u = 0.5 * 10.0 ** (-decimals)
        self.scale = 10.0 ** decimals
        self.exact = exact
        self.rng = np.random.default_rng(seed)

    def __call__(self, a):
        a = np.asarray(a, dtype=np.float64)
        if self.exact:
            return a
        with np.errstate(all="ignore"):
            # exact to D places in the first sample means exact in all (the inputs were exact): only there
            # is the check made, the samples all carry independent errors otherwise
            t = a[:1] * self.scale
            off = np.abs(t - np.rint(t)) >= 1e-7                 # not exact to D places: rounding moves it
        noise = self.rng.random(a.shape, dtype=np.float32)
        noise -= 0.5
        if not off.all():
            noise *= off
        return a + (2.0 * self.u) * noise

    def const(self, c: float, lead: tuple) -> np.ndarray:
        """A constant such as √d_k as the student has it: one rounding per sample, shaped to broadcast."""
        return self(np.full(lead + (1, 1), float(c)))


# ----------------------------------------------------------------------------- hand-work formulas
# Each takes (rd, *inputs) with inputs of shape (S, …) (S samples side by side) and returns the step.
def _T(x):
    return np.swapaxes(x, -1, -2)


def _head(x, h, i):
    dk = x.shape[-1] // h
    return x[..., i * dk:(i + 1) * dk]


def _floor_var(var, x, mean):
    """A variance as a student divides by it: rounding never takes it below half its value (a student whose
    variance rounds to 0.00 keeps more digits rather than divide by √ε)."""
    return np.maximum(var, 0.5 * ((x - mean[..., None]) ** 2).mean(-1))


def _stats(rd, x, eps):
    mu = rd(x.mean(-1))
    var = _floor_var(rd(rd((x - mu[..., None]) ** 2).mean(-1)), x, mu)
    sd = rd(np.sqrt(var + eps))
    return mu, var, sd


def _xhat(rd, x, mean, sd):
    return rd((x - mean[..., None]) / sd[..., None])


class hand:
    """Builders of the hand-work formula of each kind of step (parameters captured, as in :mod:`.steps`)."""

    @staticmethod
    def mean():
        return lambda rd, x: x.mean(-1)

    @staticmethod
    def var():
        return lambda rd, x, m: rd((x - m[..., None]) ** 2).mean(-1)

    @staticmethod
    def layernorm(gamma, beta, eps):
        def f(rd, x, mean, var):
            sd = rd(np.sqrt(_floor_var(var, x, mean) + eps))
            return gamma * _xhat(rd, x, mean, sd) + beta
        return f

    @staticmethod
    def layernorm_direct(gamma, beta, eps):
        def f(rd, x):
            mu, _, sd = _stats(rd, x, eps)
            return gamma * _xhat(rd, x, mu, sd) + beta
        return f

    @staticmethod
    def linear(W, b):
        return lambda rd, x: x @ W + b

    @staticmethod
    def scores(h, i, dk):
        sq = math.sqrt(dk)

        def f(rd, Q, K):
            prod = rd(_head(Q, h, i) @ _T(_head(K, h, i)))
            return prod / rd.const(sq, prod.shape[:-2])
        return f

    @staticmethod
    def softmax():
        def f(rd, s):
            c = np.maximum(s.max(-1, keepdims=True), 0.0)
            e = rd(np.exp(s - c))
            return e / rd(e.sum(-1, keepdims=True))
        return f

    @staticmethod
    def context(h):
        return lambda rd, *a: np.concatenate([a[i] @ _head(a[-1], h, i) for i in range(h)], axis=-1)

    @staticmethod
    def residual():
        return lambda rd, x, fx: x + fx

    @staticmethod
    def copy():
        return lambda rd, g: g + 0.0

    @staticmethod
    def activation(act):
        def f(rd, z):
            if act == "relu":
                return np.maximum(z, 0.0)
            if act == "gelu":
                return z * rd(0.5 * (1.0 + _erf(z / math.sqrt(2.0))))
            t = rd(np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))
            return 0.5 * z * (1.0 + t)
        return f

    @staticmethod
    def activation_grad(act):
        def f(rd, z, da):
            if act == "relu":
                return da * (z > 0)
            if act == "gelu":
                cdf = rd(0.5 * (1.0 + _erf(z / math.sqrt(2.0))))
                pdf = rd(np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi))
                return da * rd(cdf + z * pdf)
            c = math.sqrt(2.0 / math.pi)
            t = rd(np.tanh(c * (z + 0.044715 * z ** 3)))
            return da * rd(0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * z * z))
        return f

    # ------------------------------------------------------------------ backward
    @staticmethod
    def linear_dx(W):
        return lambda rd, dy: dy @ W.T

    @staticmethod
    def linear_dW():
        return lambda rd, x, dy: _T(x) @ dy

    @staticmethod
    def colsum():
        return lambda rd, dy: dy.sum(-2)

    @staticmethod
    def d_attention_weights(h, i):
        return lambda rd, g, V: _head(g, h, i) @ _T(_head(V, h, i))

    @staticmethod
    def softmax_grad():
        def f(rd, a, g):
            return a * (g - rd((g * a).sum(-1, keepdims=True)))
        return f

    @staticmethod
    def qk_grad(which, h, dk):
        sq = math.sqrt(dk)

        def f(rd, *a):
            parts = [rd((a[i] if which == "Q" else _T(a[i])) @ _head(a[-1], h, i)) for i in range(h)]
            out = np.concatenate(parts, axis=-1)
            return out / rd.const(sq, out.shape[:-2])
        return f

    @staticmethod
    def d_V(h):
        return lambda rd, *a: np.concatenate([_T(a[i]) @ _head(a[-1], h, i) for i in range(h)], axis=-1)

    @staticmethod
    def layernorm_grad(gamma, eps, which):
        def f(rd, x, mu, var, dy):          # μ, σ² as the student has them (rounded in the chain)
            sd = rd(np.sqrt(_floor_var(var, x, mu) + eps))
            xh = _xhat(rd, x, mu, sd)
            if which == 1:
                return (dy * xh).sum(-2)
            if which == 2:
                return dy.sum(-2)
            g = rd(dy * gamma)
            m1 = rd(g.mean(-1, keepdims=True))
            m2 = rd((g * xh).mean(-1, keepdims=True))
            return (g - m1 - xh * m2) / sd[..., None]
        return f

    @staticmethod
    def plus(second):
        """r + second(…), the term rounded on its own (a skip path's gradient plus a sublayer's)."""
        def f(rd, r, *rest):
            return r + rd(second(rd, *rest))
        return f

    @staticmethod
    def sum3(fq, fk, fv, skip=False):
        """d_Q W_Qᵀ + d_K W_Kᵀ + d_V W_Vᵀ, each term rounded (``skip``: a first input r added, the skip path)."""
        def f(rd, *a):
            r, (q, k, v) = (a[0], a[1:]) if skip else (0.0, a)
            return r + rd(fq(rd, q)) + rd(fk(rd, k)) + rd(fv(rd, v))
        return f


# ----------------------------------------------------------------------------- the band
def sample_chain(steps, inputs: dict, decimals: int, reference: dict, fixed: dict | None = None,
                 samples: int = SAMPLES, upto=None) -> dict:
    """σ of every step (per entry): the steps worked by hand ``samples`` times with honest rounding.

    ``reference``: the exact value of every step (the deviation is measured from it); ``fixed``:
    ``{key: Answer}`` whose given entries are the student's written numbers (the follow-through chain, where
    the student's answers are the inputs): each is the rounding to D places of what the student had, so in
    every sample it is off by an independent uniform error in [−u, u] — the band that honest rounding of the
    written inputs warrants, whether the student carried the rounded numbers or kept more digits.
    ``upto``: stop after this key.
    """
    rd = Rounder(decimals)
    kept = np.random.default_rng(_SEED + 2)
    vals = {k: np.broadcast_to(v, (samples,) + np.shape(v)) for k, v in inputs.items()}
    sigma: dict = {}
    with np.errstate(all="ignore"):
        for s in steps:
            v = s.hand(rd, *(vals[k] for k in s.inputs))
            dev = v - reference[s.key]
            sigma[s.key] = np.sqrt(np.mean(dev * dev, axis=0))
            v = rd(v)
            a = None if fixed is None else fixed.get(s.key)
            if a is not None:
                written = a.value + kept.uniform(-rd.u, rd.u, size=(samples,) + np.shape(a.value))
                v = np.where(a.mask, written, v)
            vals[s.key] = v
            if upto is not None and s.key == upto:
                break
    return sigma


def local_band(step, values: list, noisy: list[bool], decimals: int) -> np.ndarray:
    """The band of ``step`` recomputed from ``values``, the inputs the student wrote (``noisy``; the others are
    the sheet's exact data): u for the answer's rounding, plus the smaller of C_BAND · σ (this step's sub-steps
    and its written inputs rounded, :func:`local_sigma`) and the worst case — every written input off by u with
    the worst sign for the entry (:func:`input_worst_case`) — plus C_BAND · σ of the sub-steps alone. With few
    inputs the worst case is the tighter of the two; with many, σ."""
    u = 0.5 * 10.0 ** (-decimals)
    both = C_BAND * local_sigma(step, values, noisy, decimals)
    worst = input_worst_case(step, values, noisy, decimals) + \
        C_BAND * local_sigma(step, values, [False] * len(values), decimals)
    return u + np.minimum(both, worst)


def input_worst_case(step, values: list, noisy: list[bool], decimals: int) -> np.ndarray:
    """Per entry of the step, how far it moves when every entry of the written inputs (``noisy``) is off by u with
    the sign that moves this entry most: the signs from the step's derivatives (forward differences), then the
    step worked at that corner, both ways, and the larger move taken (so a LayerNorm's or a softmax's curvature is
    in it, not only the first order). All perturbations are worked side by side (the hand formula takes a leading
    axis)."""
    rd = Rounder(decimals, exact=True)
    u = rd.u
    vals = [np.asarray(v, dtype=np.float64) for v in values]
    with np.errstate(all="ignore"):
        base = step.hand(rd, *[v[None] for v in vals])[0]
        n_out = int(np.size(base))
        signs = []
        for i, (v, n) in enumerate(zip(vals, noisy)):
            if not n or v.size == 0:
                signs.append(None)
                continue
            h = 1e-6 * (1.0 + float(np.max(np.abs(v))))
            batch = np.repeat(v[None], v.size, axis=0)
            batch.reshape(v.size, -1)[np.arange(v.size), np.arange(v.size)] += h
            args = [batch if j == i else np.broadcast_to(w, (v.size,) + w.shape) for j, w in enumerate(vals)]
            deriv = (step.hand(rd, *args) - base).reshape(v.size, n_out)        # (entries of x, entries of y)
            signs.append(np.sign(deriv).T.reshape((n_out,) + v.shape))          # per entry of y: the worst signs
        if all(sg is None for sg in signs):
            return np.zeros(np.shape(base))
        worst = np.zeros(n_out)
        for direction in (1.0, -1.0):
            args = [np.broadcast_to(v, (n_out,) + v.shape) if sg is None else v + direction * u * sg
                    for v, sg in zip(vals, signs)]
            moved = (step.hand(rd, *args) - base).reshape(n_out, n_out)
            worst = np.maximum(worst, np.abs(np.diagonal(moved)))
    return worst.reshape(np.shape(base))


def local_sigma(step, values: list, noisy: list[bool], decimals: int, samples: int = SAMPLES) -> np.ndarray:
    """σ of ``step`` worked by hand from ``values`` (its inputs as the student wrote them) alone: this step's own
    sub-step rounding, and each written input (``noisy``) off by an independent uniform error in [−u, u] — the
    student may have kept more digits than they wrote. Inputs that are the sheet's data (H0, dH) are exact."""
    rd = Rounder(decimals)
    rng = np.random.default_rng(_SEED + 1)
    u = rd.u
    vals = []
    for v, n in zip(values, noisy):
        v = np.asarray(v, dtype=np.float64)
        b = np.broadcast_to(v, (samples,) + v.shape)
        vals.append(b + rng.uniform(-u, u, size=b.shape) if n else b)
    with np.errstate(all="ignore"):
        dev = step.hand(rd, *vals) - step.fn(*values)
        return np.sqrt(np.mean(dev * dev, axis=0))
