"""Names say what they are (issue 46, item 6), read from the source with ``ast``:

* a name imported from another package does not start with ``_``;
* ``__all__`` only where there is an API (not in a private ``_x`` module);
* each subsystem folder's ``__init__`` docstring is its map (names every module and subpackage in it).

The packages are the subpackages of ``transformer_np`` (``ops``, ``fast``, ``model``, …, ``cli``), each with
everything below it. The top-level modules (``_validate``, ``errors``, ``_files``, ``_optional``, ``_compat``,
``textout``, ``__init__``) are the shared base: a private *module* of the base may be imported from every
package (its underscore says "not the library's API", and every package belongs to the library), but a private
*name* in it may not, and the base imports no private name of a package either.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import transformer_np as tnp

PACKAGE = Path(tnp.__file__).resolve().parent
SUBPACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())

#: the one crossing left, each with why. ``bench --profile`` times the encoder's embedding block and layers by
#: patching the two module-level seams of model/encoder.py (their docstrings say so); model/encoder.py was being
#: restructured in another change of issue 46 and was left to it.
ALLOWED: set[tuple[str, str, str]] = set()


def _module_name(path: Path) -> str:
    return ".".join(("transformer_np",) + path.relative_to(PACKAGE).with_suffix("").parts)


def _package_of(module: str) -> str:
    """The package a ``transformer_np`` module belongs to: its subpackage, or "" for the shared base."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in SUBPACKAGES) else ""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_module(module: str) -> str | None:
    """The first private part of a package's module path (``cli._gradebook``), None for a public path or a
    module of the base (``transformer_np._validate``)."""
    parts = module.split(".")[2:]
    return next((p for p in parts if _private(p)), None)


def crossings(path: Path, module: str | None = None) -> list[tuple[int, str, str]]:
    """``(line, home module, private name)`` for every private name of another package that the file at
    ``path`` imports or reads as an attribute, at any depth (a function's lazy import counts)."""
    module = module or _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    package = package.removesuffix(".__init__")
    own = _package_of(module)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bound: dict[str, str] = {}          # local name -> the transformer_np module or object it stands for
    found = []

    def foreign(home: str) -> bool:
        return home.startswith("transformer_np") and _package_of(home) != own

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                home = ".".join(base + ([node.module] if node.module else []))
            else:
                home = node.module or ""
            if not home.startswith("transformer_np"):
                continue
            if foreign(home) and _private_module(home):
                found.append((node.lineno, home, _private_module(home)))
            for a in node.names:
                bound[a.asname or a.name] = f"{home}.{a.name}"
                base_module = home == "transformer_np" and (PACKAGE / f"{a.name}.py").exists()
                if foreign(home) and _private(a.name) and not base_module:
                    found.append((node.lineno, home, a.name))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("transformer_np"):
                    if foreign(a.name) and _private_module(a.name):
                        found.append((node.lineno, a.name, _private_module(a.name)))
                    bound[a.asname or "transformer_np"] = a.name if a.asname else "transformer_np"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, base = [], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and bound.get(base.id):
                home = ".".join([bound[base.id]] + chain[::-1])
                if foreign(home):
                    found.append((node.lineno, home, node.attr))
    return sorted(set(found))


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _id(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


# ----------------------------------------------------------------------------- private names across packages
@pytest.mark.parametrize("path", _modules(), ids=_id)
def test_no_private_name_crosses_a_package_line(path):
    module = _module_name(path)
    found = [(line, home, name) for line, home, name in crossings(path)
             if (module, home, name) not in ALLOWED]
    assert found == [], f"{_id(path)} imports another package's private names (line, home, name): {found}"


@pytest.mark.parametrize("text, expected", [
    ("from ..ops.erf import _erf\n", [(1, "transformer_np.ops.erf", "_erf")]),
    ("def f():\n    from ..fast.threads import _in_shards\n", [(2, "transformer_np.fast.threads", "_in_shards")]),
    ("from ..fast import threads\nthreads._THREADS = 1\n", [(2, "transformer_np.fast.threads", "_THREADS")]),
    ("import transformer_np.fast.threads\ntransformer_np.fast.threads._THREADS\n",
     [(2, "transformer_np.fast.threads", "_THREADS")]),
    ("import transformer_np as tnp\ntnp.io.pretrained._SORT_CHUNK\n",
     [(2, "transformer_np.io.pretrained", "_SORT_CHUNK")]),
    ("from ..io.interop import _layer_hf_config as cfg\n", [(1, "transformer_np.io.interop", "_layer_hf_config")]),
    ("from ..cli._gradebook import shown\n", [(1, "transformer_np.cli._gradebook", "_gradebook")]),
    ("from .. import _validate\nfrom .._validate import describe\n", []),       # the base's private module
    ("from .._validate import _x\n", [(1, "transformer_np._validate", "_x")]),   # not a private name in it
    ("from .params import _secret\nfrom . import checks\nchecks._y\n", []),     # inside the package: its own
    ("from ..ops import kernels as op\nop.linear_forward\n", []),
])
def test_the_checker_sees_every_way_a_private_name_crosses(tmp_path, text, expected):
    """The check above can fail: a probe module of model/ written each way is read as expected."""
    probe = tmp_path / "probe.py"
    probe.write_text(text, encoding="utf-8")
    assert crossings(probe, module="transformer_np.model.probe") == expected


# ----------------------------------------------------------------------------- __all__ where there is an API
def _declares_all(path: Path) -> bool:
    return any(isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
               and any(isinstance(t, ast.Name) and t.id == "__all__"
                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
               for n in ast.parse(path.read_text(encoding="utf-8")).body)


def _is_private_module(path: Path) -> bool:
    return any(_private(part) for part in path.relative_to(PACKAGE).with_suffix("").parts)


@pytest.mark.parametrize("path", [p for p in _modules() if _is_private_module(p)], ids=_id)
def test_a_private_module_declares_no_all(path):
    assert not _declares_all(path), f"{_id(path)} is private: it has no API to list in __all__"


def test_the_all_check_sees_an_assignment(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""doc"""\n__all__ = ["f"]\n', encoding="utf-8")
    assert _declares_all(probe)
    probe.write_text('"""doc"""\nnames = ["__all__"]\n', encoding="utf-8")
    assert not _declares_all(probe)


# ----------------------------------------------------------------------------- each folder's map
def _folders() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py"))


def missing_from_map(folder: Path) -> list[str]:
    """The modules and subpackages of ``folder`` its ``__init__`` docstring does not name."""
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
    names = [f.stem for f in folder.glob("*.py") if f.stem not in ("__init__", "__main__")]
    names += [d.name for d in folder.iterdir() if (d / "__init__.py").exists()]
    return sorted(n for n in names if not re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", doc))


@pytest.mark.parametrize("folder", _folders(),
                         ids=lambda f: str(f.relative_to(PACKAGE.parent)))
def test_each_folder_init_docstring_is_its_map(folder):
    assert missing_from_map(folder) == []


def test_the_map_check_sees_a_module_left_out(tmp_path):
    (tmp_path / "__init__.py").write_text('"""``alpha`` does A."""\n', encoding="utf-8")
    (tmp_path / "alpha.py").write_text("", encoding="utf-8")
    (tmp_path / "beta.py").write_text("", encoding="utf-8")
    assert missing_from_map(tmp_path) == ["beta"]
