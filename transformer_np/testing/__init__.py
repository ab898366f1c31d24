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

Each entry has the max abs error, the max relative error (over the elements where the reference is
nonzero; None when the reference is exactly 0 everywhere: such a tensor is read by its absolute error),
the norm-relative error ``norm_rel`` (below), and where the max abs error is (an index into the
framework's tensor). :func:`assert_matches_torch` raises an ``AssertionError`` naming the first entry that
disagrees and, in it, the one element furthest outside the element-wise criterion (its index, both values,
the error and the tolerance there) and, when the norm-wise criterion fails, the norm of the error against
its tolerance; under pytest the library's own frames are hidden, so the traceback ends at your test.

Two criteria, both must hold for every tensor:

    element-wise:  |ours − ref| ≤ atol · S + rtol · |ref|   for every element,
    norm-wise:     ‖ours − ref‖ ≤ norm_rtol · N,             N = max(‖ref‖, √m · rms_G),

where S is the largest |ref| in the tensor's *module* and rms_G the root mean square of the reference
over that module (m is the tensor's size): a parameter's tensors (weight and bias of one Linear,
LayerNorm or Embedding — siblings in the name, ``…key.weight`` / ``…key.bias``) share one S and one
rms_G; the output and the input gradient have their own. ``norm_rel`` = ‖ours − ref‖ / N. Scaling by the
module makes the check independent of the magnitudes, which really vary (BERT-base's embedding gradients
reach 10², an HF-initialised ALBERT's query gradients are 10⁻¹⁹), and it lets through exactly what must
pass: the gradient of the key bias b_K is zero in exact arithmetic (softmax ignores the constant q·b_K
added to a row of scores), so both frameworks return round-off, of the order of ε times the key
*weight*'s gradient, its sibling. The norm-wise criterion is what catches a systematic error: an output
scaled by 1 + 1e-5 moves every element by too little to leave a float32 element-wise tolerance, but the
norm of the error shows it.

Defaults by dtype (:data:`TOLERANCES` (rtol, atol) and :data:`NORM_TOLERANCES`; pass ``rtol``/``atol``/
``norm_rtol`` to override), set from the round-off measured over every supported case by
``scripts/compare_tolerances.py`` (the table and the margins are in ``docs/guide/testing.md``):

* float64: rtol = 1e-10, atol = 1e-12, norm_rtol = 1e-12 per layer.
* float32: rtol = 1e-4, atol = 1e-5, norm_rtol = 5e-6 per layer. Both sides round in float32 and accumulate
  in different orders; the attention kernel torch picks is one of those orders. An FFN output scaled by
  1 + 1e-5 on a BERT-base-sized layer fails these defaults.

A module of L layers gets the per-layer values times √L (:func:`default_tolerances`): the round-off of
independent layers adds up like a random walk (a 12-layer BERT-base's float32 gradients err 6.2 times
more than one of its layers').

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
Query rows with no key to attend to — a padded query whose ModernBERT sliding window holds only padding, a
padded query before the first real token under a causal mask — have no defined output (torch returns 0,
transformers' eager attention a uniform row, or NaN in float64): they are left out of the output and the
input gradient, their upstream gradient is 0, and the notes name them (:mod:`~transformer_np.testing.rows`).
A gradient that is zero in exact arithmetic (the query and key gradients when every query has one key: n = 1,
or one real token per sequence) is measured at the scale of its layer's gradients, not of its own round-off
(``criterion._set_source_scales``).

The map of this package: this module — the two entry points, each step of a comparison in order;
:mod:`~transformer_np.testing.criterion` — one tensor's comparison, the tolerances and the report with its
message; :mod:`~transformer_np.testing.inputs` — the inputs and every mask convention, checked;
:mod:`~transformer_np.testing.modules` — which modules are accepted, their weights as our params;
:mod:`~transformer_np.testing.own` — your own module (``config=`` and ``names=``), its name map checked;
:mod:`~transformer_np.testing.sides` — each side's run and the glue between them;
:mod:`~transformer_np.testing.sublayers` — the first sublayer that differs, and
:mod:`~transformer_np.testing.scripted` — a scripted module's captures for it; :mod:`~transformer_np.testing.rows` —
the query rows with no key, left out; :mod:`~transformer_np.testing.modes` — autograd off (forward-only) and half
precision. Import from here: these modules are its parts, not an API of their own.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from .._validate import check_float_dtype, describe
from ..errors import InputTypeError, InputValueError
from . import inputs as _inputs
from . import modes as _modes
from . import modules as _modules
from . import own as _own
from . import rows as _rows
from . import scripted as _scripted
from . import sides as _sides
from . import sublayers as _sub
from .criterion import (
    NORM_TOLERANCES,
    TOLERANCES,
    ComparisonReport,
    TensorComparison,
    _compare,
    _hide_assertion,
    _set_scales,
    _set_source_scales,
    _tolerance,
    _tolerances,
)
from .own import names_for

__all__ = ["compare_with_torch", "assert_matches_torch", "names_for", "ComparisonReport", "TensorComparison",
           "TOLERANCES", "NORM_TOLERANCES", "HALF_TOLERANCES", "HALF_GRAD_TOLERANCES", "HALF_GRAD_TOLERANCES_RELU",
           "default_tolerances"]

HALF_TOLERANCES, HALF_GRAD_TOLERANCES = _modes.HALF_TOLERANCES, _modes.HALF_GRAD_TOLERANCES
HALF_GRAD_TOLERANCES_RELU = _modes.HALF_GRAD_TOLERANCES_RELU

# Defined in testing/criterion.py with the criterion and the messages; documented and imported from here.
ComparisonReport.__module__ = TensorComparison.__module__ = __name__


def default_tolerances(dtype, n_layers: int = 1) -> tuple[float, float, float]:
    """``(rtol, atol, norm_rtol)`` used by default for ``dtype`` (float32 or float64; or float16 / bfloat16, the
    module's half-precision run against the float64 reference: :data:`HALF_TOLERANCES`) and a module of
    ``n_layers`` encoder layers: the per-layer values of :data:`TOLERANCES` and :data:`NORM_TOLERANCES` times
    √n_layers (round-off of independent layers adds up like a random walk; measured: a 12-layer BERT-base's worst
    float32 gradient error is 6.2 times its single layer's, √12 = 3.5 with the single layer's margin of 5.9)."""
    half = _modes.half_name(dtype)
    dt = None if half else _np_dtype(dtype)
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise InputTypeError(f"n_layers must be an int >= 1, got {describe(n_layers)}")
    k = math.sqrt(n_layers)
    if half:
        rtol, atol, norm_rtol = _modes.half_tolerances(half)
        return rtol * k, atol * k, norm_rtol * k
    rtol, atol = TOLERANCES[dt]
    return rtol * k, atol * k, NORM_TOLERANCES[dt] * k


# ----------------------------------------------------------------------------- dtype
def _np_dtype(dtype) -> np.dtype:
    """float32 or float64, given as NumPy's or torch's (``torch.float64``): the library's one dtype check (half
    precision is :func:`~transformer_np.testing.modes.half_name`'s, before it)."""
    if dtype is not None and "torch." in str(dtype):
        dtype = str(dtype).replace("torch.", "")
    try:
        return check_float_dtype(dtype)
    except InputTypeError:
        raise InputTypeError("dtype must be float32, float64, float16 or bfloat16, got "
                             f"{getattr(dtype, '__name__', dtype)}") from None


@_sides.with_small_pages
def compare_with_torch(module, inputs, attention_mask=None, grad_output=None, dtype=None, *,
                       src_key_padding_mask=None, src_mask=None, attn_mask=None, is_causal: bool = False,
                       token_type_ids=None, params=None, config=None, names=None, sublayers=None,
                       dropout_off: bool = False, seed: int = 0, rtol: float | None = None, atol: float | None = None,
                       norm_rtol: float | None = None) -> ComparisonReport:
    """Run ``module`` and transformer_np on the same weights and inputs; compare the output and every gradient.

    Args:
        module: an ``nn.TransformerEncoderLayer``, an ``nn.TransformerEncoder`` (with or without final
            norm), an ``nn.MultiheadAttention`` (self-attention: query = key = value = ``inputs``), a
            transformers base model of a supported family (``BertModel``, ``RobertaModel``,
            ``DistilBertModel``, ``AlbertModel``, ``ElectraModel``, ...) or one of their layers
            (``BertLayer``, ``AlbertLayer``, ...). It is not modified (a copy runs, in eval mode).
        inputs: the float input in the module's layout (torch modules, HF layers), or ``input_ids``
            (B, n) for an HF model; NumPy or torch.
        attention_mask: Hugging Face's padding mask (B, n): integers, 1 = real token, 0 = padding.
        src_key_padding_mask: torch's padding mask (B, n): booleans, True = padding (the same thing the other
            way round; give one of the two). Every row needs a real token.
        src_mask, attn_mask: (torch modules; two names for one argument) torch's attention mask, (n, n) or per
            head (B·num_heads, n, n): boolean (True = may not attend) or float (added to the scores).
        is_causal: (torch modules) position i attends to j ≤ i only. Alone, the causal mask is built and given
            to torch with the hint; with ``src_mask``, that mask must be the causal one (torch's hint).
        grad_output: the upstream gradient R of L = ⟨R, output⟩, in the output's shape; default standard
            normal from ``seed``, zero at padded positions. (HF models: torch defines the gradient of an
            embedding row at its ``padding_idx`` — the padding token's word row, RoBERTa's position row p — as 0;
            so a padding token that is not masked out, or a given R nonzero at a padded position holding one, is
            refused, with the reason.)
        dtype: float32 or float64 (NumPy or torch); default the module's (float64 if all its parameters
            are, else float32). Both sides run in it. Or ``torch.float16`` / ``torch.bfloat16``: the module runs in
            it, forward and backward, the reference in float64 on the same rounded values, at the half defaults
            (:data:`HALF_TOLERANCES`, ``report.grad_tolerances``). A float16/bfloat16 module without ``dtype``
            runs as a float32 copy and warns (``UserWarning``). Inside ``torch.no_grad()`` /
            ``torch.inference_mode()`` the comparison is forward-only (``report.forward_only``).
        token_type_ids: (B, n) segment ids, for HF models.
        params: our params to use (e.g. from your own code) instead of converting the module's weights;
            their disagreement with the module's weights is then reported first. Give them with their
            configuration, ``params=(config, params)`` (what ``from_torch``/``from_hf`` return) or ``config=``:
            every configuration value the output depends on (eps, activation, norm placement, final LayerNorm,
            attention scale, sizes, the family's embedding layout) is then compared too, first, and ours runs
            with your config. Without it, your params run with the module's configuration (a note says so).
        config: your config, with ``params`` (see there); or, with ``names``, your own module's architecture.
        names: your own module (any ``torch.nn.Module``, scripted or compiled too): a dict from its parameter
            names to the library's (``"blocks.0.q.weight": "layers.0.attn.W_Q"``) or a callable; ``config=`` then
            declares what it computes (an EncoderConfig without embeddings, or a dict of its fields). The module
            is called as ``module(inputs)`` on (B, n, d). See :mod:`transformer_np.testing.own`.
        sublayers: (with ``names``) your module's layer map, for the first sublayer that differs: the library's
            prefix (``"layers.1.ffn"``; ``attn``, ``ffn``, ``ln1``, ``ln2``, or ``"final_ln"``) → a submodule name,
            or (the submodule whose input is the sublayer's input, the one whose output is its output). Stock
            modules have theirs built in. See :mod:`transformer_np.testing.sublayers`.
        dropout_off: a module in training mode with dropout > 0 is refused (its output is random); True compares
            it with dropout off (a copy in eval mode), and the report's notes say so.
        seed: seeds the default ``grad_output``.
        rtol, atol, norm_rtol: the tolerances stored in the report (default :func:`default_tolerances` of
            ``dtype`` and the module's number of layers).

    Returns:
        a :class:`ComparisonReport`; ``report.check()`` raises like :func:`assert_matches_torch`.
    """
    __tracebackhide__ = _hide_assertion                  # pytest: a disagreement's frames are not the user's concern
    from ..io.interop import hf_config_of
    from ..io.interop_torch import require_torch, torch_config_of

    torch = require_torch()
    user_config = config                                 # yours; `config` becomes the module's below
    name_map = names
    if name_map is not None:                             # your own module: its architecture is declared
        if not isinstance(module, torch.nn.Module):
            raise InputTypeError(f"module must be a torch.nn.Module, got {describe(module)}")
        given = [k for k, v in (("attention_mask", attention_mask), ("src_key_padding_mask", src_key_padding_mask),
                                ("src_mask", src_mask), ("attn_mask", attn_mask), ("token_type_ids", token_type_ids),
                                ("params", params)) if v is not None] + (["is_causal"] if is_causal else [])
        if given:
            raise InputValueError(f"{', '.join(given)}: not taken with names= (your own module is called as "
                                  "module(inputs), without masks, and compared with its own weights)")
        kind = "own"
    else:
        kind = _modules.kind_of(module)
        if sublayers is not None:
            raise InputValueError("sublayers= declares your own module's layer map (with names=); a stock module's "
                                  "is built in")
    module_dtypes = sorted({str(p.dtype).replace("torch.", "") for p in module.parameters()})
    dtype_given = dtype is not None
    if dtype is None:
        dtype = np.float64 if module_dtypes == ["float64"] else np.float32
        _modes.warn_half_copy(module_dtypes, np.dtype(dtype).name)
    half = _modes.half_name(dtype)                       # the module runs in half; ours in float64 on its values
    dt = np.dtype(np.float64) if half else _np_dtype(dtype)
    grad_off = _modes.grad_off(torch)                    # inside no_grad / inference_mode: forward-only
    for name, v in (("rtol", rtol), ("atol", atol), ("norm_rtol", norm_rtol)):
        if v is not None:
            _tolerance(name, v)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputTypeError(f"seed must be an int >= 0, got {describe(seed)}")
    if not isinstance(dropout_off, bool):
        raise InputTypeError(f"dropout_off must be a bool, got {describe(dropout_off)}")
    if src_mask is not None and attn_mask is not None:
        raise InputValueError("give src_mask or attn_mask, not both (two names for torch's attention mask)")
    src_mask = attn_mask if src_mask is None else src_mask
    if kind.startswith("hf") and (src_mask is not None or is_causal is not False):
        raise InputValueError("src_mask / attn_mask / is_causal apply to the torch modules "
                              f"({', '.join(_modules.SUPPORTED_TORCH)}); a Hugging Face encoder "
                              f"({type(module).__name__}) takes the padding mask only "
                              "(attention_mask, 1 = real token, or src_key_padding_mask, True = padding)")
    notes, conversions = [], []
    run_name = half or dt.name                           # the dtype the module runs in
    if module_dtypes != [run_name]:
        conversions.append(f"the module's parameters ({', '.join(module_dtypes)}) run as a {run_name} copy"
                           + (" (dtype=)" if dtype_given else ""))
    if half:
        tdt = _modes.torch_dtype(half, torch)
        notes.append(_modes.half_note(half))
    else:
        tdt = {np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32}[dt]
    if grad_off:
        notes.append(_modes.forward_only_note(grad_off))
    with torch.no_grad():                                # a ScriptModule's deepcopy clones through autograd otherwise:
        mod = _sides.module_copy(module, torch).to(device="cpu", dtype=tdt).eval()   # they would not be leaves
        # half: our float64 params are views of a float64 copy of the half copy (its values, exactly)
        ref_mod = copy.deepcopy(mod).to(dtype=torch.float64) if half else mod
    if not grad_off:
        for p in mod.parameters():
            p.requires_grad_(True)
            p.grad = None

    own_notes = []
    if kind == "own":
        config, user_config = _own.declared_config(user_config), None
        own_notes = _own.check_activations(mod, config, dt, torch)
    elif kind == "mha":
        config = _modules.mha_config(mod)
    else:
        config = (torch_config_of if kind == "torch" else hf_config_of)(mod)[0]
    _modules.check_attention_scale(mod, config)
    # training mode last: an unsupported family or activation is the true reason, not the dropout (issue 45 item 6)
    dropping = _modules.training_dropout(module, torch)
    if dropping and not dropout_off:
        raise InputValueError(f"module is in training mode with dropout > 0 in {', '.join(dropping[:4])}"
                              f"{', …' if len(dropping) > 4 else ''}: its output is random and cannot match. Call "
                              "module.eval(), or pass dropout_off=True to compare it with dropout off (in eval mode)")
    if dropping:
        notes.append(f"dropout_off=True: the module is in training mode with dropout > 0 ({len(dropping)} places); "
                     "its copy runs in eval mode, dropout off")
    elif any(m.training for m in module.modules()):
        notes.append("the module is in training mode with no dropout > 0: its copy runs in eval mode (the same "
                     "function)")
    if kind == "own":
        names, unmapped = _own.resolve_names(mod, name_map, config)
        notes += own_notes + unmapped
    else:
        names = _modules.names_of(kind, config, module, torch)
    converted = _modules.param_views(ref_mod, names)     # ours, as views of the module copy's own tensors
    if isinstance(params, tuple):
        if len(params) != 2 or user_config is not None:
            raise InputTypeError("params must be a dict of name -> numpy array (ours), or the pair (config, params) "
                                 "that from_torch / from_hf return, with config= not given as well")
        user_config, params = params
    cfg_entries = []
    if params is None:
        if user_config is not None:
            raise InputValueError("config= describes your params: give them with it (params=(config, params))")
        params = converted
    elif not isinstance(params, dict):
        raise InputTypeError(f"params must be a dict of name -> numpy array (ours), got {describe(params)}")
    else:
        cast = sorted({str(np.asarray(v).dtype) for v in params.values()} - {dt.name})
        if cast:
            conversions.append(f"params ({', '.join(cast)}) cast to {dt.name}")
        params = {k: np.asarray(v).astype(dt, copy=False) for k, v in params.items()}
        if user_config is None:
            notes.append("params= without its config: your params run with the module's configuration (eps, "
                         "activation, norm placement, ...); pass params=(config, params) to compare yours too")
        else:
            cfg_entries = _modules.config_entries(user_config, config)
            structural = [e.name for e in cfg_entries if e.max_abs and e.name in _modules.STRUCTURAL]
            if structural:
                notes.append(f"no tensor compared: your config differs from the module's in {structural}, which "
                             "decide the parameters' shapes")
                rt, at, nt = default_tolerances(half or dt, 1)
                return ComparisonReport(type(module).__name__, "transformers" if kind.startswith("hf") else "torch",
                                        _modes.report_dtype(half, dt), rt, at, cfg_entries, notes, nt, conversions,
                                        forward_only=bool(grad_off))
            config = user_config
    d_rtol, d_atol, d_norm = default_tolerances(half or dt, config.n_layers)
    if not half and dt == np.float64 and getattr(config, "modernbert", None) is not None:
        # transformers rounds ModernBERT's rotary tables, its rotated queries and keys and its eager softmax to
        # float32 even in a float64 model: float32-sized differences are the framework's, and are said so
        d_rtol, d_atol, d_norm = default_tolerances(np.float32, config.n_layers)
        notes.append("ModernBERT in float64: transformers computes its rotary tables, the rotated queries and keys and "
                     "the eager softmax in float32, so the defaults are float32's (pass rtol=, atol=, norm_rtol= to "
                     "tighten; with those casts lifted the two agree to ~1e-14, tests/io/test_parity_modernbert.py)")
    rtol, atol = _tolerances(dt, rtol, atol, d_rtol, d_atol)
    norm_rtol = _tolerance("norm_rtol", d_norm if norm_rtol is None else norm_rtol)
    if config.n_layers > 1:
        notes.append(f"default tolerances: the per-layer values times √{config.n_layers} for {config.n_layers} "
                     "layers (see default_tolerances)")

    # ---- inputs, both layouts
    batch_first = _modules.batch_first(mod, kind)
    ids_kwargs, ids, tt, pad_rows, pad_tables = {}, None, None, None, []
    if kind == "hf_model":
        ids = _inputs.to_numpy(inputs, "inputs")
        if not np.issubdtype(ids.dtype, np.integer) or ids.ndim != 2:
            raise InputTypeError(f"inputs must be input_ids: an integer array (B, n) for {type(module).__name__}, "
                                 f"got {describe(ids)}")
        B, n = ids.shape
        _inputs.check_ids(ids, config, type(module).__name__)
        masks = _inputs.AttentionMasks(am=_inputs.padding(attention_mask, src_key_padding_mask, B, n))
        ids_kwargs = {"input_ids": torch.from_numpy(ids.astype(np.int64))}
        if masks.am is not None:
            ids_kwargs["attention_mask"] = torch.from_numpy(masks.am)
        if token_type_ids is not None:
            tt = _inputs.to_numpy(token_type_ids, "token_type_ids")
            if not np.issubdtype(tt.dtype, np.integer):
                raise InputTypeError(f"token_type_ids must be integers, got {describe(tt)}")
            tt = tt.astype(np.int64)
            _inputs.check_token_types(tt, config, B, n, type(module).__name__)
            ids_kwargs["token_type_ids"] = torch.from_numpy(tt)
        pad_rows, pad_tables = _inputs.padding_index_positions(mod, ids, config)
        x_t, x_ours = None, None
        out_shape = (B, n, config.d_model)
        notes.append(f"attention: transformers' {getattr(mod.config, '_attn_implementation', '?')!r} implementation")
    else:
        if token_type_ids is not None:
            raise InputValueError("token_type_ids only applies to Hugging Face models (input_ids)")
        x = _inputs.float_input(inputs, "inputs", 3)
        x_name = "bfloat16" if _inputs.is_bfloat16(inputs) else x.dtype.name
        if x_name != run_name:
            conversions.append(f"inputs ({x_name}) cast to {run_name}")
        x = _modes.rounded(x, half, torch) if half else x.astype(dt, copy=False)
        x_ours = x if batch_first else np.ascontiguousarray(x.transpose(1, 0, 2))         # (B, n, d)
        B, n = x_ours.shape[:2]
        am = _inputs.padding(attention_mask, src_key_padding_mask, B, n)
        if kind == "hf_layer":
            masks = _inputs.AttentionMasks(am=am)
        elif kind == "own":
            if am is not None:
                raise InputValueError("a padding mask is not taken with names= (own modules run as module(inputs))")
            masks = _inputs.AttentionMasks()
        else:
            masks = _inputs.attention_masks(am, src_mask, is_causal, B, config.n_heads, n, dt, tdt, torch)
            conversions += masks.notes
            if half:                                     # torch takes a float mask in the query's dtype
                conversions += _modes.half_masks(masks, half, tdt, torch)
        x_t = torch.from_numpy(x.copy()).to(tdt).requires_grad_(not grad_off)
        out_shape = x.shape
        if kind not in ("hf_layer", "own"):
            notes.append("attention: nn.MultiheadAttention → scaled_dot_product_attention "
                         "(torch's default CPU backend unless an sdpa_kernel context selects one)")
    am = masks.am
    pad = None if am is None else (am == 0)[:, :, None] if batch_first else (am == 0).T[:, :, None]
    if kind == "hf_model" and pad_tables:                 # tokens reading a padding_idx row: see the function
        _sides.check_no_gradient_at_padding_rows(grad_output, pad_rows, pad_tables, ids, am)
    R = _inputs.grad_output(grad_output, out_shape, dt, pad, seed)
    R_name = "bfloat16" if _inputs.is_bfloat16(grad_output) else R.dtype.name
    if grad_output is not None and R_name != run_name:
        conversions.append(f"grad_output ({R_name}) cast to {run_name}")
    R = _modes.rounded(R, half, torch) if half else R.astype(dt, copy=False)
    left, R = _rows.left_out(config, masks, R, batch_first, notes)   # query rows with no key (testing/rows.py)
    R_ours = R if batch_first else np.ascontiguousarray(R.transpose(1, 0, 2))

    # ---- the framework's side (its sublayers captured by forward hooks), then ours
    if kind == "own":
        layer_map = None if sublayers is None else _sub.declared_map(sublayers, mod, config)
    else:
        layer_map = None if kind == "mha" else _sub.stock_map(kind, mod, config, torch)
    graphs = bool(layer_map) and isinstance(mod, torch.jit.ScriptModule)      # no Python hooks: its graphs instead
    if graphs:
        notes.append("a TorchScript module (torch.jit.script or trace) takes no forward hooks: its sublayer table "
                     "records the mapped submodules' calls in an instrumented copy of its graphs (its own values, "
                     "wiring included)")

    def framework_run(keyed: bool):
        cap = None if not layer_map or graphs else _sub.Capture(mod, layer_map, torch)
        keys = _rows.KeyedRows(mod, torch) if keyed else None
        try:
            out = _sides.run_framework(mod, x_t, kind, masks, ids_kwargs, torch)
        finally:
            for h in (cap, keys):
                if h is not None:
                    h.remove()
        if not grad_off:
            out.backward(torch.from_numpy(R.copy()).to(tdt))
        return out, cap, keys

    out_t, capture, _ = framework_run(False)
    bad = [] if left is None else _rows.not_finite(out_t, mod, x_t, torch, left, batch_first)
    if bad:                                              # its undefined rows reached the rest: rerun them keyed
        for p in [*mod.parameters(), x_t]:
            if p is not None:
                p.grad = None
        out_t, capture, keys = framework_run(True)
        notes.append(_rows.rerun_note(bad, keys.fixed, _rows.not_finite(out_t, mod, x_t, torch, left, batch_first)))
    H, grads, dx = _sides.run_ours(kind, params, config, x_ours, ids, tt, masks, R_ours, backward=not grad_off)

    # ---- names: the framework's, with ours alongside (views of our arrays in the framework's layout)
    if user_config is not None:
        names = _modules.names_of(kind, config, module, torch)
    entries = list(cfg_entries)
    named = list(mod.named_parameters())
    for fw, p in named:
        ours_p = _sides.in_framework_layout(params, names.get(fw))
        if ours_p is None:
            notes.append(f"{fw}: a parameter of the module with no counterpart in ours (not compared)")
            continue
        entries.append(_compare(fw, "weight", ours_p, _modes.tensor_numpy(p), *names[fw]))
    H_fw = H if batch_first else H.transpose(1, 0, 2)
    out_np = _modes.tensor_numpy(out_t)
    if grad_off and pad is not None and kind == "torch":
        H_fw = _modes.nested_tensor_padding(H_fw, out_np, pad, notes)
    entries.append(_compare("output", "output", *_rows.leave_out(H_fw, out_np, left, batch_first)))
    if grad_off:
        named = []                                       # forward-only: no gradient on either side
    if x_t is not None and not grad_off:
        dx_fw = dx if batch_first else dx.transpose(1, 0, 2)
        entries.append(_compare("input", "input grad", *_rows.leave_out(dx_fw, _modes.tensor_numpy(x_t.grad), left,
                                                                        batch_first)))
    for fw, p in named:
        ours_g = _sides.in_framework_layout(grads, names.get(fw))
        if p.grad is None:
            if ours_g is not None:
                entries.append(_compare(fw, "grad", ours_g, np.zeros(tuple(p.shape), dtype=ours_g.dtype), *names[fw]))
            else:
                notes.append(f"{fw}: no gradient on either side (not on the path to the output)")
            continue
        if ours_g is None:
            continue
        entries.append(_compare(fw, "grad", ours_g, _modes.tensor_numpy(p.grad), *names[fw]))
    _set_scales(entries)
    zero = _set_source_scales(entries, atol)
    if zero:
        notes.append(f"zero in exact arithmetic, so compared at the scale of their layer's gradients (their largest "
                     f"|reference| is below atol times it; see docs/guide/testing.md): {', '.join(zero[:8])}"
                     + (f" and {len(zero) - 8} more" if len(zero) > 8 else ""))
    framework = "transformers" if kind.startswith("hf") else "torch"
    grad_tols = _modes.grad_tolerances(half, config) if half else None      # half's gradients: their own defaults
    report = ComparisonReport(type(module).__name__, framework, _modes.report_dtype(half, dt), rtol, atol, entries,
                              notes, norm_rtol, conversions, forward_only=bool(grad_off), grad_tolerances=grad_tols)
    if capture is not None or graphs:
        r1, a1, n1 = default_tolerances(half or dt, 1)      # one sublayer's round-off: the per-layer tolerances
        mask = _sides.sublayer_mask(kind, masks, dt)

        def sublayer_table():                             # computed when read: free when passing
            cap = capture
            if graphs:                                    # in the framework run's autograd mode (its fast paths)
                with torch.set_grad_enabled(not grad_off):
                    cap = _scripted.GraphCapture(mod, layer_map, (x_t,), torch)
                report.notes.extend(cap.notes)
            return _sub.table(cap, layer_map, params, config, mask, batch_first, dt, r1, a1, n1, left)

        report._sublayer_table = sublayer_table
    elif kind == "own" and sublayers is None:
        report.notes.append("no sublayers= given: a disagreement is not localised to a layer and sublayer")
    return report


def assert_matches_torch(module, inputs, attention_mask=None, grad_output=None, dtype=None, *,
                         src_key_padding_mask=None, src_mask=None, attn_mask=None, is_causal: bool = False,
                         rtol: float | None = None, atol: float | None = None, norm_rtol: float | None = None,
                         token_type_ids=None, params=None, config=None, names=None, sublayers=None,
                         dropout_off: bool = False, seed: int = 0) -> ComparisonReport:
    """:func:`compare_with_torch`, then raise ``AssertionError`` if any tensor disagrees.

    The message names the first tensor that disagrees (weights first, then the output, the input
    gradient, the parameter gradients) under the framework's own name with ours alongside; then one
    element, the one furthest outside the element-wise criterion (the largest |ours − ref| − (atol·S +
    rtol·|ref|)), with its index, both values, the error and the tolerance there; the norm-wise criterion
    when it fails; then the tensor's max abs / max rel / norm-relative errors. Under pytest the library's
    own frames are hidden (``__tracebackhide__``): the traceback ends at your test's line. Returns the
    report when everything agrees.
    """
    __tracebackhide__ = True                             # pytest: show the message, not this library's source
    report = compare_with_torch(module, inputs, attention_mask, grad_output, dtype,
                                src_key_padding_mask=src_key_padding_mask, src_mask=src_mask, attn_mask=attn_mask,
                                is_causal=is_causal, token_type_ids=token_type_ids, params=params, config=config,
                                names=names, sublayers=sublayers, dropout_off=dropout_off, seed=seed,
                                rtol=rtol, atol=atol, norm_rtol=norm_rtol)
    return report.check()
