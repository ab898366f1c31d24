"""The policy on numerical backwards holds for complex step as for finite differences (issue 43, item 3).

A complex-step backward — Im f(x + ih·e_k) / h, exact to rounding — passed the "analytic" rule silently, since
its gradients agree with the library's to ~1e-16. Now a backward that evaluates a function of the notebook (its
forward, a helper) at complex inputs gets ``not_analytic`` with a reason naming complex step, exactly where a
finite-difference backward gets it: when the forward is right and the backward is compared with the library.
With a wrong forward both are followed alike (the backward is checked against the student's own forward).
"""

from __future__ import annotations

import numpy as np
from test_grade import SOL, grade
from test_grading import SEED, softmax_fwd

from transformer_np.grader.grading import grade_backward


def _stable(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True).real)
    return e / e.sum(axis=-1, keepdims=True)


def complex_step_bwd(dout, cache):
    """Im softmax(x + ih e_k) / h for every k: the forward evaluated at complex inputs."""
    x, h = cache["x"], 1e-30
    dx = np.zeros_like(x)
    for k in np.ndindex(x.shape):
        z = x.astype(complex)
        z[k] += 1j * h
        dx[k] = np.sum(dout * _stable(z).imag) / h
    return dx


def central_bwd(dout, cache):
    x, h = cache["x"], 1e-5
    dx = np.zeros_like(x)
    for k in np.ndindex(x.shape):
        p, m = x.copy(), x.copy()
        p[k] += h
        m[k] -= h
        dx[k] = np.sum(dout * (_stable(p) - _stable(m))) / (2 * h)
    return dx


def right_fwd(x):
    return _stable(x), {"x": x}


def test_a_complex_step_backward_is_not_analytic_like_finite_differences():
    fb = grade_backward("softmax", right_fwd, complex_step_bwd, seed=SEED)
    assert fb is not None and fb.codes == ["not_analytic"], fb
    assert "complex" in fb.text and "_stable" in fb.text, fb.text
    fd = grade_backward("softmax", right_fwd, central_bwd, seed=SEED)
    assert fd is not None and set(fd.codes) == {"not_analytic"}, fd

    def bwd(dout, cache):                # an analytic backward calling a helper of the notebook is not flagged
        s = softmax_fwd(cache["x"])[0]
        return s * (dout - np.sum(dout * s, axis=-1, keepdims=True))

    assert grade_backward("softmax", right_fwd, bwd, seed=SEED) is None

    def scaled(x):                       # a slip (twice the softmax): followed, for complex step as for
        return 2 * _stable(x), {"x": x}  # finite differences — checked against the student's own forward

    def step(dout, cache):
        x, h = cache["x"], 1e-30
        dx = np.zeros_like(x)
        for k in np.ndindex(x.shape):
            z = x.astype(complex)
            z[k] += 1j * h
            dx[k] = np.sum(dout * 2 * _stable(z).imag) / h
        return dx

    assert grade_backward("softmax", scaled, step, seed=SEED) is None


def test_a_complex_step_through_the_forward_itself_is_named():
    def fwd(x):
        return _stable(x), {"x": x, "f": fwd}

    def bwd(dout, cache):
        x, h = cache["x"], 1e-30
        dx = np.zeros_like(x)
        for k in np.ndindex(x.shape):
            z = x.astype(complex)
            z[k] += 1j * h
            dx[k] = np.sum(dout * cache["f"](z)[0].imag) / h
        return dx

    fb = grade_backward("softmax", fwd, bwd, seed=SEED)
    assert fb is not None and fb.codes == ["not_analytic"] and "evaluates fwd at complex inputs" in fb.text, fb


def test_the_grade_of_record_refuses_a_complex_step_backward(tmp_path):
    cells = SOL + ["""
_fwd = softmax_forward
def softmax_forward(x):
    out, _ = _fwd(x)
    return out, {"x": x}

def _stable(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True).real)
    return e / e.sum(axis=-1, keepdims=True)

def softmax_backward(dout, cache):
    x, h = cache["x"], 1e-30
    dx = np.zeros_like(x)
    for k in np.ndindex(x.shape):
        z = x.astype(complex)
        z[k] += 1j * h
        dx[k] = np.sum(dout * _stable(z).imag) / h
    return dx
"""]
    g = grade(tmp_path, cells)
    (bwd,) = [c for c in g.checks if c.kind == "backward"]
    assert bwd.earned == 0 and bwd.codes == ["not_analytic"], bwd
    assert "complex" in bwd.why and "_stable" in bwd.why, bwd.why
    assert g.score == 1
