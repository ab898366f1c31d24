"""``check … --roster ROSTER.csv``: the class gradebook in roster order, and the files made from it.

The rows, flags and matching are :mod:`transformer_np.worksheets.gradebook`'s; the LMS layouts
:mod:`transformer_np.worksheets.lms`'s; the figure :mod:`transformer_np.worksheets.gradebook_plot`'s. Here: the
sheets are marked one at a time (only each sheet's row and verdicts are kept), then the gradebook is printed and
every file asked for is written, each all or nothing (a temporary sibling renamed into place).
"""

from __future__ import annotations

import json
import os
import sys

from ._gradebook import CsvSink, cell, shown

_TEXT_COLUMNS = ("name", "id", "marks", "percent", "first mistake / flags")


def _targets(args, sheets) -> list[tuple[str, str]]:
    """The files to write, as (option, path); refused when one names a sheet, a folder, or another's path."""
    from ..errors import InputValueError

    out = [("--csv", args.csv)] if args.csv not in (None, "-") else []
    out += [("--export", args.export[1])] if args.export else []
    out += [(f"--{k}", getattr(args, k)) for k in ("matrix", "summary", "figure") if getattr(args, k)]
    real = {os.path.realpath(e.path) for e in sheets} | {os.path.realpath(args.roster)}
    seen: dict[str, str] = {}
    for opt, path in out:
        rp = os.path.realpath(path)
        if rp in real or path.endswith(".toml"):
            raise InputValueError(f"{opt}: {shown(path)} is a worksheet or the roster; give another file name")
        if os.path.isdir(path):
            raise InputValueError(f"{opt}: {shown(path)} is a folder; give a file name")
        if os.path.islink(path):
            raise InputValueError(f"{opt}: {shown(path)} is a symbolic link; refusing to write through it")
        if os.path.lexists(path) and not args.force:
            raise InputValueError(f"{opt}: {shown(path)} already exists; give another name, or --force to "
                                  f"replace it")
        if rp in seen:
            raise InputValueError(f"{opt}: {shown(path)} is also the file of {seen[rp]}")
        seen[rp] = opt
    return out


def _stem(path: str) -> str:
    name = os.path.basename(path)
    return name[:-5] if name.endswith(".toml") else name


def roster_class(sheets: list, args, ring, mark_one, make_row) -> int:
    """Mark ``sheets`` and write the roster gradebook (see the module docstring). Returns the exit status."""
    from ..worksheets.gradebook import ROSTER_COLUMNS, Gradebook, read_students, summary
    from ..worksheets.keys import fingerprint

    students = read_students(args.roster)
    targets = _targets(args, sheets)
    if args.figure:                                   # a missing matplotlib is said before the class is marked
        from ..worksheets.gradebook_plot import require_matplotlib

        require_matplotlib()
    book = Gradebook(students, ring.students if ring is not None else None)
    status = 0
    for entry in sheets:
        keep: dict = {}
        report, error = mark_one(entry, ring, keep)
        if report is None and error is None:              # an answer key: never graded
            continue
        row = make_row(entry, report, error)
        if error is not None:
            print(f"transformer-np check: error: {error}", file=sys.stderr)
            status = 2
        elif report.exit_status:
            status = max(status, 1)
        fp = None if report is None or report.problem_id else fingerprint(report.worksheet)[:16]
        book.add(shown(entry.path), _stem(entry.path), row, report, keep.get("data"), keep.get("raw"), fp)
    rows = book.rows()
    s = summary(rows, book.steps, len(students))
    _write(args, targets, rows, students, book.steps, s)
    if args.json:
        print(json.dumps({"rows": [{k: r[k] for k in ROSTER_COLUMNS} for r in rows], "summary": s},
                         allow_nan=False))
    elif args.csv != "-":
        _print(rows, s, targets)
    return status


def _write(args, targets, rows, students, steps, s) -> None:
    from .._files import write_atomic
    from ..errors import InputValueError
    from ..worksheets.gradebook import ROSTER_COLUMNS, matrix_rows
    from ..worksheets.lms import export_rows

    if args.csv is not None:
        _csv(args.csv, list(ROSTER_COLUMNS), [[r[k] for k in ROSTER_COLUMNS] for r in rows], args.force)
    if args.export:
        lines = export_rows(args.export[0], rows, students, args.assignment)
        _csv(args.export[1], lines[0], lines[1:], args.force)
    if args.matrix:
        header, lines = matrix_rows(rows, steps)
        _csv(args.matrix, header, lines, args.force)
    if args.summary:
        write_atomic(args.summary, json.dumps(s, indent=1, allow_nan=False) + "\n", error=InputValueError)
    if args.figure:
        from ..worksheets.gradebook_plot import summary_figure

        summary_figure(s, args.figure)


def _csv(target: str, header: list, lines: list[list], force: bool) -> None:
    sink = CsvSink(target, tuple(str(h) for h in header), force=force)
    try:
        for line in lines:
            sink.writer.writerow([cell(v) for v in line])
        sink.close()
    except BaseException:
        sink.abort()
        raise


def _print(rows: list[dict], s: dict, targets) -> None:
    wn = max([len(shown(r["name"])) for r in rows] + [4]) + 2
    wi = max([len(shown(r["id"])) for r in rows] + [2]) + 2
    print(f"{'name'.ljust(wn)}{'id'.ljust(wi)}{'marks':>9s}{'%':>8s}  first mistake / flags")
    for r in rows:
        marks = f"{r['total']:g}/{r['out_of']:g}" if isinstance(r["total"], (int, float)) else "-"
        pct = f"{r['percent']:.1f}" if isinstance(r["percent"], (int, float)) else "-"
        what = f"{r['first_mistake']} — {r['diagnosis']}" if r["diagnosis"] else ""
        if r["error"]:
            what = "UNREADABLE: " + r["error"].removeprefix(r["file"] + ": ")
        if not r["id"]:
            what = f"{r['file']}: {what}"
        flags = f"  [{r['flags']}]" if r["flags"] else ""
        print(shown(f"{r['name'].ljust(wn)}{r['id'].ljust(wi)}{marks:>9s}{pct:>8s}  {what}{flags}"), flush=True)
    print(f"\n{s['students']} students: {s['sheets_marked']} sheets marked, {s['no_submission']} without a "
          f"submission, {s['unreadable']} unreadable"
          + (f"; mean {s['mean_percent']:.1f}% of the marks" if s["mean_percent"] is not None else "") + ".")
    if s["steps_wrong"]:
        print("Steps most often wrong: " + ", ".join(f"{d['step']} ({d['students']})" for d in s["steps_wrong"][:8]))
    if s["first_mistakes_by_diagnosis"]:
        print("First mistakes by diagnosis: " + ", ".join(f"{d['diagnosis']} ({d['students']})"
                                                          for d in s["first_mistakes_by_diagnosis"][:8]))
    for opt, path in targets:
        print(f"{opt}: written to {shown(path)}")
