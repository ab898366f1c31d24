"""Helpers shared by the tests (imported as ``from helpers import nrel, randomise_, assert_paths_close``)."""

from __future__ import annotations

import math

import numpy as np


def nrel(ours, ref) -> float:
    """‖ours − ref‖ / ‖ref‖ (Frobenius), in float64; ``ref`` may be a torch tensor."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref.detach().numpy() if hasattr(ref, "detach") else ref, dtype=np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    den = np.linalg.norm(ref)
    assert den > 0, "reference is exactly zero: the relative error is undefined"
    return float(np.linalg.norm(ours - ref) / den)


def randomise_(model, seed: int) -> None:
    """Every parameter of a torch module random: matrices N(0, 0.5²), biases/β N(0, 0.3²), LayerNorm γ = 1 + N(0, 0.3²)
    (torch is imported by the caller's test module; this only uses the module's own tensors)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if p.ndim == 2:
                p.copy_(0.5 * z)
            elif "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * z)
            else:
                p.copy_(0.3 * z)


# ----------------------------------------------------------------------------- comparing two paths
#: The default constant c in rtol = c·eps(dtype)·√k (CONTRIBUTING.md, "Comparing numbers in tests").
PATH_C = 16.0


def path_tolerance(dtype, k: int, c: float = PATH_C) -> float:
    """rtol = c·eps(dtype)·√k: the relative round-off allowed between two orders of summing k terms.

    A sum of k terms computed in two orders (two BLAS kernels, two thread counts, blocked or not)
    differs by about eps·√k relative to the size of the terms (random-walk growth of the rounding
    errors; the worst case is eps·k). ``c`` absorbs the constant and the amplification of the
    operations after the sum (a softmax, a LayerNorm's division by σ, a few layers)."""
    dtype = np.dtype(dtype)
    if not np.issubdtype(dtype, np.floating):
        raise TypeError(f"path_tolerance: dtype must be a float dtype, got {dtype} "
                        "(integer and boolean results are exact by construction: compare them exactly)")
    if int(k) < 1:
        raise ValueError(f"path_tolerance: k (the reduction length) must be >= 1, got {k!r}")
    if not c > 0:
        raise ValueError(f"path_tolerance: c must be > 0, got {c!r}")
    return float(c) * float(np.finfo(dtype).eps) * math.sqrt(int(k))


