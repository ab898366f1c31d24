r"""No marks for calling the library: find calls into transformer_np, torch or jax inside a graded function.

An exercise asks the student to *write* an op; the library must be installed for the checks to run, so a
student could simply call ``transformer_np.ops.softmax.softmax_forward`` (or torch's autograd) and pass.
Two independent checks refuse that:

1. **Static** (:func:`static_findings`): the function's source is parsed (``inspect.getsource``; in a
   notebook IPython keeps every cell's source) and every name it uses is resolved in the function's own
   globals, closure and defaults: a module of ``transformer_np``, ``torch``, ``jax``/``jaxlib``/``flax``,
   a function defined in one (also under another name: ``from transformer_np.ops import softmax_forward
   as f``; ``import transformer_np as t; t.softmax``), an ``import`` of one inside the function, and the
   dynamic-import doors ``__import__``, ``importlib``, ``eval``, ``exec``, ``compile``, ``sys.modules``.
   Helper functions the student defined in the same notebook are followed. Without source (a function
   built by ``exec``), the code object's names are resolved instead.
2. **Dynamic** (:class:`CallWatch`): while the student's function runs, a profiler
   (``sys.setprofile``) records every Python function entered whose code lives in one of those packages
   *and* whose caller is not library code, and every C function of torch/jax called. This catches what
   no reading of the source can: ``getattr(t, "soft" + "max")``, ``importlib.import_module(name)`` built
   at run time, a library function smuggled through the cache (the forward stores the library's backward
   in ``cache`` and the backward calls it), a lambda default.

Each exercise may *allow* named library functions that the notebook hands the student (the attention op
in exercise 4, ``erf`` in exercise 5, the sublayers in exercise 6); calls made *by* an allowed function are
its own business. What is not caught: code copied from the library's source into the notebook (that is
the student's code as far as a machine can tell), and a C extension of the student's own.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import os
import sys
import textwrap
import types
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["FORBIDDEN_ROOTS", "CallWatch", "allowed_objects", "static_findings"]

FORBIDDEN_ROOTS = ("transformer_np", "torch", "jax", "jaxlib", "flax")
_DYNAMIC_DOORS = {"__import__", "eval", "exec", "compile", "importlib", "import_module"}
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # …/transformer_np


def _root(name: str | None) -> str:
    return (name or "").split(".", 1)[0]


def _forbidden_module_name(name: str | None) -> bool:
    return _root(name) in FORBIDDEN_ROOTS


def _package_dirs() -> tuple[str, ...]:
    """The directories of the forbidden packages that are installed (found without importing them)."""
    dirs = [_PACKAGE_DIR]
    for root in FORBIDDEN_ROOTS[1:]:
        try:
            spec = importlib.util.find_spec(root)
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(os.path.abspath(loc))
    return tuple(d + os.sep for d in dirs)


def allowed_objects(names: Iterable[str]) -> list[Any]:
    """``"transformer_np.ops.erf.erf"`` → the function itself, for each name."""
    out = []
    for dotted in names:
        module, _, attr = dotted.rpartition(".")
        out.append(getattr(importlib.import_module(module), attr))
    return out


def _module_of(obj: Any) -> str | None:
    """The module an object (function, builtin, class, bound method) comes from."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    mod = getattr(obj, "__module__", None)
    if isinstance(mod, str) and mod:
        return mod
    owner = getattr(obj, "__self__", None)
    if owner is not None and not isinstance(owner, types.ModuleType):
        return type(owner).__module__
    if isinstance(owner, types.ModuleType):
        return owner.__name__
    return None


