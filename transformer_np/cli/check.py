"""The ``check`` command: mark hand calculations written as worksheets (see :mod:`transformer_np.worksheets`).

Every step of a worksheet's problem is computed with the library's own ops; each answer is marked correct /
follows (wrong, but right from your own earlier answers) / wrong / missing, marks are awarded with error carried
forward, and the first mistake is diagnosed. Give several sheets, or a folder of them, to mark a whole class;
with ``--key`` the instructor's key decides the problem and the mark scheme (:mod:`transformer_np.worksheets.keys`).
The gradebook is made safe for its reader in :mod:`transformer_np.cli._gradebook`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections import Counter

from ._gradebook import CsvSink, find_sheets, read_sheet, shown

EPILOG = """\
one sheet:
  prints its report (--json: one JSON object). Expected values are shown only for
  the steps the sheet answers; --answers shows them for every step (an instructor's key).

--key KEY (an answer key TOML, or a folder of keys, e.g. the keys/ of 'worksheet class'):
  each submission is matched to its key by the problem id on the sheet; its problem and
  mark scheme come from the key, its answers from the submission. A submission whose
  copy of the problem or [marks] differs from the key's is marked against the key's
  and flagged problem_altered. Without --key a sheet is marked as it stands.

several sheets or a folder (every *.toml in it, sorted by name), or --csv:
  marks a whole class: one line per sheet (file, marks, first mistake, diagnosis) and
  a summary of the most common mistakes; answer keys are never graded. --csv FILE also
  writes that table as CSV (columns: file, student, problem_id, total, out_of,
  first_mistake, diagnosis, correct, follows, wrong, missing, flags, error); an
  existing FILE is replaced only with --force; --csv - writes the CSV to standard
  output instead of the table. A sheet that cannot be read (or is a FIFO, a device,
  a folder, a symbolic link out of its folder) gets a row with its error.

--roster ROSTER.csv (several sheets or a folder; the worksheets guide, "The
  gradebook against a roster"): one row per roster student in roster order
  (name, id, total, out_of, percent, first_mistake, diagnosis, flags, file, ...),
  no_submission rows, unmatched rows for files that name no student; files
  matched by roster id, LMS user id or Canvas / Moodle download name, an
  unreadable file by its header's problem id; copies (same_problem, same_answers,
  not_own_problem) and look-alike ids (confusable_id) flagged on every row
  involved. --export canvas|moodle FILE, --matrix FILE, --summary FILE (JSON) and
  --figure FILE (PNG) need it.

[setup] reveal = false on a sheet (worksheet class writes it): verdicts, marks
  and diagnoses only, no correct value (--answers shows them).

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
  transformer-np check --key class/keys submissions/ --csv gradebook.csv
  transformer-np check --key class/keys subs/ --roster roster.csv --csv book.csv
  transformer-np check --key class/keys subs/ --roster roster.csv --export canvas c.csv
"""

CSV_COLUMNS = ("file", "student", "problem_id", "total", "out_of", "first_mistake", "diagnosis", "correct",
               "follows", "wrong", "missing", "flags", "error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = textwrap.fill(
        "Mark hand calculations written as worksheets: every step is computed with the library's own ops, each "
        "answer marked correct / follows / wrong / missing, marks awarded with error carried forward, and the first "
        "mistake diagnosed. Several sheets or a folder: a class gradebook; --key: the instructor's key decides the "
        "problem and the marks.", 80)   # raw formatter: wrapped here
    parser.epilog = EPILOG
    parser.add_argument("paths", metavar="DIR_OR_FILE", nargs="+",
                        help="worksheets (TOML) or folders of them; 'example' is the article's 'the cat sat' "
                             "sheet unless a file of that name exists here")
    parser.add_argument("--key", metavar="KEY", default=None,
                        help="the instructor's answer key (TOML) or a folder of keys: the problem and the mark "
                             "scheme are taken from it, the answers from each sheet")
    parser.add_argument("--json", action="store_true",
                        help="print JSON instead of text (strict JSON, full precision)")
    parser.add_argument("--full", action="store_true",
                        help="show your rows next to the correct ones for every answer, not only the wrong ones")
    parser.add_argument("--answers", action="store_true",
                        help="show the correct value of every step, answered or not (an instructor's key)")
    parser.add_argument("--csv", metavar="GRADEBOOK", default=None,
                        help="write the class gradebook to this CSV file (one row per sheet); '-': to standard "
                             "output")
    parser.add_argument("--force", action="store_true",
                        help="let --csv (and --export, --matrix, --summary, --figure) replace an existing file")
    g = parser.add_argument_group("a class against its roster (docs/guide/instructors.md, 'The gradebook')")
    g.add_argument("--roster", metavar="ROSTER.csv", default=None,
                   help="one gradebook row per roster student, in roster order (its 'id' column; names from "
                        "'name' or 'first name'/'last name'), a row for each student with no file and for each "
                        "file that names no student; copies and look-alike ids flagged")
    g.add_argument("--export", nargs=2, metavar=("canvas|moodle", "FILE"), default=None,
                   help="with --roster: also write the grades as Canvas's or Moodle's CSV import expects them")
    g.add_argument("--assignment", metavar="NAME", default="Worksheet",
                   help="the assignment (grade item) column's name in --export (default: Worksheet)")
    g.add_argument("--matrix", metavar="FILE", default=None,
                   help="with --roster: write a student × step table of verdicts (CSV)")
    g.add_argument("--summary", metavar="FILE", default=None,
                   help="with --roster: write the class summary (JSON: steps most often wrong or missing, first "
                        "mistakes by diagnosis, every percentage)")
    g.add_argument("--figure", metavar="FILE", default=None,
                   help="with --roster: draw the class summary as one figure (PNG, 150 dpi; needs matplotlib)")


def _example(p: str) -> str | None:
    from ..worksheets import example_path

    return example_path("the_cat_sat") if p == "example" and not os.path.exists(p) else None


def run(args) -> int:
    try:
        return _run(args)
    except BrokenPipeError:                             # a reader closed the pipe: the CLI's main ends quietly
        raise
    except (ValueError, TypeError, OSError) as e:       # one line, escaped (the message may quote a file name)
        print(f"transformer-np check: error: {shown(str(e))}", file=sys.stderr)
        return 2


def _run(args) -> int:
    from ..errors import InputValueError
    from ..worksheets.keys import KeyRing

    if args.csv == "-" and args.json:
        raise InputValueError("--csv - and --json both write to standard output; give --csv a file name")
    roster_only = [f"--{k}" for k in ("export", "matrix", "summary", "figure") if getattr(args, k) is not None]
    if roster_only and args.roster is None:
        raise InputValueError(f"{roster_only[0]} needs --roster ROSTER.csv (the students the rows are for)")
    if args.export is not None and args.export[0] not in ("canvas", "moodle"):
        raise InputValueError(f"--export: expected canvas or moodle, got {args.export[0]!r}")
    ring = KeyRing(args.key) if args.key is not None else None
    sheets = find_sheets(args.paths, _example)
    if args.csv is not None:
        _check_csv_target(args.csv, [e.path for e in sheets])
    if args.roster is not None:
        from ._roster import roster_class

        return roster_class(sheets, args, ring, _mark_one, _row)
    if len(sheets) == 1 and sheets[0].named and args.csv is None:
        return _one(sheets[0].path, args, ring)
    return _class(sheets, args, ring)


def _one(path: str, args, ring) -> int:
    from ..worksheets import check
    from ..worksheets.keys import mark
    from ..worksheets.tomlio import read_toml

    if ring is None:
        report = check(path)
    else:
        report = mark(ring, read_toml(path), path)
    from ..worksheets.withheld import reveals, withheld_dict, withheld_text

    if not reveals(report, args.answers):              # [setup] reveal = false: no correct value is printed
        if args.json:
            print(json.dumps(withheld_dict(report), allow_nan=False))
        else:
            print(shown(withheld_text(report), keep_newlines=True))
        return report.exit_status
    if args.json:
        print(report.to_json(answers=args.answers))
    else:
        print(shown(report.format(full=args.full, answers=args.answers), keep_newlines=True))
    return report.exit_status


def _check_csv_target(target: str, sheets: list[str]) -> None:
    from ..errors import InputValueError

    if target == "-":
        return
    if target.endswith(".toml") or os.path.realpath(target) in {os.path.realpath(s) for s in sheets}:
        raise InputValueError(f"--csv: {target!r} is a worksheet, not a gradebook; give a .csv file name")
    if os.path.isdir(target):
        raise InputValueError(f"--csv: {target!r} is a folder; give a file name such as gradebook.csv")


class _Summary:
    """What the class summary needs, gathered sheet by sheet (no report is kept)."""

    def __init__(self):
        self.sheets = self.marked = self.unreadable = self.no_answers = self.altered = self.keys = 0
        self.total = self.share = 0.0
        self.shares = 0
        self.out_of: set = set()
        self.first: Counter = Counter()
        self.wrong: Counter = Counter()
        self.ids: set = set()

    def add(self, row: dict, report) -> None:
        self.sheets += 1
        if report is None:
            self.unreadable += 1
            return
        self.marked += 1
        self.no_answers += report.answered == 0
        self.altered += bool(report.flags)
        self.total += row["total"]
        if row["out_of"]:
            self.share += row["total"] / row["out_of"]      # of each sheet's own out_of
            self.shares += 1
        self.out_of.add(row["out_of"])
        if report.problem_id:
            self.ids.add(report.problem_id)
        if row["diagnosis"]:
            self.first[(row["first_mistake"], row["diagnosis"])] += 1
        self.wrong.update(f"layer {s['layer']} {s['name']}" for s in report.steps if s["verdict"] == "wrong")

    def to_dict(self) -> dict:
        # most common first; ties in the order of the steps' first appearance (Counter keeps insertion order)
        return {"sheets": self.sheets, "marked": self.marked, "unreadable": self.unreadable,
                "no_answers": self.no_answers, "problem_altered": self.altered, "keys_skipped": self.keys,
                "mean_total": self.total / self.marked if self.marked else None,
                "mean_share": self.share / self.shares if self.shares else None,
                "out_of": sorted(self.out_of),
                "first_mistakes": [{"step": k[0], "diagnosis": k[1], "sheets": n} for k, n in self.first.most_common()],
                "steps_wrong": [{"step": k, "sheets": n} for k, n in self.wrong.most_common()]}


def _mark_one(entry, ring, keep: dict | None = None):
    """(report, None), (None, error message), or (None, None) for an answer key (never graded). ``keep``, when
    given, receives the file's bytes (``"data"``) and its TOML (``"raw"``) as far as they could be read."""
    from ..worksheets import check
    from ..worksheets.format import parse_worksheet
    from ..worksheets.keys import mark
    from ..worksheets.tomlio import MAX_FILE_BYTES, decode_toml

    where = shown(entry.path)
    try:
        data = read_sheet(entry, MAX_FILE_BYTES)
        if keep is not None:
            keep["data"] = data
        raw = decode_toml(data, where)
        if keep is not None:
            keep["raw"] = raw
        if isinstance(raw, dict) and "key" in raw:
            return None, None
        if ring is not None:
            if os.path.realpath(entry.path) in ring.real_paths():
                return None, None
            return mark(ring, raw, where), None
        ws = parse_worksheet(raw, where)
        ws.source = where
        return check(ws), None
    except (ValueError, TypeError, OSError) as e:
        msg = shown(str(e))
        return None, (msg if msg.startswith(where) else f"{where}: {msg}")


def _name_unreadable(row: dict, data: bytes, ring, summary) -> None:
    """An unreadable sheet's row gets the problem id its header gives and, from the keys, the student it was
    made for; that student is then not counted as having handed nothing in."""
    from ..worksheets.gradebook import header_problem_id

    pid = header_problem_id(data)
    if pid is None:
        return
    row["problem_id"] = pid
    summary.ids.add(pid)
    if ring is not None and pid in ring.students:
        row["student"] = ring.students[pid]


def _row(entry, report, error) -> dict:
    if report is None:
        return {"file": shown(entry.path), "error": error}
    fm = report.first_mistake
    return {"file": shown(entry.path), "student": report.student or "", "problem_id": report.problem_id or "",
            "total": report.marks["awarded"], "out_of": report.marks["available"],
            "first_mistake": "" if fm is None else f"layer {fm['layer']} {fm['name']}",
            "diagnosis": "" if fm is None else fm["diagnosis"], **report.counts(),
            "flags": "" if not report.flags else f"{report.flags[0]}: {', '.join(report.altered)}", "error": ""}


def _class(sheets: list, args, ring) -> int:
    """Mark every sheet, one at a time: its row is printed (and written to the CSV) and the report dropped, so
    memory stays flat however large the class. Returns the exit status."""
    sink = CsvSink(args.csv, CSV_COLUMNS, force=args.force) if args.csv is not None else None
    text = not args.json and args.csv != "-"
    summary, status = _Summary(), 0
    w = max(len(shown(e.path)) for e in sheets) + 2
    from ._progress import Progress

    # a class that takes more than 2 s (hundreds of sheets): a line every 2 s at most on stderr; a small class stays
    # quiet; none under --json (stdout only)
    bar = None if args.json else Progress("check", every=2.0, delay=2.0)
    try:
        if text:
            print(f"{'file'.ljust(w)}{'marks':>9s}  first mistake", flush=True)
        elif args.json:
            sys.stdout.write('{"sheets": [')
        first = True
        for i, entry in enumerate(sheets, 1):
            if bar is not None:
                bar(i, len(sheets), shown(entry.path))
            keep: dict = {}
            report, error = _mark_one(entry, ring, keep)
            if report is None and error is None:
                summary.keys += 1
                continue
            row = _row(entry, report, error)
            if report is None and "data" in keep:       # unreadable: its header may still name the problem
                _name_unreadable(row, keep["data"], ring, summary)
            summary.add(row, report)
            if error is not None:
                print(f"transformer-np check: error: {error}", file=sys.stderr)
                status = 2
            elif report.exit_status:
                status = max(status, 1)
            if sink is not None:
                sink.write(row)
            if text:
                print(_line(row, w), flush=True)
            elif args.json:
                item = {"file": row["file"], "error": error,
                        "report": None if report is None else _report_dict(report, args.answers)}
                sys.stdout.write(("" if first else ", ") + json.dumps(item, allow_nan=False))
                first = False
        s = summary.to_dict()
        if ring is not None and ring.students:         # a folder of class keys: who handed nothing in
            s["no_submission"] = sorted(sid for pid, sid in ring.students.items() if pid not in summary.ids)
        if sink is not None:
            sink.close()
            sink = None
    finally:
        if bar is not None:
            bar.close()
        if sink is not None:
            sink.abort()
    if args.json:
        sys.stdout.write('], "summary": ' + json.dumps(s, allow_nan=False) + "}\n")
    elif text:
        print("\n".join(_summary_text(s, args.csv)))
    return status


def _report_dict(report, answers: bool) -> dict:
    from ..worksheets.withheld import reveals, withheld_dict

    return report.to_dict(answers) if reveals(report, answers) else withheld_dict(report)


def _line(r: dict, w: int) -> str:
    if r["error"]:
        who = f"[{shown(r['student'])}] " if r.get("student") else ""
        return f"{r['file'].ljust(w)}{'-':>9s}  {who}UNREADABLE: {r['error'].removeprefix(r['file'] + ': ')}"
    marks = f"{r['total']:g}/{r['out_of']:g}"
    what = f"{r['first_mistake']} — {r['diagnosis']}" if r["diagnosis"] else \
        ("no answers" if r["correct"] + r["follows"] + r["wrong"] == 0 else "none")
    who = f"[{shown(r['student'])}] " if r.get("student") else ""
    flag = "  PROBLEM ALTERED" if r["flags"] else ""
    return f"{r['file'].ljust(w)}{marks:>9s}  {who}{what}{flag}"


def _summary_text(s: dict, csv_path: str | None) -> list[str]:
    L = ["", f"{s['marked']} of {s['sheets']} sheets marked"
         + (f", {s['unreadable']} unreadable" if s["unreadable"] else "")
         + (f", {s['no_answers']} with no answers" if s["no_answers"] else "")
         + (f"; mean mark {s['mean_total']:.2f}" + (f" / {s['out_of'][0]:g}" if len(s["out_of"]) == 1 else "")
            if s["mean_total"] is not None else "")
         + (f" ({100 * s['mean_share']:.0f}% of the marks available)" if s["mean_share"] is not None else "") + "."]
    if s["keys_skipped"]:
        L.append(f"{s['keys_skipped']} answer key{'s' if s['keys_skipped'] > 1 else ''} skipped (a key is never "
                 f"graded as a submission).")
    if s.get("no_submission"):
        L += textwrap.wrap(f"No submission from {len(s['no_submission'])} student"
                           f"{'s' if len(s['no_submission']) > 1 else ''} of the keys: "
                           + ", ".join(shown(x) for x in s["no_submission"]) + ".", 110, subsequent_indent="  ")
    if s["problem_altered"]:
        L.append(f"{s['problem_altered']} sheet{'s' if s['problem_altered'] > 1 else ''} flagged problem_altered "
                 f"(marked against the key's problem and marks).")
    if s["first_mistakes"]:
        L.append("Most common first mistakes:")
        L += [f"  {m['sheets']:3d} × {m['step']} — {m['diagnosis']}" for m in s["first_mistakes"][:8]]
    if s["steps_wrong"]:
        L.append("Steps most often wrong: " + ", ".join(f"{m['step']} ({m['sheets']})" for m in s["steps_wrong"][:8]))
    if csv_path is not None:
        L.append(f"Gradebook written to {shown(csv_path)}")
    return L
