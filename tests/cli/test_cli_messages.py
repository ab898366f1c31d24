"""What the command line says to a person: help in plain text with every flag explained (for every registered
command, whoever wrote it), progress of the long commands on stderr and never on stdout or under --json, no
internal module names in what figures prints, and trace's legend for its claim ids."""

from __future__ import annotations

import argparse
import io
import json
import os
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


# ----------------------------------------------------------------------------- issue 38: waits and messages
def _cli_env() -> dict:
    import os

    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


@pytest.mark.parametrize("argv", [["check", "example", "--json"], ["trace", "--json"], ["trace"],
                                  ["gradflow", "--depth", "2", "--json"], ["--help"]],
                         ids=lambda a: " ".join(a))
def test_a_closed_pipe_ends_the_command_quietly(argv):
    """`transformer-np check example --json | head`: the reader has gone before the command writes. The command
    ends with status 141 (128 + SIGPIPE, as Unix tools do) and says nothing (it said 'error: [Errno 32] Broken
    pipe', and Python added an 'Exception ignored' at exit)."""
    import os

    r, w = os.pipe()
    os.close(r)                                   # no reader: every write to the pipe fails with EPIPE
    try:
        # one BLAS thread said up front: without threadpoolctl (the NumPy-only lane) gradflow would otherwise warn
        # that it cannot limit the threads itself, a true line on stderr that has nothing to do with the pipe
        proc = subprocess.run([sys.executable, "-m", "transformer_np", *argv], stdout=w, stderr=subprocess.PIPE,
                              text=True, env=dict(_cli_env(), OPENBLAS_NUM_THREADS="1"), timeout=300)
    finally:
        os.close(w)
    assert proc.returncode in (0, 141) and proc.stderr == "", (proc.returncode, proc.stderr)   # --help: argparse's 0


def test_gradflow_prints_its_header_before_it_computes_and_then_its_progress(monkeypatch, capsys):
    from transformer_np.cli import gradflow as cli_gradflow
    from transformer_np.course.gradflow import MEASURE_STAGES

    real, before = cli_gradflow.measure, {}

    def measure(*a, **kw):                       # what the user had seen when the measurement started
        out, err = capsys.readouterr()
        before.update(out=out, err=err)
        return real(*a, **kw)

    monkeypatch.setattr(cli_gradflow, "measure", measure)
    assert main(["gradflow", "--depth", "3"]) == 0
    out, err = capsys.readouterr()
    assert before["out"].splitlines()[0].startswith("gradflow: variant=pre depth=3 init=xavier"), before
    assert before["out"].splitlines()[1].startswith("loss: L = sum(H_final * R)"), before
    assert not out.startswith("gradflow:") and out.splitlines()[0].lstrip().startswith("ℓ")   # printed once
    assert err.splitlines() == [f"gradflow [{i}/{len(MEASURE_STAGES)}] {s}" for i, s in enumerate(MEASURE_STAGES, 1)]
    for flag in ("--json", "--quiet"):
        assert main(["gradflow", "--depth", "3", flag]) == 0
        assert capsys.readouterr().err == ""


def test_gradflow_compute_all_tells_each_stack_it_starts():
    from transformer_np.course import gradflow

    seen = []
    gradflow.compute_all(depths=(2,), jac_depth=1, exp_depth=1, progress=lambda *a: seen.append(a))
    total = len(gradflow.VARIANTS) * len(gradflow.INITS) + len(gradflow.VARIANTS) * len(gradflow.INITS) + 4
    assert [(i, n) for i, n, _ in seen] == [(i, total) for i in range(1, total + 1)]
    assert seen[0][2] == "per-layer view: pre, xavier init, depth 2" and seen[-1][2].startswith("expansion: post")
    with pytest.raises(TypeError, match="progress must be a callable"):
        gradflow.measure("pre", 2, progress="yes")


