r"""A report that does not give the answers away: for a sheet whose ``[setup]`` says ``reveal = false``.

``worksheet class`` writes ``reveal = false`` into every student sheet and key it makes (``--reveal`` writes
``true``); a sheet without the setting reveals, as before. With ``reveal = false``, ``check`` (text and
``--json``) and the page of ``worksheet serve`` show each step's verdict and marks, the counts, and the first
mistake's step and diagnosis with its one-line meaning — but no correct value, no value recomputed from the
student's own numbers (with correct earlier answers that is the correct value), and no error size (the answer
plus or minus the error is the correct value). ``check --answers`` is the instructor's explicit request and
still shows everything. Marked against a key (``check --key``), the key's setting decides.

This is a courtesy to the class, not a lock: the sheet is the student's file, and the library computes every
step for anyone who runs it.
"""

from __future__ import annotations

import os
import textwrap

__all__ = ["reveals", "withheld_dict", "withheld_explanation", "withheld_text", "NOTE"]

NOTE = "Correct values are not shown for this sheet (its [setup] has reveal = false)."


def reveals(report, answers: bool = False) -> bool:
    """Whether ``report``'s correct values may be shown: the sheet's ``[setup].reveal``, or ``answers``."""
    return answers or getattr(report.worksheet, "reveal", True)


def withheld_explanation(fm: dict) -> str:
    """The first mistake told without numbers: where, the diagnosis and its one-line meaning."""
    from .diagnosis import describe_code

    try:
        meaning = describe_code(fm["diagnosis"])
    except KeyError:
        meaning = fm["diagnosis"].replace("_", " ")
    return (f"Layer {fm['layer']}, {fm['name']}: {meaning.rstrip('.')}. Your earlier answers are right or "
            f"followed through; check this step's working. {NOTE}")


_STEP_KEYS = ("layer", "name", "verdict", "given", "marks", "out_of", "diagnosis")     # no number of the truth's
_FIRST_KEYS = ("layer", "name", "diagnosis")


def withheld_dict(report) -> dict:
    """``report.to_dict()`` with every correct value, error size and numeric explanation taken out: each step
    keeps only what the student wrote and how it was marked (a whitelist, so a field added to the report later
    is withheld until it is listed here); ``expected`` and ``max_abs_error`` are None."""
    d = report.to_dict()
    d["steps"] = [{**{k: s.get(k) for k in _STEP_KEYS}, "expected": None, "max_abs_error": None}
                  for s in d["steps"]]
    fm = d["first_mistake"]
    if fm is not None:
        d["first_mistake"] = {**{k: fm.get(k) for k in _FIRST_KEYS}, "explanation": withheld_explanation(fm)}
    d["reveal"] = False
    return d


def withheld_text(report) -> str:
    """The text report of a sheet that does not reveal: the verdict and marks of every step, the totals and the
    first mistake's diagnosis."""
    ws = report.worksheet
    d = withheld_dict(report)
    c = d["counts"]
    L = [f"Worksheet {os.path.basename(ws.source)}: tokens {', '.join(ws.tokens)}; d_model {ws.d_model}, "
         f"{ws.n_heads} head{'s' if ws.n_heads > 1 else ''}, d_ff {ws.d_ff}, {ws.norm.capitalize()}-LN, "
         f"{ws.activation}, {ws.layers} layer{'s' if ws.layers > 1 else ''}", NOTE]
    if report.key_source is not None:
        L.append(f"Marked against the key {report.key_source}" + (f" (student {report.student})" if report.student
                                                                  else "") + ".")
    if report.flags:
        L.append("PROBLEM ALTERED (problem_altered): " + ", ".join(report.altered))
    L.append(f"{c['correct']} correct, {c['follows']} follows, {c['wrong']} wrong, {c['missing']} not answered.")
    part = None
    w = max(len(s["name"]) for s in d["steps"]) + 2
    for s in d["steps"]:
        here = (s["layer"], "backward" if s["name"].startswith("d_") else "forward")
        if here != part:
            L += ["", f"LAYER {here[0]} — {here[1]}", f"  {'quantity'.ljust(w)}{'verdict':9s}{'marks':>9s}"]
            part = here
        marks = "" if s["out_of"] is None else f"{s['marks']:g}/{s['out_of']:g}"
        L.append(f"  {s['name'].ljust(w)}{(s['verdict'].upper() if s['verdict'] == 'wrong' else s['verdict']):9s}"
                 f"{marks:>9s}")
    m = d["marks"]
    L += ["", f"MARKS: {m['awarded']:g} / {m['available']:g}"]
    fm = d["first_mistake"]
    if fm is not None:
        L.append(f"FIRST MISTAKE: layer {fm['layer']}, {fm['name']} — {fm['diagnosis']}")
        L += textwrap.wrap(fm["explanation"], 110, initial_indent="  ", subsequent_indent="  ")
    elif report.answered:
        L.append("No mistake: every answer is correct or follows from your own earlier answers.")
    return "\n".join(L)
