"""Honest work never loses a mark to the checks (issue 35, item 4), in the in-notebook checks that the grade
of record (``transformer-np grade``) reuses through its proxies.

A ``print`` in a correct function (its output would land in otter's doctest, whose expected output is empty),
``np.seterr(all="raise")`` or warnings-as-errors set by the notebook, a KeyboardInterrupt or SystemExit in
the student's code, an exception relayed from the grade's child process, float32 arithmetic, and a forward
that overflows on one case each get a verdict on the results and one line naming the cause.
"""

from __future__ import annotations

import doctest
import warnings

import numpy as np
import pytest
from test_grading import HONEST, SEED, softmax_bwd, softmax_fwd

from transformer_np.course.exercises import EXERCISE_NAMES, Feedback, check_backward, check_forward, run_forward
from transformer_np.grader.grading import grade_backward, grade_forward
from transformer_np.grader.specs import EXERCISES


# ============================================================================= prints
def _printing(fn, text="debugging: shapes look right\n"):
    def student(*args):
        print(text, end="")
        return fn(*args)
    return student


def _doctest_passes(source: str, globs: dict) -> bool:
    """What otter does with a test cell: a doctest whose expected output is empty."""
    test = doctest.DocTestParser().get_doctest(source, globs, "cell", None, 0)
    runner = doctest.DocTestRunner(verbose=False)
    runner.run(test, out=lambda _: None)
    return runner.failures == 0


@pytest.mark.parametrize("name", ["softmax", "layernorm", "mha"])
def test_a_print_in_a_correct_function_changes_no_verdict(name, capsys):
    fwd, bwd = HONEST[name]
    loud_fwd, loud_bwd = _printing(fwd), _printing(bwd)
    assert check_forward(name, loud_fwd) is None and check_backward(name, loud_fwd, loud_bwd) is None
    assert grade_forward(name, loud_fwd, seed=SEED) is None
    assert grade_backward(name, loud_fwd, loud_bwd, seed=SEED) is None
    assert capsys.readouterr() == ("", "")           # nothing reached the cell's output
    globs = {"check_forward": check_forward, "check_backward": check_backward, "f": loud_fwd, "b": loud_bwd}
    assert _doctest_passes(f'>>> check_forward("{name}", f)\n', globs)
    assert _doctest_passes(f'>>> check_backward("{name}", f, b)\n', globs)


def test_a_failing_check_says_how_much_was_printed_without_showing_it(capsys):
    def wrong(x):
        print("x" * 3_000_000)                        # 3 MB: counted, not kept
        e = np.exp(x - x.max(-1, keepdims=True))
        return 2 * e / e.sum(-1, keepdims=True), None

    fb = check_forward("softmax", wrong)
    assert isinstance(fb, Feedback) and fb.codes == ["scale_factor"], fb
    assert "printed 3000001 characters" in fb.text and "xxxx" not in fb.text
    assert capsys.readouterr() == ("", "")


def test_prints_to_stderr_are_captured_too(capsys):
    import sys

    def to_stderr(x):
        print("warning from the student", file=sys.stderr)
        return softmax_fwd(x)

    assert grade_forward("softmax", to_stderr, seed=SEED) is None
    assert capsys.readouterr() == ("", "")


