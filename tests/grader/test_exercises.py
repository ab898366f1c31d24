"""The course exercises: the feedback helpers (fast), and the otter-grader assignments end to end (slow).

Fast part: the library's own ops pass every check; every known mistake of every exercise, planted
as a student's function, gets its own diagnosis; hand-written student slips (missing 1/√d_k, a
transposed output, softmax over the wrong axis, a wrong shape, wrong backwards, NotImplementedError,
None, a crash) get feedback that names the problem and contains no traceback.

Slow part (marked ``slow`` and ``notebooks``): for each solution notebook in exercises/,
``scripts/build_exercises.sh`` runs ``otter assign``; the generated solution notebook is executed and
every check passes; the generated student notebook is executed, runs to the end, and every check
fails with the helpers' feedback (never a traceback into transformer_np). Grading with the autograder
zips (``otter run`` in a fresh venv) is in test_autograder_zip.py; the grading rules in test_grading.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import execute_notebook
from transformer_np.course.exercises import EXERCISE_NAMES, Feedback, check_backward, check_forward
from transformer_np.errors import InputValueError
from transformer_np.grader.specs import EXERCISES, copy_inputs
from transformer_np.model.config import EncoderConfig
from transformer_np.model.encoder import encoder_layer_backward, encoder_layer_forward
from transformer_np.ops.activations import activation_backward, activation_forward
from transformer_np.ops.attention import attention_backward, attention_forward, mha_backward, mha_forward
from transformer_np.ops.feedforward import ffn_backward, ffn_forward
from transformer_np.ops.layernorm import layernorm_backward, layernorm_forward
from transformer_np.ops.softmax import softmax, softmax_backward, softmax_forward

REPO = Path(__file__).resolve().parents[2]


NOTEBOOKS = sorted(p.stem for p in (REPO / "exercises").glob("[0-9]*.ipynb"))


# ----------------------------------------------------------------------------- the library as a student
def _layer_forward(x, p, norm, n_heads, mask=None, eps=1e-5):
    cfg = EncoderConfig(n_layers=1, d_model=x.shape[-1], n_heads=n_heads, d_ff=p["ffn.W_1"].shape[1],
                        norm_position=norm, layer_norm_eps=eps, dropout=0.0)
    return encoder_layer_forward(x, p, cfg, mask)


LIBRARY = {
    "softmax": (softmax_forward, softmax_backward),
    "layernorm": (layernorm_forward, layernorm_backward),
    "attention": (attention_forward, attention_backward),
    "mha": (mha_forward, mha_backward),
    "gelu": (lambda z: activation_forward(z, "gelu"), activation_backward),
    "ffn": (ffn_forward, ffn_backward),
    "encoder_layer_post": (_layer_forward, encoder_layer_backward),
    "encoder_layer_pre": (_layer_forward, encoder_layer_backward),
}

# The documented call signatures, inverted: a student's arguments back to (arrays, static).
ARGS = {
    "softmax": lambda x: ({"x": x}, {}),
    "layernorm": lambda x, gamma, beta, eps: ({"x": x, "gamma": gamma, "beta": beta}, {"eps": eps}),
    "attention": lambda Q, K, V, mask=None: ({"Q": Q, "K": K, "V": V}, {"mask": mask}),
    "mha": lambda x, p, n_heads, mask=None: ({"x": x, **p}, {"n_heads": n_heads, "mask": mask}),
    "gelu": lambda z: ({"z": z}, {}),
    "ffn": lambda x, p: ({"x": x, **p}, {}),
    "encoder_layer_post": lambda x, p, norm, n_heads, mask=None, eps=1e-5:
        ({"x": x, **p}, {"norm": norm, "n_heads": n_heads, "mask": mask, "eps": eps}),
}
ARGS["encoder_layer_pre"] = ARGS["encoder_layer_post"]


def _pack(ex, grads: dict):
    """Gradients by input name → the return value the exercise documents."""
    if ex.returns == "array":
        return grads[ex.grad_names[0]]
    if ex.returns == "tuple":
        return tuple(grads[n] for n in ex.grad_names)
    return grads["x"], {k: v for k, v in grads.items() if k != "x"}


def test_the_exercise_list_matches_the_library_table():
    assert set(EXERCISE_NAMES) == set(LIBRARY) == set(ARGS)


@pytest.mark.parametrize("name", EXERCISE_NAMES)
def test_the_library_itself_passes_every_check(name):
    forward, backward = LIBRARY[name]
    assert check_forward(name, forward) is None
    assert check_backward(name, forward, backward) is None


def _forward_mistakes() -> list:
    return [pytest.param(name, m, id=f"{name}-{i}-{m.code}")
            for name, ex in EXERCISES.items() for i, m in enumerate(ex.forward_mistakes)]


def _backward_mistakes() -> list:
    return [pytest.param(name, m, id=f"{name}-{i}-{m.code}")
            for name, ex in EXERCISES.items() for i, m in enumerate(ex.backward_mistakes)]


@pytest.mark.parametrize("name, mistake", _forward_mistakes())
def test_every_known_forward_mistake_is_diagnosed(name, mistake):
    """A student forward that makes exactly this mistake gets exactly this diagnosis."""
    def student(*args):
        arrays, static = ARGS[name](*args)
        return mistake.compute(copy_inputs(arrays), dict(static)), None

    fb = check_forward(name, student)
    assert isinstance(fb, Feedback), f"{name}: the mistake {mistake.code!r} passed the checks"
    assert fb.codes == [mistake.code], fb.text
    assert mistake.message in fb.text


@pytest.mark.parametrize("name, mistake", _backward_mistakes())
def test_every_known_backward_mistake_is_diagnosed(name, mistake):
    """A correct forward with a backward that makes this mistake: diagnosed by name, and the
    finite-difference check (independent of the library) fails too."""
    ex = EXERCISES[name]
    lib_forward, lib_backward = LIBRARY[name]

    def forward(*args):
        arrays, static = ARGS[name](*args)
        out, cache = lib_forward(*args)
        return out, (arrays, static, cache)

    def backward(dout, cache):
        arrays, static, lib_cache = cache
        lib = lib_backward(dout.copy(), lib_cache)
        if ex.returns == "tuple":
            grads = dict(zip(ex.grad_names, lib))
        elif ex.returns == "array":
            grads = {ex.grad_names[0]: lib}
        else:
            grads = {"x": lib[0], **lib[1]}
        grads.update(mistake.compute(copy_inputs(arrays), dict(static), dout.copy()))
        return _pack(ex, grads)

    fb = check_backward(name, forward, backward)
    assert isinstance(fb, Feedback), f"{name}: the mistake {mistake.code!r} passed the checks"
    assert mistake.code in fb.codes, fb.text
    assert mistake.message in fb.text or ex.returns == "dx_grads", fb.text   # a layer's paths may share one
    gc_case = next(c for c in ex.cases() if c.gradcheck)
    try:
        out, _ = ex.reference(copy_inputs(gc_case.arrays), dict(gc_case.static))
        mistake.compute(copy_inputs(gc_case.arrays), dict(gc_case.static), np.ones(out.shape))
        applies = True
    except ValueError:     # e.g. dV = A dout needs n_q = n_k: a student's code would crash there too
        applies = False
    if applies:
        assert "gradcheck" in fb.codes, fb.text
    else:
        assert "exception" in fb.codes and "during the finite-difference check" in fb.text, fb.text
    assert set(fb.codes) <= {mistake.code, "gradcheck", "exception"}, fb.text


# ----------------------------------------------------------------------------- hand-written slips
def _assert_readable(fb: Feedback) -> str:
    """Feedback is plain text for a student: no traceback, no library file paths, no blank line
    (otter's doctest would need <BLANKLINE>)."""
    text = fb.text
    assert "Traceback" not in text and 'File "' not in text and "site-packages" not in text, text
    assert "\n\n" not in text and text == repr(fb) == str(fb)
    return text


def test_missing_scale_in_attention_is_named():
    def attention_no_scale(Q, K, V, mask=None):
        S = Q @ K.swapaxes(-1, -2)                              # no / sqrt(d_k)
        if mask is not None:
            S = S + mask
        A = softmax(S)
        return A @ V, {"A": A}

    fb = check_forward("attention", attention_no_scale)
    assert fb.codes == ["missing_scale"]
    assert "head width" in _assert_readable(fb) and "case 1 of 3" in fb.text


def test_missing_scale_in_the_backward_is_named_as_the_factor_sqrt_dk():
    def backward(dout, cache):
        dQ, dK, dV = attention_backward(dout, cache)
        return dQ * math.sqrt(cache["Q"].shape[-1]), dK, dV  # forgot the 1/sqrt(d_k) in dQ

    fb = check_backward("attention", attention_forward, backward)
    assert fb.codes == ["scale_factor", "gradcheck"], fb.text
    text = _assert_readable(fb)
    assert "dQ: is off by a constant factor: yours is the expected values times √d_k" in text
    assert "relative error dQ" in text


def test_transposed_output_is_named():
    def attention_transposed(Q, K, V, mask=None):
        out, cache = attention_forward(Q, K, V, mask)
        return out.swapaxes(-1, -2), cache

    fb = check_forward("attention", attention_transposed)
    assert fb.codes == ["shape"]
    assert "the last two axes are swapped" in _assert_readable(fb)


def test_transposed_square_weight_gradient_is_named():
    def backward(dout, cache):
        dx, grads = mha_backward(dout, cache)
        return dx, {**grads, "W_O": grads["W_O"].T}

    fb = check_backward("mha", mha_forward, backward)
    assert fb.codes == ["transposed", "gradcheck"]
    assert "grads['W_O']: holds the transpose" in _assert_readable(fb)


def test_softmax_over_the_wrong_axis_is_named():
    def softmax_axis0(x):
        e = np.exp(x - x.max(axis=0, keepdims=True))
        return e / e.sum(axis=0, keepdims=True), None

    fb = check_forward("softmax", softmax_axis0)
    assert fb.codes == ["softmax_axis"]
    assert "axis 0 instead of the last axis" in _assert_readable(fb)


def test_unstable_softmax_fails_only_on_large_scores_with_the_cause_in_words():
    def naive(x):
        e = np.exp(x)
        return e / e.sum(axis=-1, keepdims=True), None

    fb = check_forward("softmax", naive)
    assert fb.codes == ["nonfinite"]
    text = _assert_readable(fb)
    assert "case 3 of 3" in text and "cases 1–2 passed" in text and "keeps every exponent at most 0" in text


def test_wrong_shapes_are_explained():
    def returns_weights(Q, K, V, mask=None):
        _, cache = attention_forward(Q, K, V, mask)
        return cache["weights"], cache

    fb = check_forward("attention", returns_weights)
    assert fb.codes == ["shape"]
    assert "the shape of the attention weights A" in _assert_readable(fb)

    def dgamma_not_summed(dout, cache):
        dx, _, dbeta = layernorm_backward(dout, cache)
        return dx, dout * cache["xhat"], dbeta

    fb = check_backward("layernorm", layernorm_forward, dgamma_not_summed)
    assert fb.codes == ["shape"]
    assert "dgamma: has shape (4, 6), expected (6,)" in fb.text and "sum its gradient over those axes" in fb.text


def test_wrong_backwards_are_diagnosed():
    def diagonal_only(dout, cache):
        s = cache["s"]
        return dout * s * (1 - s)

    fb = check_backward("softmax", softmax_forward, diagonal_only)
    assert fb.codes == ["jacobian_diagonal", "gradcheck"]
    assert "diagonal of the softmax Jacobian" in _assert_readable(fb)

    def naive_layernorm(dout, cache):
        _, dgamma, dbeta = layernorm_backward(dout, cache)
        return dout * cache["gamma"] * cache["rstd"], dgamma, dbeta

    fb = check_backward("layernorm", layernorm_forward, naive_layernorm)
    assert fb.codes == ["ln_backward_terms", "gradcheck"]
    assert "treats μ and σ² as constants" in _assert_readable(fb)

    def flipped_sign(dout, cache):
        dx, dgamma, dbeta = layernorm_backward(dout, cache)
        return -dx, dgamma, dbeta

    fb = check_backward("layernorm", layernorm_forward, flipped_sign)
    assert fb.codes == ["sign", "gradcheck"]

    def pre_ln_without_the_last_skip(dout, cache):   # Pre-LN backward, dx = LN1's path only
        grads = {}
        dy2, g = ffn_backward(dout, cache["ffn"])
        grads.update({"ffn." + k: v for k, v in g.items()})
        dz, grads["ln2.gamma"], grads["ln2.beta"] = layernorm_backward(dy2, cache["ln2"])
        dz = dz + dout
        dy1, g = mha_backward(dz, cache["attn"])
        grads.update({"attn." + k: v for k, v in g.items()})
        dx, grads["ln1.gamma"], grads["ln1.beta"] = layernorm_backward(dy1, cache["ln1"])
        return dx, grads                                # forgot: dx = dx + dz

    fb = check_backward("encoder_layer_pre", _layer_forward, pre_ln_without_the_last_skip)
    assert fb.codes == ["missing_skip_gradient", "gradcheck"], fb.text
    assert "dx: leaves out the gradient of the skip path around the attention sublayer" in _assert_readable(fb)


def _attention_no_scale(Q, K, V, mask=None):
    """A recognisable forward slip (missing 1/sqrt(d_k)): its backward is then followed, not compared."""
    out, cache = attention_forward(Q * math.sqrt(Q.shape[-1]), K, V, mask)
    return out, {**cache, "Q": Q}


def test_a_followed_backward_still_has_its_gradient_shapes_and_finiteness_checked():
    """With a slipped forward the backward is checked against the student's own forward; its gradients are
    still checked one by one for shape and for NaN/inf first, in dQ, dK, dV order."""
    def dk_one_key_short(dout, cache):
        dQ, dK, dV = attention_backward(dout, cache)
        return dQ, dK[..., :-1, :], dV

    def dv_nan(dout, cache):
        dQ, dK, dV = attention_backward(dout, cache)
        dV = dV.copy()
        dV[..., 0, 0] = np.nan
        return dQ, dK, dV

    def both(dout, cache):
        dQ, dK, dV = dv_nan(dout, cache)
        return dQ, dK[..., :-1, :], dV

    assert check_forward("attention", _attention_no_scale).codes == ["missing_scale"]
    fb = check_backward("attention", _attention_no_scale, dk_one_key_short)
    assert fb.codes == ["shape"], fb.text
    assert "dK:" in _assert_readable(fb)
    fb = check_backward("attention", _attention_no_scale, dv_nan)
    assert fb.codes == ["nonfinite"], fb.text
    assert "dV: has NaN/inf entries" in _assert_readable(fb)
    assert check_backward("attention", _attention_no_scale, both).codes == ["shape", "nonfinite"]


def test_post_ln_written_as_pre_ln_is_named():
    def always_pre(x, p, norm, n_heads, mask=None, eps=1e-5):
        return _layer_forward(x, p, "pre", n_heads, mask, eps)

    fb = check_forward("encoder_layer_post", always_pre)
    assert fb.codes == ["wrong_norm_position"]
    assert "Pre-LN" in _assert_readable(fb)
    assert check_forward("encoder_layer_pre", always_pre) is None


def test_unwritten_and_crashing_code_becomes_feedback():
    def not_written(x):
        raise NotImplementedError

    def stub(x):
        ...

    def backward_stub(dout, cache):
        ...

    def crashes(x):
        e = np.exp(x)
        return e / e.sum(axis=-1), None          # no keepdims: (4, 5) / (4,) does not broadcast

    assert check_forward("softmax", not_written).codes == ["not_implemented"]
    assert check_forward("softmax", stub).codes == ["returned_none"]
    fb = check_forward("softmax", crashes)
    assert fb.codes == ["exception"]
    text = _assert_readable(fb)
    assert "raised ValueError" in text and "e / e.sum(axis=-1)" in text       # the student's own line
    assert check_backward("softmax", stub, backward_stub).codes == ["forward_first"]
    assert check_backward("softmax", softmax_forward, backward_stub).codes == ["returned_none"]
    assert check_forward("softmax", 3).codes == ["not_callable"]


def test_library_errors_raised_inside_student_code_are_reported_without_traceback():
    def wrong_rank(Q, K, V, mask=None):
        return attention_forward(Q, K[..., None], V, mask)   # the library refuses the shapes

    fb = check_forward("attention", wrong_rank)
    assert fb.codes == ["exception"]
    text = _assert_readable(fb)
    assert "in a call made at" in text and "attention_forward(Q, K[..., None], V, mask)" in text


def test_mutating_an_input_and_wrong_return_structures_are_reported():
    def in_place(x, gamma, beta, eps):
        x -= x.mean(axis=-1, keepdims=True)
        return layernorm_forward(x, gamma, beta, eps)

    assert check_forward("layernorm", in_place).codes == ["mutated_input"]

    def two_of_three(dout, cache):
        return layernorm_backward(dout, cache)[:2]

    assert check_backward("layernorm", layernorm_forward, two_of_three).codes == ["wrong_count"]

    def misspelled(dout, cache):
        dx, grads = mha_backward(dout, cache)
        grads["W_q"] = grads.pop("W_Q")
        return dx, grads

    fb = check_backward("mha", mha_forward, misspelled)
    assert fb.codes == ["unexpected_gradient"] and "did you mean 'W_Q'?" in fb.text

    def forgot_one(dout, cache):
        dx, grads = mha_backward(dout, cache)
        del grads["b_O"]
        return dx, grads

    assert check_backward("mha", mha_forward, forgot_one).codes == ["missing_gradient"]


def test_tanh_gelu_is_told_apart_from_the_exact_one():
    fb = check_forward("gelu", lambda z: activation_forward(z, "gelu_tanh"))
    assert fb.codes == ["wrong_activation"] and "tanh approximation" in fb.text


def test_unknown_exercise_is_an_error_with_a_suggestion():
    with pytest.raises(InputValueError, match="did you mean 'softmax'"):
        check_forward("softmx", softmax_forward)


# ----------------------------------------------------------------------------- the notebooks, end to end
def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _build(name: str, out: Path) -> tuple[Path, Path]:
    """``scripts/build_exercises.sh`` (otter assign) for one assignment; returns (solution, student)."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build_exercises.sh"), "-o", str(out), "--no-run-tests",
                           "--no-wheel", name], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / name / "autograder" / f"{name}.ipynb", out / name / "student" / f"{name}.ipynb"


def _execute(path: Path, monkeypatch):
    import nbformat

    for key, value in _env().items():                    # the kernel inherits this process's environment
        monkeypatch.setenv(key, value)
    return execute_notebook(nbformat.read(path, as_version=4), path.parent)   # raises on any error


def _check_outputs(nb) -> dict[str, str]:
    """{question: the text its ``grader.check("q…")`` cell printed}."""
    found = {}
    for cell in nb.cells:
        m = re.fullmatch(r'grader\.check\("(\w+)"\)', cell.source.strip()) if cell.cell_type == "code" else None
        if m:
            found[m.group(1)] = "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "")
                                        for o in cell.outputs)
    return found


def _solution_lines(name: str) -> list[str]:
    import nbformat

    nb = nbformat.read(REPO / "exercises" / f"{name}.ipynb", as_version=4)
    lines, inside = [], False
    for cell in nb.cells:
        for line in cell.source.splitlines() if cell.cell_type == "code" else []:
            if line.strip() == "# BEGIN SOLUTION":
                inside = True
            elif line.strip() == "# END SOLUTION":
                inside = False
            elif inside and len(line.strip()) > 12:
                lines.append(line.strip())
    return lines


@pytest.mark.slow
@pytest.mark.notebooks
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_assignment_solution_passes_and_student_version_fails_with_feedback(name, tmp_path, monkeypatch):
    pytest.importorskip("otter", reason="the assignments need otter-grader: pip install 'otter-grader>=7'")
    pytest.importorskip("nbclient")
    solution, student = _build(name, tmp_path)
    tests = json.loads(student.read_text())["metadata"]["otter"]["tests"]
    assert tests, f"{name}: otter assign produced no tests"
    student_text = student.read_text()
    leaked = [line for line in _solution_lines(name) if line in student_text]
    assert not leaked, f"{name}: solution lines left in the student notebook: {leaked[:3]}"

    done = _check_outputs(_execute(solution, monkeypatch))
    assert set(done) == set(tests), (sorted(done), sorted(tests))
    for q, text in done.items():
        assert "All test cases passed" in text and "❌" not in text, f"{name} {q} (solution):\n{text}"

    done = _check_outputs(_execute(student, monkeypatch))     # runs to the end: no cell raised
    assert set(done) == set(tests)
    for q, text in done.items():
        n_cases = len(tests[q]["suites"][0]["cases"])
        assert text.count("❌ Test case failed") == n_cases, f"{name} {q} (student):\n{text}"
        assert len(re.findall(r"Got:\n\s+✗ \w+: ", text)) == n_cases, f"{name} {q}: a check failed without feedback"
        assert "Traceback" not in text and "transformer_np/" not in text, f"{name} {q}:\n{text}"
