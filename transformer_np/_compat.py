"""Old import paths keep working.

Until 0.2 the package was one flat folder (``transformer_np.attention``, ``transformer_np.interop``,
…). Each of those modules now lives in the subpackage of its role; this finder makes every old
dotted path import the module at its new home — the *same* module object, so attributes,
monkeypatching and ``isinstance`` checks behave exactly as before. Nothing is imported until an
old path is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

# old module name (under transformer_np, dotted below a subpackage) -> new dotted path (under transformer_np)
MOVED = {
    **{m: f"ops.{m}" for m in ("linear", "softmax", "attention", "masks", "layernorm", "activations", "erf",
                               "feedforward", "residual", "dropout", "embeddings")},
    **{m: f"model.{m}" for m in ("config", "params", "encoder", "heads", "losses", "gradcheck", "flops")},
    "safetensors_io": "io.safetensors",
    "tokenizer": "io.tokenizer",
    "interop": "io.interop",
    "pretrained": "io.pretrained",
    "optim": "training.optim",
    "tasks": "training.tasks",
    "train": "training.loop",
    "trace": "course.trace",
    "gradflow": "course.gradflow",
    "anatomy": "course.anatomy",
    "complexity": "course.complexity",
    "figures": "course.figures",
    "bench": "perf.bench",
    "memory": "perf.memory",
    # the exercise grader left course/ for its own package (issue 43)
    **{f"course.{old}": f"grader.{new}" for old, new in (
        ("sandbox", "sandbox"), ("grade", "grade"), ("grading", "grading"), ("exercises", "exercises"),
        ("feedback", "feedback"), ("similarity", "similarity"), ("_calling", "calling"), ("_diagnosis", "diagnosis"),
        ("_exercise_base", "exercise_base"), ("_exercise_specs", "specs"), ("_specs_blocks", "specs_blocks"),
        ("_specs_ops", "specs_ops"), ("_hidden_cases", "hidden_cases"), ("_source", "source"),
        ("_sandbox_child", "child"))},
    # redesign (issue 46): the engine out of ops/ into fast/, ops/head_split.py folded back into ops/attention.py
    "ops.fast": "fast",
    "ops.fast_attention": "fast.attention",
    "ops.fast_mha": "fast.mha",
    "ops.fast_ffn": "fast.ffn",
    "ops._attention_blocks": "fast.blocks",
    "ops._threads": "fast.threads",
    "ops._gelu64": "fast.gelu64",
    "ops.plain": "ops.kernels",
    "ops.head_split": "ops.attention",
    "model.inference": "fast.inference",
    # redesign (issue 46): testing.py and its three private modules, one package
    "_comparison": "testing.criterion",
    "_comparison_inputs": "testing.inputs",
    "_comparison_modules": "testing.modules",
    # redesign (issue 46): one way out for untrusted text (``_text.printable`` is ``textout.printable``)
    "_text": "textout",
    # redesign (issue 46): one "BLAS threads around a block" helper (course's one_blas_thread, perf's limiter)
    "course._blas": "fast.threads",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)  # the real module, already initialised
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module):
        # Nothing to run (it ran at its new home); the import system has just stamped the alias
        # spec on the module: give it its own back, so reload() and pickling see the real path.
        module.__spec__ = self._real_spec


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def __init__(self, package: str):
        self.prefix = package + "."

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.prefix):
            return None
        new = MOVED.get(fullname[len(self.prefix):])
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(self.prefix + new))


def install(package: str) -> None:
    """Put the finder on ``sys.meta_path`` once (idempotent across reloads), first: an old path is answered
    by the alias even where another finder would still find a file there (a stale copy left by an upgrade in
    place, or an editable install of another checkout, whose finder maps the package's names to its tree)."""
    if not any(isinstance(f, _MovedModuleFinder) and f.prefix == package + "." for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder(package))



def forward_moved(module_name: str, moved: dict[str, str]):
    """A module ``__getattr__`` for names that moved out of ``module_name`` into another module
    (``{name: "transformer_np.course.contextual", …}``): ``from transformer_np.io.pretrained import
    contextual_report`` keeps working, and the new home is imported only when such a name is used."""

    def __getattr__(name: str):
        if name in moved:
            return getattr(importlib.import_module(moved[name]), name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__
