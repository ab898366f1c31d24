"""The ``worksheet`` command: ``worksheet new`` writes a fresh problem for hand calculation;
``worksheet class`` one problem per student of a roster; ``worksheet serve`` a local page to type the answers in;
``worksheet prairielearn`` a PrairieLearn question (:mod:`transformer_np.worksheets.prairielearn`).

``worksheet new``: four files: the problem as TOML (the student fills in its [answers] and runs
``transformer-np check``), a student sheet in Markdown with a blank table per step, the answer key in
Markdown, and the key as TOML (``check`` marks it all correct, and never grades it in a class). Each
seed gives a different problem.

``worksheet class --roster ROSTER.csv --out DIR [--secret-file F]``: one problem per student id (the
roster's ``id`` column), from seeds derived from a secret the instructor keeps (made if absent), so
no sheet prints anything from which its key can be remade; the student sheets go to ``DIR/students/``
and the keys to ``DIR/keys/`` (for ``check --key DIR/keys``); all files are written or none.
"""

from __future__ import annotations

import argparse
import os

from ..textout import terminal
from ..worksheets.format import LIMITS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Write worksheets for hand calculation. 'worksheet new' writes a fresh problem (TOML), a "
                          "student sheet and an answer key (Markdown and TOML); 'worksheet class' one problem per "
                          "student of a roster; 'worksheet serve SHEET' a local page that marks the answers as they "
                          "are typed.")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))
    sub.required = True
    p = sub.add_parser("new", help="write a fresh problem, a student sheet and an answer key",
                       description="Write a fresh problem chosen for hand calculation: the TOML, a student sheet "
                                   "(Markdown, with blanks) and an answer key (Markdown and TOML).")
    _options(p, seed_help="different seeds give different problems (default 0)")
    p.add_argument("--out", default=".", help="directory to write into (default: the current one)")
    p.add_argument("--name", default=None,
                   help="file name stem, a name not a path (default worksheet_seed<SEED>)")
    p.add_argument("--force", action="store_true", help="overwrite existing files (never through a symbolic link)")
    _marks_option(p)
    c = sub.add_parser("class", help="one problem per student of a roster, with keys from a secret seed",
                       description="Write one problem per student of a roster: student sheets in DIR/students/, "
                                   "keys in DIR/keys/ (mark with 'check --key DIR/keys'). The seeds come from a "
                                   "secret the instructor keeps (made if absent): no sheet shows a seed.")
    c.add_argument("--roster", required=True, help="CSV with a header; its 'id' column names the students")
    c.add_argument("--out", required=True, help="folder to write students/ and keys/ into")
    c.add_argument("--secret-file", default=None,
                   help="the instructor's secret (made if absent; default DIR/class_secret.txt): keep it, and "
                        "keys/, away from the students")
    _options(c, seed_help="another set of problems from the same secret, e.g. a second assignment (default 0)")
    _marks_option(c)
    c.add_argument("--force", action="store_true", help="overwrite existing files (never through a symbolic link)")
    c.add_argument("--reveal", action="store_true",
                   help="let check and the page show correct values (writes [setup] reveal = true; default: "
                        "reveal = false, the verdicts, marks and diagnoses only)")
    pl = sub.add_parser("prairielearn", help="a PrairieLearn question: each variant its own problem, marked on the "
                                             "server as check --key marks",
                        description="Write a PrairieLearn question (DIR/questions/NAME/: info.json, question.html, "
                                    "server.py) and the library it imports (DIR/serverFilesCourse/transformer_np/). "
                                    "Each variant draws its own problem; the key never leaves the server.")
    pl.add_argument("--out", required=True, help="the course folder to write into")
    pl.add_argument("--name", default="worksheet", help="the question's folder name, its QID (default worksheet)")
    _options(pl, seed_help="another set of problems for the same variants, e.g. a second assignment (default 0)")
    _marks_option(pl)
    pl.add_argument("--reveal", action="store_true",
                    help="show the correct values in PrairieLearn's answer panel and the feedback (default: the "
                         "verdicts, marks and diagnoses only)")
    pl.add_argument("--force", action="store_true", help="overwrite the question's files")
    from . import worksheet_serve  # worksheet serve SHEET: the local page (worksheet_serve.py)

    worksheet_serve.add_parser(sub)


