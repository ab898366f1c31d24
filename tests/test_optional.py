"""transformer_np._optional.require, and the messages of the functions that import an optional package with it.

Making an import fail: ``sys.modules[name] = None`` makes ``import name`` (and ``importlib.import_module``)
raise ModuleNotFoundError, an ImportError. Submodules already imported (``jax.numpy``, ``flax.nnx``,
``matplotlib.pyplot``) are blocked too, since ``import_module("a.b")`` returns ``sys.modules["a.b"]`` without
looking at ``a``.
"""

import json
import os.path
import sys

import pytest

from transformer_np._optional import require

MISSING = "transformer_np_no_such_module_4f1c"     # no package of this name can exist in the environment


def test_require_returns_the_module():
    assert require("json", "unused hint") is json
    assert require("os.path", "unused hint") is os.path          # a dotted name gives the submodule


def test_require_raises_the_hint_chained_from_the_original_error():
    hint = "this needs a package: pip install it"
    with pytest.raises(ImportError) as info:
        require(MISSING, hint)
    assert str(info.value) == hint
    assert type(info.value) is ImportError                       # the hint's error, not the original one
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert info.value.__cause__.name == MISSING


def test_require_wraps_a_blocked_package(monkeypatch):
    """A package present on disk but failing to import (here: blocked) gets the hint as well."""
    monkeypatch.setitem(sys.modules, "json", None)
    with pytest.raises(ImportError, match="^need json$") as info:
        require("json", "need json")
    assert isinstance(info.value.__cause__, ImportError)


def _block(monkeypatch, *names):
    for top in names:
        monkeypatch.setitem(sys.modules, top, None)
        for name in [m for m in sys.modules if m.startswith(top + ".")]:
            monkeypatch.setitem(sys.modules, name, None)


def _interop_transformers(monkeypatch, tmp_path):
    from transformer_np.io import interop
    interop._require_transformers()


def _interop_torch(monkeypatch, tmp_path):
    from transformer_np.io import interop_torch
    interop_torch._require_torch()


def _interop_flax(monkeypatch, tmp_path):
    from transformer_np.io import interop_jax
    interop_jax._require_flax()


def _machine_torch(monkeypatch, tmp_path):
    from transformer_np.perf import machine
    machine._import_torch()


def _machine_threadpoolctl(monkeypatch, tmp_path):
    from transformer_np.perf import machine
    machine._limit_blas_threads(1)


def _profile_sentence_transformers(monkeypatch, tmp_path):
    from transformer_np.perf import machine, profile
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")                        # the function sets it if unset
    monkeypatch.setattr(machine, "_import_torch", lambda: None)      # torch is not what this test is about
    profile.minilm_profile()


def _minilm_bench_sentence_transformers(monkeypatch, tmp_path):
    from transformer_np.perf import minilm_bench
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(minilm_bench, "_import_torch", lambda: None)
    minilm_bench.minilm_throughput()


def _style_pyplot(monkeypatch, tmp_path):
    from transformer_np.course.plots import _style
    _style.pyplot()


def _figures_generate(monkeypatch, tmp_path):
    from transformer_np.course import figures
    monkeypatch.setenv("MPLBACKEND", "Agg")                          # the function sets it if unset
    figures.generate(str(tmp_path / "figs"))


def _tomlio_tomli(monkeypatch, tmp_path):
    from transformer_np.worksheets import tomlio
    tomlio._toml_module()


# (call site, the packages made unimportable, the exact message the user reads)
CALL_SITES = [
    (_interop_transformers, ["transformers"],
     "this function needs transformers: pip install transformers (or pip install 'transformer_np[hf]')"),
    (_interop_torch, ["torch"],
     "this function needs PyTorch: pip install torch==2.13.0 (or pip install 'transformer_np[torch]')"),
    (_interop_flax, ["jax", "flax"],
     "the JAX lane needs jax and flax: pip install jax flax (or pip install 'transformer_np[jax]')"),
    (_interop_flax, ["flax"],
     "the JAX lane needs jax and flax: pip install jax flax (or pip install 'transformer_np[jax]')"),
    (_machine_torch, ["torch"],
     "the bench command needs PyTorch: pip install 'transformer_np[torch]' (torch==2.13.0)"),
    (_machine_threadpoolctl, ["threadpoolctl"],
     "setting the BLAS thread count needs threadpoolctl: pip install threadpoolctl "
     "(or set OPENBLAS_NUM_THREADS before starting Python)"),
    (_profile_sentence_transformers, ["sentence_transformers"],
     "the MiniLM profile needs sentence-transformers: pip install sentence-transformers"),
    (_minilm_bench_sentence_transformers, ["sentence_transformers"],
     "the MiniLM throughput needs sentence-transformers: pip install sentence-transformers"),
    (_style_pyplot, ["matplotlib"],
     "the course figures need matplotlib: pip install 'transformer_np[plot]' (or pip install matplotlib)"),
    (_figures_generate, ["matplotlib"],
     "the figures command needs matplotlib: pip install 'transformer_np[plot]'"),
    (_tomlio_tomli, ["tomllib", "tomli"],
     "reading a worksheet on Python 3.10 needs the 'tomli' package "
     "(pip install tomli, or pip install 'transformer_np[worksheets]')"),
]


@pytest.mark.parametrize("call, blocked, message", CALL_SITES,
                         ids=[f"{c.__name__.lstrip('_')}-{'+'.join(b)}" for c, b, _ in CALL_SITES])
def test_call_site_message_when_the_package_is_missing(monkeypatch, tmp_path, call, blocked, message):
    _block(monkeypatch, *blocked)
    with pytest.raises(ImportError) as info:
        call(monkeypatch, tmp_path)
    assert str(info.value) == message                            # the exact text the user reads
    assert isinstance(info.value.__cause__, ImportError)         # chained from the failed import
