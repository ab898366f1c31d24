"""Optional packages, imported only when a function needs them.

The core package depends on NumPy alone; PyTorch, transformers, JAX/Flax, matplotlib, threadpoolctl,
sentence-transformers and tomli are imported inside the functions that use them, so that importing
``transformer_np`` never imports them. :func:`require` is that import: the module, or an ``ImportError``
whose message says what needs the package and how to install it, chained from the original error
(``raise … from``) so the traceback still shows why the import failed.

This is the package's lowest layer: it imports nothing from ``transformer_np``.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, hint: str) -> ModuleType:
    """``importlib.import_module(module)``, or ``ImportError(hint)`` raised from the original error.

    ``module`` is a dotted name (``"matplotlib.pyplot"`` imports the package and returns the submodule);
    ``hint`` is the whole message the user reads, e.g. ``"this function needs PyTorch: pip install torch"``.
    Any ``ImportError`` of the import (the package missing, or installed but failing to import) becomes
    the hint, with the original error as ``__cause__``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(hint) from e