def test_figures_shows_the_steps_of_a_long_set_within_its_own(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="the figures need matplotlib: pip install matplotlib")
    import types

    from transformer_np.course import figures

    def save_figures(outdir="figures", progress=None):
        for j in (1, 2):
            progress(j, 2, f"step {j}")
        return []

    long_set = types.ModuleType("transformer_np._cli_long_fig")
    long_set.save_figures = save_figures
    monkeypatch.setitem(sys.modules, long_set.__name__, long_set)
    seen = []
    figures.generate(str(tmp_path), (long_set.__name__,), progress=lambda *a: seen.append(a))
    what = figures.title(long_set.__name__)
    assert seen == [(1, 1, what), (1, 1, f"{what}: step 1 (1/2)"), (1, 1, f"{what}: step 2 (2/2)")]


def test_progress_off_a_terminal_writes_a_line_every_few_seconds_at_most():
    from transformer_np.cli._progress import Progress

    now = [0.0]
    log = io.StringIO()
    bar = Progress("check", log, every=2.0, clock=lambda: now[0])
    for i, t in zip(range(1, 8), (0.0, 0.5, 1.9, 2.1, 2.2, 4.5, 4.6)):
        now[0] = t
        bar(i, 7, f"s{i}")
    # the first step, the first step after 2 s without a line (twice), and the last step
    assert log.getvalue().splitlines() == ["check [1/7] s1", "check [4/7] s4", "check [6/7] s6", "check [7/7] s7"]
    now[0], log = 0.0, io.StringIO()
    late = Progress("check", log, delay=2.0, clock=lambda: now[0])
    for i, t in zip(range(1, 4), (1.0, 1.9, 2.0)):
        now[0] = t
        late(i, 3, f"s{i}")
    assert log.getvalue() == "check [3/3] s3\n"                                  # nothing before 2 s have passed


def _class_folder(tmp_path: Path, n: int = 3) -> Path:
    from transformer_np.worksheets.generate import new_worksheet, write_worksheet

    folder = tmp_path / "class"
    for seed in range(n):
        write_worksheet(new_worksheet(seed=seed), str(tmp_path / "made"), f"s{seed}")
        # the key's answers handed in as a student's sheet: without its [key] table (a key is never graded)
        (folder if folder.is_dir() else folder.mkdir() or folder).joinpath(f"s{seed}.toml").write_text(
            (tmp_path / "made" / f"s{seed}_key.toml").read_text().replace("\n[key]\n", "\n", 1))
    return folder


def test_check_shows_its_progress_through_a_folder_that_takes_a_while(tmp_path, capsys, monkeypatch):
    from transformer_np.cli import _progress

    folder = _class_folder(tmp_path)
    now = [0.0]

    def clock():                                 # each look at the clock: 1.5 s later (a slow class)
        now[0] += 1.5
        return now[0]

    monkeypatch.setattr(_progress, "_now", clock)
    assert main(["check", str(folder)]) == 0
    out, err = capsys.readouterr()
    # sheet 1 starts 1.5 s in: nothing yet; sheet 2 at 3 s: its line; sheet 3 (the last) 1.5 s later: its line
    assert err.splitlines() == [f"check [2/3] {folder / 's1.toml'}", f"check [3/3] {folder / 's2.toml'}"], err
    assert "check [" not in out and "3 of 3 sheets marked" in out
    assert main(["check", str(folder), "--json"]) == 0
    assert capsys.readouterr().err == ""                                          # --json: stdout only, no progress
    monkeypatch.undo()
    assert main(["check", str(folder)]) == 0
    assert capsys.readouterr().err == ""                                          # a quick class: quiet


