"""What the command line says to a person: help in plain text with every flag explained (for every registered
command, whoever wrote it), progress of the long commands on stderr and never on stdout or under --json, no
internal module names in what figures prints, and trace's legend for its claim ids."""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_np.cli import COMMANDS, build_parser, main, plain_text

ROOT = Path(__file__).resolve().parents[2]
MARKUP = re.compile(r"`|:\w+:|\*\*")        # any backtick (literals, roles, links), a role's :name:, bold


def _parsers(parser: argparse.ArgumentParser, path=("transformer-np",)):
    """(command path, parser) for the top level and every command and sub-command, found by walking the parser."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


ALL = list(_parsers(build_parser()))


def test_every_present_command_of_the_registry_is_walked():
    walked = {path[1] for path, _ in ALL if len(path) == 2}
    present = {name for name, (module, _) in COMMANDS.items() if (ROOT / (module.replace(".", "/") + ".py")).is_file()}
    assert present <= walked and {"trace", "gradcheck", "gradflow", "figures"} <= walked, (present, walked)
    assert ("transformer-np", "worksheet", "new") in {path for path, _ in ALL}       # sub-commands too


@pytest.mark.parametrize("path, parser", ALL, ids=[" ".join(p[1:]) or "top" for p, _ in ALL])
def test_help_is_plain_text_with_every_flag_explained(path, parser):
    text = parser.format_help()
    assert not MARKUP.search(text), f"{' '.join(path)} --help shows markup {MARKUP.search(text).group()!r}:\n{text}"
    if len(path) > 1:
        assert parser.description and len(parser.description.split()) >= 5, f"{' '.join(path)}: no description"
    undocumented = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            undocumented += [c.dest for c in action._choices_actions if not (c.help or "").strip()]
        elif action.help is not argparse.SUPPRESS and not (action.help or "").strip():
            undocumented.append("/".join(action.option_strings) or action.dest)
    assert not undocumented, f"{' '.join(path)}: flags without help: {undocumented}"


def test_help_as_the_user_runs_it():
    for argv in ([], ["gradflow"], ["trace"]):
        r = subprocess.run([sys.executable, "-m", "transformer_np", *argv, "--help"], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and r.stdout.startswith("usage: transformer-np"), r.stderr
        assert not MARKUP.search(r.stdout), r.stdout


def test_plain_text_strips_the_docstrings_markup():
    assert plain_text("see :func:`transformer_np.model.gradcheck.run_all`") == \
        "see transformer_np.model.gradcheck.run_all"
    assert plain_text(":py:class:`~transformer_np.testing.ComparisonReport`") == "ComparisonReport"
    assert plain_text(":ref:`the guide <guide-testing>`") == "the guide"
    assert plain_text("The ``trace`` command runs ``python -m transformer_np trace``") == \
        "The trace command runs 'python -m transformer_np trace'"
    assert plain_text("`NumPy <https://numpy.org>`_ is **fast**, *really*") == \
        "NumPy (https://numpy.org) is fast, really"
    assert plain_text("a|b, 2*3*4 and x * y") == "a|b, 2*3*4 and x * y"        # not markup: unchanged
    assert plain_text("Example::\n\n    code") == "Example:\n\n    code"


# ----------------------------------------------------------------------------- progress
def test_gradcheck_shows_one_progress_line_per_case_on_stderr(capsys):
    assert main(["gradcheck", "--max-coords", "1"]) == 0
    out, err = capsys.readouterr()
    rows = [line for line in out.splitlines() if line.endswith(" yes")]
    steps = err.splitlines()
    assert len(steps) == len(rows) >= 20, err
    assert steps[0] == f"gradcheck [1/{len(rows)}] linear" and steps[-1].startswith(f"gradcheck [{len(rows)}/"), err
    assert "gradcheck [" not in out and "transformer_np." not in err             # progress never on stdout


@pytest.mark.parametrize("flag", ["--json", "--quiet"])
def test_gradcheck_is_quiet_under_json_and_quiet(flag, capsys):
    assert main(["gradcheck", "--max-coords", "1", flag]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    if flag == "--json":
        assert len(json.loads(out)) >= 20                                         # stdout is the JSON, whole


def test_gradcheck_progress_is_a_callback_of_the_library():
    from transformer_np.model.gradcheck import run_all

    seen = []
    results = run_all(max_coords=1, progress=lambda i, total, name: seen.append((i, total, name)))
    assert seen == [(i, len(results), r.name) for i, r in enumerate(results, 1)]
    with pytest.raises(TypeError, match="progress must be a callable"):
        run_all(progress="yes")


def test_progress_is_a_bar_redrawn_in_place_on_a_terminal():
    from transformer_np.cli._progress import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty, log = Terminal(), io.StringIO()
    for stream in (tty, log):
        bar = Progress("gradcheck", stream)
        for i in (1, 2):
            bar(i, 2, f"case {i}")
        bar.close()
    assert "\n" not in tty.getvalue() and tty.getvalue().count("\r") == 3         # redrawn twice, erased once
    assert "gradcheck [##########..........] 2/2 case 2" in tty.getvalue()
    assert log.getvalue() == "gradcheck [1/2] case 1\ngradcheck [2/2] case 2\n"   # a pipe: a line per step


def test_figures_says_what_it_draws_in_words_and_never_names_a_module(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="the figures need matplotlib: pip install matplotlib")
    from transformer_np.course import figures

    # a module that is absent and one that draws nothing are passed over without a word
    monkeypatch.setattr(figures, "FIGURE_MODULES", ("transformer_np.does_not_exist", "transformer_np.model.flops",
                                                    "transformer_np.course.plots.trace"))
    assert main(["figures", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"3 figure(s) written to {tmp_path}\n"
    assert err.splitlines()[0] == f"figures [1/1] {figures.FIGURE_SETS['trace'][1]}", err
    assert "wrote 3 figure(s): trace_attention_layer1.png" in err
    assert "transformer_np" not in out + err and "skipping" not in err, err
    assert main(["figures", "--out", str(tmp_path), "--quiet", "--only", "trace"]) == 0
    assert capsys.readouterr().err == ""


def test_figures_quiet_still_tells_a_failed_set(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="the figures need matplotlib: pip install matplotlib")
    import types

    from transformer_np.course import figures

    broken = types.ModuleType("transformer_np._cli_broken_fig")
    broken.save_figures = lambda outdir="figures": 1 / 0
    monkeypatch.setitem(sys.modules, broken.__name__, broken)
    monkeypatch.setattr(figures, "FIGURE_MODULES", (broken.__name__,))
    assert main(["figures", "--out", str(tmp_path), "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "figures [" not in err
    assert err.splitlines() == ["FAILED the figures of '_cli_broken_fig': ZeroDivisionError: division by zero",
                                f"0 figure(s) written to {tmp_path}; 1 figure set(s) failed: the figures of "
                                "'_cli_broken_fig'"], err


def test_figures_names_its_sets_in_words():
    from transformer_np.course import figures

    text = build_parser()._subparsers._group_actions[0].choices["figures"].format_help()
    lines = text.splitlines()
    for name, (_, title) in figures.FIGURE_SETS.items():
        assert "transformer_np" not in title
        assert any(line.split() == [name, *title.split()] for line in lines), (name, text)   # the list of sets
    assert "transformer_np." not in text.replace("transformer_np.course.figures.generate", "")   # only the API pointer


# ----------------------------------------------------------------------------- trace
def test_trace_explains_its_claim_ids(capsys):
    from transformer_np.course.ledger import LEDGER_JSON, row

    assert main(["trace"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("CLAIMS of the article, checked")
    legend = lines[at + 1]
    assert "claims ledger" in legend and "docs/claims.md" in legend and "transformer_np/data/claims.json" in legend
    assert "A = article" in legend and "L = lesson" in legend
    assert (ROOT / "docs" / "claims.md").is_file() and LEDGER_JSON.is_file()
    ids = re.findall(r"^  \[(?:holds|FAILS)\] ([AL]\d+) ", "\n".join(lines[at + 2:]), flags=re.M)
    assert ids and all(row(i) for i in ids)                                         # each id is a ledger row
    helptext = " ".join(build_parser()._subparsers._group_actions[0].choices["trace"].format_help().split())
    assert "claims ledger" in helptext and "docs/claims.md" in helptext and "A for the article" in helptext
