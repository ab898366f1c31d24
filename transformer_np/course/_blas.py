"""One BLAS thread for the course's studies, through threadpoolctl when it is installed.

The studies multiply small matrices (at most a few hundred on a side), where BLAS threads bring nothing and,
on a busy 2-core machine, OpenBLAS's spinning idle threads made each product 25–100× slower (notebook 02: 148–174 s
with OpenBLAS's default threads, 34 s at one). threadpoolctl is optional (the core needs NumPy only; the
``notebooks`` extra installs it); without it the limit cannot be set inside a running process, so
:func:`one_blas_thread` says so once (a warning) and the study runs unchanged — unless ``OPENBLAS_NUM_THREADS``,
``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is 1 already, when there is nothing to say.
"""

from __future__ import annotations

import contextlib
import os
import warnings

__all__ = ["one_blas_thread"]

_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_warned = False           # the missing-threadpoolctl warning is given once per process


def _one_thread_already() -> bool:
    return any(os.environ.get(v, "").strip() == "1" for v in _THREAD_VARIABLES) or (os.cpu_count() or 1) == 1


def one_blas_thread():
    """A context manager running its block with one BLAS thread (the caller's setting is restored); without
    threadpoolctl a no-op that warns once (:class:`RuntimeWarning`) with what to install."""
    global _warned
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        if not _warned and not _one_thread_already():
            _warned = True
            warnings.warn("threadpoolctl is not installed, so this study runs its small matrix products on all of "
                          "OpenBLAS's threads, which on a busy machine makes it several times slower (notebook 02: "
                          "148-174 s instead of 34). Install it with: pip install threadpoolctl (it comes with "
                          "pip install 'transformer_np[notebooks]'), or start Python with OPENBLAS_NUM_THREADS=1.",
                          RuntimeWarning, stacklevel=3)
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")
