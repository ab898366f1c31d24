"""Argument checks shared by the public functions.

Every public entry point checks its arguments once, at the boundary, and raises an
:class:`~transformer_np.errors.InputTypeError` (a ``TypeError``: wrong kind of thing),
:class:`~transformer_np.errors.InputValueError` (a ``ValueError``: right kind, wrong shape or
value) or :class:`~transformer_np.errors.NonFiniteError` (NaN/inf where finite numbers are
required) whose message names the argument, what was expected and what was received.
Internal calls (the encoder calling ops, ops calling ops, the fast path) do not check again.
The helpers below exist so those messages read the same everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .errors import InputTypeError, InputValueError, NonFiniteError

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def describe(x: Any) -> str:
    """A short description of a received value for an error message."""
    if isinstance(x, np.ndarray):
        return f"array of shape {x.shape} and dtype {x.dtype}"
    if x is None:
        return "None"
    text = repr(x)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(x).__name__} {text}"


def as_float_array(x: Any, name: str, ndim: int | Sequence[int] | None = None,
                   dtype: np.dtype | None = None, finite: bool = True) -> np.ndarray:
    """Check that ``x`` is a float32/float64 ndarray of the given rank (optionally
    of the given dtype) with only finite values, and return it unchanged."""
    if not isinstance(x, np.ndarray):
        raise InputTypeError(f"{name} must be a numpy.ndarray of float32 or float64, got {describe(x)}")
    if x.dtype not in FLOAT_DTYPES:
        raise InputTypeError(f"{name} must have dtype float32 or float64, got dtype {x.dtype}")
    if dtype is not None and x.dtype != np.dtype(dtype):
        raise InputTypeError(f"{name} must have dtype {np.dtype(dtype)} (the dtype of the other "
                        f"operands), got dtype {x.dtype}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.ndim not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise InputValueError(f"{name} must have {want} dimensions, got shape {x.shape}")
    if finite and not all_finite(x):
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        raise NonFiniteError(f"{name} must contain only finite values, got {bad} NaN/inf entries")
    return x


def all_finite(x: np.ndarray) -> bool:
    """True when no entry is NaN or ±inf.

    Fast path: NaN and inf propagate through a sum (inf − inf = NaN), so a finite sum proves
    every entry finite in one read-only pass; only a sum that overflows (huge but finite
    entries) or is non-finite needs the elementwise check.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.sum(x)):
            return True
    return bool(np.all(np.isfinite(x)))


def check_shape(x: np.ndarray, name: str, shape: Sequence[int | None]) -> None:
    """``shape`` may contain ``None`` for "any size" on that axis."""
    ok = x.ndim == len(shape) and all(s is None or s == t for s, t in zip(shape, x.shape))
    if not ok:
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise InputValueError(f"{name} must have shape {want}, got shape {x.shape}")


def as_int_array(x: Any, name: str, ndim: int | None = None) -> np.ndarray:
    """Accept an integer ndarray (or nested list of ints) and return an int64 array."""
    if isinstance(x, (list, tuple)):
        try:
            x = np.asarray(x)
        except ValueError as e:  # ragged lists
            raise InputValueError(f"{name} must be a rectangular array of integers, got a ragged "
                             f"{type(x).__name__}") from e
    if not isinstance(x, np.ndarray):
        raise InputTypeError(f"{name} must be a numpy.ndarray of integers, got {describe(x)}")
    if x.dtype == bool or not np.issubdtype(x.dtype, np.integer):
        raise InputTypeError(f"{name} must have an integer dtype, got dtype {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise InputValueError(f"{name} must have {ndim} dimensions, got shape {x.shape}")
    if x.dtype.kind == "u" and x.size and x.max() > np.iinfo(np.int64).max:
        raise InputValueError(f"{name} has values too large for an index, got {int(x.max())}")
    return x.astype(np.int64, copy=False)


def check_int(x: Any, name: str, minimum: int | None = None, maximum: int | None = None,
              allow_none: bool = False) -> None:
    if x is None and allow_none:
        return
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise InputTypeError(f"{name} must be an int, got {describe(x)}")
    if minimum is not None and x < minimum:
        raise InputValueError(f"{name} must be >= {minimum}, got {x}")
    if maximum is not None and x > maximum:
        raise InputValueError(f"{name} must be <= {maximum}, got {x}")


def check_float(x: Any, name: str, minimum: float | None = None, maximum: float | None = None,
                min_inclusive: bool = True, max_inclusive: bool = True) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise InputTypeError(f"{name} must be a number, got {describe(x)}")
    if not np.isfinite(x):
        raise NonFiniteError(f"{name} must be finite, got {x}")
    if minimum is not None and (x < minimum or (x == minimum and not min_inclusive)):
        op = ">=" if min_inclusive else ">"
        raise InputValueError(f"{name} must be {op} {minimum}, got {x}")
    if maximum is not None and (x > maximum or (x == maximum and not max_inclusive)):
        op = "<=" if max_inclusive else "<"
        raise InputValueError(f"{name} must be {op} {maximum}, got {x}")


def check_choice(x: Any, name: str, choices: Iterable[Any]) -> None:
    choices = tuple(choices)
    if not isinstance(x, str) or x not in choices:
        raise InputValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {x!r}")


def mismatch_detail(missing: Sequence[str], unexpected: Sequence[str], most: int = 8) -> str:
    """"missing [...]; unexpected [...]" for a set of names that does not match what is expected
    (at most ``most`` of each listed); empty when both are empty."""
    parts = []
    for label, names in (("missing", missing), ("unexpected", unexpected)):
        if names:
            parts.append(f"{label} {list(names[:most])}{' …' if len(names) > most else ''}")
    return "; ".join(parts)


def check_float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """``dtype`` must name float32 or float64; returns it as a ``np.dtype``."""
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise InputTypeError(f"{name} must be float32 or float64, got {dtype!r}") from e
    if dt not in FLOAT_DTYPES:
        raise InputTypeError(f"{name} must be float32 or float64, got {dt}")
    return dt


def check_bool(x: Any, name: str) -> None:
    if not isinstance(x, (bool, np.bool_)):
        raise InputTypeError(f"{name} must be a bool, got {describe(x)}")


def check_rng(rng: Any, name: str = "rng") -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise InputTypeError(f"{name} must be a numpy.random.Generator (e.g. np.random.default_rng(0)), "
                        f"got {describe(rng)}")
    return rng


def check_cache(cache: Any, name: str, kind: str) -> dict:
    """Backward functions take the cache their forward returned; catch mix-ups early."""
    if not isinstance(cache, dict) or cache.get("kind") != kind:
        if isinstance(cache, dict) and "kind" in cache:
            got = f"the cache of {cache['kind']}_forward"
        else:
            got = describe(cache)
        raise InputTypeError(f"{name} must be the cache returned by {kind}_forward, got {got}")
    return cache


def check_dout(dout: Any, name: str, like: tuple[int, ...], finite: bool = False) -> np.ndarray:
    """Upstream gradients must match the forward output's shape exactly: no broadcasting.

    Finiteness is checked where the gradient enters from outside (``finite=True``, e.g. the
    stack's dH); inside the stack each op would otherwise re-scan every intermediate
    gradient, and an overflow there is reported once, by the stack, with its cause."""
    x = as_float_array(dout, name, finite=finite)
    if x.shape != tuple(like):
        raise InputValueError(f"{name} must have the shape of the forward output {tuple(like)}, "
                         f"got shape {x.shape}")
    return x