def _describe(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return f"the module {obj.__name__}"
    mod, name = _module_of(obj), getattr(obj, "__qualname__", getattr(obj, "__name__", type(obj).__name__))
    return f"{mod}.{name}" if mod else str(name)


class _Scan:
    """One static scan: findings, and the student's helper functions already visited."""

    def __init__(self, allowed: list[Any]):
        self.allowed_ids = {id(a) for a in allowed}
        self.findings: list[str] = []
        self.seen: set[int] = set()

    def add(self, text: str) -> None:
        if text not in self.findings:
            self.findings.append(text)

    def judge(self, obj: Any, how: str, fn: Callable) -> None:
        """A value the function refers to (``how``: the expression it is reached by)."""
        if id(obj) in self.allowed_ids:
            return
        if isinstance(obj, types.ModuleType):
            if _forbidden_module_name(obj.__name__):
                self.add(f"uses {_describe(obj)} (as `{how}`)")
            elif obj.__name__ in ("importlib", "sys", "builtins"):
                self.add(f"uses the module {obj.__name__} (as `{how}`), a way to reach the library by name at run time")
            return
        if obj in (builtins.__import__, builtins.eval, builtins.exec, builtins.compile):
            self.add(f"uses {obj.__name__} (as `{how}`), a way to reach the library by name at run time")
            return
        if _forbidden_module_name(_module_of(obj)):
            self.add(f"calls {_describe(obj)} (as `{how}`)")
            return
        if isinstance(obj, types.FunctionType) and obj.__globals__ is getattr(fn, "__globals__", None):
            self.function(obj)                   # a helper the student wrote: follow it

    def function(self, fn: Callable) -> None:
        fn = inspect.unwrap(fn) if callable(fn) else fn
        if id(fn) in self.seen:
            return
        self.seen.add(id(fn))
        if isinstance(fn, types.MethodType):
            fn = fn.__func__
        if not isinstance(fn, types.FunctionType):
            if _forbidden_module_name(_module_of(fn)) and id(fn) not in self.allowed_ids:
                self.add(f"is {_describe(fn)} itself")
            return
        env = _environment(fn)
        for value in list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values()):
            self.judge(value, "a default argument", fn)
        tree = None if fn.__name__ == "<lambda>" else _source_tree(fn)   # a lambda's source is its whole line
        if tree is None:
            self._code_names(fn, env)
            return
        consumed: set[int] = set()          # the inner nodes of an attribute chain already resolved
        for node in ast.walk(tree):          # breadth first: an outer chain is seen before its parts
            if id(node) in consumed:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _forbidden_module_name(alias.name):
                        self.add(f"imports {alias.name} inside the function")
            elif isinstance(node, ast.ImportFrom):
                if _forbidden_module_name(node.module) or node.level:
                    self.add(f"imports from {node.module} inside the function")
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                chain = _chain(node)
                if chain is not None:
                    cur: ast.AST = node.value
                    while isinstance(cur, ast.Attribute):
                        consumed.add(id(cur))
                        cur = cur.value
                    consumed.add(id(cur))
                    self._resolve(chain, env, fn)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id in _DYNAMIC_DOORS and node.id not in env:
                    self.add(f"uses {node.id}, a way to reach the library by name at run time")
                elif node.id in env:
                    self.judge(env[node.id], node.id, fn)

    def _resolve(self, chain: list[str], env: dict, fn: Callable) -> None:
        """``t.ops.softmax`` → follow the modules from ``t`` and judge the object reached."""
        if chain[0] not in env:
            return
        obj, how = env[chain[0]], chain[0]
        if isinstance(obj, types.ModuleType) and obj.__name__ in ("importlib", "sys", "builtins"):
            self.judge(obj, how, fn)
            return
        for attr in chain[1:]:
            if not isinstance(obj, types.ModuleType):
                break
            nxt = getattr(obj, attr, None)
            if nxt is None:
                break
            obj, how = nxt, f"{how}.{attr}"
        if how.count(".") == len(chain) - 1 or not isinstance(obj, types.ModuleType):
            self.judge(obj, how, fn)     # the object reached (a module only if the whole chain is modules)
        elif _forbidden_module_name(obj.__name__) or obj.__name__ in ("importlib", "sys", "builtins"):
            self.judge(obj, how, fn)     # an attribute the module does not have: still the library

    def _code_names(self, fn: types.FunctionType, env: dict) -> None:
        """No source: the names in the code objects (nested ones included)."""
        stack = [fn.__code__]
        while stack:
            code = stack.pop()
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
            for name in code.co_names:
                if _forbidden_module_name(name):
                    self.add(f"refers to {name}")
                elif name in _DYNAMIC_DOORS and name not in env:
                    self.add(f"uses {name}, a way to reach the library by name at run time")
                elif name in env and not (code is fn.__code__ and name in fn.__code__.co_varnames):
                    self.judge(env[name], name, fn)


def _environment(fn: types.FunctionType) -> dict:
    """The names a function can see: builtins < globals < its closure."""
    env = dict(vars(builtins))
    env.update(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            env[name] = cell.cell_contents
        except ValueError:              # an empty cell
            pass
    return env


def _source_tree(fn: types.FunctionType) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None


def _chain(node: ast.Attribute) -> list[str] | None:
    names: list[str] = []
    cur: ast.AST = node
    while isinstance(cur, ast.Attribute):
        names.append(cur.attr)
        cur = cur.value
    if not isinstance(cur, ast.Name):
        return None
    return [cur.id, *reversed(names)]


def static_findings(fn: Callable, allowed: Iterable[Any] = ()) -> list[str]:
    """What in ``fn`` (and the helpers it calls) reaches transformer_np, torch or jax: one line each,
    ``[]`` when nothing does. ``allowed``: library functions the exercise hands the student."""
    scan = _Scan(list(allowed))
    scan.function(fn)
    return scan.findings


class CallWatch:
    """Context manager: record calls into the forbidden packages made from outside them.

    ``with CallWatch(allowed) as w: student_fn(...)``; then ``w.findings`` lists what was called.
    Library code calling library code is not recorded (an allowed function may use anything).
    """

    def __init__(self, allowed: Iterable[Any] = ()):
        allowed = list(allowed)
        self._allowed_codes = {a.__code__ for a in allowed if hasattr(a, "__code__")}
        self._allowed_ids = {id(a) for a in allowed}
        self._dirs = _package_dirs()
        self.findings: list[str] = []
        self._previous: Any = None

    def _inside(self, filename: str) -> bool:
        return os.path.abspath(filename).startswith(self._dirs)

    def _profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code in self._allowed_codes or code.co_filename == __file__ or not self._inside(code.co_filename):
                return
            caller = frame.f_back
            if caller is not None and self._inside(caller.f_code.co_filename):
                return
            mod = frame.f_globals.get("__name__", "?")
            text = f"calls {mod}.{code.co_qualname if hasattr(code, 'co_qualname') else code.co_name}"
        elif event == "c_call":
            if id(arg) in self._allowed_ids or not _forbidden_module_name(_module_of(arg)):
                return
            caller = frame
            if self._inside(caller.f_code.co_filename):
                return
            text = f"calls {_describe(arg)}"
        else:
            return
        if text not in self.findings:
            self.findings.append(text)

    def __enter__(self) -> CallWatch:
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(self._previous)