# ============================================================================= the notebook's NumPy and warnings state
@pytest.fixture
def strict_numpy():
    """A notebook that ran ``np.seterr(all="raise")`` and ``warnings.simplefilter("error")``."""
    old = np.seterr(all="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield
    np.seterr(**old)


@pytest.mark.parametrize("name", EXERCISE_NAMES)
def test_seterr_raise_and_warnings_as_errors_in_the_notebook_change_no_verdict(name, strict_numpy):
    fwd, bwd = HONEST[name]
    assert np.geterr()["under"] == "raise"
    assert grade_forward(name, fwd, seed=SEED) is None
    assert grade_backward(name, fwd, bwd, seed=SEED) is None
    assert np.geterr()["under"] == "raise"              # the notebook's state is left as it was


def test_seterr_inside_a_student_function_does_not_leak_into_the_checks():
    def sets_raise(x):
        np.seterr(all="raise")
        return softmax_fwd(x)

    before = np.geterr()
    try:
        assert grade_forward("softmax", sets_raise, seed=SEED) is None
        assert grade_backward("softmax", sets_raise, softmax_bwd, seed=SEED) is None
        assert np.geterr() == before
    finally:
        np.seterr(**before)


# ======================================================= KeyboardInterrupt, SystemExit, the grader's own
def test_keyboard_interrupt_and_system_exit_cost_that_check_only():
    def interrupted(dout, cache):
        raise KeyboardInterrupt

    fb = grade_backward("softmax", softmax_fwd, interrupted, seed=SEED)
    assert fb.codes == ["exception"] and "raised KeyboardInterrupt" in fb.text, fb
    assert "\n  -" in fb.text and fb.text.count("\n  - ") == 1

    def exits(x):
        raise SystemExit(3)

    fb = grade_forward("softmax", exits, seed=SEED)
    assert fb.codes == ["exception"] and "raised SystemExit: 3" in fb.text, fb
    assert grade_backward("softmax", exits, softmax_bwd, seed=SEED).codes == ["forward_first"]
    assert grade_forward("softmax", softmax_fwd, seed=SEED) is None      # the next question is graded as usual


def doubled_fwd(x):
    """A forward slip (twice the softmax): its backward is followed, by the finite-difference check on each case
    (a backward that agrees with the library after a right forward is not checked by finite differences)."""
    s, cache = softmax_fwd(x)
    return 2 * s, cache


def test_an_interrupt_during_the_finite_difference_check_is_one_line():
    calls = []

    def late_interrupt(dout, cache):      # the derivative of doubled_fwd; interrupted in the finite-difference check
        calls.append(1)
        if len(calls) > 2:                # 1: its structure on case 1, 2: against the library, then central differences
            raise KeyboardInterrupt
        return 2 * softmax_bwd(dout, cache)

    fb = check_backward("softmax", doubled_fwd, late_interrupt)
    assert fb.codes == ["exception"], fb
    assert "raised KeyboardInterrupt" in fb.text and "during the finite-difference check" in fb.text


class _SandboxTimeout(BaseException):
    """Stands in for the grade-of-record sandbox's own BaseException (a child process that timed out)."""


def test_the_graders_own_base_exception_propagates_untouched():
    def times_out(*args):
        raise _SandboxTimeout("the child process timed out")

    with pytest.raises(_SandboxTimeout):
        grade_forward("softmax", times_out, seed=SEED)
    with pytest.raises(_SandboxTimeout):
        grade_backward("softmax", softmax_fwd, times_out, seed=SEED)
    with pytest.raises(_SandboxTimeout):
        run_forward(EXERCISES["softmax"], times_out, EXERCISES["softmax"].cases())


# ============================================================================= exceptions relayed from another process
class _Relayed(Exception):
    """What a grade-of-record proxy raises for an exception in the student's code, in the child process."""

    def __init__(self, student_type: str, message: str, student_where: str):
        super().__init__(message)
        self.student_type = student_type
        self.student_where = student_where


def _raising(exc):
    def student(*args):
        raise exc
    return student


def test_a_relayed_exception_reads_like_a_local_one():
    where = " — at line 3 of softmax_forward: `s = x.max()`"
    fb = check_forward("softmax", _raising(_Relayed("ValueError", "operands could not be broadcast\nmore", where)))
    assert fb.codes == ["exception"]
    assert fb.problems[0].message == f"raised ValueError: operands could not be broadcast{where}"

    fb = check_forward("softmax", _raising(_Relayed("NotImplementedError", "", "")))
    assert fb.codes == ["not_implemented"]
    local = check_forward("softmax", _raising(NotImplementedError()))
    assert fb.problems[0].message == local.problems[0].message

    fb = grade_backward("softmax", softmax_fwd, _raising(_Relayed("KeyboardInterrupt", "", "")), seed=SEED)
    assert fb.codes == ["exception"] and fb.problems[0].message == "raised KeyboardInterrupt"


def test_a_relayed_exception_in_the_finite_difference_check_reads_like_a_local_one():
    calls = []
    where = " — at line 2 of softmax_backward: `return s * dout`"

    def late(dout, cache):
        calls.append(1)
        if len(calls) > 2:
            raise _Relayed("ZeroDivisionError", "division by zero", where)
        return 2 * softmax_bwd(dout, cache)

    fb = check_backward("softmax", doubled_fwd, late)
    assert fb.codes == ["exception"]
    assert fb.problems[0].message == f"your functions raised ZeroDivisionError: division by zero{where} during " \
                                     f"the finite-difference check"


# ============================================================================= float32
def _cast(value, dtype):
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value.astype(dtype)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def _in_float32(fwd, store_as=np.float32):
    """The honest forward fed float32 copies of its inputs; the result returned as ``store_as``."""
    def student(*args):
        out, cache = fwd(*[_cast(a, np.float32) for a in args])
        return np.asarray(out, dtype=np.float32).astype(store_as), cache
    return student


@pytest.mark.parametrize("store_as", [np.float32, np.float64], ids=["float32", "float64-holding-float32"])
@pytest.mark.parametrize("name", EXERCISE_NAMES)
def test_a_float32_forward_is_named_as_such(name, store_as):
    fwd, _ = HONEST[name]
    student = _in_float32(fwd, store_as)
    for fb in (check_forward(name, student), grade_forward(name, student, seed=SEED)):
        assert isinstance(fb, Feedback) and fb.codes == ["float32"], fb
        assert "computes in float32" in fb.text and "times 1" not in fb.text
        assert ("returns float32 values" if store_as is np.float32 else "all float32 numbers") in fb.text


def test_a_float16_forward_is_named_as_such():
    def half(x):
        s, c = softmax_fwd(x.astype(np.float16))
        return s, c

    fb = grade_forward("softmax", half, seed=SEED)
    assert fb.codes == ["float32"] and "computes in float16" in fb.text, fb


def test_the_backward_of_a_float32_forward_says_so_rather_than_accusing_the_backward():
    student = _in_float32(softmax_fwd)
    fb = grade_backward("softmax", student, softmax_bwd, seed=SEED)
    assert isinstance(fb, Feedback) and fb.codes == ["float32"], fb
    assert "computes in float32" in fb.text


def test_float64_arithmetic_that_misses_is_not_called_float32():
    def tanh_gelu(z):            # a float64 near miss: the tanh approximation, named by its own diagnosis
        return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3))), None

    assert check_forward("gelu", tanh_gelu).codes == ["wrong_activation"]
    assert check_forward("gelu", _in_float32(tanh_gelu)).codes == ["wrong_activation"]   # float32 and tanh: the tanh


