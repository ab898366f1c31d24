"""The name-table machinery both framework mappings share: a state dict in, our params out, and back.

A name table is a list of rows ``(framework name, our name, transpose?)``. :func:`_rows_for` checks that
a state dict holds exactly the table's names (refusing an impossible one from the counts alone),
:func:`_import` turns the matched tensors into our params (shapes checked, ``nn.Linear`` weights
transposed, one float dtype), :func:`_export` goes back from params or grads to the framework's names.
:mod:`transformer_np.io.interop` (Hugging Face) and :mod:`transformer_np.io.interop_torch`
(``nn.TransformerEncoder``) build the tables; everything here is pure NumPy (a torch tensor is read
without importing torch).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from .._validate import FLOAT_DTYPES, describe, mismatch_detail
from ..errors import InputTypeError, InputValueError


# ----------------------------------------------------------------------------- arrays in, arrays out
def _as_numpy(x, name: str) -> np.ndarray:
    """A NumPy view of an array-like; torch tensors are detached and moved to the CPU."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):      # a torch.Tensor, without importing torch
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":            # NumPy has no bfloat16
            x = x.float()
        x = x.numpy()
    if not isinstance(x, np.ndarray):
        raise InputTypeError(f"state[{name!r}] must be a numpy array or torch tensor, got {describe(x)}")
    return x


def _target_dtype(arrays: list[np.ndarray], dtype) -> np.dtype:
    """The dtype of the imported params: ``dtype`` if given, else float64 when every source
    tensor is float64, else float32 (float16/bfloat16 checkpoints are widened to float32)."""
    if dtype is not None:
        dt = np.dtype(dtype)
        if dt not in FLOAT_DTYPES:
            raise InputTypeError(f"dtype must be float32 or float64, got {dt}")
        return dt
    for a in arrays:
        if not np.issubdtype(a.dtype, np.floating):
            raise InputTypeError(f"expected floating-point weights, got a tensor of dtype {a.dtype}")
    if arrays and all(a.dtype == np.float64 for a in arrays):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _rows_for(state: Mapping, rows: Iterable[tuple[str, str, bool]], n_rows: int, optional: list, ignored,
              source: str) -> list[tuple[str, str, bool]]:
    """The rows of a name table, after checking ``state`` holds exactly those names.

    The table is walked lazily and only as far as the state can match it: a config that asks
    for a million layers is refused from the counts, before a million rows are built.
    """
    if not isinstance(state, Mapping):
        raise InputTypeError(f"state must be a mapping of name -> array (a state dict), got {describe(state)}")
    if n_rows > len(state):
        missing = []
        for fw, _, _ in rows:
            if fw not in state:
                missing.append(fw)
                if len(missing) > 8:
                    break
        raise InputValueError(f"{source} state dict does not match the config: it has {len(state)} tensors, the "
                              f"config needs {n_rows} ({mismatch_detail(missing, [])})")
    rows = list(rows)
    known = {fw for fw, _, _ in rows} | {fw for fw, _, _ in optional}
    missing = [fw for fw, _, _ in rows if fw not in state]
    unexpected = [k for k in state if k not in known and k not in ignored]
    if missing or unexpected:
        raise InputValueError(f"{source} state dict does not match the config ({mismatch_detail(missing, unexpected)})")
    return rows + [r for r in optional if r[0] in state]


def _import(state: Mapping, rows: list[tuple[str, str, bool]], shapes: dict, dtype,
            source: str) -> dict[str, np.ndarray]:
    """Framework state dict → our params (rows already matched by :func:`_rows_for`), shapes checked."""
    arrays = {fw: _as_numpy(state[fw], fw) for fw, _, _ in rows}
    dt = _target_dtype(list(arrays.values()), dtype)
    params: dict[str, np.ndarray] = {}
    for fw, ours, transpose in rows:
        a = arrays[fw]
        want = shapes[ours][::-1] if transpose else shapes[ours]
        if a.shape != tuple(want):
            raise InputValueError(f"{source} tensor {fw!r} must have shape {tuple(want)} (for {ours!r} of shape "
                                  f"{shapes[ours]}), got shape {a.shape}")
        params[ours] = np.ascontiguousarray(a.T if transpose else a, dtype=dt)
    return params


def _export(tree: Mapping, table, optional, shapes: dict, what: str) -> dict[str, np.ndarray]:
    """Our params (or grads) → framework names, transposes included."""
    if not isinstance(tree, Mapping):
        raise InputTypeError(f"tree must be a dict of name -> numpy array (params or grads), got {describe(tree)}")
    ours = {o for _, o, _ in table} | {o for _, o, _ in optional}
    missing = [o for _, o, _ in table if o not in tree]
    # "inputs_embeds" is the input's gradient in an encoder_backward result, not a parameter.
    unexpected = [k for k in tree if k not in ours and k != "inputs_embeds"]
    if missing or unexpected:
        raise InputValueError(f"{what}: tree does not match the config ({mismatch_detail(missing, unexpected)})")
    out: dict[str, np.ndarray] = {}
    dtype = None
    for fw, o, transpose in table + [r for r in optional if r[1] in tree]:
        a = tree[o]
        if not isinstance(a, np.ndarray) or a.dtype not in FLOAT_DTYPES:
            raise InputTypeError(f"{what}: tree[{o!r}] must be a float32/float64 numpy array, got {describe(a)}")
        if a.shape != tuple(shapes[o]):
            raise InputValueError(f"{what}: tree[{o!r}] must have shape {tuple(shapes[o])}, got shape {a.shape}")
        if dtype is None:
            dtype = a.dtype
        elif a.dtype != dtype:
            raise InputTypeError(f"{what}: tree arrays must share one dtype: tree[{o!r}] is {a.dtype}, others {dtype}")
        out[fw] = np.ascontiguousarray(a.T if transpose else a)
    return out
