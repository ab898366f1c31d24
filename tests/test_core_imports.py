"""The core imports alone: ``transformer_np.ops`` and ``transformer_np.model`` load NumPy and the core,
nothing of the application packages (issue 46, item 4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the packages (and the one module, ``testing``) above the core in the layering
APPLICATION = ("io", "worksheets", "course", "grader", "training", "perf", "testing", "cli")


def _loaded_after(statement: str) -> list[str]:
    """The ``transformer_np`` modules in ``sys.modules`` after running ``statement`` in a fresh interpreter."""
    code = (f"import json, sys\n{statement}\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('transformer_np'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _application(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == f"transformer_np.{a}" or m.startswith(f"transformer_np.{a}.")
                                      for a in APPLICATION)]


@pytest.mark.parametrize("module", ["transformer_np.ops", "transformer_np.model", "transformer_np.ops.layernorm",
                                    "transformer_np"])
def test_core_loads_no_application_module(module):
    loaded = _loaded_after(f"import {module}")
    assert module in loaded                      # the statement did import something
    assert _application(loaded) == []


def test_entry_points_still_reachable_from_the_top_level():
    """``tnp.check`` and ``from transformer_np import load_pretrained`` import their packages on first use."""
    loaded = _loaded_after("import transformer_np as tnp\nfrom transformer_np import load_pretrained\n"
                           "assert callable(tnp.check) and callable(load_pretrained)\n"
                           "assert load_pretrained.__module__ == 'transformer_np.io.pretrained'")
    assert "transformer_np.worksheets" in loaded and "transformer_np.io.pretrained" in loaded


def test_star_import_still_gives_every_public_name():
    loaded = _loaded_after("from transformer_np import *\nassert callable(check) and callable(load_pretrained)")
    assert "transformer_np.io.pretrained" in loaded


def test_ops_load_no_model_and_no_engine():
    """The textbook ops import alone: the top level's names (``tnp.encoder_forward``, …) are imported on
    first use, so ``import transformer_np.ops`` loads neither the model nor the engine that builds on it."""
    loaded = _loaded_after("import transformer_np.ops")
    above = [m for m in loaded if m.startswith(("transformer_np.model", "transformer_np.fast"))]
    assert "transformer_np.ops.attention" in loaded and above == []


def test_top_level_names_resolve_to_their_modules():
    """Every name of ``__all__`` is reachable from the top level, and is the object of the module it lives in."""
    import importlib

    import transformer_np as tnp

    for name in tnp.__all__:
        if name == "__version__":
            continue
        value = getattr(tnp, name)
        assert value is getattr(importlib.import_module(tnp._LAZY[name]), name), name
    assert {"ops", "model", "encoder_forward"} <= set(dir(tnp))
