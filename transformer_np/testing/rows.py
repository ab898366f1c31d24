r"""Query rows with no key to attend to, left out of a comparison (a part of :func:`compare_with_torch`: import from
:mod:`transformer_np.testing`).

A query row whose every key is hidden has no defined attention output: the softmax of a row of −∞ is 0/0. It
happens only at padding, in two setups real batches have:

* ModernBERT's local attention: a padded query whose window (|i − j| ≤ w, w = ``local_attention // 2``) holds only
  padding keys — a padded tail longer than w. ModernBERT-base's window of 128 (w = 64) with 100 pads: the last 36
  positions;
* a causal mask with padding on the left: a padded query before the first real token sees only padding.

There the frameworks differ among themselves: torch's ``scaled_dot_product_attention`` returns 0, transformers'
eager attention in float32 a uniform row (the mask is the dtype's most negative finite number, as ours is), and in
float64 NaN (its softmax runs in float32, where float64's most negative number is −∞). So these rows are left out of
the comparison by default, and listed in the report's notes (sequence and positions):

* the output and the input gradient are compared on the other rows only (both sides read 0 on the left-out rows in
  the report's arrays);
* the upstream gradient is 0 on them, so neither backward carries them into the gradients: nothing real depends on
  a padded row (it is hidden as a key everywhere), and its own upstream gradient is 0;
* when the framework's own run is still not finite (transformers' eager float64: 0·NaN in its backward carries the
  NaN of those rows into every gradient, and a later layer's Q Kᵀ into real tokens), it runs again with each
  left-out row given its own position as a key in the 4-d masks its layers receive — only those rows change, and
  they are not compared — and the notes say what its own run returned.

A query with no key at a *real* token (a custom mask that hides every key from it) is refused, as before: its value
reaches every later position.
"""

from __future__ import annotations

import numpy as np

# ----------------------------------------------------------------------------- which rows


def window_rows(am: np.ndarray | None, window: int, n_sliding: int) -> np.ndarray | None:
    """(B, n) True at padded queries whose sliding window (|i − j| ≤ ``window``) holds no real key, or None when
    there is no padding or no sliding layer."""
    if am is None or not n_sliding:
        return None
    real = (am == 1).astype(np.int64)                                    # (B, n)
    n = am.shape[1]
    c = np.concatenate([np.zeros((am.shape[0], 1), np.int64), np.cumsum(real, axis=1)], axis=1)   # (B, n + 1)
    i = np.arange(n)
    lo, hi = np.clip(i - window, 0, n), np.clip(i + window + 1, 0, n)    # keys [lo, hi) of each query
    seen = c[:, hi] - c[:, lo]                                           # real keys in each window (B, n)
    rows = (seen == 0) & (am == 0)
    return rows if rows.any() else None


def mask_rows(extra: np.ndarray | None, am: np.ndarray | None, B: int, n: int) -> np.ndarray | None:
    """(B, n) True where a query has no key in some head once ``extra`` (an additive mask broadcastable to
    (B, h, n, n): −∞ or the dtype's min blocks) and the padding ``am`` are combined; None when there is none."""
    if extra is None:
        return None
    blocked = np.isneginf(extra) | (extra <= np.finfo(extra.dtype).min)
    if am is not None:
        blocked = blocked | (am == 0)[:, None, None, :]                  # (B, h|1, n, n)
    rows = np.broadcast_to(blocked.all(axis=-1).any(axis=1), (B, n))     # any head: the row is a mix of it
    return np.array(rows) if rows.any() else None


def modernbert_rows(config, am: np.ndarray | None) -> tuple[np.ndarray | None, str]:
    """The left-out rows of a ModernBERT config (its ``modernbert`` arch) with padding ``am``, and why."""
    arch = getattr(config, "modernbert", None)
    if arch is None or am is None:
        return None, ""
    n_sliding = sum(t == "sliding" for t in arch.layer_types)
    if arch.window >= am.shape[1] - 1:
        n_sliding = 0                                                    # the window covers every key
    why = (f"padded query rows whose sliding window (local_attention = {arch.local_attention}: |i - j| <= "
           f"{arch.window}) holds only padding")
    return window_rows(am, arch.window, n_sliding), why


def describe_rows(rows: np.ndarray) -> str:
    """'sequence 1: positions 192–227 (36 rows)' for every sequence with left-out rows (``rows`` (B, n), whatever the
    module's layout: sequence b is the input's batch index b)."""
    parts = []
    for b in np.flatnonzero(rows.any(axis=1)):
        idx = np.flatnonzero(rows[b])
        runs, start = [], idx[0]
        for k in range(1, len(idx) + 1):
            if k == len(idx) or idx[k] != idx[k - 1] + 1:
                end = idx[k - 1]
                runs.append(f"{start}" if start == end else f"{start}–{end}")
                if k < len(idx):
                    start = idx[k]
        parts.append(f"sequence {int(b)}: position{'s' if len(idx) > 1 else ''} {', '.join(runs)} "
                     f"({len(idx)} row{'s' if len(idx) > 1 else ''})")
    return "; ".join(parts)


def note(rows: np.ndarray, why: str) -> str:
    return (f"left out of the comparison: {why}, which have no key to attend to (their attention output is "
            f"undefined: torch returns 0 there, transformers' eager attention a uniform row or NaN) — "
            f"{describe_rows(rows)}. Their output and input gradient are not compared and the upstream "
            "gradient is 0 on them, so neither backward carries them (nothing else depends on a padded row)")


