"""Issue 37's acceptance: the generated hostile-folder set (scripts/hostile_set.py — safetensors headers of
1-100 MB in every JSON shape, lying shapes and offsets, sparse tensors of 3 and 16 GiB, a vocabulary of 10 M
lines, every special file in place of every file of a model folder) is refused case by case in a fresh
process under RLIMIT_AS = 4 GB: exit 2, one line naming the file, < 1 s of CPU, < 200 MB peak, the folder
byte-identical."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_hostile_set_is_refused_within_the_bounds():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "hostile_set.py"), "--quick", "--json"],
                       capture_output=True, text=True, timeout=1800)
    rep = json.loads(r.stdout)
    # by construction: 3 header sizes x 8 JSON shapes, 8 lying shapes/offsets/sparse/vocabulary cases, 8 files x 5
    # special kinds
    assert rep["cases"] == 3 * 8 + 8 + 8 * 5
    assert rep["failed"] == [], [x for x in rep["results"] if not x["ok"]]
    assert rep["slowest"]["cpu"] < 1.0 and rep["largest"]["rss_mb"] < 200
