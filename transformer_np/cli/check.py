"""The ``check`` command: mark hand calculations written as worksheets (see :mod:`transformer_np.worksheets`).

Every step of a worksheet's problem is computed with the library's own ops; each answer is marked correct /
follows (wrong, but right from your own earlier answers) / wrong / missing, marks are awarded with error carried
forward, and the first mistake is diagnosed. Give several sheets, or a folder of them, to mark a whole class.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
import textwrap
from collections import Counter

EPILOG = """\
one sheet:
  prints its report (--json: one JSON object). Expected values are shown only for
  the steps the sheet answers; --answers shows them for every step (an instructor's key).

several sheets or a folder (every *.toml in it, sorted by name), or --csv:
  marks a whole class: one line per sheet (file, marks, first mistake, diagnosis) and
  a summary of the most common mistakes; --csv FILE also writes that table as CSV
  (columns: file, total, out_of, first_mistake, diagnosis, correct, follows, wrong,
  missing, error). A sheet that cannot be read gets a row with its error.

exit status:
  0  every given answer is correct or follows from the student's own earlier answers
     (also: a sheet with no answers)
  1  at least one answer is wrong
  2  a sheet cannot be read (missing, too large, not valid TOML, a key or value
     refused), or bad arguments; with several sheets, 2 wins over 1

examples:
  transformer-np check example
  transformer-np check my_sheet.toml --json
  transformer-np check submissions/ --csv gradebook.csv
"""

CSV_COLUMNS = ("file", "total", "out_of", "first_mistake", "diagnosis", "correct", "follows", "wrong", "missing",
               "error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = textwrap.fill(
        "Mark hand calculations written as worksheets: every step is computed with the library's own ops, each "
        "answer marked correct / follows / wrong / missing, marks awarded with error carried forward, and the first "
        "mistake diagnosed. Several sheets or a folder: a class gradebook.", 80)   # raw formatter: wrapped here
    parser.epilog = EPILOG
    parser.add_argument("paths", metavar="DIR_OR_FILE", nargs="+",
                        help="worksheets (TOML) or folders of them; 'example' is the article's 'the cat sat' "
                             "sheet unless a file of that name exists here")
    parser.add_argument("--json", action="store_true",
                        help="print JSON instead of text (strict JSON, full precision)")
    parser.add_argument("--full", action="store_true",
                        help="show your rows next to the correct ones for every answer, not only the wrong ones")
    parser.add_argument("--answers", "--key", dest="answers", action="store_true",
                        help="show the correct value of every step, answered or not (an instructor's key)")
    parser.add_argument("--csv", metavar="GRADEBOOK", default=None,
                        help="write the class gradebook to this CSV file (one row per sheet)")


def _sheets(paths: list[str]) -> list[str]:
    """The sheet paths to mark, in order: a folder gives its *.toml files sorted by name; duplicates once."""
    from ..errors import InputValueError
    from ..worksheets import example_path

    out: list[str] = []
    for p in paths:
        if p == "example" and not os.path.exists(p):
            out.append(example_path("the_cat_sat"))
        elif os.path.isdir(p):
            found = sorted(os.path.join(p, f) for f in os.listdir(p)
                           if f.endswith(".toml") and not f.startswith("."))
            if not found:
                raise InputValueError(f"{p}: a folder with no worksheets (*.toml) in it")
            out += found
        elif not os.path.exists(p) and not p.endswith(".toml"):    # a missing folder, or a file without its .toml
            raise InputValueError(f"{p}: no such file or folder")
        else:
            out.append(p)
    seen: set[str] = set()
    unique = [p for p in out if not (os.path.realpath(p) in seen or seen.add(os.path.realpath(p)))]
    return sorted(unique)           # by path; the same class gives the same gradebook in any argument order


def _one(path: str, args) -> int:
    from ..worksheets import check

    report = check(path)
    if args.json:
        print(report.to_json(answers=args.answers))
    else:
        print(report.format(full=args.full, answers=args.answers))
    return report.exit_status


def run(args) -> int:
    sheets = _sheets(args.paths)
    if args.csv is not None:
        _check_csv_target(args.csv, sheets)
    if len(sheets) == 1 and args.csv is None:
        return _one(sheets[0], args)
    return _class(sheets, args)


def _check_csv_target(target: str, sheets: list[str]) -> None:
    from ..errors import InputValueError

    if target.endswith(".toml") or os.path.realpath(target) in {os.path.realpath(s) for s in sheets}:
        raise InputValueError(f"--csv: {target!r} is a worksheet, not a gradebook; give a .csv file name")
    if os.path.isdir(target):
        raise InputValueError(f"--csv: {target!r} is a folder; give a file name such as gradebook.csv")


def _class(sheets: list[str], args) -> int:
    """Mark every sheet; one row each; the summary; the CSV. Returns the exit status."""
    from ..worksheets import check
    from ._progress import Progress

    rows, reports = [], {}
    # a class that takes more than 2 s (hundreds of sheets): a line every 2 s at most; a small class stays quiet
    bar = None if args.json else Progress("check", every=2.0, delay=2.0)
    for i, path in enumerate(sheets, 1):
        if bar is not None:
            bar(i, len(sheets), path)
        try:
            report = check(path)
        except (ValueError, TypeError, OSError) as e:
            msg = str(e) if str(e).startswith(path) else f"{path}: {e}"
            print(f"transformer-np check: error: {msg}", file=sys.stderr)
            rows.append({"file": path, "error": msg})
            continue
        reports[path] = report
        fm = report.first_mistake
        c = report.counts()
        rows.append({"file": path, "total": report.marks["awarded"], "out_of": report.marks["available"],
                     "first_mistake": "" if fm is None else f"layer {fm['layer']} {fm['name']}",
                     "diagnosis": "" if fm is None else fm["diagnosis"], **c, "error": ""})
    if bar is not None:
        bar.close()
    summary = _summary(rows, reports)
    if args.csv is not None:
        _write_csv(args.csv, rows)
    if args.json:
        out = {"sheets": [{"file": r["file"], "error": r["error"] or None,
                           "report": reports[r["file"]].to_dict(args.answers) if r["file"] in reports else None}
                          for r in rows], "summary": summary}
        print(json.dumps(out, allow_nan=False))
    else:
        print("\n".join(_class_text(rows, summary, args.csv)))
    if any(r["error"] for r in rows):
        return 2
    return 1 if any(rep.exit_status for rep in reports.values()) else 0


def _summary(rows: list[dict], reports: dict) -> dict:
    marked = [r for r in rows if not r["error"]]
    first = Counter((r["first_mistake"], r["diagnosis"]) for r in marked if r["diagnosis"])
    wrong = Counter(f"layer {s['layer']} {s['name']}" for rep in reports.values() for s in rep.steps
                    if s["verdict"] == "wrong")
    totals = [r["total"] for r in marked]
    shares = [r["total"] / r["out_of"] for r in marked if r["out_of"]]
    # most common first; ties in the order of the steps' first appearance (Counter keeps insertion order)
    return {"sheets": len(rows), "marked": len(marked), "unreadable": len(rows) - len(marked),
            "no_answers": sum(1 for rep in reports.values() if rep.answered == 0),
            "mean_total": (sum(totals) / len(totals)) if totals else None,
            "mean_share": (sum(shares) / len(shares)) if shares else None,     # of each sheet's own out_of
            "out_of": sorted({r["out_of"] for r in marked}),
            "first_mistakes": [{"step": k[0], "diagnosis": k[1], "sheets": n} for k, n in first.most_common()],
            "steps_wrong": [{"step": k, "sheets": n} for k, n in wrong.most_common()]}


def _class_text(rows: list[dict], summary: dict, csv_path: str | None) -> list[str]:
    w = max(len(r["file"]) for r in rows) + 2
    L = [f"{'file'.ljust(w)}{'marks':>9s}  first mistake"]
    for r in rows:
        if r["error"]:
            L.append(f"{r['file'].ljust(w)}{'-':>9s}  UNREADABLE: {r['error'].removeprefix(r['file'] + ': ')}")
            continue
        marks = f"{r['total']:g}/{r['out_of']:g}"
        what = f"{r['first_mistake']} — {r['diagnosis']}" if r["diagnosis"] else \
            ("no answers" if r["correct"] + r["follows"] + r["wrong"] == 0 else "none")
        L.append(f"{r['file'].ljust(w)}{marks:>9s}  {what}")
    s = summary
    L += ["", f"{s['marked']} of {s['sheets']} sheets marked"
          + (f", {s['unreadable']} unreadable" if s["unreadable"] else "")
          + (f", {s['no_answers']} with no answers" if s["no_answers"] else "")
          + (f"; mean mark {s['mean_total']:.2f}" + (f" / {s['out_of'][0]:g}" if len(s["out_of"]) == 1 else "")
             if s["mean_total"] is not None else "")
          + (f" ({100 * s['mean_share']:.0f}% of the marks available)" if s["mean_share"] is not None else "") + "."]
    if s["first_mistakes"]:
        L.append("Most common first mistakes:")
        L += [f"  {m['sheets']:3d} × {m['step']} — {m['diagnosis']}" for m in s["first_mistakes"][:8]]
    if s["steps_wrong"]:
        L.append("Steps most often wrong: " + ", ".join(f"{m['step']} ({m['sheets']})" for m in s["steps_wrong"][:8]))
    if csv_path is not None:
        L.append(f"Gradebook written to {csv_path}")
    return L


def _write_csv(path: str, rows: list[dict]) -> None:
    from .._files import write_atomic
    from ..errors import InputValueError

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in CSV_COLUMNS})
    write_atomic(path, buf.getvalue(), error=InputValueError)
