"""The test matrix: the NumPy-only fast lane on every Python and NumPy that pyproject.toml promises.

    nox -s fast                              # all eight sessions: Python 3.10–3.13 × NumPy oldest / newest
    nox -s "fast-3.10(numpy='oldest')"       # one session (nox -l lists them)
    nox -s corners-oldest corners-newest     # what CI runs: oldest Python + oldest NumPy, newest + newest

``oldest`` installs the declared floors, pinned by ``constraints/oldest.txt`` (NumPy at the oldest release with
wheels for that Python, the test tools at the ``test-fast`` extra's floors), and prints what it installed, so a
NumPy-2-only API that reaches the core fails there. ``newest`` lets pip pick the newest releases that install.

The interpreters are the ones ``pyenv versions`` lists on the project's machines; their ``bin`` folders are put on
PATH here so nox finds ``python3.10`` … ``python3.13`` without ``pyenv shell``. Elsewhere, any ``python3.X`` on PATH
will do. Arguments after ``--`` go to pytest (``nox -s fast -- -x -k erf``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nox

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
FAST_LANE = "not torch and not hf and not jax and not plot and not slow and not notebooks"
CONSTRAINTS = Path(__file__).parent / "constraints" / "oldest.txt"

nox.options.sessions = ["fast"]
nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True     # a promised Python that is missing is a failure, not a skip


def _pyenv_bins() -> list[str]:
    """The bin folders of pyenv's 3.10–3.13 interpreters (newest patch release of each), if pyenv is here."""
    if not shutil.which("pyenv"):
        return []
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return []
    found = {}
    for v in sorted(Path(root, "versions").glob("3.*"), key=lambda p: [int(x) for x in p.name.split(".")
                                                                       if x.isdigit()]):
        minor = ".".join(v.name.split(".")[:2])
        if minor in PYTHONS and (v / "bin" / f"python{minor}").exists():
            found[minor] = str(v / "bin")
    return list(found.values())


os.environ["PATH"] = os.pathsep.join(_pyenv_bins() + [os.environ.get("PATH", "")])


def _fast_lane(session: nox.Session, numpy: str) -> None:
    if numpy == "oldest":
        session.install("-c", str(CONSTRAINTS), "-e", ".[test-fast]")
    else:
        session.install("--upgrade", "-e", ".[test-fast]")
    session.run("python", "-c", "import sys, numpy, pytest, hypothesis; "
                "print('Python', sys.version.split()[0], '| NumPy', numpy.__version__, '| pytest', pytest.__version__,"
                " '| Hypothesis', hypothesis.__version__)")
    if numpy == "oldest":      # the floors really are what was installed
        session.run("python", "-m", "pip", "check")
        session.run("python", str(Path(__file__).parent / "constraints" / "check_installed.py"), str(CONSTRAINTS))
    session.run("python", "-m", "pytest", "-n", "2", "-m", FAST_LANE, "-p", "no:cacheprovider", *session.posargs)


@nox.session(python=PYTHONS)
@nox.parametrize("numpy", ["oldest", "newest"])
def fast(session: nox.Session, numpy: str) -> None:
    """The NumPy-only fast lane on one Python with the oldest or the newest NumPy."""
    _fast_lane(session, numpy)


@nox.session(python=PYTHONS[0], name="corners-oldest")
def corners_oldest(session: nox.Session) -> None:
    """Oldest Python with the oldest declared NumPy and test tools (CI)."""
    _fast_lane(session, "oldest")


@nox.session(python=PYTHONS[-1], name="corners-newest")
def corners_newest(session: nox.Session) -> None:
    """Newest Python with the newest NumPy and test tools (CI)."""
    _fast_lane(session, "newest")
