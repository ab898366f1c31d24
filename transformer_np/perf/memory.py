r"""What a forward cache keeps alive, in bytes: the memory cost of being able to run backward.

Every ``x_forward`` returns ``(out, cache)``; the cache holds exactly the arrays its
backward needs (the layer's input x for dW = xᵀ dY, the attention weights A for the
softmax backward, f'(z) for the activation, x̂ and 1/σ for LayerNorm, …). Until backward
runs, all of it stays in memory — for a stack, N layers' worth: this is why training
needs far more memory than inference.

:func:`cache_nbytes` walks a cache (nested dicts and lists) and reports every array by its
dotted path, e.g. ``attn.attn.weights`` or ``layers.0.ffn.act.grad``. Several entries may
share one buffer — Q, K and V are views into the fused QKV projection's output; the next
op's cached input *is* the previous op's output — so ``total`` counts each underlying
buffer once (by the array that owns the memory), while ``entries`` lists each view's own
size. ``groups`` sums ``entries`` per sublayer (first path component, or ``layers.ℓ`` for
an encoder cache). Entries named ``W``, ``gamma`` or ``beta`` refer to parameters, not activations:
they are listed under ``param_refs`` and left out of ``total``. One of them is a copy, not a
reference: ``attn.qkv.W`` is the fused [W_Q | W_K | W_V] (d, 3d), concatenated in every
forward and kept alive by the cache (3d² numbers, 6.75 MiB per layer for BERT-base in
float32) — counted in ``total`` only with ``include_params=True``.
"""

from __future__ import annotations

import numpy as np

from .._validate import describe

__all__ = ["cache_nbytes", "cache_arrays", "owner", "is_param_ref"]

_PARAM_KEYS = ("W", "gamma", "beta")   # cache entries that hold a reference to a parameter, not an activation


def owner(a: np.ndarray) -> np.ndarray:
    """The array that owns a's memory (follows .base through views and reshapes)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _walk(node, path: str, out: list) -> None:
    if isinstance(node, np.ndarray):
        out.append((path, node))
    elif isinstance(node, dict):
        for k, v in node.items():
            _walk(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _walk(v, f"{path}.{i}" if path else str(i), out)


def cache_arrays(cache) -> list[tuple[str, np.ndarray]]:
    """Every array in a cache (nested dicts, lists, tuples) with its dotted path, in walk order —
    the one cache walker of the package (:func:`cache_nbytes` and the anatomy study use it)."""
    out: list = []
    _walk(cache, "", out)
    return out


def is_param_ref(path: str) -> bool:
    """True for an entry that refers to a parameter (``…W``, ``…gamma``, ``…beta``, ``…W.0`` for the fast path's
    three projection matrices), not to an activation."""
    return any(part in _PARAM_KEYS for part in path.split("."))   # W, gamma, or a tuple of them (W.0, …)


_owner = owner          # the names used before 0.2


def _group(path: str) -> str:
    parts = path.split(".")
    return ".".join(parts[:2]) if parts[0] == "layers" and len(parts) > 1 else parts[0]


def cache_nbytes(cache: dict, include_params: bool = False) -> dict:
    """Bytes held by the arrays of a forward cache.

    Args:
        cache: the cache of any ``*_forward`` (an op, a layer or the whole encoder).
        include_params: also count the parameter arrays the cache refers to (W, γ).

    Returns:
        dict: ``entries`` ({dotted path: nbytes}), ``groups`` ({sublayer: nbytes}), ``total``
        (int) and ``param_refs`` ({dotted path: nbytes}), where ``total`` counts each underlying
        buffer once (views share their owner's bytes) and ``entries``/``groups`` count each view
        at its own size.
    """
    if not isinstance(cache, dict):
        raise TypeError(f"cache must be the dict returned by a *_forward function, got {describe(cache)}")
    arrays = cache_arrays(cache)
    is_param = [is_param_ref(p) for p, _ in arrays]
    param_refs = {p: int(a.nbytes) for (p, a), flag in zip(arrays, is_param) if flag}
    if not include_params:
        arrays = [pa for pa, flag in zip(arrays, is_param) if not flag]
    entries = {p: int(a.nbytes) for p, a in arrays}
    groups: dict = {}
    for p, nbytes in entries.items():
        groups[_group(p)] = groups.get(_group(p), 0) + nbytes
    owners = {id(owner(a)): owner(a) for _, a in arrays}
    total = sum(int(o.nbytes) for o in owners.values())
    return {"entries": entries, "groups": groups, "total": total, "param_refs": param_refs}
