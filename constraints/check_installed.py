"""Fail unless every pin of a constraints file that applies to this Python is what is installed.

    python constraints/check_installed.py constraints/oldest.txt

pip's ``-c`` only constrains what it installs; this check proves the session really runs on the floors (and not on
a newer release already present, or one pulled in some other way)."""

from __future__ import annotations

import sys
from importlib import metadata

from packaging.markers import Marker
from packaging.requirements import Requirement


def main(path: str) -> int:
    wrong = []
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        if req.marker is not None and not Marker(str(req.marker)).evaluate():
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{req.name}: not installed (constraint {req.specifier})")
            continue
        if have not in req.specifier:
            wrong.append(f"{req.name}: {have} installed, constraint {req.specifier}")
    for w in wrong:
        print(f"{path}: {w}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
