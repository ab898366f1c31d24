r"""The first sublayer that differs (a part of :func:`transformer_np.testing.compare_with_torch`: import from there).

A *layer map* says where each sublayer of layer ℓ is in the module: the library's prefix (``layers.ℓ.attn``,
``layers.ℓ.ffn``, ``layers.ℓ.ln1``, ``layers.ℓ.ln2``, ``final_ln``) → the submodule whose first input is the
sublayer's input and the submodule whose output is its output (one name when it is one submodule). Stock modules
have theirs built in (``nn.TransformerEncoder``/``Layer``; BERT-layout Hugging Face layers: BERT, RoBERTa, ELECTRA,
ERNIE, DeBERTa-v2 (its disentangled attention run as such), ...); an own module declares it with ``sublayers=``.

Forward hooks capture each sublayer's input and output during the framework's own forward. Then, layer by layer in
the order of computation, two things are checked against the reference:

* the sublayer itself: the library's op (attention, FFN, LayerNorm) run on the framework's *own* input to it, against
  the framework's output — so an error does not compound from one sublayer to the next;
* its wiring: its input against what the library's layer feeds it, computed from the framework's captured outputs
  (Post-LN: LN₁ gets x + attention(x); Pre-LN: the FFN gets LN₂'s output, ...) — a bug between sublayers (a
  residual sum) is named at the sublayer it reaches.

The first row outside the per-layer tolerances (the norm-wise criterion and the element-wise one, as for whole
tensors) is named in the first line of a failing comparison's message: "layer 1, FFN" (layers counted from 0 as in
the parameter names; sublayers "attention", "FFN", "norm") — unless the first tensor that disagrees is a weight or a
configuration value (``params=``): that is then the cause, and the message starts with it. The forward is checked
here; gradients are compared whole (the report's other entries).

A ``torch.jit.script`` module takes no Python hooks: :class:`~transformer_np.testing.scripted.GraphCapture` records
the same inputs and outputs from an instrumented copy of its graphs, and its table is built by the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputTypeError, InputValueError

KINDS = {"attn": "attention", "ffn": "FFN", "ln1": "norm", "ln2": "norm", "final_ln": "norm"}


@dataclass
class SublayerComparison:
    """One row of ``report.sublayers``: ``layer`` (from 0; None for the final LayerNorm), ``sublayer`` ("attention",
    "FFN" or "norm"), ``prefix`` (ours, ``layers.1.ffn``), ``module`` (the framework's submodule names), ``what``
    ("output": the op on the framework's input; "input": the wiring), the errors and whether they are within the
    per-layer tolerances."""

    layer: int | None
    sublayer: str
    prefix: str
    module: str
    what: str
    max_abs: float
    norm_rel: float
    ratio: float
    ok: bool

    @property
    def where(self) -> str:
        at = "after the last layer" if self.layer is None else f"layer {self.layer}"
        return f"{at}, {self.sublayer}"

    def line(self) -> str:
        part = "its output (our op on the framework's input to it)" if self.what == "output" else \
            "its input (the wiring from the sublayers before it)"
        return (f"first sublayer that differs: {self.where} ({self.module}, ours {self.prefix}): {part} — "
                f"norm-relative error {self.norm_rel:.3g}, max abs error {self.max_abs:.3g}, {self.ratio:.3g} times "
                "the tolerance")


# ----------------------------------------------------------------------------- layer maps
def stock_map(kind: str, mod, config, torch) -> dict[str, tuple[str, str]] | None:
    """The built-in layer map of a stock module, or None (no sublayer table for it)."""
    if kind == "torch":
        single = isinstance(mod, torch.nn.TransformerEncoderLayer)
        out = {}
        for i in range(config.n_layers):
            tp = "" if single else f"layers.{i}."
            out.update({f"layers.{i}.attn": (tp + "self_attn", tp + "self_attn"),
                        f"layers.{i}.ffn": (tp + "linear1", tp + "linear2"),
                        f"layers.{i}.ln1": (tp + "norm1",) * 2, f"layers.{i}.ln2": (tp + "norm2",) * 2})
        if not single and getattr(mod, "norm", None) is not None:
            out["final_ln"] = ("norm", "norm")
        return out
    if kind not in ("hf_model", "hf_layer") or getattr(config, "encoder", config).share_layers:
        return None
    names = dict(mod.named_modules())
    stem = "encoder.layer.{}." if kind == "hf_model" else ""
    n = getattr(config, "encoder", config).n_layers if kind == "hf_model" else 1
    out = {}
    for i in range(n):
        p = stem.format(i)
        row = {f"layers.{i}.attn": (p + "attention.self", p + "attention.output.dense"),
               f"layers.{i}.ln1": (p + "attention.output.LayerNorm",) * 2,
               f"layers.{i}.ffn": (p + "intermediate.dense", p + "output.dense"),
               f"layers.{i}.ln2": (p + "output.LayerNorm",) * 2}
        if any(m not in names for pair in row.values() for m in pair):
            return None                                   # not BERT's layout: no built-in map
        out.update(row)
    return out


def declared_map(sublayers, mod, config) -> dict[str, tuple[str, str]]:
    """An own module's ``sublayers=``: {our prefix: submodule name, or (input submodule, output submodule)}."""
    if not isinstance(sublayers, dict):
        raise InputTypeError(f"sublayers must be a dict (library prefix like 'layers.0.ffn' -> submodule name or "
                             f"(input submodule, output submodule)), got {type(sublayers).__name__}")
    names = {k[len("_orig_mod."):] if k.startswith("_orig_mod.") else k for k, _ in mod.named_modules()}
    out = {}
    for prefix, where in sublayers.items():
        parts = prefix.split(".")
        ok = prefix == "final_ln" or (len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit()
                                      and int(parts[1]) < config.n_layers and parts[2] in KINDS)
        if not ok:
            raise InputValueError(f"sublayers key {prefix!r} must be 'layers.ℓ.attn', 'layers.ℓ.ffn', 'layers.ℓ.ln1', "
                                  f"'layers.ℓ.ln2' (ℓ < {config.n_layers}) or 'final_ln'")
        pair = (where, where) if isinstance(where, str) else tuple(where)
        if len(pair) != 2 or any(not isinstance(m, str) or m not in names for m in pair):
            raise InputValueError(f"sublayers[{prefix!r}] = {where!r}: expected a submodule name of the module or a "
                                  f"pair (input submodule, output submodule); submodules: {sorted(names)[:8]} …")
        out[prefix] = pair
    return out


# ----------------------------------------------------------------------------- capture
class Capture:
    """Forward hooks on the mapped submodules: the first tensor input of each input module, the (first) tensor output
    of each output module, of their first call."""

    def __init__(self, mod, layer_map: dict[str, tuple[str, str]], torch):
        self.inputs, self.outputs, self.handles = {}, {}, []
        mods = dict(mod.named_modules())
        pref = "_orig_mod." if any(k.startswith("_orig_mod.") for k in mods) else ""
        for prefix, (m_in, m_out) in layer_map.items():
            self.handles.append(mods[pref + m_in].register_forward_pre_hook(self._pre(prefix, torch),
                                                                            with_kwargs=True))
            self.handles.append(mods[pref + m_out].register_forward_hook(self._post(prefix, torch)))

    def _pre(self, prefix, torch):
        def hook(_m, args, kwargs):
            first = args[0] if args else kwargs.get("hidden_states", kwargs.get("query"))
            if isinstance(first, torch.Tensor) and prefix not in self.inputs:
                self.inputs[prefix] = first.detach().clone()       # a copy: an in-place op later cannot change it
        return hook

    def _post(self, prefix, torch):
        def hook(_m, _args, out):
            out = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(out, torch.Tensor) and prefix not in self.outputs:
                self.outputs[prefix] = out.detach().clone()
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


# ----------------------------------------------------------------------------- the order of computation
def walk(enc, pre: bool, first_in, step) -> None:
    """Visit the sublayers in the order of computation: ``step(prefix, expected_in)`` gets each mapped sublayer with
    the input the library's wiring computes from the framework's outputs before it (None when not known) and returns
    the framework's output of it (None: the walk stops there); ``first_in(prefix)`` is layer 0's input, read at its
    first sublayer (LN₁ in Pre-LN, the attention in Post-LN)."""
    h = None                                               # the layer's input, from the framework's values
    for i in range(enc.n_layers):
        a_, f_, n1, n2 = (f"layers.{i}.{k}" for k in ("attn", "ffn", "ln1", "ln2"))
        if pre:
            if h is None:
                h = first_in(n1)
            y1 = step(n1, h)
            a = step(a_, y1)
            if a is None or h is None:
                return
            r = h + a
            y2 = step(n2, r)
            f = step(f_, y2)
            if f is None:
                return
            h = r + f
        else:
            if h is None:
                h = first_in(a_)
            a = step(a_, h)
            if a is None or h is None:
                return
            y1 = step(n1, h + a)
            f = step(f_, y1)
            if f is None or y1 is None:
                return
            h = step(n2, y1 + f)
            if h is None:
                return
    step("final_ln", h)


# ----------------------------------------------------------------------------- the table
def _row(prefix, module, what, ours, ref, rtol, atol, norm_rtol) -> SublayerComparison:
    d = ours - ref
    S = float(np.max(np.abs(ref))) if ref.size else 0.0
    ref_norm = float(np.linalg.norm(ref))
    err_norm = float(np.linalg.norm(d))
    norm_rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else np.inf)
    allowed = atol * S + rtol * np.abs(ref)
    elem = float(np.max(np.abs(d) / np.where(allowed > 0, allowed, np.inf))) if d.size else 0.0
    ratio = max(elem, norm_rel / norm_rtol if norm_rtol > 0 else np.inf)
    parts = prefix.split(".")
    layer = int(parts[1]) if parts[0] == "layers" else None
    kind = KINDS[parts[-1]]
    return SublayerComparison(layer, kind, prefix, module, what, float(np.max(np.abs(d))) if d.size else 0.0,
                              norm_rel, ratio, ratio <= 1.0)


def table(cap: Capture, layer_map, params: dict, config, mask, batch_first: bool, dt, rtol, atol,
          norm_rtol, left=None) -> list[SublayerComparison]:
    """The rows, in the order of computation; ``mask`` is our additive attention mask (or None); ``left`` (B, n)
    the query rows left out of the comparison (:mod:`transformer_np.testing.rows`), or None."""
    from ..ops.attention import mha_forward
    from ..ops.feedforward import ffn_forward
    from ..ops.layernorm import layernorm_forward
    from .rows import leave_out

    enc = getattr(config, "encoder", config)
    eps, act, pre = float(enc.layer_norm_eps), enc.activation, enc.norm_position == "pre"

    def got(prefix, side):                                 # (B, n, d) in the run's dtype
        t = (cap.inputs if side == "in" else cap.outputs).get(prefix)
        if t is None:
            return None
        t = t.cpu()
        a = (t.double() if t.is_floating_point() and t.element_size() < 4 else t).numpy().astype(dt, copy=False)
        return a if batch_first or a.ndim != 3 else a.transpose(1, 0, 2)

    def p_of(prefix):
        return {k[len(prefix) + 1:]: v for k, v in params.items() if k.startswith(prefix + ".")}

    def op(prefix, x):
        p, leaf = p_of(prefix), prefix.rsplit(".", 1)[-1]
        if leaf == "attn" and getattr(config, "deberta", None) is not None:     # disentangled attention
            from ..model.deberta import deberta_attention_alone

            am = None if mask is None else (mask[:, 0, 0, :] == 0)                # the padding mask's 1/0 back
            return deberta_attention_alone(x, params, enc, config.deberta, int(prefix.split(".")[1]), am)
        if leaf == "attn":
            return mha_forward(x, p, enc.n_heads, mask)[0]
        if leaf == "ffn":
            return ffn_forward(x, p, act)[0]
        return layernorm_forward(x, p["gamma"], p["beta"], eps)[0]

    rows = []

    def check(prefix, expected_in):
        """The wiring (when the input is known from before) and the op, for one mapped sublayer."""
        if prefix not in layer_map:
            return None
        x, y = got(prefix, "in"), got(prefix, "out")
        if x is None or y is None:
            return None
        m_in, m_out = layer_map[prefix]
        module = m_in if m_in == m_out else f"{m_in} → {m_out}"
        if expected_in is not None and expected_in.shape == x.shape:      # the inputs are the framework's own
            rows.append(_row(prefix, module, "input", *leave_out(x, expected_in, left), rtol, atol, norm_rtol))
        rows.append(_row(prefix, module, "output", *leave_out(op(prefix, x), y, left), rtol, atol, norm_rtol))
        return y

    walk(enc, pre, lambda prefix: got(prefix, "in"), check)
    return rows
