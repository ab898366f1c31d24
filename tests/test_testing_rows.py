"""The two rules of issue 45 item 3 that need no framework (NumPy only; the comparisons with torch and transformers
are in tests/test_testing_rows_torch.py):

* which query rows have no key to attend to (ModernBERT's sliding window over a padded tail; a causal mask over left
  padding), and how the report names them;
* a gradient that is zero in exact arithmetic is measured at the scale of its layer's gradients — its round-off
  passes, a wrong nonzero value beyond atol times that scale still fails."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_np.testing import ComparisonReport
from transformer_np.testing.criterion import _compare, _set_scales, _set_source_scales
from transformer_np.testing.rows import describe_rows, leave_out, mask_rows, window_rows, zero_grad_output


def _am(real: list[int], n: int) -> np.ndarray:
    am = np.zeros((len(real), n), dtype=np.int64)
    for b, k in enumerate(real):
        am[b, :k] = 1
    return am


def test_modernbert_bases_window_over_100_pads_leaves_out_the_last_36_rows():
    am = _am([228, 128], 228)                         # sequence 1: 128 real tokens, 100 pads
    rows = window_rows(am, 64, n_sliding=1)           # local_attention = 128: |i - j| <= 64
    want = np.zeros((2, 228), dtype=bool)
    want[1, 192:] = True                              # 192 - 64 = 128: the first window with no real key
    assert np.array_equal(rows, want)                 # exact: integer positions, no arithmetic on floats
    assert describe_rows(rows) == "sequence 1: positions 192–227 (36 rows)"


def test_no_row_is_left_out_without_a_window_holding_only_padding():
    assert window_rows(_am([228, 128], 228), 64, n_sliding=0) is None      # no sliding layer
    assert window_rows(_am([228, 164], 228), 64, n_sliding=1) is None      # a tail of 64 pads: every window reaches
    assert window_rows(None, 64, n_sliding=1) is None                      # a real token


def test_a_causal_mask_over_left_padding_leaves_out_the_padded_head():
    n = 6
    causal = np.where(np.triu(np.ones((n, n), dtype=bool), 1), -np.inf, 0.0)[None, None]
    am = np.array([[1] * n, [0, 0, 0, 1, 1, 1]])
    rows = mask_rows(causal, am, 2, n)
    assert np.array_equal(rows, np.array([[False] * n, [True] * 3 + [False] * 3]))   # exact: booleans
    assert describe_rows(rows) == "sequence 1: positions 0–2 (3 rows)"
    assert mask_rows(causal, np.ones((2, n), dtype=np.int64), 2, n) is None


def test_left_out_rows_read_zero_on_both_sides_and_the_upstream_gradient_is_zero_there():
    rng = np.random.default_rng(0)
    rows = np.zeros((2, 5), dtype=bool)
    rows[1, 3:] = True
    ours, ref = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 4))
    ref[1, 4] = np.nan                                # the framework's undefined value there
    o, r = leave_out(ours, ref, rows)
    assert not np.isnan(r).any() and not o[1, 3:].any() and not r[1, 3:].any()
    assert np.array_equal(o[~rows], ours[~rows]) and np.array_equal(r[~rows], ref[~rows])  # exact: copied
    R, hit = zero_grad_output(ours, rows)
    assert hit and not R[1, 3:].any()
    o_t, _ = leave_out(ours.transpose(1, 0, 2), ref.transpose(1, 0, 2), rows, batch_first=False)  # (n, B, d)
    assert not o_t[3:, 1].any() and np.array_equal(o_t[:, 0], ours[0])                   # exact: copied


# ----------------------------------------------------------------------------- zero in exact arithmetic
def _layer_grads(query_ours: np.ndarray, query_ref: np.ndarray, dt=np.float32, value_ref=None):
    """The gradient entries of one layer: the query's (the tensor under test) and the value's (an O(1) sibling)."""
    rng = np.random.default_rng(1)
    value = rng.normal(size=(8, 8)).astype(dt) if value_ref is None else value_ref
    value_ours = (value * (1 + 4 * np.finfo(dt).eps * rng.normal(size=value.shape))).astype(dt)   # round-off
    entries = [_compare("layer.0.attention.self.query.weight", "grad", query_ours, query_ref),
               _compare("layer.0.attention.self.value.weight", "grad", value_ours, value)]
    _set_scales(entries)
    return entries


def _report(entries, dt=np.float32, rtol=1e-4, atol=1e-5):
    _set_source_scales(entries, atol)
    return ComparisonReport("BertLayer", "transformers", np.dtype(dt), rtol, atol, entries)


def test_round_off_of_a_tensor_zero_in_exact_arithmetic_passes_at_its_layers_scale():
    rng = np.random.default_rng(2)
    ref = (1e-9 * rng.normal(size=(8, 8))).astype(np.float32)           # sdpa's round-off (measured: ~1e-9)
    entries = _layer_grads(np.zeros((8, 8), np.float32), ref)          # ours: exactly 0 (A = 1 exactly)
    before = ComparisonReport("BertLayer", "transformers", np.dtype(np.float32), 1e-4, 1e-5, list(entries))
    assert not before.ok and entries[0].norm_rel == pytest.approx(1.0)  # the old reading: "norm-relative error 1"
    report = _report(entries)
    assert report.ok, report
    q = report["layer.0.attention.self.query.weight"]
    assert q.source == "layer.0's gradients"
    assert q.scale == report["layer.0.attention.self.value.weight"].scale    # exact: the same number, assigned


def test_a_wrong_nonzero_value_beyond_the_layers_scale_still_fails():
    ref = np.zeros((8, 8), np.float32)
    ours = np.zeros((8, 8), np.float32)
    entries = _layer_grads(ours, ref)
    S = max(e.ref_absmax for e in entries)
    ours[3, 5] = 2 * 1e-5 * S                                          # twice atol·S_layer
    report = _report(_layer_grads(ours, ref))
    assert not report.ok
    with pytest.raises(AssertionError, match=r"query\.weight.*\n.*at index \(3, 5\).*zero in exact arithmetic"):
        report.check()
    ours[3, 5] = 0.5 * 1e-5 * S                                        # half of it: round-off at the layer's scale
    assert _report(_layer_grads(ours, ref)).ok


def test_a_small_gradient_that_is_not_zero_keeps_its_own_scale_and_its_bugs_are_caught():
    rng = np.random.default_rng(3)
    ref = (1e-3 * rng.normal(size=(8, 8))).astype(np.float32)          # small, but 100 x atol·S_layer
    entries = _layer_grads(ref * np.float32(1 + 1e-4), ref)           # a systematic 1e-4 bug in it
    report = _report(entries)
    assert report["layer.0.attention.self.query.weight"].source is None
    assert [f[0].name for f in report.failures()] == ["layer.0.attention.self.query.weight"]


def test_float64_round_off_of_a_zero_tensor_passes_and_a_wrong_value_fails():
    rng = np.random.default_rng(4)
    value = rng.normal(size=(8, 8))
    ref = 1e-18 * rng.normal(size=(8, 8))                             # measured for sdpa float64: ~2e-18
    ok = _report(_layer_grads(np.zeros((8, 8)), ref, np.float64, value), np.float64, 1e-10, 1e-12)
    assert ok.ok, ok
    bad = np.zeros((8, 8))
    bad[0, 0] = 1e-9                                                   # 1000 x atol·S_layer (S_layer ~ 2.5)
    assert not _report(_layer_grads(bad, ref, np.float64, value), np.float64, 1e-10, 1e-12).ok
