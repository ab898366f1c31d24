"""Helpers shared by the parity tests (imported as ``from helpers import nrel``)."""

from __future__ import annotations

import numpy as np


def nrel(ours, ref) -> float:
    """‖ours − ref‖ / ‖ref‖ (Frobenius), in float64; ``ref`` may be a torch tensor."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref.detach().numpy() if hasattr(ref, "detach") else ref, dtype=np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    den = np.linalg.norm(ref)
    assert den > 0, "reference is exactly zero: the relative error is undefined"
    return float(np.linalg.norm(ours - ref) / den)
