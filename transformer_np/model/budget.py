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

The limit and :class:`MemoryEstimate` are the shared base's (``transformer_np._memory``), so that an op
sized by its arguments (``sinusoidal_positional_encoding``) checks them without importing the model; every
name is re-exported here.

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

import numpy as np

# the limit and the estimate live in the shared base (an op sized by its arguments checks them too); re-exported
from .._memory import (  # noqa: F401  (FALLBACK_LIMIT: kept importable here)
    ENV_VAR,
    FALLBACK_LIMIT,
    MemoryEstimate,
    available_memory,
    cgroup_headroom,
    check_memory,
    format_bytes,
    memory_limit,
    rlimit_headroom,
)
from .._validate import check_float_dtype, check_int
from .config import _layer_param_count, encoder_param_count  # the count is the config's; kept importable here

__all__ = ["ENV_VAR", "MemoryEstimate", "encoder_param_count", "encoder_param_entries", "estimate_encoder",
           "memory_limit", "available_memory", "rlimit_headroom", "cgroup_headroom", "check_memory", "format_bytes"]

TABLE_BYTES_PER_ENTRY = 300
# activation elements kept per layer: ACT_TD·T·d + ACT_TF·T·f + ACT_SCORES·B·h·n²
ACT_TD, ACT_TF, ACT_SCORES = 16, 5, 4


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
