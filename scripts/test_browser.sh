#!/usr/bin/env bash
# The browser lane (marker "browser"): the docs site built and opened offline in a headless Chromium
# (tests/test_docs_offline.py), and the page of `worksheet serve` driven through chromedriver with Selenium
# (tests/worksheets/test_worksheet_serve_browser.py). The README's test command (scripts/test.sh) leaves it out
# because it needs a browser and its driver:
#   apt-get install chromium chromium-driver        # or chromium-browser, google-chrome (+ a chromedriver)
#   . .venv/bin/activate && bash scripts/test_browser.sh
# Run it in the venv scripts/test.sh made (it needs the docs packages and pytest, both in ".[test]").
# TNP_DOCS_HTML=docs/_build/html uses a site scripts/docs.sh built instead of building one. Extra arguments go to
# pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
found=""
for name in chromium chromium-browser google-chrome google-chrome-stable; do   # as tests/test_docs_offline.py
    if command -v "$name" >/dev/null; then found=$name; break; fi
done
if [ -z "$found" ]; then
    echo "scripts/test_browser.sh: needs a Chromium (looked for chromium, chromium-browser, google-chrome," \
         "google-chrome-stable): apt-get install chromium" >&2
    exit 2
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg
rc=0
if ! command -v chromedriver >/dev/null; then
    echo "scripts/test_browser.sh: needs chromedriver for the worksheet page's test: apt-get install chromium-driver" >&2
    exit 2
fi
# axe-core (the accessibility checker the worksheet page's test loads from disk into the page): installed with npm
# into .axe-core/ (git-ignored) when absent; TNP_AXE_JS=/path/to/axe.min.js uses another copy.
AXE_VERSION=4.14.1
if [ -z "${TNP_AXE_JS:-}" ] && [ ! -f .axe-core/node_modules/axe-core/axe.min.js ]; then
    if ! command -v npm >/dev/null; then
        echo "scripts/test_browser.sh: needs npm to install axe-core for the worksheet page's test: apt-get install npm" >&2
        exit 2
    fi
    npm install --no-save --no-audit --no-fund --prefix .axe-core "axe-core@$AXE_VERSION" >&2
fi
python -m pytest -m browser -p no:cacheprovider tests/test_docs_offline.py tests/worksheets/test_worksheet_serve_browser.py \
    "$@" || rc=$?
if [ "$rc" -eq 5 ]; then echo "scripts/test_browser.sh: no test was collected" >&2; fi
exit "$rc"
