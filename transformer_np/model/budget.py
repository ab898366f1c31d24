r"""Memory estimates made before allocating, and the limit they are checked against.

A 600-byte ``config.json`` can ask for a million layers; ``--batch-size 10**9`` asks for a
batch no machine holds. Every entry point that builds something sized by its input (``init_params``,
``load_pretrained``, a training run and its checkpoint, the gradient-flow study) first estimates
the bytes the work needs from the sizes alone — in O(1), without building any per-layer table —
and refuses with :class:`~transformer_np.errors.ResourceLimitError` when the estimate exceeds the
limit. The message states the estimate, its largest parts, and the limit with where it came from.

The limit, in this order:

1. the ``max_bytes`` argument of :func:`check_memory` (when a caller passes one);
2. the environment variable ``TRANSFORMER_NP_MAX_BYTES`` — an integer number of bytes, optionally
   with a suffix ``K``, ``M``, ``G``, ``T`` (powers of 1000) or ``Ki``, ``Mi``, ``Gi``, ``Ti``
   (powers of 1024), e.g. ``TRANSFORMER_NP_MAX_BYTES=64G``. This is the documented way to raise
   (or lower) the limit, for example to run on swap;
3. otherwise the smallest of what this process can really get: the memory the operating system reports as
   available now (``MemAvailable`` in ``/proc/meminfo`` on Linux, else the free physical pages), the
   address-space limit ``RLIMIT_AS`` (``ulimit -v``) less what the process already maps, and a container's
   cgroup memory limit less what the cgroup already uses — or 8 GiB when none is known. (Comparing with the
   machine's memory alone let a process under a 4 GB limit start work it could not finish: a MemoryError.)

The model of the work (element counts; bytes = elements × itemsize). With T = B·n tokens,
d = d_model, f = d_ff, h heads, N layers (N_p distinct layer parameter sets, 1 when shared):

    parameters       P = embeddings + N_p (4d² + 4d + 2 d f + f + d + 4d) + final LN
    parameter table  ≈ 300 bytes per named array (the dict entry, its name and the array object)
    gradients        P + one layer's parameters (a backward pass)
    optimiser state  P per slot (AdamW: 2, SGD with momentum: 1)
    activations      per layer, kept for the backward: 16 T d + 5 T f + 4 B h n²
                     (inputs and outputs of the sublayers, Q/K/V/context, LayerNorm's x̂, the FFN's
                     pre-activation and activation, scores and attention weights with their
                     dropout masks) — the backward's transients are within this margin

Measured with ``tracemalloc`` (tests/model/test_budget.py) the activation estimate is 1–3× the
peak a forward + backward really allocates for the configurations tested: an estimate errs on
the safe side, and it only decides whether to start, never what is computed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from .._validate import check_float_dtype, check_int, describe
from ..errors import InputValueError, ResourceLimitError
from .config import _layer_param_count, encoder_param_count  # the count is the config's; kept importable here

__all__ = ["ENV_VAR", "MemoryEstimate", "encoder_param_count", "encoder_param_entries", "estimate_encoder",
           "memory_limit", "available_memory", "rlimit_headroom", "cgroup_headroom", "check_memory", "format_bytes"]

ENV_VAR = "TRANSFORMER_NP_MAX_BYTES"
FALLBACK_LIMIT = 8 * 1024 ** 3
TABLE_BYTES_PER_ENTRY = 300
# activation elements kept per layer: ACT_TD·T·d + ACT_TF·T·f + ACT_SCORES·B·h·n²
ACT_TD, ACT_TF, ACT_SCORES = 16, 5, 4
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


def encoder_param_entries(config) -> int:
    """Number of named arrays of ``config`` (the size of the parameter table), in O(1)."""
    n = 16 * (1 if config.share_layers else config.n_layers)
    if config.has_embeddings:
        n += 1 + (config.positional == "learned") + (config.type_vocab_size > 0) + 2 * config.embedding_layer_norm
    return n + 2 * config.use_final_layer_norm


def estimate_encoder(config, dtype=np.float64, batch: int = 0, seq_len: int = 0, *, backward: bool = False,
                     optimizer_slots: int = 0, param_copies: int = 1) -> MemoryEstimate:
    """Estimate the memory of building ``config``'s parameters and (with ``batch``, ``seq_len`` > 0)
    running a forward pass that keeps its caches, plus a backward pass when ``backward``.

    Args:
        config: an :class:`~transformer_np.model.config.EncoderConfig`.
        dtype: float32 or float64, the dtype of parameters and activations.
        batch, seq_len: B and n of the input (0 = parameters only).
        backward: add a gradient of every parameter.
        optimizer_slots: arrays of the parameters' size an optimiser keeps (AdamW 2).
        param_copies: how many copies of the parameters exist at once (e.g. 2 while a file's
            arrays are converted).

    Returns:
        a :class:`MemoryEstimate` with parts "parameters", "parameter table", "gradients",
        "optimiser state", "activations" and "attention maps".
    """
    item = check_float_dtype(dtype).itemsize
    check_int(batch, "batch", minimum=0)
    check_int(seq_len, "seq_len", minimum=0)
    check_int(optimizer_slots, "optimizer_slots", minimum=0)
    check_int(param_copies, "param_copies", minimum=1)
    P = encoder_param_count(config)
    parts = {"parameters": P * item * param_copies,
             "parameter table": encoder_param_entries(config) * TABLE_BYTES_PER_ENTRY,
             # the backward's transients include about one layer's weight gradients on top of the result
             "gradients": (P + _layer_param_count(config.d_model, config.d_ff)) * item if backward else 0,
             "optimiser state": P * item * optimizer_slots}
    if batch and seq_len:
        T = batch * seq_len
        N = config.n_layers
        per_layer = ACT_TD * T * config.d_model + ACT_TF * T * config.d_ff
        parts["activations"] = (N * per_layer + 4 * T * config.d_model) * item
        parts["attention maps"] = N * ACT_SCORES * batch * config.n_heads * seq_len * seq_len * item
    return MemoryEstimate(parts)


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
