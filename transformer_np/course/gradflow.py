r"""Gradient flow through deep encoder stacks, measured with the hand-written backward.

The article's correctness argument: with residuals
    ∂X_N/∂X_0 = ∏_ℓ ( I + ∂Sublayer_ℓ/∂X_{ℓ−1} ),
so the identity term survives and depth alone cannot drive the gradient to zero; LayerNorm
bounds the activation scale; both are needed. This module measures that argument on four
stacks built from the library's ops, using only vector–Jacobian products (no autograd):

    variant        one layer H → H'  (A = MHA, F = FFN, LN₁/LN₂ = LayerNorm)
    pre            Z = H + A(LN₁ H),       H' = Z + F(LN₂ Z)     + LN_final after the stack
    post           Z = LN₁(H + A(H)),      H' = LN₂(Z + F(Z))
    no-layernorm   Z = H + A(H),           H' = Z + F(Z)         (residual, no LayerNorm)
    no-residual    Z = LN₁(A(H)),          H' = LN₂(F(Z))        (Post-LN with the skips removed)

Every sublayer has the form  y = N( s·x + B(x) )  with N ∈ {LN, identity}, s ∈ {1, 0} (skip or
not) and B the branch (for Pre-LN the branch includes its LN). Its Jacobian is
    ∂y/∂x = D (s I + J_B),      D = ∂N (I when there is no LN on the path),
and the **identity path** of a stack is the product with every branch Jacobian J_B dropped:
∏ D·s — exactly I for Pre-LN and no-layernorm, the product of the LayerNorm Jacobians for
Post-LN, and 0 for no-residual (there is no skip to carry it).

The loss of the per-layer view is the fixed linear read-out
    L = Σ H_final ⊙ R,     R ~ N(0, 1) fixed by the seed,
with H_final = LN_final(H^(L)) for Pre-LN and H^(L) otherwise, so ∂L/∂H_final = R.
H^(ℓ) is the residual stream after layer ℓ (before the final LN in Pre-LN), ℓ = 0 … L.

CLI: ``python -m transformer_np gradflow --variant pre|post|no-residual|no-layernorm --depth L
--init xavier|bert --seed S --probe-layer K [--json]``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._compat import forward_moved as _forward_moved
from .._validate import check_choice, check_int, describe
from ..errors import InputTypeError
from ..fast.threads import one_blas_thread
from ..model.budget import MemoryEstimate, check_memory, estimate_encoder
from ..model.config import EncoderConfig
from ..model.params import init_params, layer_prefix, sub_params
from ..model.stack import encoder_layer_backward, encoder_layer_forward
from ..ops.attention import mha_backward, mha_forward
from ..ops.dropout import dropout_backward
from ..ops.feedforward import ffn_backward, ffn_forward
from ..ops.layernorm import layernorm_backward, layernorm_forward
from ..ops.residual import residual_backward, residual_forward

__all__ = ["VARIANTS", "INITS", "DEPTHS", "LOSS", "make_stack", "measure_estimate", "layer_forward", "layer_backward",
           "identity_backward", "sublayers", "stack_forward", "backprop_hidden", "measure", "sweep",
           "jacobian_from_vjp", "layer_jacobian_terms", "stack_jacobian", "expansion_by_order",
           "jacobian_view", "singular_values_by_depth", "numerical_rank", "stable_rank", "probe_table",
           "finite_difference_jacobian", "compute_all"]

VARIANTS = ("pre", "post", "no-residual", "no-layernorm")
INITS = ("xavier", "bert")
DEPTHS = (6, 12, 24, 48, 96)
LOSS = "L = sum(H_final * R), R ~ N(0, 1) fixed by the seed; H_final = LN_final(H^(L)) for pre, H^(L) otherwise"

# The per-layer view's defaults (the issue's) and the Jacobian view's small stack.
DEFAULT_DIMS = {"d_model": 64, "n_heads": 4, "d_ff": 256, "n": 16, "batch": 8}
SMALL_DIMS = {"d_model": 16, "n_heads": 2, "d_ff": 64, "n": 4}


# ----------------------------------------------------------------------------- BLAS threads
def single_thread_blas(fn):
    """Run ``fn`` with one BLAS thread (via threadpoolctl; without it unchanged, after one warning that says
    what to install: :func:`transformer_np.fast.threads.one_blas_thread`).

    Why: every matrix here is small (at most 128 × 256), so BLAS threads bring nothing, and
    on a busy 2-core machine OpenBLAS's spinning threads made a (128, 256) @ (256, 64)
    product 25–100× slower (measured 20 ms vs 0.8 ms). The caller's setting is restored.
    """
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with one_blas_thread():
            return fn(*args, **kwargs)
    return wrapper


def _check_progress(progress) -> None:
    if progress is not None and not callable(progress):
        raise InputTypeError(f"progress must be a callable (i, total, label) or None, got {describe(progress)}")


# ----------------------------------------------------------------------------- the stacks
def make_stack(variant: str, depth: int, init: str = "xavier", seed: int = 0, d_model: int = 64,
               n_heads: int = 4, d_ff: int = 256) -> tuple[dict, EncoderConfig]:
    """Parameters and config of a ``depth``-layer stack of ``variant`` at initialisation.

    Pre and Post share the layer weights for the same seed (init_params draws layers first,
    the Pre-LN final LN last), so the placements are compared on identical weights.
    Dropout is 0 (we look at the deterministic network); LayerNorm ε = 1e-12 (BERT's).
    """
    check_choice(variant, "variant", VARIANTS)
    check_choice(init, "init", INITS)
    check_int(depth, "depth", minimum=1)
    config = _config(depth, d_model, n_heads, d_ff, variant)
    return init_params(config, seed=seed, init=init), config


def _custom_layer_forward(x: np.ndarray, p: dict, config: EncoderConfig, skip: bool, norm: bool):
    """no-layernorm (skip, no norm) and no-residual (norm, no skip), from the library's ops."""
    eps = config.layer_norm_eps
    c: dict = {"kind": "gradflow_layer", "skip": skip, "norm": norm}
    a, c["attn"] = mha_forward(x, sub_params(p, "attn."), config.n_heads)           # (B, n, d)
    r = residual_forward(x, a) if skip else (a, None)
    r, c["res1"] = r
    z = layernorm_forward(r, p["ln1.gamma"], p["ln1.beta"], eps) if norm else (r, None)
    z, c["ln1"] = z                                                                 # Z
    f, c["ffn"] = ffn_forward(z, sub_params(p, "ffn."), config.activation)          # (B, n, d)
    r = residual_forward(z, f) if skip else (f, None)
    r, c["res2"] = r
    out = layernorm_forward(r, p["ln2.gamma"], p["ln2.beta"], eps) if norm else (r, None)
    out, c["ln2"] = out                                                             # H'
    return out, c


def _custom_layer_backward(dout: np.ndarray, c: dict):
    g: dict = {}
    dr = dout
    if c["norm"]:
        dr, g["ln2.gamma"], g["ln2.beta"] = layernorm_backward(dout, c["ln2"])
    dz, df = residual_backward(dr, c["res2"]) if c["skip"] else (0.0, dr)
    dz_ffn, gf = ffn_backward(df, c["ffn"])
    dz = dz + dz_ffn
    dr = dz
    if c["norm"]:
        dr, g["ln1.gamma"], g["ln1.beta"] = layernorm_backward(dz, c["ln1"])
    dx, da = residual_backward(dr, c["res1"]) if c["skip"] else (0.0, dr)
    dx_attn, ga = mha_backward(da, c["attn"])
    g.update({"attn." + k: v for k, v in ga.items()})
    g.update({"ffn." + k: v for k, v in gf.items()})
    return dx + dx_attn, g


def layer_forward(x: np.ndarray, p: dict, config: EncoderConfig, variant: str):
    """One layer H^(ℓ−1) → H^(ℓ), (B, n, d) → (B, n, d). Pre/Post are the library's
    :func:`encoder_layer_forward`; the two ablations are assembled from the same ops."""
    if variant in ("pre", "post"):
        out, c = encoder_layer_forward(x, p, config)
    else:
        out, c = _custom_layer_forward(x, p, config, skip=(variant == "no-layernorm"),
                                       norm=(variant == "no-residual"))
    c["variant"] = variant
    return out, c


def layer_backward(dout: np.ndarray, cache: dict) -> tuple[np.ndarray, dict]:
    """The full VJP of one layer: ``(dx, grads)`` (grads keyed ``attn.W_Q`` … ``ffn.W_2`` …)."""
    if cache["variant"] in ("pre", "post"):
        return encoder_layer_backward(dout, cache)
    return _custom_layer_backward(dout, cache)


@dataclass(frozen=True)
class Sublayer:
    """y = N(s·x + B(x)): ``norm`` is the LN cache on the path (None = no LN), ``skip`` is s,
    ``branch`` the VJP u ↦ J_Bᵀ u of the branch (for Pre-LN it includes the branch's LN)."""
    norm: dict | None
    skip: bool
    branch: Callable[[np.ndarray], np.ndarray]


def sublayers(cache: dict) -> list[Sublayer]:
    """The layer's two sublayers (attention, then FFN) in forward order."""
    v = cache["variant"]
    if v == "pre":
        attn = lambda u: layernorm_backward(                              # noqa: E731
            mha_backward(dropout_backward(u, cache["drop1"]), cache["attn"])[0], cache["ln1"])[0]
        ffn = lambda u: layernorm_backward(                               # noqa: E731
            ffn_backward(dropout_backward(u, cache["drop2"]), cache["ffn"])[0], cache["ln2"])[0]
        return [Sublayer(None, True, attn), Sublayer(None, True, ffn)]
    attn = lambda u: mha_backward(u, cache["attn"])[0]                   # noqa: E731
    ffn = lambda u: ffn_backward(u, cache["ffn"])[0]                     # noqa: E731
    if v == "post":  # dropout is the identity here (p = 0); kept for fidelity to the layer
        attn = lambda u: mha_backward(dropout_backward(u, cache["drop1"]), cache["attn"])[0]  # noqa: E731
        ffn = lambda u: ffn_backward(dropout_backward(u, cache["drop2"]), cache["ffn"])[0]    # noqa: E731
    skip = v in ("post", "no-layernorm")
    has_ln = v in ("post", "no-residual")
    return [Sublayer(cache["ln1"] if has_ln else None, skip, attn),
            Sublayer(cache["ln2"] if has_ln else None, skip, ffn)]


def _norm_vjp(u: np.ndarray, norm: dict | None) -> np.ndarray:
    return u if norm is None else layernorm_backward(u, norm)[0]


def identity_backward(dout: np.ndarray, cache: dict) -> np.ndarray:
    """The identity path of one layer: dout ↦ dout · ∏ D s (branch Jacobians dropped).

    Pre-LN / no-layernorm: dout itself. Post-LN: back through LN₂ then LN₁. No-residual: 0.
    """
    v = dout
    for s in reversed(sublayers(cache)):
        v = _norm_vjp(v, s.norm)
        v = v if s.skip else np.zeros_like(v)
    return v


def stack_forward(H0: np.ndarray, params: dict, config: EncoderConfig, variant: str):
    """Run the stack on H^(0) (B, n, d). Returns ``(H_final, cache)``; ``cache["hidden"]`` is
    [H^(0), …, H^(L)] (the residual stream; Pre-LN's final LN is applied only to H_final)."""
    hidden, caches = [H0], []
    H = H0
    for layer in range(config.n_layers):
        H, c = layer_forward(H, sub_params(params, layer_prefix(config, layer)), config, variant)
        hidden.append(H)
        caches.append(c)
    cache = {"hidden": hidden, "layers": caches, "final_ln": None}
    if config.use_final_layer_norm:
        H, cache["final_ln"] = layernorm_forward(H, params["final_ln.gamma"], params["final_ln.beta"],
                                                 config.layer_norm_eps)
    return H, cache


def backprop_hidden(dH_L: np.ndarray, layer_caches: list, path: str = "full"):
    """Back-propagate ∂L/∂H^(L) down the stack.

    ``path="full"``: the layers' own backward; returns ``(dhidden, grads)`` with
    ``dhidden[ℓ]`` = ∂L/∂H^(ℓ), ℓ = 0 … L, and ``grads[ℓ−1]`` the parameter gradients of layer ℓ.
    ``path="identity"``: only the identity path; returns ``(dhidden, None)``.
    """
    check_choice(path, "path", ("full", "identity"))
    dhidden, grads = [dH_L], []
    v = dH_L
    for c in reversed(layer_caches):
        if path == "full":
            v, g = layer_backward(v, c)
            grads.append(g)
        else:
            v = identity_backward(v, c)
        dhidden.append(v)
    dhidden.reverse()
    grads.reverse()
    return dhidden, (grads if path == "full" else None)


# ----------------------------------------------------------------------------- per-layer view
def _rms(H: np.ndarray) -> float:
    return float(np.sqrt(np.mean(H * H)))


def _token_cosine(H: np.ndarray) -> float:
    """Mean cosine similarity between distinct token vectors of a sequence, averaged over
    the batch: mean_{b, i≠j} ⟨h_bi, h_bj⟩ / (‖h_bi‖ ‖h_bj‖). 1 = all tokens parallel (collapse)."""
    B, n, _ = H.shape
    if n < 2:
        return float("nan")
    U = H / np.maximum(np.linalg.norm(H, axis=-1, keepdims=True), np.finfo(H.dtype).tiny)  # (B, n, d)
    C = U @ U.transpose(0, 2, 1)                                         # (B, n, n)
    off = C.sum(axis=(1, 2)) - np.trace(C, axis1=1, axis2=2)             # (B,)
    return float(np.mean(off / (n * (n - 1))))


def _inputs(seed: int, batch: int, n: int, d_model: int, out_shape=None):
    """H^(0) ~ N(0, 1) (RMS 1, like a LayerNormed embedding) and R ~ N(0, 1), from seed + 1
    (the weights use seed itself)."""
    rng = np.random.default_rng(seed + 1)
    H0 = rng.standard_normal((batch, n, d_model))                      # (B, n, d)
    R = rng.standard_normal(H0.shape if out_shape is None else out_shape)
    return H0, R


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _config(depth: int, d_model: int, n_heads: int, d_ff: int, variant: str = "pre") -> EncoderConfig:
    return EncoderConfig(n_layers=depth, d_model=d_model, n_heads=n_heads, d_ff=d_ff,
                         norm_position="pre" if variant == "pre" else "post", dropout=0.0,
                         final_layer_norm=(variant == "pre"))


def measure_estimate(depth: int, d_model: int = 64, n_heads: int = 4, d_ff: int = 256, n: int = 16,
                     batch: int = 8) -> MemoryEstimate:
    """Memory of :func:`measure`: the stack's parameters and caches (float64), its gradients, and the
    per-layer lists it keeps (H^(ℓ), ∂L/∂H^(ℓ) for both paths: 3 (L + 1) B n d numbers)."""
    est = estimate_encoder(_config(depth, d_model, n_heads, d_ff), np.float64, batch, n, backward=True)
    return est + MemoryEstimate({"activations": 3 * (depth + 1) * batch * n * d_model * 8})


#: the stages of :func:`measure`, as its ``progress`` names them
MEASURE_STAGES = ("forward through the stack", "backward (full)", "backward (identity path only)",
                  "norms, RMS and token cosines")


@single_thread_blas
def measure(variant: str, depth: int, init: str = "xavier", seed: int = 0, probe_layer: int | None = None,
            d_model: int = 64, n_heads: int = 4, d_ff: int = 256, n: int = 16, batch: int = 8,
            progress: Callable[[int, int, str], None] | None = None) -> dict:
    """The per-layer view of one stack at initialisation (float64).

    Returns a dict with (index ℓ = 0 … L unless said otherwise):
        grad_norm_by_layer        ‖∂L/∂H^(ℓ)‖ (Frobenius over the batch)
        identity_grad_norm_by_layer  the same with only the identity path back from H^(L)
        w2_grad_norm_by_layer     ‖∂L/∂W_2‖ of layers 1 … L (L numbers)
        rms_by_layer              RMS of H^(ℓ)
        token_cosine_by_layer     mean cosine between distinct tokens of H^(ℓ)
        probe_layer, probe_full_ratio, probe_identity_ratio   (each ‖·‖ at K / ‖·‖ at L)
    Non-finite numbers (an overflowing no-layernorm stack) are reported as None.
    ``progress(i, total, stage)``, if given, is called as each of the :data:`MEASURE_STAGES` starts.
    """
    _check_progress(progress)
    step = (lambda i: progress(i, len(MEASURE_STAGES), MEASURE_STAGES[i - 1])) if progress else (lambda i: None)
    check_choice(variant, "variant", VARIANTS)
    check_choice(init, "init", INITS)
    check_int(depth, "depth", minimum=1)
    check_int(seed, "seed", minimum=0)
    for name, val in (("d_model", d_model), ("n_heads", n_heads), ("d_ff", d_ff), ("n", n), ("batch", batch)):
        check_int(val, name, minimum=1)
    if probe_layer is None:
        probe_layer = depth // 2
    check_int(probe_layer, "probe_layer", minimum=0, maximum=depth)
    check_memory(measure_estimate(depth, d_model, n_heads, d_ff, n, batch), "gradflow")
    params, config = make_stack(variant, depth, init, seed, d_model, n_heads, d_ff)
    H0, R = _inputs(seed, batch, n, d_model)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        step(1)
        H, cache = stack_forward(H0, params, config, variant)
        step(2)
        dH_L = R if cache["final_ln"] is None else layernorm_backward(R, cache["final_ln"])[0]
        dfull, grads = backprop_hidden(dH_L, cache["layers"], "full")
        step(3)
        did, _ = backprop_hidden(dH_L, cache["layers"], "identity")
        step(4)
        g = [float(np.linalg.norm(v)) for v in dfull]
        gi = [float(np.linalg.norm(v)) for v in did]
        w2 = [float(np.linalg.norm(gr["ffn.W_2"])) for gr in grads]
        rms = [_rms(h) for h in cache["hidden"]]
        cos = [_token_cosine(h) for h in cache["hidden"]]
        full_ratio = g[probe_layer] / g[depth] if g[depth] > 0 else float("nan")
        id_ratio = gi[probe_layer] / gi[depth] if gi[depth] > 0 else float("nan")
    clean = lambda xs: [_finite(x) for x in xs]                           # noqa: E731
    return {
        "variant": variant, "depth": depth, "init": init, "seed": seed,
        "d_model": d_model, "n_heads": n_heads, "d_ff": d_ff, "n": n, "batch": batch,
        "loss": LOSS,
        "grad_norm_by_layer": clean(g),
        "identity_grad_norm_by_layer": clean(gi),
        "w2_grad_norm_by_layer": clean(w2),
        "rms_by_layer": clean(rms),
        "token_cosine_by_layer": clean(cos),
        "probe_layer": probe_layer,
        "probe_full_ratio": _finite(full_ratio),
        "probe_identity_ratio": _finite(id_ratio),
        "input_to_output_ratio": _finite(g[0] / g[depth]) if g[depth] > 0 else None,
        "finite": all(math.isfinite(x) for x in g + w2 + rms),
    }


@single_thread_blas
def sweep(depths=DEPTHS, variants=VARIANTS, inits=INITS, seed: int = 0, probe_layer: int = 50,
          progress: Callable[[int, int, str], None] | None = None, **dims) -> dict:
    """``measure`` for every (variant, init, depth); keys are those triples. The probe is
    ``probe_layer`` where it fits (depth ≥ probe_layer), else ⌊depth/2⌋. ``progress(i, total, label)``,
    if given, is called as each stack starts (label e.g. ``"post, bert init, depth 96"``)."""
    _check_progress(progress)
    cells = [(variant, init, L) for variant in variants for init in inits for L in depths]
    out = {}
    for i, (variant, init, L) in enumerate(cells, 1):
        if progress is not None:
            progress(i, len(cells), f"{variant}, {init} init, depth {L}")
        K = probe_layer if probe_layer <= L else L // 2
        out[(variant, init, L)] = measure(variant, L, init, seed, K, **dims)
    return out


# ----------------------------------------------------------------------------- Jacobian view
def jacobian_from_vjp(vjp: Callable[[np.ndarray], np.ndarray], n: int, d: int) -> np.ndarray:
    """The (n·d, n·d) matrix J[i, j] = ∂out_i/∂in_j of a map of one sequence (n, d) → (n, d).

    The forward was run on a batch of M = n·d identical copies of the input, so ``vjp``
    accepts (M, n, d); feeding the basis e_1 … e_M (one per batch row) returns row i = e_iᵀ J
    in batch row i: M backward passes in one call, since batch rows never interact.
    """
    M = n * d
    basis = np.eye(M).reshape(M, n, d)                                   # (M, n, d)
    return vjp(basis).reshape(M, M)


@dataclass
class LayerTerms:
    """One sublayer's Jacobian y = N(s·x + B(x)) as matrices: ``D`` (None = I), ``skip``, ``JB``."""
    D: np.ndarray | None
    skip: bool
    JB: np.ndarray

    def full(self) -> np.ndarray:
        M = self.JB.shape[0]
        inner = (np.eye(M) if self.skip else 0.0) + self.JB
        return inner if self.D is None else self.D @ inner


def layer_jacobian_terms(cache: dict, n: int, d: int) -> list[LayerTerms]:
    """The two sublayers of a layer (run on n·d copies of one sequence) as Jacobian matrices."""
    terms = []
    for s in sublayers(cache):
        D = None if s.norm is None else jacobian_from_vjp(lambda u, c=s.norm: layernorm_backward(u, c)[0], n, d)
        terms.append(LayerTerms(D, s.skip, jacobian_from_vjp(s.branch, n, d)))
    return terms


def _small_stack(variant: str, depth: int, init: str, seed: int, dims: dict):
    d, n = dims["d_model"], dims["n"]
    M = n * d                   # the stack runs on M copies of one sequence; Jacobians are (M, M)
    check_memory(estimate_encoder(_config(depth, d, dims["n_heads"], dims["d_ff"], variant), np.float64, M, n)
                 + MemoryEstimate({"Jacobians": (4 * depth + 4) * M * M * 8}), "the Jacobian view")
    params, config = make_stack(variant, depth, init, seed, d, dims["n_heads"], dims["d_ff"])
    x0 = np.random.default_rng(seed + 1).standard_normal((1, n, d))      # one sequence (1, n, d)
    H0 = np.repeat(x0, n * d, axis=0)                                    # (n·d, n, d) copies
    _, cache = stack_forward(H0, params, config, variant)
    return x0, params, config, cache


def stack_jacobian(cache: dict, n: int, d: int, upto: int | None = None, path: str = "full") -> np.ndarray:
    """∂H^(upto)/∂H^(0) (n·d, n·d) from backward passes through the whole (replicated) stack."""
    layers = cache["layers"] if upto is None else cache["layers"][:upto]
    return jacobian_from_vjp(lambda u: backprop_hidden(u, layers, path)[0][0], n, d)


def expansion_by_order(terms: list[LayerTerms]) -> list[np.ndarray]:
    """Expand ∏_k D_k (s_k I + J_k) (k over sublayers, applied in order) by the number of branch
    Jacobians in each product: returns E_0 … E_K with Σ_m E_m = the full Jacobian.

    E_0 is the identity path (∏ D_k s_k); E_1 sums the 2L paths through exactly one branch,
    and so on — the 2^K paths of the article's expansion, grouped by length. Recursion per
    sublayer: E_m ← D (s E_m + J E_{m−1}).
    """
    M = terms[0].JB.shape[0]
    E = [np.eye(M)]
    for t in terms:
        new = []
        for m in range(len(E) + 1):
            acc = (t.skip * E[m]) if m < len(E) else np.zeros((M, M))
            if m >= 1:
                acc = acc + t.JB @ E[m - 1]
            new.append(acc if t.D is None else t.D @ acc)
        E = new
    return E


@single_thread_blas
def singular_values_by_depth(variant: str, depth: int, init: str = "xavier", seed: int = 0,
                             dims: dict | None = None) -> list[np.ndarray]:
    """σ(∂H^(ℓ)/∂H^(0)) for ℓ = 1 … depth (descending), from the per-layer Jacobians of one stack."""
    dims = {**SMALL_DIMS, **(dims or {})}
    n, d = dims["n"], dims["d_model"]
    _, _, _, cache = _small_stack(variant, depth, init, seed, dims)
    J = np.eye(n * d)
    out = []
    for c in cache["layers"]:
        for t in layer_jacobian_terms(c, n, d):
            J = t.full() @ J
        out.append(np.linalg.svd(J, compute_uv=False))
    return out


def numerical_rank(sigma: np.ndarray, rtol: float = 1e-6) -> int:
    """Number of singular values above rtol · σ_max (how many input directions still reach the output)."""
    sigma = np.asarray(sigma)
    return int(np.sum(sigma > rtol * sigma[0])) if sigma.size and sigma[0] > 0 else 0


def stable_rank(sigma: np.ndarray) -> float:
    """Σ σ² / σ_max²: 1 when one direction dominates, the dimension for an isometry."""
    sigma = np.asarray(sigma, dtype=float)
    return float(np.sum(sigma ** 2) / sigma[0] ** 2) if sigma.size and sigma[0] > 0 else 0.0


@single_thread_blas
def probe_table(depth: int = 96, probe_layer: int = 50, seeds=(0, 1, 2), variants=("pre", "post"),
                inits=INITS, progress: Callable[[int, int, str], None] | None = None, **dims) -> list[dict]:
    """The layer-``probe_layer``-of-``depth`` numbers for several seeds: one row per
    (variant, init, seed) with the full and identity-path ratios, the last-layer and
    probe-layer ‖∂L/∂W_2‖, RMS of H^(L) and the token cosine at the probe layer.
    ``progress(i, total, label)``, if given, is called as each row starts (label e.g. ``"pre, xavier init,
    seed 0"``); a notebook passes :func:`transformer_np.course.progress.progress_line`."""
    _check_progress(progress)
    cells = [(variant, init, seed) for variant in variants for init in inits for seed in seeds]
    rows = []
    for i, (variant, init, seed) in enumerate(cells, 1):
        if progress is not None:
            progress(i, len(cells), f"{variant}, {init} init, seed {seed}")
        r = measure(variant, depth, init, seed, probe_layer, **dims)
        w2 = r["w2_grad_norm_by_layer"]
        rows.append({"variant": variant, "init": init, "seed": seed,
                     "full_ratio": r["probe_full_ratio"], "identity_ratio": r["probe_identity_ratio"],
                     "w2_probe": w2[probe_layer - 1] if probe_layer >= 1 else None,
                     "w2_last": w2[-1], "rms_last": r["rms_by_layer"][-1],
                     "cos_probe": r["token_cosine_by_layer"][probe_layer]})
    return rows


@single_thread_blas
def jacobian_view(variant: str, depth: int, init: str = "xavier", seed: int = 0, dims: dict | None = None) -> dict:
    """The small-stack Jacobian ∂H^(L)/∂H^(0), its identity path and the ∏(I + J) expansion.

    Returns ``full`` (from the stack's backward passes), ``identity`` (identity path only),
    ``product`` (product of the per-sublayer Jacobians), ``orders`` (E_0 … E_2L, see
    :func:`expansion_by_order`), ``order_norms`` (spectral norm of each), ``sigma`` (singular
    values of ``full``) and the inputs (``x0``, ``params``, ``config``) for a finite-difference check.
    """
    dims = {**SMALL_DIMS, **(dims or {})}
    n, d = dims["n"], dims["d_model"]
    x0, params, config, cache = _small_stack(variant, depth, init, seed, dims)
    terms = [t for c in cache["layers"] for t in layer_jacobian_terms(c, n, d)]
    product = np.eye(n * d)
    for t in terms:
        product = t.full() @ product
    orders = expansion_by_order(terms)
    full = stack_jacobian(cache, n, d)
    return {"variant": variant, "depth": depth, "init": init, "seed": seed, "dims": dims,
            "full": full, "identity": stack_jacobian(cache, n, d, path="identity"), "product": product,
            "orders": orders, "order_norms": [float(np.linalg.norm(E, 2)) for E in orders],
            "sigma": np.linalg.svd(full, compute_uv=False), "x0": x0, "params": params, "config": config}


def finite_difference_jacobian(x0: np.ndarray, params: dict, config: EncoderConfig, variant: str,
                               h: float = 1e-5) -> np.ndarray:
    """Central differences of H^(L) with respect to H^(0) (1, n, d): (n·d, n·d), J[i, j] = ∂out_i/∂in_j."""
    _, n, d = x0.shape
    M = n * d
    J = np.empty((M, M))
    for j in range(M):
        e = np.zeros(M)
        e[j] = h
        plus = stack_forward(x0 + e.reshape(1, n, d), params, config, variant)[1]["hidden"][-1]
        minus = stack_forward(x0 - e.reshape(1, n, d), params, config, variant)[1]["hidden"][-1]
        J[:, j] = (plus - minus).reshape(M) / (2 * h)
    return J


# ----------------------------------------------------------------------------- everything the figures need
@single_thread_blas
def compute_all(seed: int = 0, depths=DEPTHS, jac_depth: int = 24, exp_depth: int = 12,
                progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Everything the notebook and the figures need: the per-layer sweep, the spectra and
    the expansions. ``progress(i, total, label)``, if given, is called as each of their stacks starts."""
    _check_progress(progress)
    spectra_cells = [(v, i) for v in VARIANTS for i in INITS]
    view_cells = [(v, i) for v in ("pre", "post") for i in INITS]
    n_sweep = len(VARIANTS) * len(INITS) * len(depths)
    total = n_sweep + len(spectra_cells) + len(view_cells)
    tell = progress or (lambda i, n, label: None)
    results = sweep(depths, seed=seed, progress=lambda i, n, label: tell(i, total, f"per-layer view: {label}"))
    spectra = {}
    for k, (v, i) in enumerate(spectra_cells, n_sweep + 1):
        tell(k, total, f"Jacobian spectrum: {v}, {i} init, depth {jac_depth}")
        spectra[(v, i)] = singular_values_by_depth(v, jac_depth, i, seed)
    views = {}
    for k, (v, i) in enumerate(view_cells, n_sweep + len(spectra_cells) + 1):
        tell(k, total, f"expansion: {v}, {i} init, depth {exp_depth}")
        views[f"{v}, {i}"] = jacobian_view(v, exp_depth, i, seed)
    return {"results": results, "spectra": spectra, "views": views}


# Moved in 0.2 (study code to transformer_np.course, the command line to transformer_np.cli, the figures to
# transformer_np.course.plots.gradflow); the old names keep resolving.
__getattr__ = _forward_moved(__name__, {
    "add_arguments": "transformer_np.cli.gradflow",
    "_check_cli": "transformer_np.cli.gradflow",
    "_fmt": "transformer_np.cli.gradflow",
    "run": "transformer_np.cli.gradflow",
    **{n: "transformer_np.course.plots.gradflow" for n in (
        "save_figures", "plot_profile", "plot_ratio_vs_depth", "plot_last_w2_vs_depth", "plot_by_layer",
        "plot_identity_vs_full", "plot_spectra", "plot_expansion", "COLORS", "STYLES")},
})

