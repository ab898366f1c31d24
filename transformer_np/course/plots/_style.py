"""The one plotting helper every course figure uses: how matplotlib is loaded, the style, how a PNG is saved.

Rules (one place, so the figures cannot disagree):

* **Backend** — library code never calls ``matplotlib.use``: the backend is the caller's. A notebook keeps its
  inline backend; a headless run falls back to Agg by itself; the ``figures`` command
  (:func:`transformer_np.course.figures.generate`) selects Agg explicitly before any module draws.
* **Style** — :data:`RC` (readable font sizes, mathtext in DejaVu Sans so that ``$H^{(\\ell)}$`` and
  ``$\\partial L/\\partial W_2$`` render as symbols, light grid) is applied only while a figure is being built
  (:func:`figure`, :func:`styled`): the user's global ``rcParams`` are left alone.
* **Saving** — :func:`save` writes PNG at :data:`DPI` (≥ 150) with no ``Software`` entry, so the bytes depend only
  on the figure (matplotlib writes no timestamp into a PNG), then closes the figure.
* **Names** — :data:`NAMES` turns the library's identifiers (``no-layernorm``, ``attn_weights`` …) into the words
  a legend shows.
"""

from __future__ import annotations

import contextlib
import functools
import os

from ..._optional import require

DPI = 150

RC = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "figure.titlesize": 12,
    "mathtext.fontset": "dejavusans",
    "axes.grid": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "svg.hashsalt": "transformer_np",
    "savefig.dpi": DPI,
}

NAMES = {
    "pre": "Pre-LN", "post": "Post-LN", "no-residual": "no residual (LN only)",
    "no-layernorm": "no LayerNorm (residual only)",
    "xavier": "Xavier init", "bert": "BERT init $\\mathcal{N}(0, 0.02^2)$",
    "attn_weights": "attention weights $4d^2$", "ffn_weights": "FFN weights $2\\,d\\,d_{ff}$",
    "attn_biases": "attention biases $4d$", "ffn_biases": "FFN biases $d_{ff} + d$",
    "layernorm": "LayerNorm $\\gamma, \\beta$: $4d$",
}


def name(key: str) -> str:
    """The readable name of an identifier (the identifier itself when there is none)."""
    return NAMES.get(key, key)


def pyplot():
    """``matplotlib.pyplot``, or an ImportError that names the pip extra."""
    return require("matplotlib.pyplot", "the course figures need matplotlib: pip install 'transformer_np[plot]' "
                                        "(or pip install matplotlib)")


@contextlib.contextmanager
def _rc():
    plt = pyplot()
    with plt.rc_context(RC):
        yield plt


def styled(fn):
    """Decorator: build the figure inside :data:`RC` (fonts, mathtext), leaving global rcParams untouched."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _rc():
            return fn(*args, **kwargs)
    return wrapper


def figure(nrows: int = 1, ncols: int = 1, figsize=(6.4, 4.0), **kwargs):
    """``plt.subplots`` at :data:`DPI` with a constrained layout (call inside :func:`styled` code)."""
    plt = pyplot()
    kwargs.setdefault("layout", "constrained")
    return plt.subplots(nrows, ncols, figsize=figsize, dpi=DPI, **kwargs)


def colorbar(fig, mappable, ax, label: str, **kwargs):
    """A labelled colorbar (every colour scale gets one)."""
    cb = fig.colorbar(mappable, ax=ax, **kwargs)
    cb.set_label(label)
    return cb


def save(fig, outdir: str, filename: str) -> str:
    """Write ``fig`` as ``outdir/filename`` (PNG, :data:`DPI`, no metadata that changes between runs); close it."""
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, filename)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    pyplot().close(fig)
    return path
