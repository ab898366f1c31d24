"""The rows a benchmark compares: the shapes, dtypes and modes, and one encoder layer built twice.

:func:`build_pair` builds ``torch.nn.TransformerEncoderLayer`` and our Post-LN layer with the same weights
and inputs and returns one call of each (what they run is described in :mod:`transformer_np.perf.bench`);
:func:`parse_shape` reads a ``--shape``. Used by the bench's rows, the memory measurement's and the busy
study's child processes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .machine import _import_torch

__all__ = ["SHAPES", "DTYPES", "MODES", "parse_shape", "build_pair"]


#: name -> (batch B, sequence length n, d_model, heads h, d_ff)
SHAPES = {
    "bert-base": (8, 128, 768, 12, 3072),
    "minilm": (32, 16, 384, 12, 1536),
    "attn-512": (2, 512, 64, 4, 256),     # attention-bound: the (n, n) scores dominate the (n, d) work
    "long": (2, 2048, 64, 4, 256),
}
DTYPES = ("float32", "float64")
MODES = ("fwd", "fwd+bwd")


def parse_shape(text: str) -> tuple[str, tuple[int, int, int, int, int]]:
    """A shape name from :data:`SHAPES` or a custom ``B,n,d,h,d_ff`` (e.g. ``2,8,16,2,32``)."""
    if text in SHAPES:
        return text, SHAPES[text]
    parts = text.split(",")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != 5 or min(dims) < 1 or dims[2] % dims[3]:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)} or 'B,n,d,h,d_ff' with positive ints "
                         f"and h dividing d, got {text!r}")
    return text, dims  # type: ignore[return-value]


# ----------------------------------------------------------------------------- the two sides
def build_pair(dims, dtype: str, mode: str, seed: int = 0, free_cache: bool = False,
               store_attention: bool = True) -> tuple[Callable, Callable, object]:
    """``(numpy_call, torch_call, config)`` running one layer in ``mode`` on identical weights/inputs
    (``free_cache`` is passed to the NumPy backward, ``store_attention`` to the NumPy forward)."""
    kw = {} if store_attention else {"store_attention": False}
    torch = _import_torch()
    from ..io.interop import from_torch
    from ..model.params import sub_params
    from ..model.stack import encoder_layer_backward, encoder_layer_forward

    B, n, d, h, f = dims
    tdt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(d, h, f, dropout=0.0, activation="gelu", batch_first=True,
                                             dtype=tdt)
    config, params = from_torch(layer)
    p = sub_params(params, "layers.0.")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, n, d)).astype(dtype)                  # H^(ℓ−1): (B, n, d)
    dy = rng.standard_normal((B, n, d)).astype(dtype)                 # ∂L/∂H^(ℓ): (B, n, d)
    xt, dyt = torch.from_numpy(x.copy()), torch.from_numpy(dy.copy())

    if mode == "fwd":
        layer.eval()

        def np_call():
            # inference, as torch's side runs under no_grad: no cache for a backward (for_backward=False);
            # the attention weights are still kept unless store_attention=False (the recompute rows)
            return encoder_layer_forward(x, p, config, for_backward=False, **kw)

        def torch_call():
            # op-by-op eager, like ours; the switch is global to torch: restore it after the call
            was_enabled = torch.backends.mha.get_fastpath_enabled()
            torch.backends.mha.set_fastpath_enabled(False)
            try:
                with torch.no_grad():
                    return layer(xt)
            finally:
                torch.backends.mha.set_fastpath_enabled(was_enabled)
    else:
        layer.train()                                                 # dropout is 0: only autograd differs
        xt.requires_grad_(True)

        def np_call():
            _, cache = encoder_layer_forward(x, p, config, **kw)
            return encoder_layer_backward(dy, cache, free_cache=free_cache)

        def torch_call():
            layer.zero_grad(set_to_none=True)
            xt.grad = None
            layer(xt).backward(dyt)
    return np_call, torch_call, config
