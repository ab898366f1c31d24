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

The fingerprint (:func:`fingerprint`) views the array's bytes as 64-bit words and sums them per
row with wrap-around integer arithmetic (one read-only pass, memory bound: ~0.8 ms for the 7 M
parameters of a BERT-base layer in float32, against ~130 ms for that layer's forward — measured
in ``bench``). Changing any single element changes its row's sum exactly (no rounding: unlike
a float sum, ``W[0, 0] += 1e-12`` is seen); any arithmetic update (``*=``, ``+=``, an optimiser
step, assigning new values) changes it except with probability ~2⁻⁶⁴ per row; moving rows is seen
(per-row sums). What it cannot see is a rearrangement *within* one row that keeps the row's
multiset of words (e.g. swapping two entries of one row) — no arithmetic update does that.
Replacing the array in the dict (``params[name] = new``) is seen by identity.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from ..errors import StaleCacheError

__all__ = ["FREED_MESSAGE", "check_not_freed", "reader", "release", "fingerprint", "ParamGuard"]

FREED_MESSAGE = ("this cache was freed by a previous backward with free_cache=True; run the forward again "
                 "(or pass free_cache=False to backpropagate through one cache more than once)")


# ----------------------------------------------------------------------------- freeing
def check_not_freed(cache: dict) -> None:
    """Refuse a cache that a backward with ``free_cache=True`` has already consumed."""
    if cache.get("freed"):
        raise StaleCacheError(FREED_MESSAGE)


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
def fingerprint(a: np.ndarray) -> tuple[np.ndarray, bytes]:
    """Per-row wrap-around sums of ``a``'s bytes read as uint64 words (plus any trailing bytes).

    Exact for any change of a single element; see the module docstring for what it detects."""
    raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)        # the bytes (a view if contiguous)
    n8 = raw.size - raw.size % 8
    words = raw[:n8].view(np.uint64)                                # (nbytes // 8,)
    rows = a.shape[0] if a.ndim > 1 and a.shape[0] and words.size % a.shape[0] == 0 else 1
    return words.reshape(rows, -1).sum(axis=1), raw[n8:].tobytes()   # (rows,) uint64, wraps mod 2⁶⁴


class ParamGuard:
    """Remembers the parameters a forward read, to refuse a backward after any of them changed.

    ``params`` is the dict the forward was given; ``names`` the entries to fingerprint (their
    contents); ``identity_only`` further entries checked for replacement only. ``label`` is how
    the error names the dict (``params`` or ``p``). Stored in the cache as an object (not a dict
    or list), so the cache walkers of :mod:`transformer_np.perf.memory` do not count it.
    """

    __slots__ = ("params", "arrays", "prints", "label")

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
        for name, (sums, tail) in self.prints.items():
            new_sums, new_tail = fingerprint(self.arrays[name])
            if tail != new_tail or not np.array_equal(sums, new_sums):
                raise StaleCacheError(
                    f"{self.label}[{name!r}] was changed in place after the forward that made this cache; "
                    f"its backward would mix the forward's activations with the new values and return "
                    f"wrong gradients. Run the forward again after changing parameters")