# ============================================================================= a forward that overflows
def naive_softmax_fwd(x):
    """No max subtraction: exp overflows on the large-scores case, right everywhere else."""
    e = np.exp(x)
    s = e / e.sum(-1, keepdims=True)
    return s, (s,)


def test_a_forward_that_overflows_on_one_case_costs_the_forward_only():
    assert check_forward("softmax", naive_softmax_fwd).codes == ["nonfinite"]
    assert grade_forward("softmax", naive_softmax_fwd, seed=SEED).codes == ["nonfinite"]
    assert check_backward("softmax", naive_softmax_fwd, softmax_bwd) is None
    assert grade_backward("softmax", naive_softmax_fwd, softmax_bwd, seed=SEED) is None


def test_a_wrong_backward_after_an_overflowing_forward_is_still_caught_and_the_skip_said():
    def diagonal_only(dout, cache):
        (s,) = cache
        return dout * s * (1 - s)

    fb = grade_backward("softmax", naive_softmax_fwd, diagonal_only, seed=SEED)
    assert isinstance(fb, Feedback) and fb.codes[0] == "jacobian_diagonal", fb
    assert "skipped, because your softmax_forward gives NaN/inf there" in fb.text and "large scores" in fb.text


def test_a_forward_that_is_nonfinite_everywhere_leaves_nothing_to_follow():
    def all_nan(x):
        return np.full_like(x, np.nan), None

    assert grade_backward("softmax", all_nan, softmax_bwd, seed=SEED).codes == ["forward_first"]


def test_checks_in_parallel_threads_capture_their_own_prints_and_restore_the_streams(capsys):
    """``transformer-np grade --workers`` runs checks in threads: each check counts its own student's prints,
    nothing reaches the output, and sys.stdout/sys.stderr and the warnings filters are the ones from before."""
    import sys
    import time
    from concurrent.futures import ThreadPoolExecutor

    def wrong_and_loud(n):
        def student(x):
            for _ in range(50):
                print("y" * n, flush=True)                     # n + 1 characters a line
                time.sleep(0.0005)                             # let the other threads run in between
            e = np.exp(x - x.max(-1, keepdims=True))
            return 2 * e / e.sum(-1, keepdims=True), None
        return student

    before = (sys.stdout, sys.stderr, warnings.filters)
    sizes = [3, 5, 7, 11, 13, 17]
    with ThreadPoolExecutor(3) as pool:
        feedback = list(pool.map(lambda n: check_forward("softmax", wrong_and_loud(n)), sizes))
    for n, fb in zip(sizes, feedback):
        assert fb.codes == ["scale_factor"] and "fails on case 1 of" in fb.text     # one call of the student's
        assert f"printed {50 * (n + 1)} characters" in fb.text, fb
    assert all(now is then for now, then in zip((sys.stdout, sys.stderr, warnings.filters), before))
    assert capsys.readouterr() == ("", "")
