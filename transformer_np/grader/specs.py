r"""The course's assignments as data: cases, how a student's function is called, the library's answer,
and the *known mistakes* that explain a wrong answer (each recomputed with the library's ops).

Used by :mod:`transformer_np.grader.exercises`; the names of :data:`EXERCISES` are what the notebooks'
test cells pass to ``check_forward`` / ``check_backward``.

Conventions shared by every exercise:
    ``case.arrays``   the differentiable inputs, by name (the finite-difference check perturbs them)
    ``case.static``   the other arguments (mask, n_heads, eps, norm)
    ``call(fn, arrays, static)``         how the student's forward is called (the documented signature)
    ``reference(arrays, static)``        the library's ``(out, cache)``
    ``reference_backward(dout, cache)``  the library's gradients, by input name
    a forward mistake computes ``out`` from (arrays, static); a backward mistake computes a dict of
    gradients from (arrays, static, dout). A mistake that does not apply to a case returns None.
"""

from __future__ import annotations

from .exercise_base import Case, Exercise, Mistake, copy_inputs
from .specs_blocks import FFN, GELU, MHA, layer_exercise
from .specs_ops import ATTENTION, LAYERNORM, SOFTMAX

__all__ = ["EXERCISES", "Case", "Exercise", "Mistake", "copy_inputs"]

EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (
    SOFTMAX, LAYERNORM, ATTENTION, MHA, GELU, FFN, layer_exercise("post"), layer_exercise("pre"))}