def left_out(config, masks, R: np.ndarray, batch_first: bool, notes: list) -> tuple[np.ndarray | None, np.ndarray]:
    """The rows of one comparison to leave out (B, n) or None — ModernBERT's window, else the masks' padded queries
    with no key (``masks.dead``) — and R with 0 on them; the notes say which, and whether a given R was nonzero
    there."""
    left, why = modernbert_rows(config, masks.am)
    if left is None and masks.dead is not None:
        left, why = masks.dead, "padded query rows that the masks (causal and padding) leave with no key"
    if left is None:
        return None, R
    notes.append(note(left, why))
    R, hit = zero_grad_output(R, left, batch_first)
    if hit:
        notes.append("grad_output was nonzero on left-out rows: set to 0 there (a framework's gradient through a row "
                     "with no key is undefined)")
    return left, R


def rerun_note(bad: list[str], fixed: int, still: list[str]) -> str:
    return (f"the framework's own run was not finite in {', '.join(bad)}: the left-out rows' NaN (0/0 over no key) "
            "reached them (0·NaN in its backward; a later layer's Q Kᵀ). It ran again with each left-out row given "
            f"its own position as a key in the attention masks ({fixed} masks changed): the rows compared compute "
            "what they did" + (f" — still not finite in {', '.join(still)}" if still else ", and are finite"))


# ----------------------------------------------------------------------------- applying them
def leave_out(ours: np.ndarray, ref: np.ndarray, rows: np.ndarray | None, batch_first: bool = True
              ) -> tuple[np.ndarray, np.ndarray]:
    """Copies of ``ours`` and ``ref`` ((B, n, d), or (n, B, d) when not ``batch_first``) with 0 on both sides at the
    left-out ``rows`` (B, n); the arrays themselves when there are none."""
    if rows is None:
        return ours, ref
    r = rows if batch_first else rows.T
    keep = ~r[..., None]
    return np.where(keep, ours, 0).astype(ours.dtype), np.where(keep, ref, 0).astype(ref.dtype)


def zero_grad_output(R: np.ndarray, rows: np.ndarray | None, batch_first: bool = True) -> tuple[np.ndarray, bool]:
    """R with 0 at the left-out rows, and whether it was nonzero there (the caller says so in a note)."""
    if rows is None:
        return R, False
    r = (rows if batch_first else rows.T)[..., None]
    hit = bool(np.any(np.where(r, R, 0) != 0))
    return (np.where(r, 0, R).astype(R.dtype) if hit else R), hit


def finite_mask(extra: np.ndarray | None, rows: np.ndarray | None) -> np.ndarray | None:
    """Our additive mask with −∞ replaced by the dtype's most negative finite number when some row has no key: such a
    row is then a finite uniform row (as :mod:`transformer_np.ops.masks` builds padding), not 0/0 — so our backward
    carries no NaN from it either. The other rows are unchanged: exp(min − max) is 0 exactly, as exp(−∞) is."""
    if extra is None or rows is None:
        return extra
    return np.maximum(extra, np.finfo(extra.dtype).min).astype(extra.dtype)


def not_finite(out_t, mod, x_t, torch, rows: np.ndarray, batch_first: bool = True) -> list[str]:
    """What of the framework's own run is not finite: 'the output (on real tokens too)', 'the input gradient',
    'k of m parameter gradients'; ``rows`` (B, n) the left-out rows."""
    bad = []
    finite = torch.isfinite(out_t.detach()).all(dim=-1).numpy()                 # (B, n), or (n, B)
    if not finite.all():
        r = rows if batch_first else rows.T
        bad.append("the output" + (" (on the left-out rows only)" if finite[~r].all() else " (on other rows too)"))
    if x_t is not None and x_t.grad is not None and not bool(torch.isfinite(x_t.grad).all()):
        bad.append("the input gradient")
    grads = [p.grad for p in mod.parameters() if p.grad is not None]
    k = sum(not bool(torch.isfinite(g).all()) for g in grads)
    if k:
        bad.append(f"{k} of {len(grads)} parameter gradients")
    return bad


class KeyedRows:
    """Forward pre-hooks giving every query row with no key its own position as a key, in each 4-d attention mask a
    submodule receives as ``attention_mask=`` (boolean, True = attend: the diagonal set; float, additive: the diagonal
    0). Rows with a key are unchanged, so every row that is compared computes exactly what it did."""

    def __init__(self, mod, torch):
        self.torch, self.handles, self.fixed = torch, [], 0
        for m in mod.modules():
            self.handles.append(m.register_forward_pre_hook(self._hook, with_kwargs=True))

    def _hook(self, _m, args, kwargs):
        m = kwargs.get("attention_mask")
        if not isinstance(m, self.torch.Tensor) or m.dim() != 4 or m.shape[-1] != m.shape[-2]:
            return None
        if m.dtype == self.torch.bool:
            dead = ~m.any(dim=-1)                                        # (B, h|1, n)
            if not bool(dead.any()):
                return None
            m = m.clone()
            m.diagonal(dim1=-2, dim2=-1).logical_or_(dead)
        else:
            low = self.torch.finfo(m.dtype).min
            dead = (m <= low).all(dim=-1)
            if not bool(dead.any()):
                return None
            m = m.clone()
            diag = m.diagonal(dim1=-2, dim2=-1)
            diag.copy_(self.torch.where(dead, self.torch.zeros_like(diag), diag))
        self.fixed += 1
        return args, {**kwargs, "attention_mask": m}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
