"""The ``grade`` command: the grade of record of a course exercise, each submission run in its own process.

    transformer-np grade 01_softmax submissions/ --csv grades.csv --workers 2

EXERCISE is an assignment's name as in ``exercises/`` (``01_softmax`` … ``06_encoder_layer``); each SUBMISSION
is an ``.ipynb`` file or a folder of them. The student's cells run in a child process that cannot import this
project or any framework (NumPy, math and the standard library only), with limits on time, memory and files; the
hidden cases, the reference and the comparisons stay in the grader. The child runs behind a boundary the kernel
enforces (Landlock, seccomp-bpf, a user namespace without capabilities); on a machine without it the command
refuses, naming what is missing, unless ``--no-sandbox`` (formative grades, each row marked ``unsandboxed``).
Points attach to named checks. A crash, a timeout or a wrong output costs that check only; the run goes on with
the next submission.

Without ``--json`` a line per submission (score, each question) and the feedback of each failed check are
printed; progress goes to stderr. ``--csv FILE`` writes one row per submission (file, score, out_of, each
question, each question's one-line cause of a lost mark ``<q>_why``, flags, seed, sandbox, error: see
:mod:`transformer_np.grader.gradebook`) with every cell a spreadsheet would read as a formula escaped;
``--csv -`` writes it to standard output. ``--similarity`` compares each graded function with the library's own
source and with every other submission in the run, and lists the pairs above the threshold: flagged for the
instructor, never penalised.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..textout import csv_cell, terminal

__all__ = ["add_arguments", "run", "csv_cell", "terminal_text"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("exercise", metavar="EXERCISE", help="the assignment: 01_softmax … 06_encoder_layer")
    p.add_argument("submissions", metavar="SUBMISSION", nargs="+", help="an .ipynb file or a folder of them")
    p.add_argument("--csv", metavar="FILE", help="write one row per submission to FILE ('-': standard output)")
    p.add_argument("--force", action="store_true", help="let --csv replace an existing FILE")
    p.add_argument("--json", action="store_true", help="print the grades as JSON instead of text")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="CPU seconds one cell or one call of a student's function may take, handed-out calls "
                        "included (default 10; wall-clock cap 4x)")
    p.add_argument("--submission-timeout", type=float, default=300.0, metavar="S",
                   help="CPU seconds a whole submission may take (default 300; wall-clock cap 4x)")
    p.add_argument("--memory-mb", type=int, default=1024, metavar="MB",
                   help="address-space limit of a submission's process, NumPy included (default 1024)")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="submissions graded at once (default 1)")
    p.add_argument("--seed", type=int, default=None, metavar="N",
                   help="the hidden cases' seed, to reproduce a run (default: a fresh random one, printed)")
    p.add_argument("--similarity", action="store_true",
                   help="list pairs of graded functions that look copied (from the library or each other)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="grade without the kernel's boundary (where it is missing): every row is marked "
                        "'unsandboxed' and the grades are formative, not of record")


def terminal_text(text: str, newlines: bool = True) -> str:
    """``text`` as the terminal shows it: the project's one policy (:func:`transformer_np.textout.terminal`);
    newlines kept when ``newlines``."""
    return terminal(text, newlines=newlines)


def _validate(args: argparse.Namespace) -> None:
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be a positive number of seconds; got {args.timeout}")
    if not args.submission_timeout > 0:
        raise ValueError(f"--submission-timeout must be a positive number of seconds; got {args.submission_timeout}")
    if args.memory_mb < 256:
        raise ValueError(f"--memory-mb must be at least 256 (NumPy itself needs ~150 MB); got {args.memory_mb}")
    if args.workers < 1:
        raise ValueError(f"--workers must be at least 1; got {args.workers}")
    if args.csv and args.csv != "-" and os.path.lexists(args.csv) and not args.force:
        raise ValueError(f"--csv {args.csv!r} exists; add --force to replace it")
    if args.csv == "-" and args.json:
        raise ValueError("--csv - and --json both write to standard output; choose one")


def _write_csv(path: str, rows: list[list], force: bool) -> None:
    """The gradebook through the one CSV writer of the project (``check``'s: :class:`._gradebook.CsvSink`): every
    cell escaped for a spreadsheet and a terminal, written to a temporary sibling and renamed into place."""
    from ._gradebook import CsvSink

    columns = tuple(rows[0])
    sink = CsvSink(path, columns, force=force)
    try:
        for row in rows[1:]:
            sink.write(dict(zip(columns, row)))
    except BaseException:
        sink.abort()
        raise
    sink.close()


def _similarity(exercise: str, grades: list) -> list:
    from ..grader.grade import read_code_cells
    from ..grader.similarity import function_sources, graded_functions, similarity_report

    names = graded_functions(exercise)
    subs = {}
    for g in grades:
        if g.error is None:
            cells, _ = read_code_cells(g.file)
            subs[g.file] = function_sources([src for _, src in cells], names)
    pairs = similarity_report(subs, exercise)
    by_file = {g.file: g for g in grades}
    for p in pairs:
        for side, other in ((p.a, p.b), (p.b, p.a)):
            if side in by_file:
                by_file[side].flags.append(f"similar:{p.function}:{other}:{p.score:.2f}")
    return pairs


def _print_text(grades: list, pairs: list | None, seed: int) -> None:
    out = sys.stdout
    for g in grades:
        name = terminal_text(g.file, newlines=False)
        if g.error is not None:
            out.write(f"{name}: 0/{g.out_of:g}  could not be graded: {terminal_text(g.error, False)}\n")
            continue
        per = "  ".join(f"{q} {e:g}/{o:g}" for q, (e, o) in g.questions().items())
        marked = "" if g.sandbox == "kernel" else f"  [{g.sandbox}]"
        out.write(f"{name}: {g.score:g}/{g.out_of:g}  {per}{marked}\n")
        for q, why in g.why().items():
            if why:
                out.write(f"    {q} why: {terminal_text(why, False)}\n")
        for c in g.checks:
            if c.feedback:
                for line in terminal_text(c.feedback).splitlines():
                    out.write(f"    {line}\n")
        for note in g.notes:
            out.write(f"    note: {terminal_text(note, False)}\n")
        if g.output:
            out.write(f"    note: the notebook printed output (the first {len(g.output):,} characters are in "
                      f"--json's \"output\")\n")
    if grades:
        scores = [g.score for g in grades]
        out_of = grades[0].out_of
        full = sum(s == out_of for s in scores)
        boxes = ", ".join(sorted({g.sandbox for g in grades}))
        out.write(f"{len(grades)} submission{'s' if len(grades) != 1 else ''}: mean {sum(scores) / len(scores):.2f}"
                  f"/{out_of:g}, {full} with full marks (hidden cases drawn with seed {seed}; sandbox: {boxes})\n")
    if pairs is not None:
        if not pairs:
            out.write("similarity: no pair above the threshold\n")
        for p in pairs:
            out.write(f"similar ({p.score:.2f}): {p.function} in {terminal_text(p.a, False)} and "
                      f"{terminal_text(p.b, False)} — flagged for a look, not penalised\n")


def run(args: argparse.Namespace) -> int:
    _validate(args)
    import secrets

    from ..grader.grade import grade_submissions
    from ..grader.grading import POINTS
    from ..grader.sandbox import Limits
    from ._progress import Progress

    if args.exercise not in POINTS:
        raise ValueError(f"EXERCISE must be one of {', '.join(POINTS)}; got {args.exercise!r}")
    seed = secrets.randbits(32) if args.seed is None else args.seed
    limits = Limits(call_timeout=args.timeout, submission_timeout=args.submission_timeout, memory_mb=args.memory_mb,
                    cpu_seconds=int(args.submission_timeout) + 30)
    from ..grader.grade import submission_paths

    paths = submission_paths(args.submissions)
    if args.no_sandbox:
        print("--no-sandbox: the students' code runs with your rights, outside the kernel's boundary; these grades "
              "are formative, not of record (every row is marked 'unsandboxed')", file=sys.stderr, flush=True)
    else:
        from ..grader.confine import ConfinementUnavailable
        from ..grader.grade import require_boundary

        try:
            require_boundary()
        except ConfinementUnavailable as e:
            print(f"transformer-np grade: error: {e}", file=sys.stderr)
            return 2
    print(f"grading {args.exercise}: {len(paths)} submission{'s' if len(paths) != 1 else ''}, hidden cases from seed "
          f"{seed}, {args.workers} at a time", file=sys.stderr, flush=True)
    progress = Progress(f"grading {args.exercise}")
    try:
        grades = grade_submissions(args.exercise, paths, workers=args.workers, seed=seed, limits=limits,
                                   sandbox=not args.no_sandbox,
                                   progress=lambda i, n, f: progress(i, n, terminal_text(os.path.basename(f), False)))
    finally:
        progress.close()
    pairs = _similarity(args.exercise, grades) if args.similarity else None
    if args.csv:
        from ..grader.gradebook import csv_rows

        _write_csv(args.csv, csv_rows(grades, list(POINTS[args.exercise])), args.force)
    if args.json:
        doc = {"exercise": args.exercise, "seed": seed, "submissions": [g.to_dict() for g in grades]}
        if pairs is not None:
            doc["similar"] = [{"function": p.function, "a": p.a, "b": p.b, "score": p.score} for p in pairs]
        json.dump(doc, sys.stdout, indent=1, ensure_ascii=True)
        sys.stdout.write("\n")
    elif args.csv != "-":
        _print_text(grades, pairs, seed)
    return 0
