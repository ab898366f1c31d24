"""The layering of issue 46: ``ops`` ← ``fast`` ← ``model`` ← the rest, every layer, read from the source's imports; the
textbook path runs only the textbook; every module the redesign moved still imports at its old path."""

from __future__ import annotations

import ast
import importlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import transformer_np as tnp
from transformer_np import _compat

PACKAGE = Path(tnp.__file__).resolve().parent


def _imported(path: Path) -> set[str]:
    """Every ``transformer_np`` module a source file imports (absolute dotted names), wherever the import
    statement sits (top level, function, ``if TYPE_CHECKING``)."""
    module = "transformer_np." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    package = package.removesuffix(".__init__")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            found.add(name)
            found.update(f"{name}.{a.name}" for a in node.names)   # ``from .. import model`` imports a module
    return {m for m in found if m == "transformer_np" or m.startswith("transformer_np.")}


def _modules(sub: str) -> list[Path]:
    return sorted((PACKAGE / sub).rglob("*.py"))


def _reaches(imports: set[str], package: str) -> list[str]:
    return sorted(m for m in imports if m == f"transformer_np.{package}" or m.startswith(f"transformer_np.{package}."))


def test_the_parser_sees_relative_and_absolute_imports(tmp_path):
    """The checks below can fail: a module of fast/ importing model, either way, is seen."""
    for text in ("from ..model import encoder\n", "import transformer_np.model.config\n",
                 "def f():\n    from ..model.params import sub_params\n", "from .. import model\n"):
        probe = PACKAGE / "fast" / "probe_layering.py"
        imports = set()
        try:
            probe.write_text(text, encoding="utf-8")
            imports = _imported(probe)
        finally:
            probe.unlink()
        assert _reaches(imports, "model"), text


#: each package's layer (CONTRIBUTING's table); the shared base (top-level modules) is layer 0
LAYER = {"ops": 1, "fast": 2, "model": 3, "io": 4, "worksheets": 4, "training": 5, "testing": 5, "perf": 5,
         "course": 6, "grader": 6, "cli": 7}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYER.get(parts[1], 0) if len(parts) > 1 else 0


def _upward(path: Path) -> list[str]:
    """The modules of a higher layer than its own that the file at ``path`` imports, at any depth."""
    module = "transformer_np." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    return sorted(m for m in _imported(path) if _layer(m) > _layer(module))


#: the top level's __init__ (lazy entry points, ``tnp.check``) and __main__ (the CLI) sit above every layer
TOP = {PACKAGE / "__init__.py", PACKAGE / "__main__.py"}


