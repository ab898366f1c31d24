r"""The cache protocol: what a forward hands its backward, and when a cache can no longer be used.

Every ``x_forward(...)`` returns ``(out, cache)``: a dict tagged with ``cache["kind"]`` that holds
exactly what ``x_backward(dout, cache)`` needs (CS231n style). Two things can make a cache
unusable, and both raise :class:`~transformer_np.errors.StaleCacheError`:

* **Freed.** A backward with ``free_cache=True`` removes each entry as it reads it (so its arrays
  are released as soon as the step that needs them is done, as autograd frees a saved tensor
  after its node's backward). One mechanism does it everywhere: :func:`reader` returns
  ``take(key)``, which reads ``cache[key]`` — or, when freeing, pops it — and marks the cache
  ``"freed"``; :func:`check_not_freed` refuses a freed cache. :func:`release` frees a whole cache
  at once (the plain path's composite ops, which keep nothing to free mid-way).

* **Stale.** A parameter changed between the forward and its backward: the backward would mix the
  forward's activations with the new weights and return gradients of no function at all (PyTorch
  refuses this case with its tensor version counters). NumPy arrays have no version counter, so
  :class:`ParamGuard` records, at the forward, each parameter's array object and a fingerprint of
  its contents, and :meth:`ParamGuard.check` compares both before the backward starts.

Why fingerprints, not read-only arrays. Marking the parameters read-only while a cache is alive
would cost nothing, but it forbids legitimate code: a training loop keeps the last cache in a
variable while the optimiser updates the parameters in place, and an inference cache kept in a
notebook would block every later edit — with NumPy's "assignment destination is read-only",
naming no parameter. PyTorch allows the change and refuses only the stale *backward*; the
fingerprint gives the same behaviour.

The fingerprint (:func:`fingerprint`) of a matrix W (d_in, d_out) is the vector rᵀW of its
columns' weighted sums, with fixed pseudo-random weights r ∈ [1, 2) (one per row), in W's dtype:
one read-only pass (``np.einsum``, single-threaded, no temporary), ~0.8 ms for the 7 M
parameters of a BERT-base layer in float32, against ~130 ms for that layer's forward. Every
column has its own sum and every row its own weight, so scaling, sign flips, zeroing, an
optimiser step, new values, and swapping rows *or* columns all change it. A vector (bias, γ, β)
is fingerprinted by a copy: any change is seen exactly. What a matrix fingerprint cannot see is
a change below its own rounding: an entry moved by less than about √d_in · ε times the size of
its column's entries (ε = 6e-8 in float32, 1.1e-16 in float64; e.g. one ulp of one entry) — a
change whose effect on the gradients is of the order of the backward's own rounding error.
(A wrap-around integer sum of the raw bits would see one-ulp changes, but not ``W *= -1`` when
the rows have an even length; a plain float sum would not see two entries swapped.)
Replacing the array in the dict (``params[name] = new``) is seen by identity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..errors import InputValueError, StaleCacheError

__all__ = ["FREED_MESSAGE", "check_not_freed", "check_for_backward", "reader", "release", "fingerprint", "ParamGuard"]

FREED_MESSAGE = ("this cache was freed by a previous backward with free_cache=True; run the forward again "
                 "(or pass free_cache=False to backpropagate through one cache more than once)")


# ----------------------------------------------------------------------------- freeing
def check_not_freed(cache: dict) -> None:
    """Refuse a cache that a backward with ``free_cache=True`` has already consumed."""
    if cache.get("freed"):
        raise StaleCacheError(FREED_MESSAGE)


def check_for_backward(cache: dict, forward: str) -> None:
    """Refuse an inference cache (made with ``for_backward=False``): it keeps nothing a backward needs."""
    if cache.get("for_backward") is False:
        raise InputValueError(f"this cache was made by {forward}(..., for_backward=False), for inference: it keeps "
                              f"nothing a backward needs. Run the forward again with for_backward=True (the "
                              f"default) to take a backward")


# ----------------------------------------------------------------------------- the engine's caches
#: the speed engine's backwards for the caches of its own layout, by name (``"mha_backward"``, …): filled by
#: :mod:`transformer_np.fast` when it is imported — the textbook ops never import the engine, and an engine
#: cache exists only once the engine has run.
ENGINE_BACKWARDS: dict[str, Callable] = {}


def engine_backward(backward: str) -> Callable:
    """The engine's ``backward`` (e.g. ``"mha_backward"``), for a cache of the engine's own layout that was
    passed to the textbook backward of that name."""
    try:
        return ENGINE_BACKWARDS[backward]
    except KeyError:     # only a hand-made cache gets here: the engine registers itself before it makes one
        raise InputValueError(f"cache has the speed engine's layout, but transformer_np.fast.{backward} is not "
                              f"loaded: import transformer_np.fast, or pass the cache of the textbook forward") \
            from None


def reader(cache: dict, free_cache: bool) -> Callable[[str], Any]:
    """``take(key)`` for a backward: ``cache[key]``, or — with ``free_cache`` — ``cache.pop(key)``,
    so the entry's arrays are released as soon as the step that reads them returns. Marks the
    cache freed (a second backward then raises :class:`StaleCacheError`)."""
    check_not_freed(cache)
    if free_cache:
        cache["freed"] = True
        return cache.pop
    return cache.__getitem__


def release(cache: dict) -> None:
    """Free a whole cache at once: drop every entry but its ``kind`` and mark it freed."""
    kind = cache.get("kind")
    cache.clear()
    cache.update(kind=kind, freed=True)


# ----------------------------------------------------------------------------- stale parameters
_WEIGHTS: dict = {}   # (rows, dtype) -> r: the fixed weights of :func:`fingerprint`


def _weights(rows: int, dtype: np.dtype) -> np.ndarray:
    key = (rows, np.dtype(dtype))
    if key not in _WEIGHTS:
        _WEIGHTS[key] = (1.0 + np.random.default_rng(rows).random(rows)).astype(dtype)   # (rows,) in [1, 2)
    return _WEIGHTS[key]


def fingerprint(a: np.ndarray) -> np.ndarray:
    """rᵀ A for a matrix (A's leading axis against fixed weights r), a copy of a vector or scalar.

    See the module docstring for what it detects and what it cannot."""
    if a.ndim < 2:
        return a.copy()
    A = a.reshape(a.shape[0], -1)                                   # (rows, cols) a view if a is contiguous
    return np.einsum("i,ij->j", _weights(A.shape[0], a.dtype), A)   # (cols,)


class ParamGuard:
    """Remembers the parameters a forward read, to refuse a backward after any of them changed.

    ``params`` is the dict the forward was given; ``names`` the entries to fingerprint (their
    contents); ``identity_only`` further entries checked for replacement only. ``label`` is how
    the error names the dict (``params`` or ``p``). Stored in the cache as an object (not a dict
    or list), so the cache walkers of :mod:`transformer_np.perf.memory` do not count it.
    """

    __slots__ = ("arrays", "label", "params", "prints")

    def __init__(self, params: dict, names: Iterable[str], identity_only: Iterable[str] = (),
                 label: str = "params"):
        self.params = params
        self.label = label
        names = tuple(names)
        self.arrays = {n: params[n] for n in (*names, *identity_only)}
        self.prints = {n: fingerprint(params[n]) for n in names}

    def check(self) -> None:
        """Raise :class:`StaleCacheError` naming the first parameter replaced or changed in place."""
        for name, a in self.arrays.items():
            if self.params.get(name) is not a:
                raise StaleCacheError(
                    f"{self.label}[{name!r}] is no longer the array the forward used (the entry was replaced "
                    f"or removed after the forward); its backward would mix the forward's activations with "
                    f"other weights. Run the forward again with the current parameters")
        for name, before in self.prints.items():
            if not np.array_equal(fingerprint(self.arrays[name]), before, equal_nan=True):
                raise StaleCacheError(
                    f"{self.label}[{name!r}] was changed in place after the forward that made this cache; "
                    f"its backward would mix the forward's activations with the new values and return "
                    f"wrong gradients. Run the forward again after changing parameters")