def assert_paths_close(actual, expected, *, paths: tuple[str, str] = ("fast", "plain"), k: int,
                       c: float = PATH_C, atol_scale: float = 1.0, scale: float | None = None, dtype=None) -> None:
    """Assert that two results computed along two different paths agree to round-off.

    Every element must satisfy ``|actual − expected| ≤ rtol·|expected| + atol`` with
    ``rtol = c·eps·√k`` (:func:`path_tolerance`; eps of ``dtype``, by default the coarser of the two
    arrays' float dtypes) and ``atol = atol_scale·rtol·S``, S = ``scale`` or else max|expected|: the
    absolute floor lets through round-off in elements that are zero (or tiny) in exact arithmetic,
    whose error is of the order of the largest terms they were computed from, not of their own size.
    Pass ``scale`` when a whole array is zero in exact arithmetic (a key bias's gradient: pass the
    largest gradient of the same backward, as gradcheck's error floor does). Shapes must be equal;
    non-finite values (inf, nan) must be in the same places with the same values.

    ``paths`` names the two paths in the message (actual's first), which also gives the worst
    element's index, both values, the error and the tolerance used.
    """
    __tracebackhide__ = True
    a = np.asarray(actual)
    e = np.asarray(expected)
    p_a, p_e = paths
    if a.shape != e.shape:
        raise AssertionError(f"{p_a} vs {p_e}: shapes differ: {p_a} {a.shape}, {p_e} {e.shape}")
    if dtype is None:
        floats = [x.dtype for x in (a, e) if np.issubdtype(x.dtype, np.floating)]
        if not floats:
            raise TypeError(f"assert_paths_close: {p_a} ({a.dtype}) and {p_e} ({e.dtype}) are not float arrays; "
                            "integer and boolean results are exact by construction: compare them exactly")
        dtype = max(floats, key=lambda d: np.finfo(d).eps)
    rtol = path_tolerance(dtype, k, c)
    if not atol_scale >= 0:
        raise ValueError(f"assert_paths_close: atol_scale must be >= 0, got {atol_scale!r}")
    a64 = a.astype(np.float64)
    e64 = e.astype(np.float64)
    fin_a, fin_e = np.isfinite(a64), np.isfinite(e64)
    same_nonfinite = (~fin_a & ~fin_e) & ((a64 == e64) | (np.isnan(a64) & np.isnan(e64)))
    bad_nonfinite = ~(fin_a & fin_e) & ~same_nonfinite
    if bad_nonfinite.any():
        idx = tuple(int(i) for i in np.argwhere(bad_nonfinite)[0])
        raise AssertionError(f"{p_a} vs {p_e}: non-finite values differ at index {idx}: "
                             f"{p_a} = {float(a64[idx])!r}, {p_e} = {float(e64[idx])!r} "
                             f"({int(bad_nonfinite.sum())} of {a.size} elements)")
    both = fin_a & fin_e
    if scale is None:
        scale, s_name = (float(np.abs(e64[both]).max()) if both.any() else 0.0), f"max|{p_e}|"
    else:
        scale, s_name = float(scale), "S"
    atol = atol_scale * rtol * scale
    err = np.abs(np.where(both, a64, 0.0) - np.where(both, e64, 0.0))
    tol = rtol * np.abs(np.where(both, e64, 0.0)) + atol
    over = err > tol
    if over.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(over, err / np.where(tol > 0, tol, np.inf), -1.0)
        ratio = np.where(over & (tol == 0), np.inf, ratio)
        idx = np.unravel_index(int(np.argmax(ratio)), a.shape) if a.ndim else ()
        idx = tuple(int(i) for i in idx)
        av, ev, er, to = (float(v[idx]) for v in (a64, e64, err, tol))
        where = f"index {idx}" if a.ndim else "the scalar"
        raise AssertionError(
            f"{p_a} vs {p_e} differ beyond round-off at {where} (the worst of {int(over.sum())} of {a.size} "
            f"elements): {p_a} = {av!r}, {p_e} = {ev!r}, |error| = {er:.3g} > tolerance {to:.3g} "
            f"= rtol·|{p_e}| + atol with rtol = c·eps·√k = {c:g}·{np.finfo(dtype).eps:.3g}·√{int(k)} = {rtol:.3g} "
            f"({np.dtype(dtype)}), atol = {atol_scale:g}·rtol·{s_name} = {atol:.3g} ({s_name} = {scale:.3g})")


