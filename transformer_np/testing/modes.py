r"""The modes an engineer's test runs in (a part of :func:`transformer_np.testing.compare_with_torch`: import from
there).

* **Autograd off** — inside ``torch.no_grad()``, ``torch.inference_mode()`` or ``torch.set_grad_enabled(False)``
  there is no backward to compare: the comparison is *forward-only* (the weights and the output), the module runs as
  it runs there (``nn.TransformerEncoderLayer``/``nn.TransformerEncoder`` take torch's fused "fast path" in eval mode
  without autograd — the function an inference test exercises), and the report says so
  (``report.forward_only``, a note). A module whose weights were made inside ``inference_mode`` (inference tensors)
  is compared in full outside it: its copy is made outside, as ordinary tensors.
* **Half precision** — ``dtype=torch.float16`` or ``torch.bfloat16`` runs the module's copy in that dtype, forward
  and backward (torch supports both on CPU), on the input, upstream gradient and weights rounded to it; the
  reference runs in float64 on those very values, and the two are compared at the tolerances measured for the
  dtype (:data:`HALF_TOLERANCES` for the forward; for the gradients :data:`HALF_GRAD_TOLERANCES`, or
  :data:`HALF_GRAD_TOLERANCES_RELU` in a ReLU module; from ``scripts/compare_tolerances_half.py``, the table is in
  ``docs/guide/testing.md``).
* **A half module run as a float32 copy** (``dtype`` not given) warns: a green comparison then says nothing about the
  half-precision numerics the module computes with.
* **bfloat16 tensors** (an input, a ``grad_output``, a mask) are read exactly, through float32 (NumPy has no
  bfloat16).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..errors import InputTypeError

HALF = ("float16", "bfloat16")

#: Default (rtol, atol, norm_rtol) per encoder layer of a half-precision run's *forward* (the weights and the output;
#: the module in ``dtype``, the reference in float64 on the same rounded values), measured by
#: ``scripts/compare_tolerances_half.py`` (docs/guide/testing.md, "Half precision"). A module of L layers gets them
#: times √L, as float32's.
HALF_TOLERANCES = {"float16": (2e-2, 2e-3, 2e-3), "bfloat16": (0.16, 0.016, 1.5e-2)}
#: The same for its *gradients* (input and parameters) in a module with a smooth activation (GELU, tanh-GELU; a bare
#: attention module): looser than the forward's, as measured.
HALF_GRAD_TOLERANCES = {"float16": (0.2, 0.02, 5e-2), "bfloat16": (0.5, 0.05, 0.13)}
#: ... and in a ReLU module, far looser: a unit whose input is within half's round-off of 0 is on in one run and off
#: in the other, and its whole gradient changes.
HALF_GRAD_TOLERANCES_RELU = {"float16": (2.4, 0.24, 0.11), "bfloat16": (4.0, 0.4, 0.32)}


def half_name(dtype) -> str | None:
    """"float16" or "bfloat16" when ``dtype`` names a half-precision type (torch's, NumPy's float16, or the
    name), else None (the library's float32/float64 check then applies)."""
    if dtype is None or isinstance(dtype, bool):
        return None
    text = str(dtype).replace("torch.", "")
    if text in ("half", "float16", "<class 'numpy.float16'>") or text == "bfloat16":
        return "bfloat16" if text == "bfloat16" else "float16"
    try:
        if np.dtype(dtype) == np.float16:
            return "float16"
    except TypeError:
        pass
    return None


def torch_dtype(name: str, torch):
    return {"float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def half_tolerances(name: str, grads: bool = False, activation: str | None = None) -> tuple[float, float, float]:
    """The per-layer half-precision defaults: the forward's, or (``grads``) the gradients' for ``activation``."""
    table = HALF_TOLERANCES if not grads else HALF_GRAD_TOLERANCES_RELU if activation == "relu" else \
        HALF_GRAD_TOLERANCES
    if name not in table:
        raise InputTypeError(f"dtype must be float16 or bfloat16 for half tolerances, got {name!r}")
    return table[name]


# ----------------------------------------------------------------------------- autograd off
def grad_off(torch) -> str | None:
    """The context the call runs in when autograd is off ("torch.inference_mode()" or "torch.no_grad()"), or None."""
    if torch.is_inference_mode_enabled():
        return "torch.inference_mode()"
    if not torch.is_grad_enabled():
        return "torch.no_grad()"
    return None


def forward_only_note(context: str) -> str:
    return (f"forward-only: called inside {context} (autograd off), so only the weights and the output are "
            "compared, with the module running as it runs there (for nn.TransformerEncoder(Layer): torch's fused "
            "fast path); call outside it to compare every gradient too")


# ----------------------------------------------------------------------------- tensors and rounding
def tensor_numpy(t) -> np.ndarray:
    """A torch tensor's values as a NumPy array, exactly: float16 as NumPy's float16, bfloat16 through float32."""
    t = t.detach().cpu()
    if str(t.dtype) == "torch.bfloat16":
        t = t.float()                                    # every bfloat16 is a float32 (its upper 16 bits): exact
    return t.numpy()


def rounded(a: np.ndarray, name: str, torch) -> np.ndarray:
    """``a`` rounded to the half dtype ``name`` (round to nearest even, torch's cast), returned in float64: the values
    the module in that dtype sees, which the float64 reference then uses as they are."""
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)).to(torch_dtype(name, torch))
    return t.to(torch.float64).numpy()


