"""The textbook layer apart from the engine (issue 46, item 1): ``model/encoder.py`` is the article's equations
with two dispatch points to the engine, and the README's encoder example run with ``fast=False`` enters only
``ops/``, ``model/`` and the top-level checks.

The example is the README's own first ```python block, read from the README and given ``fast=False``; every
function call is recorded (``sys.setprofile``) and mapped to the package of its source file. The example runs
once before it is recorded: a first run imports modules the core loads lazily (``resource``, for the memory
check of ``model/budget.py``), and every import asks the old-path finder of ``_compat.py`` first — the import
system, not the code path measured here.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import re
import sys
from pathlib import Path

import transformer_np as tnp
from transformer_np.model import encoder, stack

PACKAGE = Path(tnp.__file__).resolve().parent
README = PACKAGE.parent / "README.md"
ENCODER = PACKAGE / "model" / "encoder.py"
TOP_LEVEL_CHECKS = {"_validate.py", "errors.py", "_memory.py"}   # the argument and memory checks, their errors


def _readme_example(fast: bool) -> str:
    """The README's first ```python block (the encoder example), its encoder_forward call given ``fast``."""
    text = README.read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", text, flags=re.DOTALL).group(1)
    call = "tnp.encoder_forward(params, cfg, inputs_embeds=H0)"
    assert code.count(call) == 1, "the README's first example no longer makes the call this test steps"
    return code.replace(call, f"tnp.encoder_forward(params, cfg, inputs_embeds=H0, fast={fast})")


def _entered(code: str) -> dict[str, set[str]]:
    """{source file relative to the package: names of its functions entered} while ``code`` runs."""
    root, seen = str(PACKAGE), {}

    def profiler(frame, event, arg):
        path = frame.f_code.co_filename
        if event == "call" and path.startswith(root):
            seen.setdefault(str(Path(path).relative_to(root).as_posix()), set()).add(frame.f_code.co_name)

    compiled = compile(code, "README.md", "exec")
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compiled, {})                        # the lazy imports (see the module docstring)
    old = sys.getprofile()
    sys.setprofile(profiler)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compiled, {})
    finally:
        sys.setprofile(old)
    return seen


def _package(path: str) -> str:
    """``ops/attention.py`` → ``ops``; a top-level module is its own file name."""
    return path.split("/")[0]


def test_the_readme_example_with_fast_false_enters_only_ops_model_and_the_checks():
    seen = _entered(_readme_example(fast=False))
    packages = {_package(f) for f in seen}
    assert packages - TOP_LEVEL_CHECKS == {"ops", "model"}, sorted(seen)
    # the layer that ran is the textbook's: its forward and backward, through the two dispatch points
    assert {"_layer_train", "_layer_grads", "_layer_forward", "_layer_backward"} <= seen["model/encoder.py"]


def test_the_default_path_of_the_same_example_enters_the_engine():
    """The measurement above can fail: the same example on the default path enters ``fast/``, and never the
    textbook layer's equations."""
    seen = _entered(_readme_example(fast=True))
    assert "fast" in {_package(f) for f in seen}
    assert not {"_layer_train", "_layer_grads"} & seen["model/encoder.py"]


def _function_spans(tree: ast.Module) -> dict[str, range]:
    return {node.name: range(node.lineno, node.end_lineno + 1) for node in tree.body
            if isinstance(node, ast.FunctionDef)}


def test_fast_appears_in_the_textbook_layer_only_at_its_two_dispatch_points():
    """``grep -n fast model/encoder.py``: one line in the forward's dispatch point, one in the backward's."""
    text = ENCODER.read_text(encoding="utf-8")
    lines = [i for i, line in enumerate(text.splitlines(), start=1) if "fast" in line]
    spans = _function_spans(ast.parse(text))
    assert len(lines) == 2, [text.splitlines()[i - 1] for i in lines]
    assert lines[0] in spans["_layer_forward"] and lines[1] in spans["_layer_backward"]


def test_the_textbook_layer_imports_no_module_of_the_engine():
    """The engine reaches ``model/encoder.py`` only as an argument of its dispatch points (the stack passes it)."""
    imported = set()
    for node in ast.walk(ast.parse(ENCODER.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            imported.add(("." * node.level) + (node.module or ""))
            imported.update(f"{'.' * node.level}{node.module or ''}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    assert not [m for m in imported if re.search(r"(^|\.)fast(\.|$)", m)], sorted(imported)


def test_every_name_that_left_the_encoder_module_imports_from_it_as_the_same_object():
    for name in encoder._MOVED_TO_STACK:
        assert getattr(encoder, name) is getattr(stack, name), name
    module = importlib.import_module("transformer_np.model.encoder")
    assert module.encoder_forward is tnp.encoder_forward and module.encoder_layer_backward is tnp.encoder_layer_backward