@pytest.mark.parametrize("path", [p for p in sorted(PACKAGE.rglob("*.py")) if p not in TOP],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_higher_layer(path):
    """ops ← fast ← model ← io / worksheets ← training / testing / perf ← course / grader ← cli, and the shared
    base under them all, read from every import statement (a function's lazy import too)."""
    assert _upward(path) == []


def test_the_layer_check_sees_a_lazy_upward_import():
    """An op that imports the model inside a function (as ops/embeddings.py did for the memory limit) is seen."""
    probe = PACKAGE / "ops" / "probe_layering.py"
    try:
        probe.write_text("def f():\n    from ..model.budget import check_memory\n", encoding="utf-8")
        assert _upward(probe) == ["transformer_np.model.budget", "transformer_np.model.budget.check_memory"]
        probe.write_text("from .._memory import check_memory\n", encoding="utf-8")
        assert _upward(probe) == []
    finally:
        probe.unlink()


@pytest.mark.parametrize("path", _modules("fast"), ids=lambda p: p.name)
def test_fast_never_imports_model(path):
    assert _reaches(_imported(path), "model") == []


@pytest.mark.parametrize("path", _modules("ops"), ids=lambda p: p.name)
def test_ops_never_imports_the_engine(path):
    assert _reaches(_imported(path), "fast") == []


def test_the_engine_fills_the_one_table_the_textbook_backwards_consult(monkeypatch):
    """ops/ never imports fast/: a public textbook backward reaches the engine's backward for an engine cache
    through ops.cache.ENGINE_BACKWARDS, which transformer_np.fast fills when imported."""
    from transformer_np.ops import cache as ops_cache
    assert ops_cache.ENGINE_BACKWARDS == {"mha_backward": tnp.fast.mha_backward,
                                          "ffn_backward": tnp.fast.ffn_backward,
                                          "attention_backward": tnp.fast.attention_backward}
    x = np.random.default_rng(0).standard_normal((1, 3, 4))
    p = {k: np.random.default_rng(1).standard_normal(s) for k, s in
         (("W_Q", (4, 4)), ("b_Q", (4,)), ("W_K", (4, 4)), ("b_K", (4,)), ("W_V", (4, 4)), ("b_V", (4,)),
          ("W_O", (4, 4)), ("b_O", (4,)))}
    _, cache = tnp.fast.mha_forward(x, p, 2)                   # the engine's fused Q, K, V layout
    monkeypatch.setattr(ops_cache, "ENGINE_BACKWARDS", {})
    with pytest.raises(ValueError, match=r"transformer_np\.fast\.mha_backward is not loaded"):
        tnp.mha_backward(np.ones_like(x), cache)


# ----------------------------------------------------------------------------- old paths
REDESIGN = {old: new for old, new in _compat.MOVED.items()                  # issue 46's moves
            if "." in old or old.startswith("_comparison")}


def test_every_redesign_move_is_listed():
    """The modules issue 46 moved (the engine out of ops/, inference out of model/, head_split folded)."""
    assert set(REDESIGN) >= {"ops.fast", "ops.fast_attention", "ops.fast_mha", "ops.fast_ffn",
                             "ops._attention_blocks", "ops._threads", "ops._gelu64", "ops.plain", "ops.head_split",
                             "model.inference", "_comparison", "_comparison_inputs", "_comparison_modules"}


@pytest.mark.parametrize("old", sorted(REDESIGN))
def test_old_import_path_gives_the_module_at_its_new_home(old):
    new = importlib.import_module(f"transformer_np.{REDESIGN[old]}")
    assert not (PACKAGE / (old.replace(".", os.sep) + ".py")).exists()      # it did move
    assert importlib.import_module(f"transformer_np.{old}") is new
    parent, _, leaf = f"transformer_np.{old}".rpartition(".")
    assert getattr(importlib.import_module(parent), leaf) is new                      # from ... import leaf


def test_old_names_still_import():
    from transformer_np.model.inference import _layer_infer
    from transformer_np.ops.fast import attention_weights, mha_forward
    from transformer_np.ops.head_split import merge_heads, split_heads
    from transformer_np.ops.plain import ffn_forward
    assert mha_forward is tnp.fast.mha_forward and attention_weights is tnp.fast.attention_weights
    assert split_heads is tnp.split_heads and merge_heads is tnp.merge_heads
    assert ffn_forward.__module__ == "transformer_np.ops.feedforward"
    assert _layer_infer.__module__ == "transformer_np.fast.inference"
    from transformer_np._comparison import ComparisonReport, _compare
    from transformer_np._comparison_inputs import __name__ as inputs_name
    from transformer_np.testing import ComparisonReport as public_report
    assert ComparisonReport is public_report and _compare.__module__ == "transformer_np.testing.criterion"
    assert inputs_name == "transformer_np.testing.inputs"


def test_the_testing_package_keeps_every_public_name():
    """``from transformer_np.testing import …`` gives what the module gave before it became a package."""
    import transformer_np.testing as testing
    assert set(testing.__all__) >= {"compare_with_torch", "assert_matches_torch", "ComparisonReport",
                                    "TensorComparison", "TOLERANCES", "NORM_TOLERANCES", "default_tolerances"}
    for name in testing.__all__:
        assert getattr(testing, name) is not None, name
    assert (PACKAGE / "testing" / "__init__.py").exists() and not (PACKAGE / "testing.py").exists()


# ----------------------------------------------------------------------------- the textbook path
def _files_entered(fast: bool) -> set[str]:
    """The package's source files whose functions run in the README's encoder example (forward and
    backward), paths relative to the package."""
    cfg = tnp.EncoderConfig(n_layers=2, d_model=4, n_heads=1, d_ff=16)
    params = tnp.init_params(cfg, seed=0)
    H0 = np.random.default_rng(0).normal(size=(1, 3, 4))
    root, seen = str(PACKAGE), set()
    forward, backward = tnp.encoder_forward, tnp.encoder_backward   # the top level imports them on first use

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            seen.add(os.path.relpath(frame.f_code.co_filename, root))

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        H, cache = forward(params, cfg, inputs_embeds=H0, fast=fast)
        backward(np.ones_like(H), cache)
    finally:
        sys.settrace(old)
    return seen


def test_the_textbook_path_enters_only_ops_model_and_the_checks():
    seen = _files_entered(fast=False)
    outside = [f for f in seen if not f.startswith(("ops" + os.sep, "model" + os.sep))
               and f not in ("_validate.py", "errors.py")]
    assert outside == []
    assert "model/encoder.py".replace("/", os.sep) in seen and "ops/attention.py".replace("/", os.sep) in seen


def test_the_default_path_runs_the_engine():
    """The tracer above sees the engine when it runs (so the textbook test's empty list means something)."""
    assert any(f.startswith("fast" + os.sep) for f in _files_entered(fast=True))
