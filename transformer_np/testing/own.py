r"""Your own encoder module in :func:`transformer_np.testing.compare_with_torch` (a part of it: import from there).

Any ``torch.nn.Module`` (a ``torch.jit.script``\ ed or ``torch.compile``\ d one too) is compared when you declare
what it computes and where its weights are:

* ``config=``: an :class:`~transformer_np.model.config.EncoderConfig` without embeddings, or a dict of the fields
  it needs (``n_layers``, ``d_model``, ``n_heads``, ``d_ff``, ``activation``, ``norm_position``, ``layer_norm_eps``,
  optionally ``final_layer_norm``);
* ``names=``: a dict from the module's parameter names to the library's flat dotted names
  (``{"blocks.0.q.weight": "layers.0.attn.W_Q", ...}``), or a callable taking a module name and returning the
  library's name or None. A 2-d parameter is read in torch's (out, in) layout (an ``nn.Linear`` weight, an
  ``nn.MultiheadAttention``'s ``in_proj_weight``); a fused projection maps to ``"layers.0.attn.W_Q|W_K|W_V"``
  (its row blocks, in that order). :func:`names_for` gives the map of a stock torch module in this form.

The module is called as ``module(inputs)`` on (B, n, d) and must return the (B, n, d) output. Every library
parameter the config needs must be mapped (else refused, with the list); module parameters left out of the map are
listed in the report's notes (their gradients are not compared).
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import describe
from ..errors import InputTypeError, InputValueError

#: The fields ``config=`` may give as a dict (the rest of an EncoderConfig is fixed: no embeddings, no dropout).
DECLARED_FIELDS = ("n_layers", "d_model", "n_heads", "d_ff", "activation", "norm_position", "layer_norm_eps",
                   "final_layer_norm")


def declared_config(config):
    """The EncoderConfig an own module declares (``config=``), checked: no embeddings (the input is (B, n, d))."""
    from ..model.config import EncoderConfig

    if config is None:
        raise InputValueError("names= describes your own module: give its architecture with config= too (an "
                              f"EncoderConfig, or a dict of {', '.join(DECLARED_FIELDS)})")
    if isinstance(config, dict):
        unknown = sorted(set(config) - set(DECLARED_FIELDS))
        if unknown:
            raise InputValueError(f"config has unknown fields {unknown}; the fields of an own module's "
                                  f"architecture are {', '.join(DECLARED_FIELDS)}")
        missing = [k for k in DECLARED_FIELDS[:4] if k not in config]
        if missing:
            raise InputValueError(f"config is missing {missing} (the fields it needs: {', '.join(DECLARED_FIELDS)})")
        try:
            return EncoderConfig(**config, dropout=0.0, vocab_size=None, max_len=2**31 - 1, type_vocab_size=0,
                                 positional="none")
        except ValueError as e:
            raise InputValueError(f"config: {e}") from None
    if not isinstance(config, EncoderConfig):
        raise InputTypeError(f"config must be an EncoderConfig or a dict of {', '.join(DECLARED_FIELDS)}, "
                             f"got {describe(config)}")
    if config.has_embeddings:
        raise InputValueError("config has embeddings (vocab_size or a positional encoding): an own module is "
                              "compared from its (B, n, d) input; declare vocab_size=None, positional='none'")
    return config


def reference_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every parameter the library's encoder needs for ``config`` (no embeddings), with its shape."""
    from ..model.stack import layer_param_shapes

    layer = layer_param_shapes(config)
    out = {}
    for i in range(1 if config.share_layers else config.n_layers):
        out.update({f"layers.{i}.{k}": s for k, s in layer.items()})
    if config.use_final_layer_norm:
        out.update({"final_ln.gamma": (config.d_model,), "final_ln.beta": (config.d_model,)})
    return out


def _strip(name: str) -> str:
    """A module parameter's name as the user wrote the module: torch.compile's wrapper adds ``_orig_mod.``."""
    return name[len("_orig_mod."):] if name.startswith("_orig_mod.") else name


