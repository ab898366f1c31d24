"""Helpers shared by the parity tests (imported as ``from helpers import nrel, randomise_``)."""

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


def randomise_(model, seed: int) -> None:
    """Every parameter of a torch module random: matrices N(0, 0.5²), biases/β N(0, 0.3²), LayerNorm γ = 1 + N(0, 0.3²)
    (torch is imported by the caller's test module; this only uses the module's own tensors)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if p.ndim == 2:
                p.copy_(0.5 * z)
            elif "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * z)
            else:
                p.copy_(0.3 * z)