def _caller_level() -> int:
    """``warnings.warn``'s stacklevel of the first frame outside this package: the user's line."""
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    level, f = 1, sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == here:
        level, f = level + 1, f.f_back
    return level


def half_note(half: str) -> str:
    return (f"half precision: the module runs in {half}, forward and backward, on the input, upstream gradient and "
            f"weights rounded to {half}; the reference runs in float64 on those same values; the tolerances are "
            f"{half}'s (HALF_TOLERANCES for the forward, HALF_GRAD_TOLERANCES — HALF_GRAD_TOLERANCES_RELU in a ReLU "
            "module — for the gradients)")


def half_masks(masks, half: str, tdt, torch) -> list[str]:
    """torch takes a float attention mask in the query's dtype: cast it, and round ours to the same values; the
    conversion, said (a list of one sentence, or empty)."""
    if masks.extra is not None:
        masks.extra = rounded(masks.extra, half, torch)
    if masks.torch_mask is not None and masks.torch_mask.is_floating_point() and masks.torch_mask.dtype != tdt:
        masks.torch_mask = masks.torch_mask.to(tdt)
        return [f"the attention mask rounded to {half} (torch needs it in the query's dtype), for both sides"]
    return []


def grad_tolerances(half: str, config) -> tuple[float, float, float]:
    """The gradients' default (rtol, atol, norm_rtol) of a half run: by the module's activation, times √L."""
    k = math.sqrt(config.n_layers)
    act = getattr(getattr(config, "encoder", config), "activation", None)             # None: a bare attention
    return tuple(v * k for v in half_tolerances(half, grads=True, activation=act))


def report_dtype(half: str | None, dt: np.dtype):
    """The dtype the module ran in: a NumPy dtype, or the string "bfloat16" (NumPy has none)."""
    return dt if not half else np.dtype(np.float16) if half == "float16" else "bfloat16"


def nested_tensor_padding(H_fw: np.ndarray, out: np.ndarray, pad: np.ndarray, notes: list) -> np.ndarray:
    """torch's nested-tensor fast path (``nn.TransformerEncoder`` with a padding mask, autograd off) returns 0 at
    padded positions without computing them: when torch's output is 0 at every padded position, ours is set to 0
    there too (compared at the real tokens only), and a note says so."""
    if np.any(np.where(pad, out, 0)):
        return H_fw
    notes.append("padded positions: torch's fast path (nested tensors) returns 0 there without computing them; the "
                 "output is compared at the real tokens only")
    return np.where(pad, 0, H_fw).astype(H_fw.dtype)


def warn_half_copy(module_dtypes: list[str], run: str) -> None:
    """A half-precision module compared as a float32 (or float64) copy because ``dtype`` was not given: say so."""
    half = [d for d in module_dtypes if d in HALF]
    if not half:
        return
    stacklevel = _caller_level()
    warnings.warn(f"the module's parameters are {', '.join(half)}, but it is compared as a {run} copy (dtype not "
                  "given): a pass says nothing about the half-precision numerics it runs with. Pass "
                  f"dtype=torch.{half[0]} to compare its {half[0]} forward and backward against the float64 "
                  f"reference, or dtype=torch.{run} to say that the {run} copy is meant", UserWarning,
                  stacklevel=stacklevel)
