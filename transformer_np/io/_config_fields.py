"""Typed, range-checked reads of a Hugging Face ``config.json`` dict (split from :mod:`transformer_np.io.families`).

Every failure is a :class:`~transformer_np.errors.ModelConfigError` naming the file (``source``), the
field, what was expected and what was received (in JSON's words: "the boolean true", "null", ...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._validate import describe
from ..errors import ModelConfigError

_INT_MAX = 2**31 - 1          # sizes beyond an int32 index are not a real model
_MISSING = object()


def _json_value(v: Any) -> str:
    """How a received config value reads in an error message (in JSON's words)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"the boolean {'true' if v else 'false'}"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return f"the number {v!r}"
    if isinstance(v, int):
        return f"the integer {v}"
    if isinstance(v, str):
        text = v if len(v) <= 40 else v[:37] + "..."
        return f"the string {text!r}"
    if isinstance(v, (list, tuple)):
        return f"a list of {len(v)} items"
    if isinstance(v, Mapping):
        return f"an object with {len(v)} keys"
    return describe(v)


class _Fields:
    """Typed, range-checked reads of a config dict; every failure names ``source`` and the field."""

    def __init__(self, hf: Mapping, source: str):
        self.hf, self.source = hf, source

    def _fail(self, key: str, expected: str, value: Any) -> ModelConfigError:
        return ModelConfigError(f"{self.source} field {key!r} must be {expected}, got {_json_value(value)}")

    def _get(self, key: str, default: Any) -> Any:
        if key in self.hf:
            return self.hf[key]
        if default is _MISSING:
            raise ModelConfigError(f"{self.source} is missing the field {key!r} (required for "
                                   f"model_type {self.hf.get('model_type', 'bert')!r})")
        return default

    def int(self, key: str, default: Any = _MISSING, minimum: int = 1, maximum: int = _INT_MAX,
            allow_none: bool = False) -> int | None:
        v = self._get(key, default)
        if v is None and allow_none:
            return None
        expected = f"an integer in [{minimum}, {maximum}]" + (" or null" if allow_none else "")
        if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= maximum:
            raise self._fail(key, expected, v)
        return int(v)

    def float(self, key: str, default: Any = _MISSING, minimum: float = 0.0, maximum: float = math.inf,
              min_inclusive: bool = True, max_inclusive: bool = True) -> float:
        v = self._get(key, default)
        lo, hi = ("[" if min_inclusive else "("), ("]" if max_inclusive else ")")
        expected = f"a finite number in {lo}{minimum:g}, {maximum:g}{hi}"
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self._fail(key, expected, v)
        below = v < minimum or (v == minimum and not min_inclusive)
        above = v > maximum or (v == maximum and not max_inclusive)
        if below or above:
            raise self._fail(key, expected, v)
        return float(v)

    def choice(self, key: str, choices: Mapping | tuple, default: Any = _MISSING) -> str:
        v = self._get(key, default)
        if not isinstance(v, str) or v not in choices:
            raise self._fail(key, "one of " + ", ".join(repr(c) for c in sorted(choices)), v)
        return v

    def false(self, key: str, why: str) -> None:
        """A boolean flag that must be false (absent counts as false)."""
        v = self._get(key, False)
        if not isinstance(v, bool):
            raise self._fail(key, "a boolean (true/false)", v)
        if v:
            raise ModelConfigError(f"{self.source} field {key!r} is true: {why}")


