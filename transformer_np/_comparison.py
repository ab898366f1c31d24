"""The criterion and the messages of :mod:`transformer_np.testing` (private: import from there).

One tensor's comparison (:class:`TensorComparison`: the errors, the criterion
|ours − ref| ≤ atol·S + rtol·|ref| and the element that violates it most), the scale S of every tensor
(:func:`_set_scales`), and the report of one call with the ``AssertionError`` it raises
(:class:`ComparisonReport`). The frames of the functions on the way from ``assert_matches_torch`` to that
``raise`` set ``__tracebackhide__``, so pytest shows the user's test line and the message, not this code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ._validate import describe
from .errors import InputValueError


def _hide_assertion(excinfo) -> bool:
    """pytest's ``__tracebackhide__`` filter: hide the frame when the error is a comparison's AssertionError
    (any other error — a bad argument, a bug — keeps it, for the traceback to point at)."""
    return excinfo.errisinstance(AssertionError)


# ----------------------------------------------------------------------------- one tensor
@dataclass
class TensorComparison:
    """Ours against the framework's for one tensor.

    Attributes:
        name: the framework's name (``"output"``, ``"input"`` for the input gradient, or the
            parameter's name in the module, e.g. ``"layers.0.linear1.weight"``).
        kind: ``"weight"``, ``"output"``, ``"input grad"`` or ``"grad"``.
        ours_name: our parameter's name (``"layers.0.ffn.W_1"``; torch's fused ``in_proj`` maps to
            ``"layers.0.attn.W_Q|W_K|W_V"``), or None for the output and the input gradient.
        transposed: our array is the transpose of the framework's (every ``nn.Linear`` weight).
        max_abs: max |ours − ref|.
        max_rel: max |ours − ref| / |ref| over elements with ref ≠ 0 (inf if ref = 0 where ours ≠ 0).
        norm_rel: ‖ours − ref‖ / ‖ref‖ (0 if both are 0, inf if only ref is).
        where: index of the max abs error in the framework's tensor (() for scalars).
        scale: S of the criterion, the largest |ref| in this tensor's module (see the module docstring).
        ours, ref: the two arrays, in float64, in the framework's layout.
    """

    name: str
    kind: str
    ours_name: str | None
    max_abs: float
    max_rel: float
    norm_rel: float
    where: tuple
    ours: np.ndarray = field(repr=False)
    ref: np.ndarray = field(repr=False)
    scale: float = 0.0
    transposed: bool = False

    def ours_at(self, index: tuple) -> str | None:
        """Our name and index of the framework's element ``index`` (``"layers.0.attn.W_K[2, 1]"``)."""
        if not self.ours_name:
            return None
        idx = tuple(index)
        if "|" in self.ours_name:                           # torch's stacked [W_Qᵀ; W_Kᵀ; W_Vᵀ] / [b_Q; b_K; b_V]
            d = self.ref.shape[0] // 3
            base, leaves = self.ours_name.rsplit(".", 1)
            leaf = leaves.split("|")[idx[0] // d]
            idx = (idx[0] % d,) + idx[1:]
            name = f"{base}.{leaf}"
        else:
            name = self.ours_name
        if self.transposed:
            idx = idx[::-1]
        return f"{name}[{', '.join(str(i) for i in idx)}]"

    @property
    def group(self) -> tuple[str, str]:
        """The tensors that share one scale S: the weight and bias of one module (same name up to the last dot)."""
        if self.kind in ("weight", "grad"):
            return self.kind, self.name.rsplit(".", 1)[0]
        return self.kind, self.name

    @property
    def label(self) -> str:
        what = {"weight": "weight", "output": "output", "input grad": "gradient of the input",
                "grad": "gradient of"}[self.kind]
        return f"{what} {self.name!r}" if self.kind in ("weight", "grad") else what

    def worst_element(self, rtol: float, atol: float) -> tuple[tuple, float]:
        """(index, excess) of the element furthest outside the criterion: the largest
        |ours − ref| − (atol·S + rtol·|ref|) — positive when the tensor fails, ≤ 0 when it passes
        (NaN on either side counts as +inf). This is the one element an ``AssertionError`` names."""
        if self.ours.size == 0:
            return (), 0.0
        diff = np.abs(self.ours - self.ref)
        with np.errstate(invalid="ignore"):
            excess = diff - (atol * self.scale + rtol * np.abs(self.ref))
        excess = np.where(np.isnan(excess), np.inf, excess)           # NaN (or inf − inf) never passes
        k = int(np.argmax(excess))
        return tuple(int(i) for i in np.unravel_index(k, excess.shape)), float(excess.flat[k])

    def violation(self, rtol: float, atol: float) -> tuple[float, tuple]:
        """(worst ratio |ours − ref| / (atol·S + rtol·|ref|), its index); the tensor passes when ratio ≤ 1."""
        if self.ours.size == 0:
            return 0.0, ()
        diff = np.abs(self.ours - self.ref)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = diff / (atol * self.scale + rtol * np.abs(self.ref))
            ratio = np.where(diff == 0, 0.0, ratio)                  # equal (even both 0) always passes
        ratio = np.where(np.isnan(ratio), np.inf, ratio)            # NaN on either side never passes
        k = int(np.argmax(ratio))
        return float(ratio.flat[k]), tuple(int(i) for i in np.unravel_index(k, ratio.shape))


def _compare(name: str, kind: str, ours, ref, ours_name: str | None = None, transposed: bool = False
             ) -> TensorComparison:
    __tracebackhide__ = _hide_assertion
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        raise AssertionError(f"{kind} {name!r}: shapes differ, ours {ours.shape} vs the framework's {ref.shape}")
    if ours.size == 0:
        return TensorComparison(name, kind, ours_name, 0.0, 0.0, 0.0, (), ours, ref, transposed=transposed)
    diff = np.abs(ours - ref)
    bad = ~np.isfinite(diff)
    k = int(np.argmax(np.where(bad, np.inf, diff)))
    where = tuple(int(i) for i in np.unravel_index(k, diff.shape))
    max_abs = float(np.inf if bad.any() else diff.max())
    nz = ref != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = diff[nz] / np.abs(ref[nz])
    max_rel = float(rel.max()) if rel.size else 0.0
    if np.any(diff[~nz] > 0) or bad.any():
        max_rel = math.inf
    den = float(np.linalg.norm(ref))
    num = float(np.linalg.norm(np.where(bad, 0.0, diff))) if not bad.any() else math.inf
    norm_rel = 0.0 if num == 0 else (num / den if den > 0 else math.inf)
    return TensorComparison(name, kind, ours_name, max_abs, max_rel, norm_rel, where, ours, ref, transposed=transposed)


# ----------------------------------------------------------------------------- the report
@dataclass
class ComparisonReport:
    """Every comparison of one :func:`compare_with_torch` call.

    Attributes:
        module: what was compared (the module's class, e.g. ``"BertModel"``).
        framework: ``"torch"`` or ``"transformers"``.
        dtype: the dtype both sides ran in.
        rtol, atol: the tolerances :meth:`check` uses by default (the dtype's unless overridden).
        entries: the :class:`TensorComparison` list (weights, output, input grad, grads).
        notes: what was not compared and why; how attention ran on the torch side.
    """

    module: str
    framework: str
    dtype: np.dtype
    rtol: float
    atol: float
    entries: list[TensorComparison]
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> TensorComparison:
        """The entry of one tensor: ``report["output"]``, ``report["input"]``, ``report["layers.0.linear1.weight"]``
        (the gradient; ``report["weight:layers.0.linear1.weight"]`` is the weight)."""
        for e in self.entries:
            key = f"weight:{e.name}" if e.kind == "weight" else e.name
            if key == name:
                return e
        raise KeyError(f"no compared tensor named {name!r}; names: {[e.name for e in self.entries][:12]} …")

    @property
    def grads(self) -> list[TensorComparison]:
        return [e for e in self.entries if e.kind == "grad"]

    def max_norm_rel(self, kind: str | None = None) -> float:
        """Largest norm-relative error (over entries of ``kind``, or all)."""
        errs = [e.norm_rel for e in self.entries if kind is None or e.kind == kind]
        return max(errs) if errs else 0.0

    def failures(self, rtol: float | None = None, atol: float | None = None
                 ) -> list[tuple[TensorComparison, float, tuple]]:
        """``(entry, ratio, index)`` of every entry that violates |ours − ref| ≤ atol·S + rtol·|ref|: ``ratio`` is
        the entry's largest |ours − ref| / (atol·S + rtol·|ref|) (> 1), ``index`` its element furthest outside
        the criterion (:meth:`TensorComparison.worst_element`), the one the ``AssertionError`` names."""
        rtol, atol = _tolerances(self.dtype, rtol, atol, self.rtol, self.atol)
        out = []
        for e in self.entries:
            ratio, _ = e.violation(rtol, atol)
            if not ratio <= 1.0:
                out.append((e, ratio, e.worst_element(rtol, atol)[0]))
        return out

    @property
    def ok(self) -> bool:
        return not self.failures()

    def check(self, rtol: float | None = None, atol: float | None = None) -> ComparisonReport:
        """Raise ``AssertionError`` naming the first disagreeing tensor and, at its element furthest outside the
        criterion, the index, both values, the error and the tolerance there."""
        __tracebackhide__ = True                                  # pytest: the message, not this frame's source
        rtol, atol = _tolerances(self.dtype, rtol, atol, self.rtol, self.atol)
        bad = self.failures(rtol, atol)
        if not bad:
            return self
        e, ratio, idx = bad[0]
        theirs = "torch" if self.framework == "torch" else "transformers"
        o, r = e.ours[idx], e.ref[idx]
        allowed = atol * e.scale + rtol * abs(r)
        mapped = f" (ours: {e.ours_at(idx)})" if e.ours_name else ""
        lines = [f"transformer_np and {theirs} disagree on the {e.label}{mapped} [{self.module}, {self.dtype}]:",
                 f"  at index {idx} (the element furthest outside the tolerance): ours = {o:.10g}, "
                 f"{theirs} = {r:.10g}, |ours - {theirs}| = {abs(o - r):.3g} > atol*S + rtol*|{theirs}| = "
                 f"{allowed:.3g} (rtol = {rtol:g}, atol = {atol:g}, S = {e.scale:.3g})",
                 f"  over the whole tensor: max abs error {e.max_abs:.3g}, max rel error "
                 f"{e.max_rel:.3g}, norm-relative error {e.norm_rel:.3g}"]
        if len(bad) > 1:
            others = ", ".join(b[0].label for b in bad[1:6]) + (", …" if len(bad) > 6 else "")
            lines.append(f"  {len(bad)} of {len(self.entries)} tensors disagree; the others: {others}")
        raise AssertionError("\n".join(lines))

    def __str__(self) -> str:
        head = (f"{self.module} vs transformer_np, {self.dtype}, rtol = {self.rtol:g}, atol = {self.atol:g}: "
                f"{'all agree' if self.ok else f'{len(self.failures())} disagree'}")
        w = max([len(e.label) for e in self.entries] + [6])
        rows = [head, f"  {'tensor':{w}s} {'max abs':>9s} {'max rel':>9s} {'norm rel':>9s} {'S':>9s}  where"]
        failing = {id(f[0]) for f in self.failures()}
        for e in self.entries:
            flag = "  FAIL" if id(e) in failing else ""
            rows.append(f"  {e.label:{w}s} {e.max_abs:9.2e} {e.max_rel:9.2e} {e.norm_rel:9.2e} {e.scale:9.2e}  "
                        f"{e.where}{flag}")
        rows += [f"  note: {n}" for n in self.notes]
        return "\n".join(rows)


def _tolerances(dtype, rtol, atol, rtol_default, atol_default) -> tuple[float, float]:
    rtol = rtol_default if rtol is None else rtol
    atol = atol_default if atol is None else atol
    for name, v in (("rtol", rtol), ("atol", atol)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise InputValueError(f"{name} must be a finite number >= 0, got {describe(v)}")
    return float(rtol), float(atol)


def _set_scales(entries: list[TensorComparison]) -> None:
    """S of every entry: the largest |ref| over its group (a module's weight and bias)."""
    top: dict = {}
    for e in entries:
        m = float(np.abs(e.ref).max()) if e.ref.size else 0.0
        top[e.group] = max(top.get(e.group, 0.0), m)
    for e in entries:
        e.scale = top[e.group]


