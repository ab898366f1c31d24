"""The notation the sheets and the page share for the two LayerNorm backward steps.

``steps.py`` names them "LayerNorm backward of G at X"; :func:`written_out` spells the formula out with x̂ and σ
(defined where it is used), so the student sheet (:mod:`.generate`) and the page (:mod:`.serve_page`) show the
same formula.
"""

from __future__ import annotations

import re

__all__ = ["written_out"]

# The two LayerNorm backward steps, written out (steps.py names them "LayerNorm backward of G at X"): every
# symbol is defined where it is used (the page also lists them in its SYMBOLS).
_LN_BACKWARD = re.compile(r"LayerNorm backward of (\w+) at (\w+(?:\^\(\d\))?)")
_LN_NORMALISED = re.compile(r"(\w+) \* LN-normalised (\w+(?:\^\(\d\))?)")


def _ln_backward(m) -> str:
    g, x = m.group(1), m.group(2)
    # the second LayerNorm: Post-LN's is at residual2, Pre-LN's gradient arrives as d_layer_norm2
    gamma = "gamma2" if x == "residual2" or g.endswith("norm2") else "gamma1"
    return (f"(g − mean(g) − x̂ ⊙ mean(g ⊙ x̂)) / σ, row by row, with g = {gamma} ⊙ {g}, "
            f"x̂ = ({x} − μ) / σ and σ = √(var + ε) of {x}")


def written_out(formula: str) -> str:
    """``formula`` (as ``steps.py`` writes it) with each "LayerNorm backward of G at X" and "G * LN-normalised X"
    spelled out."""
    formula = _LN_BACKWARD.sub(_ln_backward, formula)
    return _LN_NORMALISED.sub(lambda m: f"{m.group(1)} * x̂ (x̂: {m.group(2)} normalised)", formula)
