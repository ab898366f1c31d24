"""What a newcomer gets from an installed package, read from the packaging files (fast lane): every extra that
runs a BLAS-heavy command installs threadpoolctl (without it `figures` took 688 s on a busy 2-core machine
instead of about a minute), and `figures` finds the data of every figure set inside the package (the
training-stability figures were skipped without a word outside a clone)."""

from __future__ import annotations

import fnmatch
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_every_extra_that_runs_a_blas_heavy_command_installs_threadpoolctl():
    script = (ROOT / "scripts" / "check_extras.sh").read_text(encoding="utf-8")
    needs = set(re.search(r'^NEEDS_THREADPOOLCTL="([^"]*)"', script, re.M).group(1).split())
    assert {"plot", "notebooks", "torch", "course"} <= needs, needs      # figures, notebooks, bench, exercises
    extras = PYPROJECT["project"]["optional-dependencies"]
    missing = sorted(x for x in needs if "threadpoolctl" not in _names(extras[x]))
    assert not missing, f"extras that run BLAS-heavy commands without threadpoolctl: {missing}"


def test_the_training_stability_data_is_package_data():
    from transformer_np.course.stability import STABILITY_JSON

    package = ROOT / "transformer_np"
    relative = STABILITY_JSON.relative_to(package).as_posix()         # inside the package, not notebooks/
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["transformer_np"]
    assert STABILITY_JSON.is_file() and any(fnmatch.fnmatch(relative, p) for p in patterns), (relative, patterns)
