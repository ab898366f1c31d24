#!/usr/bin/env bash
# Generate the student notebooks and the autograders of the assignments in exercises/ with otter-grader.
#
#   bash scripts/build_exercises.sh [-o OUT_DIR] [--no-run-tests] [--no-wheel] [NAME ...]
#
# For each solution notebook exercises/NAME.ipynb (the only source; NAME like 01_softmax, default: all)
# this stages a copy with the points of transformer_np/grader/grading.py's POINTS written into its
# questions, and runs `otter assign` on it, which writes
#   OUT_DIR/NAME/student/NAME.ipynb      the hand-out: solutions replaced by `...`, public checks kept,
#                                        hidden checks removed
#   OUT_DIR/NAME/autograder/NAME.ipynb   the solution notebook with every check (keep it private)
#   OUT_DIR/NAME/autograder/NAME-autograder_<timestamp>.zip   for `otter run` / `otter grade` (formative)
#   OUT_DIR/NAME/gradescope/NAME-gradescope.zip   a Gradescope autograder running the grade of record
#                                        (transformer_np/grader/platforms.py; not with --no-wheel)
#   OUT_DIR/prairielearn/                a PrairieLearn course folder: questions/NAME/ (an externally graded
#                                        upload of the notebook) and serverFilesCourse/ (the library, the entrypoint)
# The zip's environment.yml installs otter and a wheel of this checkout (built once, shipped in the zip
# under files/wheels/), hence NumPy; nothing else (--no-wheel: otter's default environment, which lacks
# transformer_np — only for local `otter run` in an environment that has it).
# otter assign then grades the solutions with their checks and fails if one does not pass
# (--no-run-tests skips that; the test suite grades the notebooks itself).
# OUT_DIR defaults to build/exercises (git-ignored). Needs otter-grader (the "course" extra).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
out="build/exercises"
assign_opts=()
wheel=1
names=()
while (( $# )); do
    case "$1" in
        -o|--out) out="${2:?$1 needs a directory}"; shift 2 ;;
        --no-run-tests) assign_opts+=(--no-run-tests); shift ;;
        --no-wheel) wheel=0; shift ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        -*) echo "build_exercises.sh: unknown option $1 (expected -o OUT_DIR, --no-run-tests, --no-wheel, NAME ...)" >&2; exit 2 ;;
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
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"   # the checks import this checkout's transformer_np
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
whl=""
if (( wheel )); then
    # the wheel is built from a copy, so the checkout gets no build/ or *.egg-info
    git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | (mkdir -p "$stage/src" && cd "$stage/src" && tar -xf -)
    iso=()   # build with the installed setuptools when it is new enough, else in pip's isolated build env
    python -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" 2>/dev/null \
        && iso=(--no-build-isolation)
    python -m pip wheel --quiet --no-deps "${iso[@]}" -w "$stage/wheels" "$stage/src" >/dev/null
    whl="$(cd "$stage/wheels" && ls transformer_np-*.whl)"
    echo "== wheel $whl"
fi
for name in "${names[@]}"; do
    name="$(basename "$name")"
    rm -rf "${out:?}/$name" "$stage/$name"
    mkdir -p "$out/$name" "$stage/$name"
    [[ -n "$whl" ]] && cp -r "$stage/wheels" "$stage/$name/wheels"
    python -m transformer_np.grader.grading stage "exercises/$name.ipynb" "$stage/$name/$name.ipynb" $whl
    echo "== $name -> $out/$name"
    (cd "$stage/$name" && otter assign "${assign_opts[@]}" "$name.ipynb" "$out/$name")
    if [[ -n "$whl" ]]; then
        python -m transformer_np.grader.platforms gradescope-zip "$name" "$out/$name/gradescope" "$stage/wheels/$whl"
    fi
done
rm -rf "${out:?}/prairielearn"
python -m transformer_np.grader.platforms prairielearn-course "$out/prairielearn" "${names[@]}"
echo "student notebooks: $out/*/student/   otter autograders: $out/*/autograder/*.zip"
[[ -n "$whl" ]] && echo "Gradescope autograders (grade of record): $out/*/gradescope/*-gradescope.zip"
echo "PrairieLearn course folder: $out/prairielearn/"