def assert_folder_refused(folder, *fragments) -> str:
    """``load_pretrained(folder)`` raises a one-line ``ModelFolderError`` containing every fragment; returns it."""
    import pytest

    from transformer_np.errors import ModelFolderError
    from transformer_np.io.pretrained import load_pretrained

    with pytest.raises(ModelFolderError) as info:
        load_pretrained(folder)
    msg = str(info.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, msg
    return msg



def nontrivial_params(cfg, seed: int, dtype) -> dict:
    """Glorot weights and non-trivial LayerNorm γ, β and biases for ``cfg`` (γ = 1, β = 0 and zero biases
    would hide their gradients, or a misplaced one)."""
    import transformer_np as tnp

    p = tnp.init_params(cfg, seed=seed, init="xavier", std=0.5)
    r = np.random.default_rng(seed + 7)
    for k, v in p.items():
        leaf = k.rsplit(".", 1)[-1]
        if leaf == "gamma":
            p[k] = 1 + 0.1 * r.standard_normal(v.shape)
        elif leaf == "beta" or leaf.startswith("b_"):
            p[k] = 0.1 * r.standard_normal(v.shape)
    return {k: v.astype(dtype) for k, v in p.items()}


def attention_mask_case(kind: str, B: int, n_q: int, n_k: int, dtype, r) -> np.ndarray | None:
    """An additive attention mask: ``"none"`` (None), ``"padding"`` ((B, 1, 1, n_k), the last keys of
    batch 0 hidden) or any other kind: a random (B, 1, n_q, n_k) pattern with 30% of the keys hidden."""
    import transformer_np as tnp

    if kind == "none":
        return None
    if kind == "padding":
        am = np.ones((B, n_k), dtype=np.int64)
        am[0, max(1, n_k // 2):] = 0
        return tnp.padding_mask(am, dtype)
    return np.where(r.random((B, 1, n_q, n_k)) < 0.3, np.finfo(dtype).min, 0.0).astype(dtype)


def spy_split_counts(monkeypatch, module) -> list[int]:
    """The ``count`` of every ``module._in_shards(fn, count)`` call from now on (the calls still run;
    1: the work was not split). ``module`` is the one that imported ``_in_shards`` and looks it up at
    call time: fast.inference, fast.attention or io.pretrained."""
    calls: list[int] = []
    real = module._in_shards

    def spy(fn, count):
        calls.append(count)
        return real(fn, count)

    monkeypatch.setattr(module, "_in_shards", spy)
    return calls


def lagrange_monomials(a_nodes, values, K: float) -> np.ndarray:
    """Monomial coefficients (in s = a/(a + K)) of the polynomial through ``values`` at ``a_nodes``,
    by Lagrange's formula without BLAS: products of linear factors (np.convolve), each coefficient a
    math.fsum over the nodes — the float32 GELU kernels' polynomials, recomputed by their tests
    (tests/ops/test_fast_path.py, tests/model/test_inference.py) the same way on every machine."""
    from numpy.polynomial import polynomial as P
    s = [a / (a + K) for a in a_nodes]
    basis = []
    for j, sj in enumerate(s):
        lj = np.ones(1)
        for k, sk in enumerate(s):
            if k != j:
                lj = P.polymul(lj, [-sk, 1.0])
        basis.append(lj * (values[j] / math.prod(sj - sk for k, sk in enumerate(s) if k != j)))
    return np.array([math.fsum(b[i] for b in basis) for i in range(len(s))])


# jupyter_client picks a kernel's ports by binding to port 0 and closing, then the kernel binds them: another
# process (the other test worker, another grading) can take one in between, and the kernel exits before it
# answers (jupyter/jupyter_client#154; seen once in CI). That is a failure to start, not a result: the notebook
# tests start the kernel again then, at most twice, and report each restart as a warning.
KERNEL_DID_NOT_START = "Kernel died before replying to kernel_info"


def retry_kernel_start(run, what: str):
    """``run()``, started again (at most twice, each time with a warning naming ``what``) while it raises a
    RuntimeError saying that the kernel did not start (:data:`KERNEL_DID_NOT_START`); any other exception, and a
    third such failure, propagate. Returns what ``run()`` returns."""
    import warnings

    for attempt in range(2):
        try:
            return run()
        except RuntimeError as e:
            if KERNEL_DID_NOT_START not in str(e):
                raise
            warnings.warn(f"{what}: the kernel did not start (attempt {attempt + 1}); running again.\n{e}",
                          stacklevel=3)
    return run()


def execute_notebook(nb, cwd, timeout: int = 300):
    """Run every cell of the nbformat notebook ``nb`` in a python3 kernel started in ``cwd`` (nbclient; raises on
    any cell's error), the kernel started again when it died before it answered (:func:`retry_kernel_start`),
    each attempt from the cells as they were. Returns the executed notebook (``nb`` itself)."""
    import copy

    from nbclient import NotebookClient

    original = copy.deepcopy(nb.cells)

    def run():
        nb.cells = copy.deepcopy(original)
        NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
        return nb

    return retry_kernel_start(run, "nbclient")
