"""Both sides of a comparison, run: the module's copy the framework's side runs (:func:`module_copy`), NumPy's
small pages for the call (:func:`small_pages`), the framework module's forward (:func:`run_framework`), ours
(:func:`run_ours`), and the glue between them — our mask for the sublayer table, the refusal of a padding row whose
gradients would differ with neither side wrong, and our arrays in the framework's layout. A part of
:func:`transformer_np.testing.compare_with_torch`, which calls these in order."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import threading

import numpy as np

from .._validate import describe
from ..errors import InputValueError
from .criterion import _hide_assertion
from .inputs import to_numpy


def _madvise_setter():
    """NumPy's switch for its huge-page advice (``_set_madvise_hugepage``, private but in every NumPy this library
    supports: ``numpy._core`` from 2.0, ``numpy.core`` before), or None."""
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            return getattr(importlib.import_module(name), "_set_madvise_hugepage", None)
        except ImportError:
            continue
    return None


@contextlib.contextmanager
def small_pages():
    """NumPy's huge-page advice off inside the block, restored after (also on an exception).

    On Linux NumPy advises the kernel to back each array of 4 MiB or more with 2 MiB pages. Where the kernel then
    compacts memory to find them at the first touch (``/sys/kernel/mm/transparent_hugepage/defrag`` = madvise, the
    default of many distributions), a comparison made while an earlier one's report is still alive — a loop in a
    test, or the speed script — gets its arrays from fresh pages, and that compaction cost a BERT-base layer's
    comparison 30-60 ms of its 230 (docs/bench_notes.md, "Comparisons"). With small pages the same call took
    220-228 ms; with the earlier report released, 229-240 either way. Only allocations made inside the block are
    affected (another thread's too, for that time): a speed setting, never a value. Overlapping calls (threads)
    count themselves: the first turns the advice off, the last puts back what the first found."""
    setter = _madvise_setter()
    if setter is None:
        yield
        return
    with _PAGES_LOCK:                                   # the first of overlapping calls (threads) turns it off …
        if _PAGES["depth"] == 0:
            _PAGES["previous"] = setter(False)
        _PAGES["depth"] += 1
    try:
        yield
    finally:
        with _PAGES_LOCK:                               # … and the last one puts back what the first found
            _PAGES["depth"] -= 1
            if _PAGES["depth"] == 0:
                setter(_PAGES["previous"])


_PAGES_LOCK = threading.Lock()
_PAGES = {"depth": 0, "previous": None}                 # calls inside small_pages now, and the advice before them


def with_small_pages(fn):
    """``fn`` run inside :func:`small_pages` (its signature and docstring kept)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        __tracebackhide__ = _hide_assertion              # pytest: a disagreement's frames are not the user's concern
        with small_pages():
            return fn(*args, **kwargs)
    return run


def module_copy(module, torch):
    """The copy of ``module`` a comparison runs (the user's module, its gradients, ``requires_grad`` and training
    flags are never changed): a deep copy whose parameters are new leaf tensors on the module's own storage, no
    data copied (copying a BERT-base layer's 28 MB took 7-10 ms, 3-4% of its comparison). Its gradients land on
    its own leaves; ``.to(dtype)`` on it makes new storage for the copy alone; buffers and everything else are
    copied. A TorchScript module is copied whole (its C++ copy does not read Python's memo), and so is a parameter
    made inside ``torch.inference_mode()``. Call under ``torch.no_grad()``."""
    if isinstance(module, torch.jit.ScriptModule):
        return copy.deepcopy(module)
    memo = {}
    for p in module.parameters():
        data = p.detach()
        if data.is_inference():                  # made in inference_mode: no leaf on it outside, so copied
            data = data.clone()
        memo[id(p)] = torch.nn.Parameter(data, requires_grad=p.requires_grad)
    return copy.deepcopy(module, memo)


def run_framework(mod, x_t, kind: str, masks, ids_kwargs, torch):
    """Forward of the module copy; returns the output tensor."""
    if kind == "own":
        out = mod(x_t)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(x_t.shape):
            raise InputValueError(f"module(inputs) must return the (B, n, d) output tensor {tuple(x_t.shape)}, got "
                                  f"{describe(out) if not isinstance(out, torch.Tensor) else tuple(out.shape)}")
        return out
    kpm = None if masks.am is None else torch.from_numpy(masks.am == 0)      # torch's convention: True = padding
    if kind == "mha":
        return mod(x_t, x_t, x_t, key_padding_mask=kpm, need_weights=False, attn_mask=masks.torch_mask,
                   is_causal=masks.is_causal)[0]
    if kind == "torch":
        if isinstance(mod, torch.nn.TransformerEncoderLayer):
            return mod(x_t, src_mask=masks.torch_mask, src_key_padding_mask=kpm, is_causal=masks.is_causal)
        return mod(x_t, mask=masks.torch_mask, src_key_padding_mask=kpm, is_causal=masks.is_causal)
    if kind == "hf_model":
        return mod(**ids_kwargs).last_hidden_state
    from transformers.masking_utils import create_bidirectional_mask

    from ..io.interop import layer_hf_config

    mask4 = None
    if masks.am is not None:
        mask4 = create_bidirectional_mask(config=layer_hf_config(mod), inputs_embeds=x_t,
                                          attention_mask=torch.from_numpy(masks.am))
    out = mod(x_t, attention_mask=mask4)
    return out[0] if isinstance(out, tuple) else out


def run_ours(kind: str, params: dict, config, x, ids, tt, masks, R, backward: bool = True
              ) -> tuple[np.ndarray, dict, np.ndarray | None]:
    """Our forward and backward: (output, parameter gradients, input gradient or None); the forward alone, with
    no gradients ({}, None), when not ``backward``."""
    from ..io.hf_model import hf_backward, hf_forward
    from ..model.stack import encoder_backward, encoder_forward

    if kind == "mha":
        from ..ops.attention import mha_backward, mha_forward
        from ..ops.masks import padding_mask

        mask = masks.extra if masks.extra is not None or masks.am is None else padding_mask(masks.am, x.dtype)
        H, cache = mha_forward(x, params, config.n_heads, mask)
        if not backward:
            return H, {}, None
        dx, grads = mha_backward(R, cache)
        return H, grads, dx
    if kind in ("torch", "own"):
        am = masks.am if masks.extra is None else None                        # extra holds the padding then
        H, cache = encoder_forward(params, config, inputs_embeds=x, attention_mask=am, extra_mask=masks.extra)
    elif kind == "hf_model":
        H, cache = hf_forward(params, config, input_ids=ids, attention_mask=masks.am, token_type_ids=tt)
    else:
        H, cache = hf_forward(params, config, inputs_embeds=x, attention_mask=masks.am)
    if not backward:
        return H, {}, None
    grads = (encoder_backward if kind in ("torch", "own") else hf_backward)(R, cache)
    return H, grads, grads.pop("inputs_embeds", None)


def sublayer_mask(kind: str, masks, dt):
    """Our additive attention mask for the sublayer table (what :func:`run_ours` uses), or None."""
    from ..ops.masks import padding_mask

    if masks.extra is not None:
        return masks.extra
    return None if masks.am is None else padding_mask(masks.am, dt)


def check_no_gradient_at_padding_rows(grad_output, pad_rows: np.ndarray, tables: list[str], ids, am) -> None:
    """torch defines the gradient of an nn.Embedding row at its padding_idx as 0; ours is the true derivative of the
    forward. They agree only when nothing the loss sees depends on the tokens that read that row: those positions
    must be masked out (no other position attends to them) and have a zero upstream gradient. Anything else is
    refused here, with the reason, rather than failing later on that row with no explanation."""
    why = (f"torch defines the gradient of an nn.Embedding row at padding_idx ({' and '.join(tables)}) as 0, while "
           "transformer_np returns the true derivative of the forward (see docs/guide/frameworks.md), so that row's "
           "gradient would differ with neither side wrong")
    live = np.argwhere(pad_rows & (True if am is None else am == 1))
    if live.size:
        b, i = (int(v) for v in live[0])
        raise InputValueError(f"inputs (input_ids) has the padding token {int(ids[b, i])} at position {(b, i)}, "
                              f"which attention_mask does not mask out, so the loss depends on it: {why}. Mark it "
                              "as padding (attention_mask 0 there), or use another token id")
    if grad_output is None:
        return                                            # the default grad_output is 0 at masked positions
    R = to_numpy(grad_output, "grad_output")
    if R.shape[:2] != pad_rows.shape:
        return                                            # the shape error is grad_output()'s to raise
    hit = np.argwhere(pad_rows & np.any(R != 0, axis=-1))
    if hit.size:
        b, i = (int(v) for v in hit[0])
        raise InputValueError(f"grad_output is nonzero at the padded position {(b, i)}, whose token "
                              f"{int(ids[b, i])} reads the padding row: {why}. Give grad_output = 0 at padded "
                              "positions (the default grad_output is)")


def in_framework_layout(tree: dict, row: tuple[str, bool] | None) -> np.ndarray | None:
    """Our array (parameter or gradient) of one framework tensor, in the framework's layout: a transposed view
    for an ``nn.Linear`` weight, torch's stacked [W_Qᵀ; W_Kᵀ; W_Vᵀ] / [b_Q; b_K; b_V] for the fused in_proj;
    None when ours has no such tensor."""
    if row is None:
        return None
    ours, transposed = row
    if "|" in ours:
        base, _, leaves = ours.rpartition(".")
        parts = [tree.get(f"{base}.{leaf}" if base else leaf) for leaf in leaves.split("|")]
        if any(a is None for a in parts):
            return None
        return np.concatenate([a.T for a in parts] if transposed else parts, axis=0)
    a = tree.get(ours)
    if a is None:
        return None
    return a.T if transposed else a