def resolve_names(mod, names, config) -> tuple[dict[str, tuple[str, bool]], list[str]]:
    """The name table ``{module name: (our name, transposed?)}`` of an own module, checked against the shapes, and
    the notes listing the module parameters left out. Every reference parameter must be mapped exactly once."""
    if not (isinstance(names, dict) or callable(names)):
        raise InputTypeError(f"names must be a dict (module parameter name -> library name) or a callable, got "
                             f"{describe(names)}")
    shapes = reference_shapes(config)
    params = dict(mod.named_parameters())
    if isinstance(names, dict):
        known = {_strip(k) for k in params}
        stray = [k for k in names if k not in known]
        if stray:
            raise InputValueError(f"names maps {stray[:4]}, which the module does not have; its parameters: "
                                  f"{sorted(known)[:8]}{' …' if len(known) > 8 else ''}")
    table, notes, seen = {}, [], {}
    for fw, p in params.items():
        key = _strip(fw)
        ours = names.get(key) if isinstance(names, dict) else names(key)
        if ours is None:
            notes.append(f"{key}: a parameter of the module not in names= (not compared; it must not change the "
                         "output, or the output disagrees)")
            continue
        if not isinstance(ours, str):
            raise InputTypeError(f"names[{key!r}] must be a library parameter name (str), got {describe(ours)}")
        base, _, leaves = ours.rpartition(".")
        parts = [f"{base}.{leaf}" if base else leaf for leaf in leaves.split("|")]
        for part in parts:
            if part not in shapes:
                raise InputValueError(f"names[{key!r}] = {ours!r}: {part!r} is not a parameter of the declared "
                                      f"encoder; its parameters are like {sorted(shapes)[:6]} …")
            if part in seen:
                raise InputValueError(f"names maps both {seen[part]!r} and {key!r} to {part!r}")
            seen[part] = key
        transposed = p.dim() == 2                         # torch's (out, in) layout
        want = shapes[parts[0]]
        want = (len(parts) * want[1], want[0]) if transposed else (len(parts) * want[0],) + tuple(want[1:])
        if tuple(p.shape) != want:
            raise InputValueError(f"module parameter {key} has shape {tuple(p.shape)}, but {ours} needs "
                                  f"{want}{' (torch’s (out, in) layout)' if transposed else ''}")
        table[fw] = (ours, transposed)
    missing = [k for k in shapes if k not in seen]
    if missing:
        raise InputValueError(f"the declared encoder needs {len(missing)} parameters that names= maps no module "
                              f"parameter to: {missing[:6]}{' …' if len(missing) > 6 else ''}")
    return table, notes


def names_for(module) -> dict[str, str]:
    """The parameter-name map of a stock torch encoder module (``nn.TransformerEncoderLayer`` /
    ``nn.TransformerEncoder``) in ``names=``'s form: ``compare_with_torch(layer, x, config=cfg,
    names=names_for(layer))`` compares it as your own module would be."""
    from ..io.interop_torch import require_torch, torch_config_of
    from .modules import names_of

    torch = require_torch()
    config = torch_config_of(module)[0]
    return {fw: ours for fw, (ours, _) in names_of("torch", config, module, torch).items()}


def probe_activation(fn, declared: str, dtype, torch) -> float:
    """The largest |fn(z) − declared(z)| over a probe z ∈ [−6, 6] (1201 points), relative to max |declared(z)|."""
    from ..ops.activations import activation_forward

    z = np.linspace(-6.0, 6.0, 1201).astype(dtype)
    ref = activation_forward(z, declared)[0]
    got = fn(torch.from_numpy(z)).detach().numpy()
    if got.shape != ref.shape or not np.all(np.isfinite(got)):
        return math.inf
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def _activation_candidates(mod, torch):
    """(where, function) of every activation the module holds where Python can see it: a function attribute whose
    name contains "act" (``self.act = my_gelu``, ``functools.partial(F.gelu, ...)``), an ``nn.GELU``/``nn.ReLU``."""
    out = []
    for name, m in mod.named_modules():
        if isinstance(m, (torch.nn.GELU, torch.nn.ReLU)):
            out.append((name, m))
            continue
        for attr, v in vars(m).items():
            if "act" in attr.lower() and callable(v) and not isinstance(v, (torch.nn.Module, type)):
                out.append((f"{name}.{attr}" if name else attr, v))
    return out


def check_activations(mod, config, dt, torch) -> list[str]:
    """Each activation found in the module against the declared one on a probe: accepted (a note with the measured
    difference) within 64 ε of the dtype, refused with the measured difference otherwise."""
    notes, limit = [], 64 * float(np.finfo(dt).eps)
    for where, fn in _activation_candidates(mod, torch):
        try:
            diff = probe_activation(fn, config.activation, dt, torch)
        except Exception as e:                            # not an elementwise function of one tensor
            notes.append(f"{where}: not probed as an activation ({type(e).__name__})")
            continue
        label = getattr(fn, "__name__", None) or type(fn).__name__
        if diff > limit:
            raise InputValueError(f"the module's activation {where} ({label}) differs from the declared "
                                  f"{config.activation!r} by {diff:.3g} (max |difference| / max |value| on a probe "
                                  f"of 1201 points in [-6, 6], {np.dtype(dt).name}; accepted up to {limit:.2g})")
        notes.append(f"{where} ({label}): matches the declared activation {config.activation!r} on a probe "
                     f"(relative difference {diff:.2g} on 1201 points in [-6, 6])")
    return notes
