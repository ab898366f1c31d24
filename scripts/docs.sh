#!/usr/bin/env bash
# Build the documentation site into docs/_build/html; any Sphinx warning is an error.
# Needs the docs extra: pip install -e ".[docs]"
set -euo pipefail
cd "$(dirname "$0")/.."
python -m sphinx -W --keep-going -b html docs docs/_build/html "$@"
