r"""The encoder's fast inference layer: what :mod:`transformer_np.model.stack` runs on the fast path when
``for_backward=False`` (inference), through :mod:`transformer_np.fast.layer`, kept out of it by role.

* :func:`_layer_infer` — one layer for inference (:func:`_layer_infer_one`: the fast path's inference
  kernels, the residual sums and LayerNorms in the layer's own buffers), on shards of the batch in
  parallel when :func:`_shards` splits it (over :func:`~transformer_np.fast.get_batch_threads`
  threads, for layers of at least ``_SHARD_MIN_FLOPS`` products);
* :func:`_embeddings_infer` — the embedding block for inference with learned positions.

Nothing here checks its arguments (:func:`~transformer_np.model.stack.encoder_forward` and
:func:`~transformer_np.model.stack.encoder_layer_forward` have) and nothing here is public API.
A name is patched where it is looked up at call time: ``_SHARD_MIN_FLOPS``, ``_in_shards`` and
``_layer_infer_one`` in this module; ``_layer_infer`` and ``_embeddings_infer``, called by the engine's layer,
in :mod:`transformer_np.fast.layer` (``bench --profile`` wraps ``stack._embed`` and ``stack._layer_forward``).
Like every module of the engine, it never imports ``model``.
"""

from __future__ import annotations

import numpy as np

from .. import fast as kernels  # looked up at call time (spies on transformer_np.fast's kernels see the layer)
from .ffn import _layernorm_value
from .threads import _chunks, _in_shards, get_batch_threads

# The fast inference layer splits a batch over get_batch_threads() threads (fast/threads.py has the rule and
# the measurements) when every thread gets at least one sequence and the layer has at least _SHARD_MIN_FLOPS
# of products: a split costs ~0.1 ms (handing a shard to a pool thread, waiting for it, OpenBLAS's thread
# count set twice), the time of ~2**24 flops at one thread here; bench shapes have 2**28–2**35.
_SHARD_MIN_FLOPS = 1 << 24


def _sub(p: dict, prefix: str) -> dict:
    """{name[len(prefix):]: array} for the layer's names under ``prefix`` (views, no copies)."""
    k = len(prefix)
    return {name[k:]: a for name, a in p.items() if name.startswith(prefix)}


def _shards(x: np.ndarray, config, dropout: bool) -> list[slice]:
    """The batch slices the inference layer runs on their own threads ([all of x]: no split)."""
    B, n, d = x.shape
    threads = get_batch_threads()
    flops = 2 * B * n * d * (4 * d + 2 * config.d_ff) + 4 * B * n * n * d   # the layer's products
    if dropout or threads < 2 or B < threads or flops < _SHARD_MIN_FLOPS:
        return [slice(0, B)]
    return _chunks(B, threads)


def _batch_part(mask: np.ndarray | None, rows: slice, B: int) -> np.ndarray | None:
    """The part of an additive mask (broadcastable to (B, h, n, n)) for the sequences ``rows``."""
    if mask is None or mask.ndim < 4 or mask.shape[0] != B:
        return mask                                          # broadcast over the batch: whole
    return mask[rows]


def _layer_infer(x: np.ndarray, p: dict, config, mask: np.ndarray | None,
                 training: bool, rng, store_attention: bool) -> tuple[np.ndarray, dict]:
    """:func:`_layer_infer_one`, on shards of the batch in parallel when :func:`_shards` splits it:
    each shard writes its sequences' rows of the output and of A (one (B, h, n, n) array)."""
    parts = _shards(x, config, training and config.dropout > 0)
    if len(parts) == 1:
        return _layer_infer_one(x, p, config, mask, training, rng, store_attention)
    B, n, _ = x.shape
    out = np.empty_like(x)                                                   # (B, n, d)
    A = np.empty((B, config.n_heads, n, n), dtype=x.dtype) if store_attention else None   # (B, h, n, n)

    def shard(i: int) -> None:
        rows = parts[i]
        out[rows] = _layer_infer_one(x[rows], p, config, _batch_part(mask, rows, B), training, rng,
                                     store_attention, None if A is None else A[rows])[0]   # (b, n, d)

    _in_shards(shard, len(parts))
    return out, {"kind": "encoder_layer", "for_backward": False, "fast": True,
                 "norm_position": config.norm_position, "shape": x.shape,
                 "attn": {"kind": "mha", "n_heads": config.n_heads, "for_backward": False,
                          "attn": {"kind": "attention", "weights": A, "for_backward": False}}}


