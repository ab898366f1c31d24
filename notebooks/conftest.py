"""nbval settings for the notebooks (``python -m pytest notebooks --nbval``).

The notebooks' printed outputs are compared with the stored ones after the rules in
``nbval_sanitize.cfg`` (negative zero reads as zero; widths that a minus sign changes are ignored).
They are used whenever nbval runs here, from scripts/test.sh or by hand, unless a sanitize file is
given on the command line (``--nbval-sanitize-with``).
"""

from __future__ import annotations

from pathlib import Path

SANITIZE = Path(__file__).resolve().with_name("nbval_sanitize.cfg")


def pytest_configure(config):
    option = config.option
    if hasattr(option, "nbval_sanitize_with") and not option.nbval_sanitize_with:
        option.nbval_sanitize_with = str(SANITIZE)
