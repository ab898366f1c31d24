r"""Compare a PyTorch / Hugging Face encoder with this library in your own tests.

In the spirit of :mod:`numpy.testing` and :mod:`torch.testing`::

    from transformer_np.testing import assert_matches_torch

    def test_my_layer():
        layer = torch.nn.TransformerEncoderLayer(16, 4, 64, dropout=0.0, batch_first=True, dtype=torch.float64)
        assert_matches_torch(layer, np.random.default_rng(0).normal(size=(2, 5, 16)))

:func:`compare_with_torch` converts the module's weights (:func:`~transformer_np.io.interop.from_torch`
or :func:`~transformer_np.io.interop.from_hf`), runs both forwards and both backwards with the same
upstream gradient R (L = ⟨R, output⟩), and returns a :class:`ComparisonReport` with one entry per
tensor, in this order:

1. every **weight** (the module's parameters against ours mapped back to the module's names — they
   differ only when you pass your own ``params``, or when the module changed its weights),
2. the **output**,
3. the **input gradient** ∂L/∂x (float inputs: torch layers and HF layers),
4. every **parameter gradient**, under the framework's own names (``layers.0.linear1.weight``,
   ``encoder.layer.0.attention.self.key.bias``, ...), in the module's order.

Each entry has the max abs error, the max relative error (over entries where the reference is
nonzero; inf if the reference is 0 where ours is not), the norm-relative error ‖ours − ref‖/‖ref‖,
and where the max abs error is (an index into the framework's tensor).
:func:`assert_matches_torch` raises an ``AssertionError`` naming the first entry that disagrees.

The criterion (``numpy.testing.assert_allclose``'s, with a scaled atol): every element must satisfy

    |ours − ref| ≤ atol · S + rtol · |ref|,

where S is the largest |ref| in the tensor's *module*: a parameter's tensors (weight and bias of one
Linear, LayerNorm or Embedding — siblings in the name, ``…key.weight`` / ``…key.bias``) share one S;
the output and the input gradient have their own. Scaling atol makes the check independent of the
magnitudes, which really vary (BERT-base's embedding gradients reach 10², an HF-initialised
ALBERT's query gradients are 10⁻¹⁹), and it lets through exactly what must pass: the gradient of the
key bias b_K is zero in exact arithmetic (softmax ignores the constant q·b_K added to a row of
scores), so both frameworks return round-off, of the order of ε times the key *weight*'s gradient,
its sibling.

Defaults by dtype (:data:`TOLERANCES`; pass ``rtol``/``atol`` to override), chosen from
measurements reported in ``docs/guide/testing.md`` (and re-measured by ``scripts/frameworks_findings.py``):

* float64: rtol = 1e-10, atol = 1e-12.
* float32: rtol = 1e-3, atol = 1e-4. Both sides round in float32 and accumulate in different
  orders; the attention kernel torch picks (``scaled_dot_product_attention``'s default CPU backend,
  or the math backend under ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)``) is one of those
  orders (see ``docs/guide/frameworks.md``).

What is compared, and what is not:

* ``torch.nn.TransformerEncoderLayer`` / ``TransformerEncoder`` (any ``norm_first``, ``batch_first``,
  final norm or not): ``inputs`` is the float input in the module's layout ((B, n, d) when
  ``batch_first``, else (n, B, d)); ``attention_mask`` (B, n) is 1 for real tokens and 0 for padding
  (passed to torch as ``src_key_padding_mask = (attention_mask == 0)``).
* A Hugging Face base model (``BertModel``, ``RobertaModel``, ``DistilBertModel``, ``AlbertModel``,
  ``ElectraModel``, ...): ``inputs`` is ``input_ids`` (B, n); ``token_type_ids`` optional; the output
  is ``last_hidden_state``. The pooler is not on that path: its weights are compared, its gradient
  (None in torch) is listed in ``report.notes``.
* A Hugging Face layer (``BertLayer``, ``AlbertLayer``, DistilBERT's ``TransformerBlock``, ...):
  ``inputs`` is the layer's input (B, n, d); the 4-d mask is built by transformers itself.

The module is never modified: a copy is cast to ``dtype`` and put in eval mode (no dropout).
Padded positions: with padding, the default upstream gradient is 0 there. HF's ``nn.Embedding``
rows at ``padding_idx`` get a gradient of exactly 0 by definition, while ours is the true
derivative, so with a nonzero gradient at padded positions the two differ in that row (that is a
finding, documented in ``docs/guide/frameworks.md``, not a bug on either side).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np

from ._validate import describe
from .errors import InputTypeError, InputValueError

__all__ = ["compare_with_torch", "assert_matches_torch", "ComparisonReport", "TensorComparison", "TOLERANCES",
           "default_tolerances"]

#: Default (rtol, atol) by dtype; see the module docstring for the measurements behind them.
TOLERANCES = {np.dtype(np.float64): (1e-10, 1e-12), np.dtype(np.float32): (1e-3, 1e-4)}


def default_tolerances(dtype) -> tuple[float, float]:
    """``(rtol, atol)`` used by default for ``dtype`` (float32 or float64)."""
    dt = _np_dtype(dtype)
    return TOLERANCES[dt]


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
        """``(entry, ratio, index)`` of every entry that violates |ours − ref| ≤ atol·S + rtol·|ref|."""
        rtol, atol = _tolerances(self.dtype, rtol, atol, self.rtol, self.atol)
        out = []
        for e in self.entries:
            ratio, idx = e.violation(rtol, atol)
            if not ratio <= 1.0:
                out.append((e, ratio, idx))
        return out

    @property
    def ok(self) -> bool:
        return not self.failures()

    def check(self, rtol: float | None = None, atol: float | None = None) -> ComparisonReport:
        """Raise ``AssertionError`` naming the first disagreeing tensor, the error, the tolerance and the index."""
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
                 f"  at index {idx}: ours = {o:.10g}, {theirs} = {r:.10g}, |ours - {theirs}| = {abs(o - r):.3g} "
                 f"> atol*S + rtol*|{theirs}| = {allowed:.3g} (rtol = {rtol:g}, atol = {atol:g}, S = {e.scale:.3g})",
                 f"  max abs error {e.max_abs:.3g} at {e.where}, max rel error {e.max_rel:.3g}, "
                 f"norm-relative error {e.norm_rel:.3g}"]
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


# ----------------------------------------------------------------------------- inputs
def _np_dtype(dtype) -> np.dtype:
    if dtype is not None and "torch." in str(dtype):
        dtype = str(dtype).replace("torch.", "")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InputTypeError(f"dtype must be float32 or float64 (NumPy or torch), got {dtype!r}") from None
    if dt not in TOLERANCES:
        raise InputTypeError(f"dtype must be float32 or float64 (NumPy or torch), got {dt}")
    return dt


def _to_numpy(x, name: str) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise InputTypeError(f"{name} must be a numpy array or torch tensor, got {describe(x)}")
    return x


def _float_input(x, name: str, dt: np.dtype, ndim: int) -> np.ndarray:
    x = _to_numpy(x, name)
    if not np.issubdtype(x.dtype, np.floating):
        raise InputTypeError(f"{name} must be a float array (the layer's input), got dtype {x.dtype}")
    if x.ndim != ndim:
        raise InputValueError(f"{name} must have {ndim} dimensions, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise InputValueError(f"{name} must be finite")
    return x.astype(dt)


def _mask(attention_mask, B: int, n: int) -> np.ndarray | None:
    if attention_mask is None:
        return None
    m = _to_numpy(attention_mask, "attention_mask")
    if m.shape != (B, n):
        raise InputValueError(f"attention_mask must have shape (B, n) = {(B, n)}, got shape {m.shape}")
    if not np.all((m == 0) | (m == 1)):
        raise InputValueError("attention_mask must hold 1 (real token) and 0 (padding) only")
    m = m.astype(np.int64)
    empty = np.flatnonzero(m.sum(axis=1) == 0)
    if empty.size:
        raise InputValueError(f"attention_mask row {int(empty[0])} has no real token: attention over no key is "
                              "undefined (torch returns NaN there)")
    return m


def _grad_output(grad_output, shape: tuple, dt: np.dtype, pad: np.ndarray | None, seed: int) -> np.ndarray:
    """The upstream gradient R: given, or standard normal (seeded) with zeros at padded positions.
    ``pad`` is a boolean array broadcastable to ``shape`` (True = padded position)."""
    if grad_output is None:
        R = np.random.default_rng(seed).standard_normal(shape)
        if pad is not None:
            R = np.where(pad, 0.0, R)
        return R.astype(dt)
    R = _to_numpy(grad_output, "grad_output")
    if R.shape != tuple(shape):
        raise InputValueError(f"grad_output must have the output's shape {tuple(shape)}, got shape {R.shape}")
    if not np.issubdtype(R.dtype, np.floating) or not np.all(np.isfinite(R)):
        raise InputValueError("grad_output must be a finite float array")
    return R.astype(dt)


# ----------------------------------------------------------------------------- the module kinds
def _kind(module) -> str:
    from .io.interop import _require_torch

    torch = _require_torch()
    if isinstance(module, (torch.nn.TransformerEncoderLayer, torch.nn.TransformerEncoder)):
        return "torch"
    if not isinstance(module, torch.nn.Module):
        raise InputTypeError("module must be an nn.TransformerEncoderLayer, nn.TransformerEncoder, or a transformers "
                             f"encoder model or layer, got {type(module).__name__}")
    try:
        import transformers
    except ImportError:  # pragma: no cover - depends on the environment
        raise InputTypeError(f"module {type(module).__name__} is neither an nn.TransformerEncoder(Layer) nor (without "
                             "transformers installed) a Hugging Face model") from None
    if isinstance(module, transformers.PreTrainedModel):
        if module.base_model is not module:
            raise InputValueError(f"module is the task model {type(module).__name__}, whose output is not the "
                                  f"encoder's: compare its base model, module.{module.base_model_prefix}")
        return "hf_model"
    return "hf_layer"


def _torch_names_ours(config, single: bool) -> dict[str, tuple[str, bool]]:
    """torch name → (our name, transposed?); the fused in_proj maps to "…attn.W_Q|W_K|W_V"."""
    from .io.interop import _torch_table

    out = {fw: (ours, t) for fw, ours, t in _torch_table(config, single)}
    for i in range(config.n_layers):
        tp = "" if single else f"layers.{i}."
        out[tp + "self_attn.in_proj_weight"] = (f"layers.{i}.attn.W_Q|W_K|W_V", True)
        out[tp + "self_attn.in_proj_bias"] = (f"layers.{i}.attn.b_Q|b_K|b_V", False)
    return out


def _run_torch_side(mod, x_t, kind: str, am, ids_kwargs, torch):
    """Forward of the module copy; returns the output tensor."""
    if kind == "torch":
        kpm = None if am is None else torch.from_numpy(am == 0)
        return mod(x_t, src_key_padding_mask=kpm)
    if kind == "hf_model":
        return mod(**ids_kwargs).last_hidden_state
    from transformers.masking_utils import create_bidirectional_mask

    from .io.interop import _layer_hf_config

    mask4 = None
    if am is not None:
        mask4 = create_bidirectional_mask(config=_layer_hf_config(mod), inputs_embeds=x_t,
                                          attention_mask=torch.from_numpy(am))
    out = mod(x_t, attention_mask=mask4)
    return out[0] if isinstance(out, tuple) else out


def compare_with_torch(module, inputs, attention_mask=None, grad_output=None, dtype=None, *,
                       token_type_ids=None, params=None, seed: int = 0, rtol: float | None = None,
                       atol: float | None = None) -> ComparisonReport:
    """Run ``module`` and transformer_np on the same weights and inputs; compare the output and every gradient.

    Args:
        module: an ``nn.TransformerEncoderLayer``, an ``nn.TransformerEncoder`` (with or without final
            norm), a transformers base model of a supported family (``BertModel``, ``RobertaModel``,
            ``DistilBertModel``, ``AlbertModel``, ``ElectraModel``, ...) or one of their layers
            (``BertLayer``, ``AlbertLayer``, ...). It is not modified (a copy runs, in eval mode).
        inputs: the float input in the module's layout (torch modules, HF layers), or ``input_ids``
            (B, n) for an HF model; NumPy or torch.
        attention_mask: (B, n), 1 = real token, 0 = padding (for torch modules it becomes
            ``src_key_padding_mask = attention_mask == 0``). Every row needs a real token.
        grad_output: the upstream gradient R of L = ⟨R, output⟩, in the output's shape; default standard
            normal from ``seed``, zero at padded positions.
        dtype: float32 or float64 (NumPy or torch); default the module's (float64 if all its parameters
            are, else float32). Both sides run in it.
        token_type_ids: (B, n) segment ids, for HF models.
        params: our params to use (e.g. from your own code) instead of converting the module's weights;
            their disagreement with the module's weights is then reported first.
        seed: seeds the default ``grad_output``.
        rtol, atol: the tolerances stored in the report (default :data:`TOLERANCES` for ``dtype``).

    Returns:
        a :class:`ComparisonReport`; ``report.check()`` raises like :func:`assert_matches_torch`.
    """
    from .io.hf_model import hf_backward, hf_forward
    from .io.interop import _require_torch, from_hf, from_torch, hf_state_dict_from_params, torch_state_dict_from_params
    from .model.encoder import encoder_backward, encoder_forward

    torch = _require_torch()
    kind = _kind(module)
    if dtype is None:
        dtype = np.float64 if {p.dtype for p in module.parameters()} == {torch.float64} else np.float32
    dt = _np_dtype(dtype)
    rtol, atol = _tolerances(dt, rtol, atol, *TOLERANCES[dt])
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputTypeError(f"seed must be an int >= 0, got {describe(seed)}")
    tdt = {np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32}[dt]
    mod = copy.deepcopy(module).to(device="cpu", dtype=tdt).eval()
    for p in mod.parameters():
        p.requires_grad_(True)
        p.grad = None

    config, converted = (from_torch(mod) if kind == "torch" else from_hf(mod))
    if params is None:
        params = converted
    elif not isinstance(params, dict):
        raise InputTypeError(f"params must be a dict of name -> numpy array (ours), got {describe(params)}")
    else:
        params = {k: np.asarray(v).astype(dt) for k, v in params.items()}
    notes = []

    # ---- inputs, both layouts
    batch_first = kind != "torch" or _batch_first(mod)
    ids_kwargs = {}
    if kind == "hf_model":
        ids = _to_numpy(inputs, "inputs")
        if not np.issubdtype(ids.dtype, np.integer) or ids.ndim != 2:
            raise InputTypeError(f"inputs must be input_ids: an integer array (B, n) for {type(module).__name__}, "
                                 f"got {describe(ids)}")
        B, n = ids.shape
        am = _mask(attention_mask, B, n)
        ids_kwargs = {"input_ids": torch.from_numpy(ids.astype(np.int64))}
        if am is not None:
            ids_kwargs["attention_mask"] = torch.from_numpy(am)
        tt = None if token_type_ids is None else _to_numpy(token_type_ids, "token_type_ids").astype(np.int64)
        if tt is not None:
            ids_kwargs["token_type_ids"] = torch.from_numpy(tt)
        x_t, x_ours = None, None
        out_shape = (B, n, config.d_model)
        notes.append(f"attention: transformers' {getattr(mod.config, '_attn_implementation', '?')!r} implementation")
    else:
        if token_type_ids is not None:
            raise InputValueError("token_type_ids only applies to Hugging Face models (input_ids)")
        x = _float_input(inputs, "inputs", dt, 3)
        x_ours = x if batch_first else np.ascontiguousarray(x.transpose(1, 0, 2))         # (B, n, d)
        B, n = x_ours.shape[:2]
        am = _mask(attention_mask, B, n)
        x_t = torch.from_numpy(x.copy()).requires_grad_(True)
        out_shape = x.shape
        if kind == "torch":
            notes.append("attention: nn.MultiheadAttention → scaled_dot_product_attention "
                         "(torch's default CPU backend unless an sdpa_kernel context selects one)")
    pad = None if am is None else (am == 0)[:, :, None] if batch_first else (am == 0).T[:, :, None]
    R = _grad_output(grad_output, out_shape, dt, pad, seed)
    R_ours = R if batch_first else np.ascontiguousarray(R.transpose(1, 0, 2))

    # ---- the framework's side
    out_t = _run_torch_side(mod, x_t, kind, am, ids_kwargs, torch)
    out_t.backward(torch.from_numpy(R.copy()))

    # ---- ours
    if kind == "torch":
        H, cache = encoder_forward(params, config, inputs_embeds=x_ours, attention_mask=am)
        grads = encoder_backward(R_ours, cache)
    elif kind == "hf_model":
        H, cache = hf_forward(params, config, input_ids=ids, attention_mask=am, token_type_ids=tt)
        grads = hf_backward(R_ours, cache)
    else:
        H, cache = hf_forward(params, config, inputs_embeds=x_ours, attention_mask=am)
        grads = hf_backward(R_ours, cache)
    dx = grads.pop("inputs_embeds", None)

    # ---- names: the framework's, with ours alongside
    if kind == "torch":
        single = x_t is not None and isinstance(module, torch.nn.TransformerEncoderLayer)
        ours_w = torch_state_dict_from_params(params, config, single_layer=single)
        ours_g = torch_state_dict_from_params(grads, config, single_layer=single)
        names = _torch_names_ours(config, single)
    else:
        from .io.families import hf_name_table, pooler_rows
        from .io.interop import _as_family_config

        ours_w = hf_state_dict_from_params(params, config)
        ours_g = hf_state_dict_from_params(grads, config)
        fc = _as_family_config(config, "compare_with_torch")
        names = {fw: (o, t) for fw, o, t in list(hf_name_table(fc)) + pooler_rows(fc)}

    entries = []
    named = list(mod.named_parameters())
    for fw, p in named:
        if fw not in ours_w:
            notes.append(f"{fw}: a parameter of the module with no counterpart in ours (not compared)")
            continue
        entries.append(_compare(fw, "weight", ours_w[fw], p.detach().numpy(), *names.get(fw, (None, False))))
    H_fw = H if batch_first else H.transpose(1, 0, 2)
    entries.append(_compare("output", "output", H_fw, out_t.detach().numpy()))
    if x_t is not None:
        dx_fw = dx if batch_first else dx.transpose(1, 0, 2)
        entries.append(_compare("input", "input grad", dx_fw, x_t.grad.numpy()))
    for fw, p in named:
        if p.grad is None:
            if fw in ours_g:
                zero = np.zeros(tuple(p.shape))
                entries.append(_compare(fw, "grad", ours_g[fw], zero, *names.get(fw, (None, False))))
            else:
                notes.append(f"{fw}: no gradient on either side (not on the path to the output)")
            continue
        if fw not in ours_g:
            continue
        entries.append(_compare(fw, "grad", ours_g[fw], p.grad.numpy(), *names.get(fw, (None, False))))
    _set_scales(entries)
    framework = "torch" if kind == "torch" else "transformers"
    return ComparisonReport(type(module).__name__, framework, dt, rtol, atol, entries, notes)


def _set_scales(entries: list[TensorComparison]) -> None:
    """S of every entry: the largest |ref| over its group (a module's weight and bias)."""
    top: dict = {}
    for e in entries:
        m = float(np.abs(e.ref).max()) if e.ref.size else 0.0
        top[e.group] = max(top.get(e.group, 0.0), m)
    for e in entries:
        e.scale = top[e.group]


def _batch_first(mod) -> bool:
    layer = mod if not hasattr(mod, "layers") else mod.layers[0]
    return bool(getattr(layer.self_attn, "batch_first", False))


def assert_matches_torch(module, inputs, attention_mask=None, grad_output=None, dtype=None, *,
                         rtol: float | None = None, atol: float | None = None, token_type_ids=None, params=None,
                         seed: int = 0) -> ComparisonReport:
    """:func:`compare_with_torch`, then raise ``AssertionError`` if any tensor disagrees.

    The message names the first tensor that disagrees (weights first, then the output, the input
    gradient, the parameter gradients) under the framework's own name with ours alongside, the
    index, both values, the error, the tolerance, and the tensor's max abs / max rel / norm-relative
    errors. Returns the report when everything agrees.
    """
    report = compare_with_torch(module, inputs, attention_mask, grad_output, dtype, token_type_ids=token_type_ids,
                                params=params, seed=seed, rtol=rtol, atol=atol)
    return report.check()
