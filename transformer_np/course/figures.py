"""Regenerate every figure of the course companion into figures/ (or --out DIR).

Calls ``save_figures(outdir)`` of every module that draws figures, in a fixed order. A
module that is not part of this version, that has no ``save_figures``, or whose figures need
an optional package that is not installed (an ImportError not about transformer_np itself),
is skipped with a printed notice. Any other error is reported, the remaining modules still
run, and the command exits with status 1. The drawing modules live in :mod:`transformer_np.course.plots` (one per
study; the studies themselves only compute) and share one style helper, :mod:`transformer_np.course.plots._style`
(150 dpi, mathtext, no metadata that changes between runs). This command selects matplotlib's Agg backend before
any module draws; with fixed seeds and sizes a rerun writes the same bytes — except the measured-timing figure,
drawn from fresh timings only with ``--timings``.
"""

from __future__ import annotations

import importlib
import inspect
import os

from .._compat import forward_moved as _forward_moved

__all__ = ["FIGURE_MODULES", "FigureError", "generate"]

# The modules whose save_figures(outdir) is called, in this order.
FIGURE_MODULES = (
    "transformer_np.course.plots.trace",
    "transformer_np.course.plots.gradflow",
    "transformer_np.course.plots.contextual",
    "transformer_np.course.plots.stability",
    "transformer_np.course.plots.anatomy",
    "transformer_np.perf.bench",
    "transformer_np.course.plots.complexity",
)


class FigureError(RuntimeError):
    """Some modules' save_figures raised; ``failed`` maps module -> message, ``done`` the rest."""

    def __init__(self, failed: dict, done: dict):
        super().__init__("; ".join(f"{m}: {msg}" for m, msg in failed.items()))
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
             log=print) -> dict[str, list[str]]:
    """Run every module's ``save_figures(outdir)``; returns {module: [paths]} for those that ran."""
    if not isinstance(outdir, str) or not outdir:
        raise ValueError(f"outdir must be a non-empty path, got {outdir!r}")
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise ValueError(f"--out must be a directory, got the existing file {outdir!r}")
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("the figures command needs matplotlib: pip install 'transformer_np[plot]'") from e
    matplotlib.use("Agg")
    os.makedirs(outdir, exist_ok=True)
    done: dict[str, list[str]] = {}
    failed: dict[str, str] = {}
    for module in modules:
        mod, why = _load(module)
        if mod is None:
            log(f"skipping {module}: {why}")
            continue
        kwargs = {}
        if timings and "timings" in inspect.signature(mod.save_figures).parameters:
            kwargs["timings"] = True
        try:
            paths = list(mod.save_figures(outdir, **kwargs) or [])
        except ImportError as e:
            if _is_optional(e):                # e.g. the MiniLM files or torch are not installed
                log(f"skipping {module}: needs an optional package ({e})")
                continue
            failed[module] = f"{type(e).__name__}: {e}"
            log(f"FAILED {module}: {failed[module]}")
            continue
        except Exception as e:  # one broken module must not stop the others; reported, status 1
            failed[module] = f"{type(e).__name__}: {e}"
            log(f"FAILED {module}: {failed[module]}")
            continue
        done[module] = paths
        log(f"{module}: {len(paths)} figure(s)")
        for p in paths:
            log(f"  {p}")
    if failed:
        raise FigureError(failed, done)
    return done


# Moved in 0.2 (study code to transformer_np.course, the command line to transformer_np.cli);
# the old names keep resolving.
__getattr__ = _forward_moved(__name__, {
    "add_arguments": "transformer_np.cli.figures",
    "run": "transformer_np.cli.figures",
})