def _layer_infer_one(x: np.ndarray, p: dict, config, mask: np.ndarray | None,
                     training: bool, rng, store_attention: bool,
                     weights_out: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """The fast path's layer for inference: the same sublayers as :func:`_layer_forward`, their
    inference kernels (no cache entry a backward needs, no f'(U)), and the residual sums and LayerNorms
    written in buffers the layer owns (each sublayer's output is a new array; x is never written):

        Post-LN:  a = MHA(x);  a += x;  Z = LN_1(a) in a;  f = FFN(Z);  f += Z;  H = LN_2(f) in f
        Pre-LN:   Y = LN_1(x);  a = MHA(Y);  a += x (= Z);  Y = LN_2(Z);  f = FFN(Y);  f += Z (= H)
    """
    ops = kernels
    attn_p, ffn_p = _sub(p, "attn."), _sub(p, "ffn.")
    drop, eps, h = config.dropout, float(config.layer_norm_eps), config.n_heads
    dropout = training and drop > 0

    def mha(y: np.ndarray) -> tuple[np.ndarray, dict]:
        a, ca = ops.mha_forward(y, attn_p, h, mask, drop, training, rng, store_attention=store_attention,
                                for_backward=False, weights_out=weights_out)   # (B, n, d), a new array
        return (ops.dropout_forward(a, drop, training, rng)[0] if dropout else a), ca

    def ffn(y: np.ndarray) -> np.ndarray:
        f = ops.ffn_forward(y, ffn_p, config.activation, for_backward=False)[0]   # (B, n, d), a new array
        return ops.dropout_forward(f, drop, training, rng)[0] if dropout else f

    if config.norm_position == "post":
        a, ca = mha(x)
        a += x                                                                # H + MHA(H)
        z = _layernorm_value(a, p["ln1.gamma"], p["ln1.beta"], eps, out=a)   # Z
        f = ffn(z)
        f += z                                                                # Z + FFN(Z)
        out = _layernorm_value(f, p["ln2.gamma"], p["ln2.beta"], eps, out=f)  # H^(ℓ)
    else:
        a, ca = mha(_layernorm_value(x, p["ln1.gamma"], p["ln1.beta"], eps))
        a += x                                                                # Z = H + MHA(LN(H))
        f = ffn(_layernorm_value(a, p["ln2.gamma"], p["ln2.beta"], eps))
        f += a                                                                # H^(ℓ) = Z + FFN(LN(Z))
        out = f
    return out, {"kind": "encoder_layer", "for_backward": False, "fast": True,
                 "norm_position": config.norm_position, "shape": x.shape, "attn": ca}


def _embeddings_infer(p: dict, ids: np.ndarray, token_type_ids: np.ndarray | None, eps: float,
                      use_layer_norm: bool) -> np.ndarray:
    """The embedding block for inference with learned positions (fast path, nothing kept for a backward):
    the sums of :func:`~transformer_np.ops.embeddings._embeddings_forward`, in its order and with its
    values, in one array — E_tok[ids], then + E_pos[0 … n−1] broadcast over the batch (instead of a
    gathered (B, n, d) copy), then + E_type[t] (one row broadcast when every t is the same) — and
    :func:`~transformer_np.fast.ffn._layernorm_value` in place (the plain LayerNorm also builds x̂
    and its cache: 1.2 of the 2 ms of a MiniLM batch of 32 × 22 tokens)."""
    B, n = ids.shape
    x = p["word"][ids]                                                           # (B, n, d), ours
    x += p["position"][:n]                                                       # E_pos[0 … n−1], (n, d)
    if "token_type" in p:
        tt = token_type_ids
        if tt is None or not tt.size or (tt.min() == tt.max()):
            x += p["token_type"][0 if tt is None or not tt.size else int(tt.flat[0])]   # one row, (d,)
        else:
            x += p["token_type"][tt]                                             # (B, n, d)
    if use_layer_norm:
        _layernorm_value(x, p["ln.gamma"], p["ln.beta"], eps, out=x)
    return x
