r"""The memory limit every entry point checks before allocating, and the estimate it checks.

Part of the shared base (below :mod:`transformer_np.ops`), so that an op sized by its arguments
(``sinusoidal_positional_encoding``) can refuse before allocating without importing :mod:`transformer_np.model`;
:mod:`transformer_np.model.budget` re-exports every name here with the encoder's estimates, and its docstring
says where the limit comes from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ._validate import check_int, describe
from .errors import InputValueError, ResourceLimitError

ENV_VAR = "TRANSFORMER_NP_MAX_BYTES"
FALLBACK_LIMIT = 8 * 1024 ** 3
_SUFFIXES = {"": 1, "K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12,
             "KI": 2 ** 10, "MI": 2 ** 20, "GI": 2 ** 30, "TI": 2 ** 40}


def format_bytes(n: float) -> str:
    """``1536`` → ``"1.5 KiB"``; powers of 1024."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} EiB"  # pragma: no cover - unreachable


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a piece of work needs, by part (``parts``: name → bytes); ``total`` is their sum."""

    parts: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return int(sum(self.parts.values()))

    def __add__(self, other: MemoryEstimate) -> MemoryEstimate:
        parts = dict(self.parts)
        for k, v in other.parts.items():
            parts[k] = parts.get(k, 0) + v
        return MemoryEstimate(parts)

    def describe(self, most: int = 3) -> str:
        """``"12.3 GiB (parameters 6.1 GiB, optimiser state 6.1 GiB, …)"`` — the largest parts first."""
        big = sorted(((v, k) for k, v in self.parts.items() if v > 0), reverse=True)
        inner = ", ".join(f"{k} {format_bytes(v)}" for v, k in big[:most])
        more = ", …" if len(big) > most else ""
        return f"{format_bytes(self.total)}" + (f" ({inner}{more})" if inner else "")


def available_memory() -> int | None:
    """Bytes of memory available now (Linux ``MemAvailable``; else free physical pages), None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


_NO_LIMIT = 1 << 60                # cgroup v1 writes 2^63 − 4096 for "no limit"


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read(64).strip()
    except (OSError, ValueError):
        return None
    return int(text) if text.isdigit() else None


def _vm_size() -> int:
    """Bytes this process maps now (VmSize), 0 if unknown."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def rlimit_headroom() -> int | None:
    """Bytes this process may still map under ``RLIMIT_AS`` (its soft limit less VmSize), None if unlimited."""
    try:
        import resource
    except ImportError:               # not on every platform
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    return max(soft - _vm_size(), 0)


def cgroup_headroom() -> int | None:
    """Bytes the cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) still allows, None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit = _read_int(limit_file)
        if limit is not None and limit < _NO_LIMIT:
            return max(limit - (_read_int(usage_file) or 0), 0)
    return None


def _parse_bytes(text: str) -> int:
    t = text.strip().upper().replace("_", "")
    if t.endswith("B"):
        t = t[:-1]
    num = t.rstrip("KMGTI")
    suffix = t[len(num):]
    if suffix not in _SUFFIXES or not num.isdigit():
        raise InputValueError(f"{ENV_VAR} must be a positive number of bytes such as 8000000000, 8G or 16GiB, "
                              f"got {text!r}")
    value = int(num) * _SUFFIXES[suffix]
    if value <= 0:
        raise InputValueError(f"{ENV_VAR} must be positive, got {text!r}")
    return value


def memory_limit(max_bytes: int | None = None) -> tuple[int, str]:
    """``(limit in bytes, where it comes from)``: ``max_bytes``, else ``$TRANSFORMER_NP_MAX_BYTES``,
    else the smallest of the available memory, the RLIMIT_AS headroom and the cgroup headroom (else 8 GiB)."""
    if max_bytes is not None:
        check_int(max_bytes, "max_bytes", minimum=1)
        return int(max_bytes), "max_bytes"
    env = os.environ.get(ENV_VAR)
    if env is not None and env.strip():
        return _parse_bytes(env), f"{ENV_VAR}={env.strip()}"
    known = [(v, name) for v, name in (
        (available_memory(), "the available memory"),
        (rlimit_headroom(), "this process's address-space limit (RLIMIT_AS, ulimit -v) less what it maps"),
        (cgroup_headroom(), "the cgroup's memory limit less what the cgroup uses")) if v is not None]
    if known:
        value, name = min(known)
        return value, f"{name}; set {ENV_VAR} to change the limit"
    return FALLBACK_LIMIT, f"the default, as the available memory is unknown; set {ENV_VAR} to change it"


def check_memory(estimate: MemoryEstimate, what: str, max_bytes: int | None = None) -> MemoryEstimate:
    """Raise :class:`ResourceLimitError` when ``estimate.total`` exceeds :func:`memory_limit`; else
    return ``estimate``. ``what`` names the work in the message ("init_params", "train", …)."""
    if not isinstance(estimate, MemoryEstimate):
        raise TypeError(f"estimate must be a MemoryEstimate, got {describe(estimate)}")
    limit, source = memory_limit(max_bytes)
    if estimate.total > limit:
        raise ResourceLimitError(f"{what} would need an estimated {estimate.describe()}, more than the limit of "
                                 f"{format_bytes(limit)} ({source}); nothing was allocated")
    return estimate