@pytest.mark.parametrize("name", ["no_such_folder", "no_such_folder/"])
def test_check_names_a_missing_folder_as_a_file_or_folder(tmp_path, capsys, name):
    missing = f"{tmp_path}/{name}"
    assert main(["check", missing]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"transformer-np check: error: {missing}: no such file or folder\n", err


@pytest.mark.parametrize("where", ["under_a_file", "empty"])
def test_worksheet_new_names_the_out_flag_and_the_path_it_cannot_create(tmp_path, capsys, where):
    (tmp_path / "a_file").write_text("")
    out_dir = str(tmp_path / "a_file" / "sub") if where == "under_a_file" else ""
    assert main(["worksheet", "new", "--out", out_dir]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "Errno" not in err, err
    assert err.startswith(f"transformer-np worksheet: error: --out: cannot create the folder {out_dir!r}: "), err


def test_worksheet_new_overwrite_message_names_the_cli_flag_only(tmp_path, capsys):
    assert main(["worksheet", "new", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["worksheet", "new", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"transformer-np worksheet: error: {tmp_path / 'worksheet_seed0.toml'} already exists "
                   "(use --force to overwrite)\n"), err


def test_train_says_which_loss_its_bar_and_its_summary_show(tmp_path, capsys):
    assert main(["train", "--steps", "4", "--eval-every", "2", "--out", str(tmp_path / "run")]) == 0
    out, err = capsys.readouterr()
    bar = [line for line in err.splitlines() if line.startswith("[")]
    assert bar and all(" loss (avg) " in line for line in bar), err
    assert "at the last step (its batch alone; the progress bar's loss (avg) averages about the last 20 steps)" \
        in out.splitlines()[0], out
    assert main(["train", "--steps", "4", "--out", str(tmp_path / "quiet"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "at the last step (its batch alone)," in out and "progress bar" not in out   # no bar: not mentioned


def test_the_student_sheet_says_where_answers_go_and_how_to_check_them(tmp_path):
    from transformer_np.worksheets.generate import key_markdown, new_worksheet, student_markdown, write_worksheet

    raw = new_worksheet(seed=1, layers=2)
    sheet = student_markdown(raw)
    for words in ("`[answers.layer1]`, `[answers.layer2]` sections", "the `.toml` file handed out with it",
                  "transformer-np check FILE.toml", "correct, follows", "first mistake"):
        assert words in sheet, words
    assert "Where your answers go" not in key_markdown(raw)                        # the key needs no instructions
    toml_path, student_path = write_worksheet(raw, str(tmp_path))[:2]
    assert student_path.endswith("_student.md") and toml_path == student_path.removesuffix("_student.md") + ".toml"
    name = os.path.basename(toml_path)                 # the written sheet names its own TOML file
    assert "[answers.layer2]" in Path(toml_path).read_text()                       # the sections it names exist
    assert f"`{name}`" in open(student_path).read() and f"transformer-np check {name}" in open(student_path).read()


def test_a_class_sheet_names_its_students_toml_file(tmp_path):
    """``worksheet class`` writes students/<id>.toml and students/<id>.md: the sheet names <id>.toml (it used to
    say "ending .toml instead of _student.md", the name ``worksheet new`` uses)."""
    from transformer_np.worksheets.classroom import class_worksheets

    roster = tmp_path / "roster.csv"
    roster.write_text("id,name\nst-7,Ann Öz\n", encoding="utf-8")
    class_worksheets(str(roster), str(tmp_path / "out"))
    sheet = (tmp_path / "out" / "students" / "st-7.md").read_text(encoding="utf-8")
    assert "`st-7.toml`" in sheet and "transformer-np check st-7.toml" in sheet and "_student.md" not in sheet


def test_bench_says_what_it_does_before_loading_pytorch(monkeypatch, capsys):
    from transformer_np.cli import bench as cli_bench

    before = {}

    def run_benchmark(*a, **kw):                 # what the user had seen when the work started
        before["err"] = capsys.readouterr().err
        raise ValueError("stopped here by the test")

    monkeypatch.setattr(cli_bench, "run_benchmark", run_benchmark)
    assert main(["bench", "--quick", "--no-memory"]) == 2
    assert before["err"] == "bench: loading PyTorch and reading the machine's load …\n", before
