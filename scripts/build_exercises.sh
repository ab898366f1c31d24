#!/usr/bin/env bash
# Generate the student notebooks and the autograders of the assignments in exercises/ with otter-grader.
#
#   bash scripts/build_exercises.sh [-o OUT_DIR] [--no-run-tests] [NAME ...]
#
# For each solution notebook exercises/NAME.ipynb (the only source; NAME like 01_softmax, default: all)
# this runs `otter assign exercises/NAME.ipynb OUT_DIR/NAME`, which writes
#   OUT_DIR/NAME/student/NAME.ipynb      the hand-out: solutions replaced by `...`, check cells kept
#   OUT_DIR/NAME/autograder/NAME.ipynb   the solution notebook with its check cells
#   OUT_DIR/NAME/autograder/NAME-autograder_<timestamp>.zip   for `otter run` / `otter grade` / Gradescope
# otter assign then runs the checks against the solutions and fails if one does not pass
# (--no-run-tests skips that; the test suite executes the notebooks itself).
# OUT_DIR defaults to build/exercises (git-ignored). Needs otter-grader (the "course" extra).
set -euo pipefail
cd "$(dirname "$0")/.."
out="build/exercises"
assign_opts=()
names=()
while (( $# )); do
    case "$1" in
        -o|--out) out="${2:?$1 needs a directory}"; shift 2 ;;
        --no-run-tests) assign_opts+=(--no-run-tests); shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        -*) echo "build_exercises.sh: unknown option $1 (expected -o OUT_DIR, --no-run-tests, NAME ...)" >&2; exit 2 ;;
        *) names+=("${1%.ipynb}"); shift ;;
    esac
done
command -v otter >/dev/null || { echo "build_exercises.sh: otter not found; pip install \"otter-grader>=7\"" >&2; exit 2; }
if (( ${#names[@]} == 0 )); then
    for nb in exercises/[0-9]*.ipynb; do names+=("$(basename "$nb" .ipynb)"); done
fi
for name in "${names[@]}"; do
    name="$(basename "$name")"
    [[ -f "exercises/$name.ipynb" ]] || { echo "build_exercises.sh: no solution notebook exercises/$name.ipynb" >&2; exit 2; }
done
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the checks import this checkout's transformer_np
for name in "${names[@]}"; do
    name="$(basename "$name")"
    rm -rf "${out:?}/$name"
    mkdir -p "$out/$name"
    echo "== $name -> $out/$name"
    otter assign "${assign_opts[@]}" "exercises/$name.ipynb" "$out/$name"
done
echo "student notebooks: $out/*/student/   autograders: $out/*/autograder/*.zip"