def _marks_option(p) -> None:
    p.add_argument("--marks", default=None, metavar="FILE",
                   help="a TOML mark scheme: step = marks (every layer), default = marks, [layer2] step = marks; "
                        "written in full into each key (default: 1 mark per step)")


def _marks(args):
    if args.marks is None:
        return None
    from ..worksheets.generate import read_marks_file

    return read_marks_file(args.marks)


def _options(p, seed_help: str) -> None:
    p.add_argument("--tokens", type=int, default=3, help=f"number of tokens, 2 to {LIMITS['tokens']} (default 3)")
    p.add_argument("--d-model", type=int, default=4, help=f"model width, 2 to {LIMITS['d_model']} (default 4)")
    p.add_argument("--heads", type=int, default=1, help="attention heads, dividing the width (default 1)")
    p.add_argument("--norm", choices=("post", "pre"), default="post", help="LayerNorm placement (default post)")
    p.add_argument("--backward", action="store_true", help="also ask for the backward pass (gives dH)")
    p.add_argument("--seed", type=int, default=0, help=seed_help)
    p.add_argument("--layers", type=int, default=1, help=f"encoder layers, 1 to {LIMITS['layers']} (default 1)")
    p.add_argument("--d-ff", type=int, default=None,
                   help=f"feed-forward width, 1 to {LIMITS['d_ff']} (default: d_model)")
    p.add_argument("--activation", choices=("relu", "gelu", "gelu_tanh"), default="relu",
                   help="feed-forward activation (default relu: the easiest by hand)")
    p.add_argument("--decimals", type=int, default=2,
                   help=f"decimals of the answers, 1 to {LIMITS['decimals']} (default 2)")


def run(args) -> int:
    if args.action == "serve":
        from . import worksheet_serve

        return worksheet_serve.run(args)
    if args.action == "class":
        return _class(args)
    if args.action == "prairielearn":
        return _prairielearn(args)
    from ..worksheets.generate import new_worksheet, write_worksheet

    marks = _marks(args)
    raw = new_worksheet(tokens=args.tokens, d_model=args.d_model, heads=args.heads, norm=args.norm,
                        backward=args.backward, seed=args.seed, layers=args.layers, d_ff=args.d_ff,
                        activation=args.activation, decimals=args.decimals)
    for path in write_worksheet(raw, args.out, args.name, force=args.force, marks=marks,
                                marks_source=f"--marks: {args.marks}"):
        print(terminal(path))
    return 0


def _prairielearn(args) -> int:
    from ..worksheets.prairielearn import write_question

    options = dict(tokens=args.tokens, d_model=args.d_model, heads=args.heads, norm=args.norm,
                   backward=args.backward, layers=args.layers, d_ff=args.d_ff, activation=args.activation,
                   decimals=args.decimals)
    for path in write_question(args.out, options, marks=_marks(args), reveal=args.reveal, name=args.name,
                               assignment=args.seed, force=args.force):
        print(terminal(str(path)))
    print(terminal(os.path.join(args.out, "serverFilesCourse", "transformer_np")) + os.sep)
    return 0


def _class(args) -> int:
    from ..worksheets.classroom import class_worksheets

    done = class_worksheets(args.roster, args.out, secret_file=args.secret_file, force=args.force,
                            assignment=args.seed, marks=_marks(args), marks_source=f"--marks: {args.marks}",
                            tokens=args.tokens, d_model=args.d_model, heads=args.heads,
                            norm=args.norm, backward=args.backward, layers=args.layers, d_ff=args.d_ff,
                            activation=args.activation, decimals=args.decimals, reveal=args.reveal)
    n = len(done["students"])
    print(f"{n} problem{'s' if n != 1 else ''}, one per student:")
    out, secret = terminal(args.out), terminal(done["secret"])      # paths the user gave: shown, never sent raw
    print(f"  {os.path.join(out, 'students')}{os.sep}  the sheets to hand out (<id>.toml, <id>.md)")
    print(f"  {os.path.join(out, 'keys')}{os.sep}  the keys: keep them (check --key "
          f"{os.path.join(out, 'keys')} SUBMISSIONS...)")
    print(f"  {secret}  the secret the seeds come from ({'made now' if done['secret_made'] else 'kept'}): "
          f"keep it; with it the same roster and options give the same problems again")
    return 0
