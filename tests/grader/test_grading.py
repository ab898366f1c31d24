"""Grading the exercises (issue 24's acceptance), through the hidden checks the autograder runs.

For every exercise: an untouched submission scores 0; a solution written differently from the
reference scores full marks; outputs hard-coded for the public cases pass the public
check and fail the hidden one; a forward slip with a backward that is the correct derivative of that
slipped forward earns the backward's points. Then: no student-level feedback contains the reference's
formula or the fix of any known mistake (the instructor flag adds them); the hidden cases vary their
shapes; one table of points. The notebooks end to end are in test_autograder_zip.py.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from transformer_np.course.exercises import EXERCISE_NAMES, FEEDBACK_ENV, Feedback, check_backward, check_forward
from transformer_np.errors import InputValueError
from transformer_np.grader.grading import (
    CHECKS,
    POINTS,
    SEED_ENV,
    grade_backward,
    grade_forward,
    grading_seed,
    points_table,
    stage_notebook,
)
from transformer_np.grader.hidden_cases import hidden_cases
from transformer_np.grader.specs import EXERCISES, copy_inputs
from transformer_np.model.params import sub_params
from transformer_np.ops.attention import attention_backward, attention_forward
from transformer_np.ops.attention import mha_backward as mha_backward_given  # exercise 6 hands these out
from transformer_np.ops.attention import mha_forward as mha_forward_given
from transformer_np.ops.feedforward import ffn_backward, ffn_forward
from transformer_np.ops.layernorm import layernorm_backward, layernorm_forward

REPO = Path(__file__).resolve().parents[2]
SEED = 12345


# ============================================================================= honest students
# Written differently from the reference (einsum, tuples as caches, np.var, math.erf, …): full marks.
def softmax_fwd(x):
    e = np.exp(x - np.amax(x, axis=-1)[..., None])
    s = e / np.einsum("...i->...", e)[..., None]
    return s, (s,)


def softmax_bwd(dout, cache):
    (s,) = cache
    return s * dout - s * np.einsum("...i,...i->...", dout, s)[..., None]


def layernorm_fwd(x, gamma, beta, eps=1e-5):
    xc = x - np.mean(x, axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(np.var(x, axis=-1, keepdims=True) + eps)
    xhat = xc * r
    return gamma * xhat + beta, (xhat, r, gamma)


def layernorm_bwd(dout, cache):
    xhat, r, gamma = cache
    d = xhat.shape[-1]
    g = dout * gamma
    dx = (r / d) * (d * g - g.sum(-1, keepdims=True) - xhat * (g * xhat).sum(-1, keepdims=True))
    lead = tuple(range(dout.ndim - 1))
    return dx, np.sum(dout * xhat, axis=lead), np.sum(dout, axis=lead)


def attention_fwd(Q, K, V, mask=None, scale=None):
    c = 1 / math.sqrt(Q.shape[-1]) if scale is None else scale
    S = np.einsum("...qd,...kd->...qk", Q, K) * c
    if mask is not None:
        S = S + mask
    A = np.exp(S - S.max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)
    return np.einsum("...qk,...kv->...qv", A, V), (Q, K, V, A, c)


def attention_bwd(dout, cache):
    Q, K, V, A, c = cache
    dV = np.einsum("...qk,...qv->...kv", A, dout)
    dA = np.einsum("...qv,...kv->...qk", dout, V)
    dS = A * (dA - np.einsum("...qk,...qk->...q", dA, A)[..., None])
    return np.einsum("...qk,...kd->...qd", dS, K) * c, np.einsum("...qk,...qd->...kd", dS, Q) * c, dV


def _split(t, h):
    B, n, d = t.shape
    return np.swapaxes(t.reshape(B, n, h, d // h), 1, 2)


def _merge(t):
    B, h, n, dk = t.shape
    return np.swapaxes(t, 1, 2).reshape(B, n, h * dk)


def mha_fwd(x, p, n_heads, mask=None, q_factor=1.0):
    heads = [_split(np.einsum("bnd,de->bne", x, p["W_" + c]) + p["b_" + c], n_heads) for c in "QKV"]
    O, ac = attention_forward(heads[0] * q_factor, heads[1], heads[2], mask)     # given by the notebook
    ctx = _merge(O)
    return np.einsum("bnd,de->bne", ctx, p["W_O"]) + p["b_O"], (x, p, n_heads, ac, ctx, q_factor)


def mha_bwd(dout, cache):
    x, p, h, ac, ctx, q_factor = cache
    d = x.shape[-1]
    rows = lambda t: t.reshape(-1, d)                                   # noqa: E731
    g = {"W_O": rows(ctx).T @ rows(dout), "b_O": rows(dout).sum(0)}
    dQ, dK, dV = attention_backward(_split(dout @ p["W_O"].T, h), ac)    # given by the notebook
    dx = np.zeros_like(x)
    for c, dh in zip("QKV", (dQ * q_factor, dK, dV)):
        dP = _merge(dh)
        g["W_" + c], g["b_" + c] = rows(x).T @ rows(dP), rows(dP).sum(0)
        dx += dP @ p["W_" + c].T
    return dx, g


_VERF = np.vectorize(math.erf)


def gelu_fwd(z):
    Phi = 0.5 * (1 + _VERF(z / math.sqrt(2)))
    return z * Phi, Phi + z * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def gelu_bwd(dout, cache):
    return dout * cache


def ffn_fwd(x, p, act=None):
    act = act or (gelu_fwd, gelu_bwd)
    h = np.tensordot(x, p["W_1"], axes=1) + p["b_1"]
    a, ac = act[0](h)
    return np.tensordot(a, p["W_2"], axes=1) + p["b_2"], (x, a, ac, p, act)


def ffn_bwd(dout, cache):
    x, a, ac, p, act = cache
    d, f = p["W_1"].shape
    dh = act[1](np.tensordot(dout, p["W_2"].T, axes=1), ac)
    return np.tensordot(dh, p["W_1"].T, axes=1), {
        "W_2": a.reshape(-1, f).T @ dout.reshape(-1, d), "b_2": dout.reshape(-1, d).sum(0),
        "W_1": x.reshape(-1, d).T @ dh.reshape(-1, f), "b_1": dh.reshape(-1, f).sum(0)}


def _post(x, p, h, mask, eps, ffn_skip=True):
    c = {"norm": "post", "ffn_skip": ffn_skip}
    a, c["attn"] = mha_forward_given(x, sub_params(p, "attn."), h, mask)
    z, c["ln1"] = layernorm_forward(x + a, p["ln1.gamma"], p["ln1.beta"], eps)
    f, c["ffn"] = ffn_forward(z, sub_params(p, "ffn."))
    out, c["ln2"] = layernorm_forward(z + f if ffn_skip else f, p["ln2.gamma"], p["ln2.beta"], eps)
    return out, c


def _pre(x, p, h, mask, eps, ffn_skip=True):
    c = {"norm": "pre", "ffn_skip": ffn_skip}
    y, c["ln1"] = layernorm_forward(x, p["ln1.gamma"], p["ln1.beta"], eps)
    a, c["attn"] = mha_forward_given(y, sub_params(p, "attn."), h, mask)
    z = x + a
    y2, c["ln2"] = layernorm_forward(z, p["ln2.gamma"], p["ln2.beta"], eps)
    f, c["ffn"] = ffn_forward(y2, sub_params(p, "ffn."))
    return (z + f if ffn_skip else f), c


def layer_fwd(x, p, norm, n_heads, mask=None, eps=1e-5):
    return (_post if norm == "post" else _pre)(x, p, n_heads, mask, eps)


def layer_fwd_no_ffn_skip(x, p, norm, n_heads, mask=None, eps=1e-5):      # a slip: no residual around the FFN
    return (_post if norm == "post" else _pre)(x, p, n_heads, mask, eps, ffn_skip=False)


def layer_bwd(dout, c):
    g = {}
    put = lambda prefix, d: g.update({prefix + k: v for k, v in d.items()})   # noqa: E731
    if c["norm"] == "post":
        dr2, g["ln2.gamma"], g["ln2.beta"] = layernorm_backward(dout, c["ln2"])
        dzf, gf = ffn_backward(dr2, c["ffn"])
        dz = dr2 + dzf if c["ffn_skip"] else dzf
        dr1, g["ln1.gamma"], g["ln1.beta"] = layernorm_backward(dz, c["ln1"])
        dxa, ga = mha_backward_given(dr1, c["attn"])
        dx = dr1 + dxa
    else:
        dy2, gf = ffn_backward(dout, c["ffn"])
        dzl, g["ln2.gamma"], g["ln2.beta"] = layernorm_backward(dy2, c["ln2"])
        dz = dout + dzl if c["ffn_skip"] else dzl
        dy1, ga = mha_backward_given(dz, c["attn"])
        dxl, g["ln1.gamma"], g["ln1.beta"] = layernorm_backward(dy1, c["ln1"])
        dx = dz + dxl
    put("ffn.", gf)
    put("attn.", ga)
    return dx, g


HONEST = {
    "softmax": (softmax_fwd, softmax_bwd), "layernorm": (layernorm_fwd, layernorm_bwd),
    "attention": (attention_fwd, attention_bwd), "mha": (mha_fwd, mha_bwd), "gelu": (gelu_fwd, gelu_bwd),
    "ffn": (ffn_fwd, ffn_bwd), "encoder_layer_post": (layer_fwd, layer_bwd),
    "encoder_layer_pre": (layer_fwd, layer_bwd),
}


# ============================================================================= forward slips, own derivative
def softmax_global_fwd(x):                     # slip: one softmax over ALL entries
    e = np.exp(x - x.max())
    s = e / e.sum()
    return s, s


def softmax_global_bwd(dout, s):               # … and its correct derivative
    return s * (dout - np.sum(dout * s))


def layernorm_sample_var_fwd(x, gamma, beta, eps=1e-5):   # slip: the sample variance (d − 1)
    xc = x - x.mean(-1, keepdims=True)
    r = 1 / np.sqrt(np.var(x, axis=-1, ddof=1, keepdims=True) + eps)
    return gamma * xc * r, (xc * r, r, gamma)


def layernorm_sample_var_fwd_beta(x, gamma, beta, eps=1e-5):
    out, c = layernorm_sample_var_fwd(x, gamma, beta, eps)
    return out + beta, c


def layernorm_sample_var_bwd(dout, cache):
    xhat, r, gamma = cache
    d = xhat.shape[-1]
    g = dout * gamma
    dx = r * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).sum(-1, keepdims=True) / (d - 1))
    lead = tuple(range(dout.ndim - 1))
    return dx, (dout * xhat).sum(lead), dout.sum(lead)


def attention_no_scale_fwd(Q, K, V, mask=None):           # slip: forgot 1/√d_k
    return attention_fwd(Q, K, V, mask, scale=1.0)


def mha_dmodel_scale_fwd(x, p, n_heads, mask=None):       # slip: scores scaled by 1/√d_model
    return mha_fwd(x, p, n_heads, mask, q_factor=math.sqrt(x.shape[-1] // n_heads) / math.sqrt(x.shape[-1]))


_K = math.sqrt(2 / math.pi)


def gelu_tanh_fwd(z):                                     # slip: the tanh approximation
    t = np.tanh(_K * (z + 0.044715 * z ** 3))
    return 0.5 * z * (1 + t), 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _K * (1 + 3 * 0.044715 * z * z)


def ffn_tanh_fwd(x, p):
    return ffn_fwd(x, p, act=(gelu_tanh_fwd, gelu_bwd))


SLIPS = {
    "softmax": (softmax_global_fwd, softmax_global_bwd), "layernorm": (layernorm_sample_var_fwd_beta,
                                                                         layernorm_sample_var_bwd),
    "attention": (attention_no_scale_fwd, attention_bwd), "mha": (mha_dmodel_scale_fwd, mha_bwd),
    "gelu": (gelu_tanh_fwd, gelu_bwd), "ffn": (ffn_tanh_fwd, ffn_bwd),
    "encoder_layer_post": (layer_fwd_no_ffn_skip, layer_bwd), "encoder_layer_pre": (layer_fwd_no_ffn_skip, layer_bwd),
}


# ============================================================================= untouched (as otter leaves them)
def untouched_fwd(*args, **kwargs):
    ...


def untouched_bwd(dout, cache):
    ...


# ============================================================================= the acceptance, per exercise
@pytest.mark.parametrize("name", EXERCISE_NAMES)
def test_untouched_scores_zero(name):
    assert grade_forward(name, untouched_fwd, seed=SEED).codes == ["returned_none"]
    assert grade_backward(name, untouched_fwd, untouched_bwd, seed=SEED).codes == ["forward_first"]
    fwd, _ = HONEST[name]
    assert grade_backward(name, fwd, untouched_bwd, seed=SEED).codes == ["returned_none"]


@pytest.mark.parametrize("name", EXERCISE_NAMES)
def test_a_solution_written_differently_scores_full_marks(name):
    fwd, bwd = HONEST[name]
    assert check_forward(name, fwd) is None
    assert check_backward(name, fwd, bwd) is None
    for seed in (SEED, SEED + 1):
        assert grade_forward(name, fwd, seed=seed) is None, grade_forward(name, fwd, seed=seed)
        assert grade_backward(name, fwd, bwd, seed=seed) is None, grade_backward(name, fwd, bwd, seed=seed)


def _key(args) -> bytes:
    parts = []
    for a in args:
        if isinstance(a, np.ndarray):
            parts.append(np.ascontiguousarray(a).tobytes())
        elif isinstance(a, dict):
            parts += [np.ascontiguousarray(a[k]).tobytes() for k in sorted(a)]
    return b"".join(parts)


@pytest.mark.parametrize("name", EXERCISE_NAMES)
def test_outputs_hard_coded_for_the_public_cases_fail_the_hidden_ones(name):
    """The cheat computes nothing: it looks its outputs up by the bytes of its inputs, in tables
    recorded from an honest solution run on the public checks."""
    fwd, bwd = HONEST[name]
    fwd_table, bwd_table = {}, {}

    def record_fwd(*args):
        out, cache = fwd(*args)
        fwd_table[_key(args)] = out
        return out, cache

    def record_bwd(dout, cache):
        grads = bwd(dout, cache)
        bwd_table[dout.tobytes()] = grads
        return grads

    assert check_forward(name, record_fwd) is None and check_backward(name, fwd, record_bwd) is None

    def cheat_fwd(*args):
        return fwd_table.get(_key(args), np.zeros(1)), None

    def cheat_bwd(dout, cache):
        return bwd_table.get(dout.tobytes())

    assert check_forward(name, cheat_fwd) is None            # the public cases pass …
    fb = grade_forward(name, cheat_fwd, seed=SEED)            # … the hidden ones do not
    assert isinstance(fb, Feedback) and "hidden:" in fb.header, fb
    assert check_backward(name, fwd, cheat_bwd) is None
    fb = grade_backward(name, fwd, cheat_bwd, seed=SEED)
    assert isinstance(fb, Feedback) and "hidden:" in fb.header, fb


@pytest.mark.parametrize("name", EXERCISE_NAMES)
def test_a_forward_slip_costs_the_forward_only(name):
    """Error carried forward: a wrong forward and the correct derivative of that forward → the
    forward's check fails (with its diagnosis), the backward's passes."""
    fwd, bwd = SLIPS[name]
    fb = grade_forward(name, fwd, seed=SEED)
    assert isinstance(fb, Feedback) and fb.codes[0] != "exception", fb
    assert check_backward(name, fwd, bwd) is None
    assert grade_backward(name, fwd, bwd, seed=SEED) is None
    if name == "softmax":        # the reference's derivative is not the derivative of this forward
        fb = grade_backward(name, fwd, lambda d, s: s * (d - np.sum(d * s, axis=-1, keepdims=True)), seed=SEED)
        assert isinstance(fb, Feedback) and fb.codes == ["gradcheck"], fb


def test_a_forward_unrelated_to_the_op_leaves_no_backward_to_follow():
    def zeros(x):
        return np.zeros_like(x), None

    def zero_grad(dout, cache):
        return np.zeros_like(dout)

    fb = grade_backward("softmax", zeros, zero_grad, seed=SEED)
    assert fb.codes == ["forward_first"], fb


# ============================================================================= hints before answers
def _students_with(name, mistake, backward: bool):
    """A student making exactly this known mistake (planted on the library's op)."""
    from test_exercises import ARGS, LIBRARY, _pack

    ex = EXERCISES[name]
    lib_forward, lib_backward = LIBRARY[name]
    if not backward:
        def forward(*args):
            arrays, static = ARGS[name](*args)
            return mistake.compute(copy_inputs(arrays), dict(static)), None
        return forward, None

    def forward(*args):
        arrays, static = ARGS[name](*args)
        out, cache = lib_forward(*args)
        return out, (arrays, static, cache)

    def backward(dout, cache):
        arrays, static, lib_cache = cache
        lib = lib_backward(dout.copy(), lib_cache)
        grads = (dict(zip(ex.grad_names, lib)) if ex.returns == "tuple" else
                 {ex.grad_names[0]: lib} if ex.returns == "array" else {"x": lib[0], **lib[1]})
        grads.update(mistake.compute(copy_inputs(arrays), dict(static), dout.copy()))
        return _pack(ex, grads)
    return forward, backward


def _all_mistakes():
    return [pytest.param(name, kind, i, id=f"{name}-{kind}-{i}-{m.code}")
            for name, ex in EXERCISES.items()
            for kind, ms in (("forward", ex.forward_mistakes), ("backward", ex.backward_mistakes))
            for i, m in enumerate(ms)]


def _answers(ex) -> list[str]:
    """Everything that gives the answer away: the reference's expressions, every mistake's fix, the
    op's equations (the hints), and code."""
    texts = list(ex.answers) + [m.fix for m in ex.forward_mistakes + ex.backward_mistakes if m.fix]
    texts += [ex.forward_hint, ex.backward_hint, *ex.backward_hints.values()]
    return [t for t in texts if t]


_CODE = re.compile(r"keepdims|np\.|\.sum\(|swapaxes|\.T\b|transpose\(|reshape\(|axis=")


@pytest.mark.parametrize("name, kind, i", _all_mistakes())
def test_no_feedback_gives_the_answer_unless_the_instructor_asks(name, kind, i, monkeypatch):
    ex = EXERCISES[name]
    mistake = (ex.forward_mistakes if kind == "forward" else ex.backward_mistakes)[i]
    monkeypatch.delenv(FEEDBACK_ENV, raising=False)
    forward, backward = _students_with(name, mistake, kind == "backward")
    fb = grade_forward(name, forward, seed=SEED) if kind == "forward" else \
        grade_backward(name, forward, backward, seed=SEED)
    assert isinstance(fb, Feedback) and mistake.code in fb.codes, fb
    text = fb.text
    leaked = [a for a in _answers(ex) if a in text]
    assert not leaked, f"the feedback gives away {leaked}:\n{text}"
    assert not _CODE.search(text), f"code in the feedback:\n{text}"
    monkeypatch.setenv(FEEDBACK_ENV, "instructor")
    fixes = [m.fix for m in ex.forward_mistakes + ex.backward_mistakes if m.code == mistake.code and m.fix]
    if fixes:                   # (two mistakes may share a diagnosis on one output: either's fix)
        assert any(f in fb.text and f in fb.instructor_text for f in fixes), fb.text


def test_the_feedback_level_is_checked(monkeypatch):
    monkeypatch.setenv(FEEDBACK_ENV, "everything")
    fb = check_forward("softmax", untouched_fwd)
    with pytest.raises(InputValueError, match=FEEDBACK_ENV):
        fb.text  # noqa: B018


def test_the_exercise_markdown_asks_for_the_derivation_instead_of_giving_it():
    answers = {"01_softmax": ["s ⊙ (dout", "g - \\langle g, s\\rangle", "\\odot (g -"],
               "02_layernorm": ["mean(g ⊙ x̂)", "\\mathrm{mean}(g \\odot \\hat x)", "\\frac{\\hat x_i \\hat x_j}{d}"],
               "03_attention": ["dK = \\frac", "dS^\\top Q", "dSᵀ Q"],
               "04_multihead_attention": ["dQ\\,W_Q^\\top + dK", "dW_Q = x^\\top dQ"],
               "05_gelu_ffn": ["\\Phi(z) + z\\,\\varphi(z)", "Φ(z) + z φ(z)", "dW_2 = a^\\top"],
               "06_encoder_layer": ["dZ = dout + LN₂", "dx = dR₁ + MHA"]}
    for name, texts in answers.items():
        nb = json.loads((REPO / "exercises" / f"{name}.ipynb").read_text())
        md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        assert "Derive" in md or "derive" in md, name
        for t in texts:
            assert t not in md, f"{name}: the markdown gives {t!r}"
    nb = json.loads((REPO / "exercises" / "03_attention.ipynb").read_text())
    md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "dQ = dS\\, K" in md and "Derive dK yourself" in md    # the lesson shows dQ, the exercise asks dK


# ============================================================================= hidden cases, seed, points
@pytest.mark.parametrize("name", EXERCISE_NAMES)
def test_hidden_cases_vary_and_differ_from_the_public_ones(name):
    ex = EXERCISES[name]
    public = {tuple((k, v.shape) for k, v in c.arrays.items()) for c in ex.cases()}
    a, b = hidden_cases(name, 1), hidden_cases(name, 2)
    assert all(c.label.startswith("hidden: ") for c in a) and any(c.gradcheck for c in a)
    shapes_a = [tuple((k, v.shape) for k, v in c.arrays.items()) for c in a]
    shapes_b = [tuple((k, v.shape) for k, v in c.arrays.items()) for c in b]
    # exact: two seeds' cases must differ somewhere (drawn inputs compared as given, no arithmetic)
    assert shapes_a != shapes_b or any(not np.array_equal(c.arrays[k], d.arrays[k]) for c, d in zip(a, b)
                                       for k in c.arrays)
    assert not set(shapes_a) <= public
    same = hidden_cases(name, 1)
    assert all(np.array_equal(c.arrays[k], d.arrays[k]) for c, d in zip(a, same) for k in c.arrays)  # exact: same seed
    for case in a:                  # several heads, batch > 1, non-square where the op has such axes
        if name == "attention" and case.arrays["Q"].ndim == 4:
            assert case.arrays["Q"].shape[1] >= 2 and case.arrays["Q"].shape[0] >= 2
        if name in ("mha",) or name.startswith("encoder_layer"):
            assert case.static["n_heads"] >= 2
    if name == "attention":
        assert any(c.arrays["Q"].shape[-2] != c.arrays["K"].shape[-2] for c in a)


@pytest.mark.parametrize("name", EXERCISE_NAMES)
def test_the_library_passes_the_hidden_cases_of_many_seeds(name):
    from test_exercises import LIBRARY

    fwd, bwd = LIBRARY[name]
    for seed in range(2 if name.startswith("encoder_layer") else 8):
        assert grade_forward(name, fwd, seed=seed) is None, (name, seed)
        assert grade_backward(name, fwd, bwd, seed=seed) is None, (name, seed)


def test_the_grading_seed_comes_from_the_instructor_or_chance(monkeypatch):
    monkeypatch.setenv(SEED_ENV, "77")
    assert grading_seed() == 77
    monkeypatch.setenv(SEED_ENV, "seven")
    with pytest.raises(InputValueError, match=SEED_ENV):
        grading_seed()
    monkeypatch.delenv(SEED_ENV)
    assert len({grading_seed() for _ in range(5)}) > 1
    fb = grade_forward("softmax", untouched_fwd, seed=5)
    assert "seed 5" in fb.text


def test_one_table_of_points(tmp_path):
    notebooks = sorted(p.stem for p in (REPO / "exercises").glob("[0-9]*.ipynb"))
    assert sorted(POINTS) == sorted(CHECKS) == notebooks
    for name in notebooks:
        nb = json.loads((REPO / "exercises" / f"{name}.ipynb").read_text())
        raw = ["".join(c["source"]) for c in nb["cells"]]
        assert not any(s.startswith("# BEGIN QUESTION") and "points:" in s for s in raw), \
            f"{name}: points belong in grading.POINTS, not in the notebook"
        code = [s.strip() for c, s in zip(nb["cells"], raw) if c["cell_type"] == "code"]
        for q, (kind, names) in CHECKS[name].items():
            for ex_name in names:
                assert sum(s.startswith(f'check_{kind}("{ex_name}"') for s in code) == 1, (name, q, ex_name)
                assert sum(f'grade_{kind}("{ex_name}"' in s and s.startswith("# HIDDEN") for s in code) == 1
        staged = tmp_path / f"{name}.ipynb"
        stage_notebook(REPO / "exercises" / f"{name}.ipynb", staged)
        cells = ["".join(c["source"]) for c in json.loads(staged.read_text())["cells"]]
        for q, pts in POINTS[name].items():
            n = len(CHECKS[name][q][1])
            cfg = next(s for s in cells if s.startswith("# BEGIN QUESTION") and f"name: {q}\n" in s + "\n")
            listed = json.loads(re.search(r"^points: (.*)$", cfg, flags=re.M).group(1))
            assert len(listed) == 2 * n and listed.count(0) == n and sum(listed) == pts, (name, q, listed)
            # (which cell carries which points: tests/grader/test_points_by_name.py)
    page = (REPO / "docs" / "guide" / "instructors.md").read_text()
    assert points_table() in page, "docs/guide/instructors.md must show grading.points_table()"
    assert "every question is worth 1 point" not in page.lower()


def test_staging_refuses_an_unknown_notebook(tmp_path):
    src = tmp_path / "07_unknown.ipynb"
    src.write_text(json.dumps({"cells": []}))
    with pytest.raises(InputValueError, match="07_unknown"):
        stage_notebook(src, tmp_path / "out.ipynb")


def test_the_staging_command_reports_bad_arguments_in_one_line(tmp_path, capsys):
    from transformer_np.grader.grading import main

    assert main(["stage"]) == 2 and "usage:" in capsys.readouterr().err
    assert main(["stage", str(tmp_path / "missing.ipynb"), str(tmp_path / "out.ipynb")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing" in err, err


@pytest.mark.slow
def test_the_staging_command_writes_the_notebook_and_the_zips_requirements(tmp_path):
    """Staging reads otter's version (the zip pins it): otter-grader must be installed, so not the fast lane."""
    pytest.importorskip("otter")
    from transformer_np.grader.grading import main

    assert main(["stage", str(REPO / "exercises" / "01_softmax.ipynb"), str(tmp_path / "01_softmax.ipynb"),
                 "transformer_np-0.0.0-py3-none-any.whl"]) == 0
    staged = (tmp_path / "01_softmax.ipynb").read_text()
    assert "autograder_files" in staged and "overwrite_requirements: true" in staged
    reqs = (tmp_path / "requirements.txt").read_text().split()
    assert reqs[0].startswith("otter-grader[grading]==") and reqs[1].endswith("transformer_np-0.0.0-py3-none-any.whl")
    assert len(reqs) == 2                     # otter and this project (NumPy comes with it): nothing else
