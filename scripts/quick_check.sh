#!/usr/bin/env bash
# The quick check: see that the library works on this machine in a few minutes, with NumPy and pytest only.
#   python3 -m venv .venv && . .venv/bin/activate && bash scripts/quick_check.sh
# Installs this checkout with NumPy (its only dependency) and pytest, then runs a representative subset of the
# tests: every op's finite-difference gradient check (tests/ops/test_ops.py), the article's worked example
# "the cat sat" (tests/course/test_trace.py: the trace command and its numbers), the worksheet checker on the
# article's own problem (tests/worksheets/test_worksheet_article.py), and the exercise grader's honest path (the
# in-notebook checks and the grade of record on solutions and honest variants, each run in its child process).
# At the end it says what it did not run; bash scripts/test.sh runs everything (2.6 GB, about half an hour).
# Extra arguments go to both pytest runs (e.g. -x).
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
python -m pip install -q --disable-pip-version-check -e . "pytest>=7" || exit
export MPLBACKEND=Agg
# the NumPy-only lane (CONTRIBUTING.md): tests needing an optional package or taking long are left out
lane="not torch and not hf and not jax and not plot and not slow and not notebooks and not browser"
status=0
run() {   # pytest's status 5 (nothing collected: a test file renamed) is a failure too
    local rc=0
    python -m pytest -q -p no:cacheprovider -m "$lane" "$@" || rc=$?
    if [ "$rc" -eq 5 ]; then echo "scripts/quick_check.sh: no test was collected by: pytest $*" >&2; fi
    if [ "$rc" -ne 0 ]; then status=1; fi
}
run tests/ops/test_ops.py tests/course/test_trace.py tests/worksheets/test_worksheet_article.py \
    tests/grader/test_honest_work.py "$@"
run tests/grader/test_grade.py -k "solutions_score_full_marks or honest" "$@"
echo
if [ "$status" -eq 0 ]; then verdict="passed"; else verdict="FAILED (see above)"; fi
echo "scripts/quick_check.sh: $verdict in $((SECONDS - start)) s (install included)."
echo "Not run here: the rest of the NumPy tests (model, io, training, reliability, the worksheet and grader"
echo "suites, docs), the PyTorch / Hugging Face / JAX parity lanes, the plots, the slow tests, the six notebooks"
echo "and the browser lane. bash scripts/test.sh runs all of them but the browser lane (scripts/test_browser.sh)."
exit "$status"
