"""The criterion and the messages of :mod:`transformer_np.testing` (a part of it: import from there).

One tensor's comparison (:class:`TensorComparison`: the errors, the two criteria and the element that violates
the element-wise one most), the scales of every tensor (:func:`_set_scales`), and the report of one call with the
``AssertionError`` it raises (:class:`ComparisonReport`). The frames of the functions on the way from
``assert_matches_torch`` to that ``raise`` set ``__tracebackhide__``, so pytest shows the user's test line and the
message, not this code.

Two criteria, both must hold for every tensor (see ``docs/guide/testing.md``):

* element-wise: |ours − ref| ≤ atol·S + rtol·|ref| for every element, S = the largest |ref| in the tensor's module;
* norm-wise:    ‖ours − ref‖ ≤ norm_rtol·N, N = max(‖ref‖, √m·rms_G), where m is the tensor's size and rms_G the
  root mean square of the reference over the tensor's module (weight and bias of one Linear, LayerNorm, Embedding).

A systematic error (an output scaled by 1 + 1e-5) moves every element by a little: no element leaves a tolerance
wide enough for float32's worst round-off, but the norm of the error grows with the tensor while the round-off's
does not line up, so the norm-wise criterion sees it.

Speed: every tensor is compared in the dtype both sides ran in, in one pass by blocks that stay in cache (the
difference and its reductions, :func:`_stats`); the element-wise ratios are computed only for a tensor whose
largest error exceeds atol·S (the element-wise criterion cannot fail otherwise).
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field

import numpy as np

from .._validate import describe
from ..errors import InputValueError

#: Default element-wise (rtol, atol) by dtype; see ``docs/guide/testing.md`` for the measurements behind them.
TOLERANCES = {np.dtype(np.float64): (1e-10, 1e-12), np.dtype(np.float32): (1e-4, 1e-5)}
#: Default norm-wise tolerance by dtype: ‖ours − ref‖ ≤ norm_rtol·N.
NORM_TOLERANCES = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 5e-6}


def _hide_assertion(excinfo) -> bool:
    """pytest's ``__tracebackhide__`` filter: hide the frame when the error is a comparison's AssertionError
    (any other error — a bad argument, a bug — keeps it, for the traceback to point at)."""
    return excinfo.errisinstance(AssertionError)


def _sq_norm(a: np.ndarray) -> float:
    """Σ a² in float64 (a float32 dot product accumulates in float32: redone in float64 if it overflowed)."""
    v = a.reshape(-1)
    s = float(np.dot(v, v))
    if not math.isfinite(s) and a.dtype != np.float64:
        v = v.astype(np.float64)
        s = float(np.dot(v, v))
    return s


#: Elements of one block of :func:`_stats` (256 KiB of float32): a block of ours, of ref and of their difference
#: stay in cache while the block's reductions read them, so each tensor comes from memory once.
_BLOCK = 1 << 16


def _blocks(ours: np.ndarray | None, ref: np.ndarray):
    """(o, r) blocks of ours and ref, C-contiguous and paired element for element (o None when ours is).

    A 2-D ``ours`` that is a transposed view (an nn.Linear weight's gradient: we store Wᵀ, and W_Q's is a slice of
    the fused W_QKV's) goes by blocks of ref's columns: rows j:j+b of our stored array are transposed into a buffer
    — by torch's blocked transpose when torch is loaded (it takes that path for the transpose of a whole contiguous
    matrix, which each block is; 2× NumPy's strided copy, docs/bench_notes.md "Comparisons") — and ref's columns
    j:j+b are copied beside them: both come from memory once, and neither is transposed whole. A transpose moves
    values without rounding: every path gives the same pairs."""
    if ours is not None and ours.ndim == 2 and not ours.flags.c_contiguous and ours.strides[0] == ours.itemsize \
            and ours.dtype == ref.dtype:
        rows, cols = ref.shape
        mine = ours.T                                                   # (cols, rows): what we store, rows contiguous
        b = max(1, min(cols, _BLOCK // max(1, rows)))                   # ref's columns per block
        torch = sys.modules.get("torch")
        for j in range(0, cols, b):
            n = min(b, cols - j)
            o, r = np.empty((rows, n), dtype=ours.dtype), np.empty((rows, n), dtype=ref.dtype)
            block = mine[j:j + n]                                       # (n, rows)
            if torch is not None and n * rows >= 3600:                  # torch's fast path: 3600 elements or more
                if not block.flags.c_contiguous or not block.flags.writeable:   # from_numpy: no read-only array
                    block = block.copy()                                # row by row (W_Q's rows are strided)
                torch.from_numpy(o).copy_(torch.from_numpy(block).t())  # (rows, n) ← (n, rows)ᵀ
            else:
                np.copyto(o, block.T)
            np.copyto(r, ref[:, j:j + n])                               # (rows, n)
            yield o, r
        return
    if ours is not None:
        ours = np.ascontiguousarray(ours).reshape(-1)
    r = np.ascontiguousarray(ref).reshape(-1)
    for i in range(0, r.size, _BLOCK):
        yield (None if ours is None else ours[i:i + _BLOCK]), r[i:i + _BLOCK]


def _stats(ours: np.ndarray | None, ref: np.ndarray) -> tuple[float, float, float, float]:
    """(max |ref|, Σ ref², max |ours − ref|, Σ (ours − ref)²) in one pass over both arrays, by blocks
    (:func:`_blocks`): each block's difference is made in a buffer that stays in cache and read there by its
    reductions, instead of a whole difference array and four passes over memory. The maxima are exact and propagate
    a NaN as ``np.max`` does; the sums of squares add each block's :func:`_sq_norm` in float64. ``ours`` None: the
    last two are 0."""
    ref_hi, ref_lo, d_hi, d_lo, ref_sq, d_sq = [], [], [], [], 0.0, 0.0
    d = None
    for o, r in _blocks(ours, ref):
        ref_hi.append(np.max(r))
        ref_lo.append(np.min(r))
        ref_sq += _sq_norm(r)
        if o is None:
            continue
        if d is None or d.size < o.size:
            d = np.empty(o.size, dtype=np.result_type(o, r))
        db = d[:o.size].reshape(o.shape)
        np.subtract(o, r, out=db)
        d_hi.append(np.max(db))
        d_lo.append(np.min(db))
        d_sq += _sq_norm(db)
    ref_absmax = float(max(np.max(ref_hi), -np.min(ref_lo)))          # NaN propagates
    if ours is None:
        return ref_absmax, ref_sq, 0.0, 0.0
    return ref_absmax, ref_sq, float(max(np.max(d_hi), -np.min(d_lo))), d_sq


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
        max_abs: max |ours − ref| (inf if either side has a NaN or inf where the other differs).
        norm_rel: ‖ours − ref‖ / N, N = max(‖ref‖, √m·rms of the module's reference): the quantity the
            norm-wise criterion bounds (0 if both are 0, inf if the module's reference is 0 and ours is not).
            A tensor that is zero in exact arithmetic (the key bias's gradient) is measured against its
            module (the key weight's gradient), so its round-off reads as round-off.
        ours, ref: the two arrays, in the framework's layout and in the dtype both sides ran in.
        scale: S of the element-wise criterion, the largest |ref| in this tensor's module.
        norm_scale: N of the norm-wise criterion.
        err_norm, ref_norm: ‖ours − ref‖ and ‖ref‖.
        transposed: our array is the transpose of the framework's (every ``nn.Linear`` weight).
        source: None, or where S and N come from when the tensor is zero in exact arithmetic (its module's largest
            |reference| ≤ atol times its layer's gradient scale): ``"layer 0's gradients"`` (see
            ``_set_source_scales``).

    ``where`` (a property, computed on first use) is the index of the max abs error in the framework's tensor (()
    for scalars). ``max_rel`` (computed on first use) is the max |ours − ref| / |ref| over the elements the relative
    term of the criterion governs — |ref| ≥ (atol/rtol)·S, the report's ``rel_floor``; below it atol·S is the larger
    part of the tolerance — and None when no element qualifies (an exactly-zero reference, or one of pure round-off
    like the key-bias gradient): such a tensor is read by its absolute error, ``max_abs``.
    """

    name: str
    kind: str
    ours_name: str | None
    max_abs: float
    _where: tuple | None
    ours: np.ndarray = field(repr=False)
    ref: np.ndarray = field(repr=False)
    err_norm: float = 0.0
    ref_norm: float = 0.0
    ref_absmax: float = 0.0
    transposed: bool = False
    scale: float = 0.0
    norm_scale: float = 0.0
    norm_rel: float = 0.0
    rel_floor: float = 0.0
    _max_rel: object = field(default=False, repr=False, compare=False)
    source: str | None = None

    @property
    def where(self) -> tuple:
        """Index of the max abs error in the framework's tensor (computed on first use; the first NaN if any)."""
        if self._where is None:
            ad = np.abs(np.subtract(self.ours, self.ref))
            self._where = tuple(int(i) for i in np.unravel_index(int(np.argmax(ad)), ad.shape))
        return self._where

    @property
    def ref_is_zero(self) -> bool:
        """The framework's tensor is exactly 0 everywhere (compare it by its absolute error)."""
        return self.ref_absmax == 0.0

    @property
    def max_rel(self) -> float | None:
        """max |ours − ref| / |ref| over the elements where ref ≠ 0; None if the reference is exactly 0."""
        if self._max_rel is False:
            self._max_rel = None
            if not self.ref_is_zero and self.ref.size and self.kind != "config":
                a = np.abs(self.ref)
                nz = (a != 0) & (a >= self.rel_floor)
                if nz.any():
                    with np.errstate(divide="ignore", invalid="ignore"):
                        rel = np.abs(self.ours[nz] - self.ref[nz]) / a[nz]
                    m = float(np.max(rel))
                    self._max_rel = math.inf if math.isnan(m) else m
        return self._max_rel

    def ours_at(self, index: tuple) -> str | None:
        """Our name and index of the framework's element ``index`` (``"layers.0.attn.W_K[2, 1]"``)."""
        if not self.ours_name:
            return None
        idx = tuple(index)
        if "|" in self.ours_name:                           # torch's stacked [W_Qᵀ; W_Kᵀ; W_Vᵀ] / [b_Q; b_K; b_V]
            d = self.ref.shape[0] // 3
            base, _, leaves = self.ours_name.rpartition(".")
            leaf = leaves.split("|")[idx[0] // d]
            idx = (idx[0] % d,) + idx[1:]
            name = f"{base}.{leaf}" if base else leaf
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
                "grad": "gradient of", "config": "configuration value"}[self.kind]
        return f"{what} {self.name!r}" if self.kind in ("weight", "grad", "config") else what

    def _excess_terms(self, rtol: float, atol: float) -> tuple[np.ndarray, np.ndarray]:
        diff = np.abs(np.subtract(self.ours, self.ref, dtype=np.float64))
        allowed = np.abs(self.ref, dtype=np.float64)
        allowed *= rtol
        allowed += atol * self.scale
        return diff, allowed

    def worst_element(self, rtol: float, atol: float) -> tuple[tuple, float]:
        """(index, excess) of the element furthest outside the criterion: the largest
        |ours − ref| − (atol·S + rtol·|ref|) — positive when the tensor fails, ≤ 0 when it passes
        (NaN on either side counts as +inf). This is the one element an ``AssertionError`` names."""
        if self.ours.size == 0:
            return (), 0.0
        diff, allowed = self._excess_terms(rtol, atol)
        with np.errstate(invalid="ignore"):
            excess = diff - allowed
        excess = np.where(np.isnan(excess), np.inf, excess)           # NaN (or inf − inf) never passes
        k = int(np.argmax(excess))
        return tuple(int(i) for i in np.unravel_index(k, excess.shape)), float(excess.flat[k])

    def elementwise_passes(self, rtol: float, atol: float) -> bool:
        """Every element within atol·S + rtol·|ref| (without computing the ratios when max |ours − ref| ≤ atol·S)."""
        if self.ours.size == 0 or self.max_abs <= atol * self.scale:
            return True
        return self.violation(rtol, atol)[0] <= 1.0

    def violation(self, rtol: float, atol: float) -> tuple[float, tuple]:
        """(worst ratio |ours − ref| / (atol·S + rtol·|ref|), its index); the tensor passes when ratio ≤ 1."""
        if self.ours.size == 0:
            return 0.0, ()
        diff, allowed = self._excess_terms(rtol, atol)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = diff / allowed
            ratio = np.where(diff == 0, 0.0, ratio)                  # equal (even both 0) always passes
        ratio = np.where(np.isnan(ratio), np.inf, ratio)            # NaN on either side never passes
        k = int(np.argmax(ratio))
        return float(ratio.flat[k]), tuple(int(i) for i in np.unravel_index(k, ratio.shape))

    def norm_ratio(self, norm_rtol: float) -> float:
        """‖ours − ref‖ / (norm_rtol·N); the tensor passes the norm-wise criterion when it is ≤ 1."""
        if self.err_norm == 0:
            return 0.0
        den = norm_rtol * self.norm_scale
        return self.err_norm / den if den > 0 else math.inf


def _compare(name: str, kind: str, ours, ref, ours_name: str | None = None, transposed: bool = False
             ) -> TensorComparison:
    """One tensor's comparison, in the dtype both arrays share (float64 if they differ); S and N are set
    afterwards, over the tensor's module, by :func:`_set_scales`."""
    __tracebackhide__ = _hide_assertion
    ours, ref = np.asarray(ours), np.asarray(ref)
    if ours.shape != ref.shape:
        raise AssertionError(f"{kind} {name!r}: shapes differ, ours {ours.shape} vs the framework's {ref.shape}")
    if ours.dtype != ref.dtype or ours.dtype.kind != "f":
        ours, ref = ours.astype(np.float64), ref.astype(np.float64)
    if ours.size == 0:
        return TensorComparison(name, kind, ours_name, 0.0, (), ours, ref, transposed=transposed)
    # the same memory, element for element (ours are views of the module's own weights): equal by construction
    same = (ours.ctypes.data == ref.ctypes.data and ours.strides == ref.strides) or ours is ref
    ref_absmax, ref_sq, max_abs, err_sq = _stats(None if same else ours, ref)
    ref_norm = math.sqrt(ref_sq)
    if same:
        return TensorComparison(name, kind, ours_name, 0.0, (0,) * ours.ndim, ours, ref, 0.0, ref_norm, ref_absmax,
                                transposed=transposed)
    if not math.isfinite(max_abs):
        max_abs = err_norm = math.inf
    else:
        err_norm = math.sqrt(err_sq)
    return TensorComparison(name, kind, ours_name, max_abs, None, ours, ref, err_norm, ref_norm, ref_absmax,
                            transposed=transposed)


# ----------------------------------------------------------------------------- the report
@dataclass
class ComparisonReport:
    """Every comparison of one :func:`compare_with_torch` call.

    Attributes:
        module: what was compared (the module's class, e.g. ``"BertModel"``).
        framework: ``"torch"`` or ``"transformers"``.
        dtype: the dtype both sides ran in.
        rtol, atol: the element-wise tolerances :meth:`check` uses by default (the dtype's unless overridden).
        entries: the :class:`TensorComparison` list (configuration, weights, output, input grad, grads).
        notes: what was not compared and why; how attention ran on the torch side; any conversion made.
        norm_rtol: the norm-wise tolerance :meth:`check` uses by default (:data:`NORM_TOLERANCES` of the dtype).
        conversions: every dtype conversion made on the way (the module's parameters, the inputs, ``grad_output``,
            ``params``, a float mask), one sentence each; empty when nothing was converted.
        forward_only: True when the call ran with autograd off (inside ``torch.no_grad()`` or
            ``torch.inference_mode()``): only the weights and the output were compared (a note says so).
        grad_tolerances: ``(rtol, atol, norm_rtol)`` the gradients (input and parameters) are held to by default
            when they differ from the forward's (half precision: ``HALF_GRAD_TOLERANCES``, or
            ``HALF_GRAD_TOLERANCES_RELU`` in a ReLU module); None otherwise. A
            tolerance passed to :meth:`check` or :meth:`failures` applies to every tensor.

    ``dtype`` is the dtype the module ran in: a NumPy dtype, or the string ``"bfloat16"`` (NumPy has none); in half
    precision the reference ran in float64 on the module's own rounded values.
    """

    module: str
    framework: str
    dtype: np.dtype
    rtol: float
    atol: float
    entries: list[TensorComparison]
    notes: list[str] = field(default_factory=list)
    norm_rtol: float | None = None
    conversions: list[str] = field(default_factory=list)
    forward_only: bool = False
    grad_tolerances: tuple | None = None
    _sublayer_table: object = field(default=None, repr=False, compare=False)   # list, or a function making it

    @property
    def sublayers(self) -> list:
        """The table of :mod:`transformer_np.testing.sublayers`: one ``SublayerComparison`` per sublayer's output and
        input, in the order of computation (empty without a layer map), computed on first use (a passing comparison
        does not pay for it). A failing :meth:`check` names the first row outside its tolerance in its message's
        first line ("layer 1, FFN")."""
        if callable(self._sublayer_table):
            self._sublayer_table = self._sublayer_table()
        return self._sublayer_table or []

    def __post_init__(self) -> None:
        if self.norm_rtol is None:
            key = self.dtype if isinstance(self.dtype, str) else np.dtype(self.dtype)        # "bfloat16": a name
            self.norm_rtol = NORM_TOLERANCES.get(key, 0.0)
        for e in self.entries:                       # max_rel over what the relative term governs
            e.rel_floor = (self.atol / self.rtol) * e.scale if self.rtol > 0 else math.inf
            e._max_rel = False

    def __getitem__(self, name: str) -> TensorComparison:
        """The entry of one tensor: ``report["output"]``, ``report["input"]``, ``report["layers.0.linear1.weight"]``
        (the gradient; ``report["weight:layers.0.linear1.weight"]`` is the weight, ``report["config:layer_norm_eps"]``
        a configuration value compared with ``params=(config, params)``)."""
        for e in self.entries:
            key = f"{e.kind}:{e.name}" if e.kind in ("weight", "config") else e.name
            if key == name:
                return e
        raise KeyError(f"no compared tensor named {name!r}; names: {[e.name for e in self.entries][:12]} …")

    @property
    def grads(self) -> list[TensorComparison]:
        return [e for e in self.entries if e.kind == "grad"]

    def max_norm_rel(self, kind: str | None = None) -> float:
        """Largest norm-relative error ``norm_rel`` (over entries of ``kind``, or all): the quantity the
        norm-wise criterion bounds, so ``report.max_norm_rel("grad") <= report.norm_rtol`` when the report passes."""
        errs = [e.norm_rel for e in self.entries if kind is None or e.kind == kind]
        return max(errs) if errs else 0.0

    def max_abs(self, kind: str | None = None) -> float:
        """Largest max abs error (over entries of ``kind``, or all)."""
        errs = [e.max_abs for e in self.entries if kind is None or e.kind == kind]
        return max(errs) if errs else 0.0

    def failures(self, rtol: float | None = None, atol: float | None = None, norm_rtol: float | None = None
                 ) -> list[tuple[TensorComparison, float, tuple]]:
        """``(entry, ratio, index)`` of every entry that violates either criterion: |ours − ref| ≤ atol·S + rtol·|ref|
        for every element, ‖ours − ref‖ ≤ norm_rtol·N. ``ratio`` is the larger of the entry's worst element-wise
        ratio |ours − ref| / (atol·S + rtol·|ref|) and its norm-wise ratio ‖ours − ref‖ / (norm_rtol·N) (> 1);
        ``index`` is its element furthest outside the element-wise criterion
        (:meth:`TensorComparison.worst_element`), the one the ``AssertionError`` names."""
        out = []
        for e in self.entries:
            if e.kind == "config":                             # equal or not: max_abs is 0 or inf
                if e.max_abs:
                    out.append((e, math.inf, ()))
                continue
            r, a, nt = self._tols_of(e, rtol, atol, norm_rtol)
            nr = e.norm_ratio(nt)
            if e.elementwise_passes(r, a) and nr <= 1.0:
                continue
            ratio = max(e.violation(r, a)[0], nr)
            out.append((e, ratio, e.worst_element(r, a)[0]))
        return out

    def _tols_of(self, e: TensorComparison, rtol, atol, norm_rtol) -> tuple[float, float, float]:
        """The tolerances entry ``e`` is held to: the ones given, else its kind's defaults (gradients:
        ``grad_tolerances`` when set)."""
        if self.grad_tolerances is not None and e.kind in ("input grad", "grad"):
            g = self.grad_tolerances
            rtol, atol, norm_rtol = (g[i] if v is None else v for i, v in enumerate((rtol, atol, norm_rtol)))
        return self._tols(rtol, atol, norm_rtol)

    def _tols(self, rtol, atol, norm_rtol) -> tuple[float, float, float]:
        rtol, atol = _tolerances(self.dtype, rtol, atol, self.rtol, self.atol)
        norm_rtol = _tolerance("norm_rtol", self.norm_rtol if norm_rtol is None else norm_rtol)
        return rtol, atol, norm_rtol

    @property
    def ok(self) -> bool:
        return not self.failures()

    def check(self, rtol: float | None = None, atol: float | None = None,
              norm_rtol: float | None = None) -> ComparisonReport:
        """Raise ``AssertionError`` naming the first disagreeing tensor: at its element furthest outside the
        element-wise criterion, the index, both values, the error and the tolerance there; and, when the norm-wise
        criterion fails, the norm of the error against its tolerance."""
        __tracebackhide__ = True                                  # pytest: the message, not this frame's source
        self._tols(rtol, atol, norm_rtol)                          # a bad tolerance is refused by name
        bad = self.failures(rtol, atol, norm_rtol)
        if not bad:
            return self
        e, ratio, idx = bad[0]
        rtol, atol, norm_rtol = self._tols_of(e, rtol, atol, norm_rtol)
        theirs = "torch" if self.framework == "torch" else "transformers"
        mapped = f" (ours: {e.ours_at(idx)})" if e.ours_name else ""
        lines = [f"transformer_np and {theirs} disagree on the {e.label}{mapped} [{self.module}, {self.dtype}]:"]
        first = next((s for s in self.sublayers if not s.ok), None)
        if first is not None and e.kind not in ("weight", "config"):   # a behaviour, not different weights: where
            lines.insert(0, first.line())
        if e.kind == "config":
            lines.append(f"  ours = {e.ours.item()!r}, {theirs} = {e.ref.item()!r}")
        else:
            o, r = e.ours[idx], e.ref[idx]
            allowed = atol * e.scale + rtol * abs(float(r))
            elem_ok = abs(float(o) - float(r)) <= allowed
            where = "the element furthest from its tolerance, within it" if elem_ok else \
                "the element furthest outside the tolerance"
            rel = "<=" if elem_ok else ">"
            src = "" if e.source is None else (f", the scale of {e.source}: this tensor is zero in exact arithmetic, "
                                               "its own values are round-off")
            lines.append(f"  at index {idx} ({where}): ours = {o:.10g}, {theirs} = {r:.10g}, |ours - {theirs}| = "
                         f"{abs(float(o) - float(r)):.3g} {rel} atol*S + rtol*|{theirs}| = {allowed:.3g} "
                         f"(rtol = {rtol:g}, atol = {atol:g}, S = {e.scale:.3g}{src})")
            nr = e.norm_ratio(norm_rtol)
            if nr > 1.0:
                lines.append(f"  norm-wise: ||ours - {theirs}|| = {e.err_norm:.3g} > norm_rtol*N = "
                             f"{norm_rtol * e.norm_scale:.3g} (norm_rtol = {norm_rtol:g}, N = {e.norm_scale:.3g}): "
                             f"norm-relative error {e.norm_rel:.3g}, {nr:.3g} times the tolerance"
                             + (" — a systematic error, no single element out of tolerance" if elem_ok else ""))
            rel_text = (("n/a (the reference is exactly 0)" if e.ref_is_zero else
                         "n/a (every |reference| is below (atol/rtol)*S: read the abs error)")
                        if e.max_rel is None else f"{e.max_rel:.3g}")
            lines.append(f"  over the whole tensor: max abs error {e.max_abs:.3g}, max rel error "
                         f"{rel_text}, norm-relative error {e.norm_rel:.3g}")
        if len(bad) > 1:
            others = ", ".join(b[0].label for b in bad[1:6]) + (", …" if len(bad) > 6 else "")
            lines.append(f"  {len(bad)} of {len(self.entries)} tensors disagree; the others: {others}")
        raise AssertionError("\n".join(lines))

    def __str__(self) -> str:
        failing = {id(f[0]) for f in self.failures()}
        head = (f"{self.module} vs transformer_np, {self.dtype}, rtol = {self.rtol:g}, atol = {self.atol:g}, "
                f"norm_rtol = {self.norm_rtol:g}: {'all agree' if not failing else f'{len(failing)} disagree'}"
                + (" (forward-only)" if self.forward_only else "")
                + ("" if self.grad_tolerances is None else "; gradients: rtol = {:g}, atol = {:g}, norm_rtol = "
                   "{:g}".format(*self.grad_tolerances)))
        w = max([len(e.label) for e in self.entries] + [6])
        rows = [head, f"  {'tensor':{w}s} {'max abs':>9s} {'max rel':>9s} {'norm rel':>9s} {'S':>9s}  where"]
        for e in self.entries:
            flag = "  FAIL" if id(e) in failing else ""
            if e.kind == "config":
                rows.append(f"  {e.label:{w}s} ours = {e.ours.item()!r}, theirs = {e.ref.item()!r}{flag}")
                continue
            rel = f"{'ref = 0' if e.ref_is_zero else '-':>9s}" if e.max_rel is None else f"{e.max_rel:9.2e}"
            rows.append(f"  {e.label:{w}s} {e.max_abs:9.2e} {rel} {e.norm_rel:9.2e} {e.scale:9.2e}  "
                        f"{e.where}{flag}")
        if any(e.max_rel is None and not e.ref_is_zero for e in self.entries if e.kind != "config"):
            rows.append("  max rel '-': every |reference| is below (atol/rtol)*S (round-off, like the key-bias "
                        "gradient): read the max abs error")
        rows += [f"  note: {n}" for n in self.notes]
        rows += [f"  converted: {c}" for c in self.conversions]
        return "\n".join(rows)


def _tolerance(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise InputValueError(f"{name} must be a finite number >= 0, got {describe(v)}")
    return float(v)


def _tolerances(dtype, rtol, atol, rtol_default, atol_default) -> tuple[float, float]:
    rtol = _tolerance("rtol", rtol_default if rtol is None else rtol)
    atol = _tolerance("atol", atol_default if atol is None else atol)
    return rtol, atol


def _set_scales(entries: list[TensorComparison]) -> None:
    """S and N of every entry, over its group (a module's weight and bias): S = the largest |ref| in the group,
    N = max(‖ref‖, √m·rms_G) with rms_G the root mean square of the group's reference; then ``norm_rel``."""
    top: dict = {}
    for e in entries:
        if e.kind == "config":
            continue
        m, sq, size = top.get(e.group, (0.0, 0.0, 0))
        top[e.group] = (max(m, e.ref_absmax), sq + e.ref_norm ** 2, size + e.ref.size)
    for e in entries:
        if e.kind == "config":
            continue
        m, sq, size = top[e.group]
        e.scale = m
        rms = math.sqrt(sq / size) if size else 0.0
        e.norm_scale = max(e.ref_norm, math.sqrt(e.ref.size) * rms)
        e.norm_rel = 0.0 if e.err_norm == 0 else (e.err_norm / e.norm_scale if e.norm_scale > 0 else math.inf)


_LAYER = re.compile(r"^(.*?\.\d+)\.")              # the first indexed container: layer.0, blocks.3, ...


def _set_source_scales(entries: list[TensorComparison], atol: float) -> list[str]:
    """A gradient that is zero in exact arithmetic gets S and N from the gradients it is computed with, not from its
    own round-off; returns the names of the modules treated so.

    Such a tensor — the query and key gradients when every query has a single key to attend to (n = 1, or one real
    token per sequence: the softmax over one key is constant, its derivative 0) — holds round-off on both sides, of
    the order of ε times the quantities it is computed from (the inputs and weights the other gradients of the same
    backward are made of). Scaled by itself (S = its own largest |ref|), that round-off reads as a norm-relative error
    of 1. So, per layer (the name up to its first index: ``encoder.layer.ℓ``, ``layers.ℓ``, ``blocks.ℓ``; the names
    without an index — the embeddings, or every parameter of a single layer like ``BertLayer`` — are one layer): a
    gradient module whose largest |reference| is at most ``atol`` times the layer's gradient scale S_layer (the
    largest |reference| of the layer's gradients) — indistinguishable from 0 at the layer's own tolerance — is
    measured with S = S_layer and N = max(N, √m·rms_layer), rms_layer the root mean square of the layer's gradients.
    A value beyond atol·S_layer there still fails: a wrong nonzero gradient is still found."""
    layers: dict = {}
    for e in entries:
        if e.kind == "grad" and e.ref.size:
            m = _LAYER.match(e.name)
            top, sq, size = layers.get(m.group(1) if m else "", (0.0, 0.0, 0))
            layers[m.group(1) if m else ""] = (max(top, e.ref_absmax), sq + e.ref_norm ** 2, size + e.ref.size)
    treated = []
    for e in entries:
        if e.kind != "grad" or not e.ref.size:
            continue
        m = _LAYER.match(e.name)
        key = m.group(1) if m else ""
        top, sq, size = layers[key]
        if top == 0 or e.scale > atol * top:
            continue
        e.scale = top
        e.norm_scale = max(e.norm_scale, math.sqrt(e.ref.size * sq / size))
        e.norm_rel = 0.0 if e.err_norm == 0 else e.err_norm / e.norm_scale
        e.source = f"{key}'s gradients" if key else "the module's gradients"
        treated.append(e.name)
    return treated
