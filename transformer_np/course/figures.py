"""Regenerate every figure of the course companion into figures/ (or --out DIR).

Calls ``save_figures(outdir)`` of every module that draws figures, in a fixed order (:data:`FIGURE_SETS`:
a short name for ``figures --only``, the module, and a title in words that the progress shows). A module
that is not part of this version, or that has no ``save_figures``, is passed over silently; one whose
figures need an optional package that is not installed (an ImportError not about transformer_np itself)
is skipped with a notice. Any other error is reported, the remaining modules still run, and
:class:`FigureError` is raised at the end (the command exits with status 1). The drawing modules live in
:mod:`transformer_np.course.plots` (one per study; the studies themselves only compute) and share one
style helper, :mod:`transformer_np.course.plots._style` (150 dpi, mathtext, no metadata that changes
between runs). This command selects matplotlib's Agg backend before any module draws; with fixed seeds and
sizes a rerun writes the same bytes — except the measured-timing figure, drawn from fresh timings only with
``--timings``. Nothing is printed: pass ``progress`` and ``log`` to follow the run.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable

from .._compat import forward_moved as _forward_moved
from .._optional import require

__all__ = ["FIGURE_MODULES", "FIGURE_SETS", "FigureError", "generate", "title"]

#: name (for ``figures --only``) -> (module whose save_figures(outdir) is called, what it draws, in words),
#: in the order they run.
FIGURE_SETS = {
    "trace": ("transformer_np.course.plots.trace",
              "the worked example 'the cat sat': attention and sensitivity"),
    "gradflow": ("transformer_np.course.plots.gradflow",
                 "gradient flow through deep Pre-LN / Post-LN stacks"),
    "contextual": ("transformer_np.course.plots.contextual",
                   "contextual embeddings of pretrained MiniLM (notebook 03)"),
    "stability": ("transformer_np.course.plots.stability",
                  "training stability: warm-up, LayerNorm placement, a short run"),
    "anatomy": ("transformer_np.course.plots.anatomy",
                "anatomy of an encoder layer: wiring, data flow, norms, budget"),
    "complexity": ("transformer_np.course.plots.complexity",
                   "time of one layer against sequence length, O(n²d + nd²) fit"),
}
# The modules whose save_figures(outdir) is called, in this order.
FIGURE_MODULES = tuple(module for module, _ in FIGURE_SETS.values())


def title(module: str) -> str:
    """What ``module``'s figures show, in words (its :data:`FIGURE_SETS` title; else its short name)."""
    for mod, text in FIGURE_SETS.values():
        if mod == module:
            return text
    return f"the figures of {module.rsplit('.', 1)[-1]!r}"


class FigureError(RuntimeError):
    """Some modules' save_figures raised; ``failed`` maps module -> message, ``done`` the rest."""

    def __init__(self, failed: dict, done: dict):
        super().__init__("; ".join(f"{title(m)}: {msg}" for m, msg in failed.items()))
        self.failed, self.done = failed, done


def _is_optional(e: ImportError) -> bool:
    """A missing third-party package or model files (skip), not a broken module of this package (fail)."""
    name = getattr(e, "name", None)
    return not (name and name.split(".")[0] == "transformer_np")


def _load(module: str):
    """The module, or None (with the reason) when it is absent or draws nothing."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return None, "not part of this version"
        raise
    if not callable(getattr(mod, "save_figures", None)):
        return None, "has no save_figures(outdir)"
    return mod, ""


def generate(outdir: str = "figures", modules=FIGURE_MODULES, timings: bool = False,
             log: Callable[[str], None] | None = None,
             progress: Callable[[int, int, str], None] | None = None) -> dict[str, list[str]]:
    """Run every module's ``save_figures(outdir)``; returns {module: [paths]} for those that ran.

    ``progress(i, total, title)`` is called as figure set ``i`` of ``total`` (1-based; only the modules
    that draw figures count) starts, with its title in words, and again, with the same ``i`` and the title
    followed by ``": <step> (j/n)"``, as each step of a set whose ``save_figures`` takes a ``progress``
    starts (the gradient-flow set: its 52 stacks); ``log(line)`` receives what happened to
    it: the files written, a skip for a missing optional package, a failure. Both default to silence.
    """
    if not isinstance(outdir, str) or not outdir:
        raise ValueError(f"outdir must be a non-empty path, got {outdir!r}")
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise ValueError(f"--out must be a directory, got the existing file {outdir!r}")
    for name, fn in (("log", log), ("progress", progress)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a callable or None, got {type(fn).__name__}")
    os.environ.setdefault("MPLBACKEND", "Agg")
    matplotlib = require("matplotlib", "the figures command needs matplotlib: pip install 'transformer_np[plot]'")
    matplotlib.use("Agg")
    os.makedirs(outdir, exist_ok=True)
    log = log or (lambda line: None)
    loaded = []                                # the modules that draw figures: only these are counted
    for module in modules:
        mod, _why = _load(module)
        if mod is not None:
            loaded.append((module, mod))
    done: dict[str, list[str]] = {}
    failed: dict[str, str] = {}
    for i, (module, mod) in enumerate(loaded, 1):
        what = title(module)
        if progress is not None:
            progress(i, len(loaded), what)
        kwargs = {}
        accepts = inspect.signature(mod.save_figures).parameters
        if timings and "timings" in accepts:
            kwargs["timings"] = True
        if progress is not None and "progress" in accepts:     # a long set tells its own steps, within step i
            kwargs["progress"] = (lambda j, n, label, i=i, what=what:
                                  progress(i, len(loaded), f"{what}: {label} ({j}/{n})"))
        try:
            paths = list(mod.save_figures(outdir, **kwargs) or [])
        except ImportError as e:
            if _is_optional(e):                # e.g. the MiniLM files or torch are not installed
                log(f"skipped {what}: it needs an optional package ({e})")
                continue
            failed[module] = f"{type(e).__name__}: {e}"
            log(f"FAILED {what}: {failed[module]}")
            continue
        except Exception as e:  # one broken module must not stop the others; reported, status 1
            failed[module] = f"{type(e).__name__}: {e}"
            log(f"FAILED {what}: {failed[module]}")
            continue
        done[module] = paths
        log(f"wrote {len(paths)} figure(s): {', '.join(os.path.basename(p) for p in paths)}")
    if failed:
        raise FigureError(failed, done)
    return done

# Moved in 0.2 (study code to transformer_np.course, the command line to transformer_np.cli);
# the old names keep resolving.
__getattr__ = _forward_moved(__name__, {
    "add_arguments": "transformer_np.cli.figures",
    "run": "transformer_np.cli.figures",
})

