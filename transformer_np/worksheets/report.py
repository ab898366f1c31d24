"""The result of checking a worksheet: JSON-ready steps, the first mistake, and the text report."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np

from .diagnosis import diagnose
from .marking import Marking
from .names import is_per_token

__all__ = ["Report", "format_table"]


def _num(x: float, dec: int) -> str:
    if not np.isfinite(x):
        return str(x)
    s = f"{x:.{dec}f}"
    return s.replace("-", "") if float(s) == 0 else s          # no "-0.00"


def format_table(rows: list[tuple[str, str, np.ndarray]], cols: list[str], dec: int, indent: str = "    ") -> list[str]:
    """Lines of a table: each row is (label, sublabel, values); NaN prints as a blank."""
    cells = [[("" if np.isnan(v) else _num(v, dec)) for v in vals] for _, _, vals in rows]
    w = max([len(c) for r in cells for c in r] + [len(c) for c in cols] + [4])
    l1 = max([len(r[0]) for r in rows] + [0])
    l2 = max([len(r[1]) for r in rows] + [0])
    out = [indent + " " * (l1 + l2 + 2) + "  ".join(c.rjust(w) for c in cols)]
    for (a, b, _), c in zip(rows, cells):
        out.append(indent + a.ljust(l1) + " " + b.ljust(l2) + " " + "  ".join(x.rjust(w) for x in c))
    return out


def _mark(x):
    """Marks as JSON numbers: an int when whole (2, not 2.0)."""
    if x is None:
        return None
    return int(x) if float(x).is_integer() else float(x)


def _shown_error(m: Marking, key) -> tuple[float, float]:
    """The (error, tolerance) pair the table shows for an answered step, taken at one entry so that the two can
    be compared: the entry that decided the verdict, against the reference and the band the verdict used
    (:meth:`.marking.Marking.decisive`) — so a ``wrong`` row's error is always above its tolerance and a
    ``correct``/``follows`` row's within it."""
    found = m.decisive(key)
    if found is None:                      # not answered, or nothing to compare: the band alone, no error
        return float("nan"), float(np.max(np.asarray(m.tol[key])))
    return found


def _from_yours(m: Marking, key) -> np.ndarray:
    """The value of step ``key`` recomputed from the student's own earlier answers (the reference a forced
    verdict was decided with, when there is one)."""
    return np.asarray(m.saved[key][0] if key in m.saved else m.own[key], dtype=float)


def _after_slip(m: Marking) -> set:
    """The steps that rest on an earlier mistake: an input not ``correct`` (wrong, follows, or itself resting on
    one), a mistake carried in an unwritten step, or a number of the sheet the student copied differently."""
    data = {k: v for k, v in (m.student_inputs or {}).items()}
    bad = set(m.hidden)
    if data:
        ws = m.worksheet
        sheet = {(0, "H0"): ws.H0, (0, "dH"): ws.dH}
        bad |= {k for k, v in data.items() if sheet.get(k) is not None and not np.array_equal(v, sheet[k])}
    out = set()
    for s in (m.student_steps or m.steps):
        if any(k in bad for k in s.inputs):
            out.add(s.key)
            bad.add(s.key)
        if m.verdict.get(s.key) in ("wrong", "follows"):
            bad.add(s.key)
    return out


def _fmt_mark(x) -> str:
    return "-" if x is None else f"{_mark(x):g}"


class Report:
    """What ``check`` found. ``to_dict()`` is the JSON contract::

        {"steps": [{"layer", "name", "verdict", "given", "expected", "max_abs_error", "marks", "out_of",
                    "diagnosis", "from_yours"}, …],
         "first_mistake": {"layer", "name", "diagnosis", "explanation"} or None,
         "marks": {"awarded", "available", "blank"},
         "counts": {"correct", "follows", "wrong", "missing"},
         "problem_id": str or None, "flags": ["problem_altered"] or [],
         # marked against a key (check --key) only:
         "key": path, "student": str or None, "altered": ["[input].H0", "[marks]", …]}

    ``given`` is the student's answer as written (a nested list, or ``{token: row}`` for a table of
    rows) or None; ``expected`` the correct value (full precision, nested lists) of an answered step —
    None for a step not answered unless ``to_dict(answers=True)`` (an instructor's key);
    ``max_abs_error`` the largest |given − expected| over the given entries (None when missing).
    ``marks`` / ``out_of``: the marks awarded and available for a marked quantity (None for one the mark
    scheme gives 0: see :meth:`~.format.Worksheet.questions`), with error carried forward — ``correct`` and
    ``follows`` earn the quantity's marks, ``wrong`` and a step left blank none. ``from_yours``: the value
    recomputed from the student's own earlier answers (nested lists) for a step that ``follows`` and for a
    ``wrong`` step after an earlier mistake (None otherwise), beside ``expected``, the true one.
    ``marks``: ``awarded`` and ``available`` (out of the whole sheet: every step the sheet holds counts), and
    ``blank``, how many marked steps are still blank.
    ``str(report)`` is the text report (see :meth:`format`).
    """

    def __init__(self, marking: Marking):
        self.marking = marking
        self.flags: list[str] = []          # "problem_altered" (marked against a key: :mod:`.keys`)
        self.altered: list[str] = []        # the parts of the problem / mark scheme that differ from the key's
        self.student: str | None = None     # the key's [key].student (worksheet class)
        self.problem_id: str | None = marking.worksheet.problem_id
        self.key_source: str | None = None
        self.worksheet = marking.worksheet
        m = marking
        self.steps = []
        ws = self.worksheet
        questions = set(ws.questions([s.key for s in m.steps]))
        self.after_slip = _after_slip(m)
        awarded = available = 0.0
        blank = 0
        for s in m.steps:
            a = m.given(s.key)
            v = m.verdict[s.key]
            out_of = ws.mark_of(s.key) if s.key in questions else None
            got = None if out_of is None else (out_of if v in ("correct", "follows") else 0.0)
            if out_of is not None:
                awarded, available = awarded + got, available + out_of
                blank += a is None
            mine = _from_yours(m, s.key) if v == "follows" or (v == "wrong" and s.key in self.after_slip) \
                else None
            code = "trivialised" if s.key in m.trivial else \
                m.diagnoses[s.key]["diagnosis"] if v == "wrong" and s.key in m.diagnoses else None
            self.steps.append({"layer": s.layer, "name": s.name, "verdict": v,
                               "given": None if a is None else a.raw, "expected": m.truth[s.key].tolist(),
                               "max_abs_error": m.error[s.key], "marks": _mark(got), "out_of": _mark(out_of),
                               "diagnosis": code, "from_yours": None if mine is None else mine.tolist()})
        self.marks = {"awarded": _mark(awarded), "available": _mark(available), "blank": blank}
        first = next((s for s in m.steps if m.verdict[s.key] == "wrong"), None)
        self.first_mistake = None
        self._at = None
        if first is not None:
            d = diagnose(m, first)
            self._at = d["at"]
            self.first_mistake = {"layer": first.layer, "name": first.name, "diagnosis": d["diagnosis"],
                                  "explanation": d["explanation"]}

    # ------------------------------------------------------------------ access
    def to_dict(self, answers: bool = False) -> dict:
        """The JSON-ready result (see the class docstring); ``answers=True`` keeps the expected value of every
        step, answered or not (an instructor's key)."""
        steps = [s if answers or s["verdict"] != "missing" else {**s, "expected": None} for s in self.steps]
        out = {"steps": steps, "first_mistake": self.first_mistake, "marks": dict(self.marks),
               "counts": self.counts(), "problem_id": self.problem_id, "flags": list(self.flags)}
        if self.key_source is not None:
            out.update(key=self.key_source, student=self.student, altered=list(self.altered))
        return out

    def to_json(self, answers: bool = False, **kwargs) -> str:
        """``to_dict(answers)`` as strict JSON: a non-finite number is an error here, never ``NaN`` in the text."""
        try:
            return json.dumps(self.to_dict(answers), allow_nan=False, **kwargs)
        except ValueError:
            from ..errors import WorksheetError
            raise WorksheetError(f"{self.worksheet.source}: a computed value is not finite; "
                                 f"the sheet's numbers are too large to check") from None

    @property
    def answered(self) -> int:
        """How many quantities the student answered."""
        return sum(s["verdict"] != "missing" for s in self.steps)

    @property
    def exit_status(self) -> int:
        """The command line's status for this sheet: 1 if any answer is ``wrong``, else 0."""
        return 1 if any(s["verdict"] == "wrong" for s in self.steps) else 0

    def verdict(self, name: str, layer: int = 1) -> str:
        """The verdict of quantity ``name`` of ``layer`` (1-based)."""
        for s in self.steps:
            if s["name"] == name and s["layer"] == layer:
                return s["verdict"]
        raise KeyError(f"no quantity {name!r} in layer {layer}")

    def verdicts(self) -> dict[tuple[int, str], str]:
        """{(layer, name): verdict} for every step."""
        return {(s["layer"], s["name"]): s["verdict"] for s in self.steps}

    def counts(self) -> dict[str, int]:
        out = {v: 0 for v in ("correct", "follows", "wrong", "missing")}
        for s in self.steps:
            out[s["verdict"]] += 1
        return out

    def __repr__(self) -> str:
        c = self.counts()
        fm = self.first_mistake
        first = f", first mistake {fm['name']} (layer {fm['layer']}): {fm['diagnosis']}" if fm else ""
        return (f"<worksheet report: {c['correct']} correct, {c['follows']} follows, {c['wrong']} wrong, "
                f"{c['missing']} missing, marks {_fmt_mark(self.marks['awarded'])} / "
                f"{_fmt_mark(self.marks['available'])}{first}>")

    def __str__(self) -> str:
        return self.format()

    # ------------------------------------------------------------------ text
    def format(self, full: bool = False, answers: bool = False, key: bool | None = None) -> str:
        """The text report: a table of verdicts (and marks) per layer, your rows next to the correct ones (rounded
        as the worksheet rounds) for every answer that is not correct (``full``: for every answer), the marks and
        the first mistake with its explanation. ``answers=True`` (an instructor's key; ``key`` is its older
        name) also prints the correct value of every step not answered. A sheet with no answers says so and
        lists the quantities that can be answered."""
        answers = answers or bool(key)
        ws, m = self.worksheet, self.marking
        dec = ws.decimals
        heads = f"{ws.n_heads} head{'s' if ws.n_heads > 1 else ''} (d_k {ws.d_k})"
        c = self.counts()
        L = [f"Worksheet {os.path.basename(ws.source)}: tokens {', '.join(ws.tokens)}; d_model {ws.d_model}, {heads}, "
             f"d_ff {ws.d_ff}, {ws.norm.capitalize()}-LN, {ws.activation}, {ws.layers} layer"
             f"{'s' if ws.layers > 1 else ''}, eps {ws.eps:g}",
             *textwrap.wrap(f"Answers to {dec} decimals: tolerance = {m.u:g} (half a unit in the last place) plus "
                            f"the band honest rounding of every earlier number can reach; error and tolerance are "
                            f"shown at the entry that decided the verdict, against the true value (or your own "
                            f"earlier numbers, for 'follows').", 110, subsequent_indent="  ")]
        if self.key_source is not None:
            L.append(f"Marked against the key {self.key_source}" + (f" (student {self.student})" if self.student
                                                                     else "") + ".")
        if self.flags:
            L += textwrap.wrap("PROBLEM ALTERED (problem_altered): this sheet's copy of the problem or of the mark "
                               "scheme differs from the key's in " + ", ".join(self.altered) + "; it was marked "
                               "against the key's.", 110, subsequent_indent="  ")
        if self.answered == 0 and not answers:
            return "\n".join(L + [""] + self._no_answers() + ["", self._marks_line(c)])
        L.append(f"{c['correct']} correct, {c['follows']} follows, {c['wrong']} wrong, {c['missing']} not answered.")
        by_key = {(st["layer"], st["name"]): st for st in self.steps}
        sections: dict[tuple[int, str], list] = {}
        for s in m.steps:
            sections.setdefault((s.layer, "backward" if s.backward else "forward"), []).append(s)
        for (layer, part), steps in sections.items():
            L += ["", f"LAYER {layer} — {part}"]
            answered = [s for s in steps if m.verdict[s.key] != "missing"]
            if answered:
                w = max([len(s.name) for s in answered] + [len("quantity")]) + 2
                L.append(f"  {'quantity'.ljust(w)}{'verdict':9s}{'error':>10s}{'tolerance':>11s}{'marks':>9s}")
                for s in answered:
                    v = m.verdict[s.key]
                    marks = self._marks_cell(by_key[s.key])
                    err, tol = _shown_error(m, s.key)
                    L.append(f"  {s.name.ljust(w)}{(v.upper() if v == 'wrong' else v):9s}"
                             f"{err:10.{dec + 1}f}{tol:11.{dec + 1}f}{marks:>9s}")
            L += self._blank_line([s for s in steps if m.verdict[s.key] == "missing"], by_key)
            for s in steps:
                v = m.verdict[s.key]
                if v != "missing" and (full or v != "correct"):
                    L += [""] + self._detail(s)
                elif answers and v == "missing":
                    L += [""] + self._detail(s)
        L.append("")
        L += textwrap.wrap(self._marks_line(c), 110, subsequent_indent="  ")
        if self.answered == 0:
            L.append("No answers given: the correct values above are the answer key.")
        elif self.first_mistake is None:
            L.append("No mistake: every answer is correct or follows from your own earlier answers.")
        else:
            fm = self.first_mistake
            L.append(f"FIRST MISTAKE: layer {fm['layer']}, {fm['name']} — {fm['diagnosis']}")
            L += textwrap.wrap(fm["explanation"], 110, initial_indent="  ", subsequent_indent="  ")
        return "\n".join(L)

    def _marks_line(self, c: dict) -> str:
        """MARKS: awarded / available (out of the whole sheet), how many marked steps are still blank, and the
        rule of error carried forward when it was used."""
        blank = self.marks["blank"]
        return (f"MARKS: {_fmt_mark(self.marks['awarded'])} / {_fmt_mark(self.marks['available'])}"
                + ("" if self.worksheet.has_marks else " (no [marks] table: 1 mark per step)")
                + (f"; {blank} step{'s' if blank != 1 else ''} still blank" if blank else "")
                + ("; error carried forward: a step that follows from your own earlier answers earns its marks"
                   if c["follows"] else ""))

    @staticmethod
    def _blank_line(blank: list, by_key: dict) -> list[str]:
        """The steps of a section still blank, in one wrapped line: the marks they would earn (each step's own
        when it is not 1; "not marked" for a step the scheme gives 0)."""
        if not blank:
            return []
        worth = [by_key[s.key]["out_of"] for s in blank]
        total = sum(o for o in worth if o is not None)

        def name(s, o):
            return s.name + ("" if o == 1 else " (not marked)" if o is None else f" ({_fmt_mark(o)})")
        head = f"still blank, 0 of {_fmt_mark(total)} mark{'s' if total != 1 else ''}: " if total else "not answered: "
        return textwrap.wrap(head + ", ".join(name(s, o) for s, o in zip(blank, worth)), 110, initial_indent="  ",
                             subsequent_indent="    ")

    @staticmethod
    def _marks_cell(step: dict) -> str:
        if step["out_of"] is None:
            return ""
        return f"{_fmt_mark(step['marks'])}/{_fmt_mark(step['out_of'])}"

    def _no_answers(self) -> list[str]:
        """What a sheet without answers says: that, and every quantity that can be answered, per layer."""
        ws, m = self.worksheet, self.marking
        tables = "[answers.layer1]" if ws.layers == 1 else f"[answers.layer1] … [answers.layer{ws.layers}]"
        L = textwrap.wrap(f"No answers given: nothing to mark. Fill in {tables} with any of these quantities, "
                          f"rounded to {ws.decimals} decimals (a full matrix, or rows keyed by token), and run check "
                          f"again:", 110)
        sections: dict[tuple[int, str], list] = {}
        for s in m.steps:
            sections.setdefault((s.layer, "backward" if s.backward else "forward"), []).append(s.name)
        for (layer, part), names in sections.items():
            L += textwrap.wrap(f"[answers.layer{layer}] {part}: " + ", ".join(names), 110, initial_indent="  ",
                               subsequent_indent="    ")
        return L

    def _detail(self, s) -> list[str]:
        ws, m = self.worksheet, self.marking
        dec = ws.decimals
        v = m.verdict[s.key]
        note = {"correct": "correct", "follows": "follows from your answers", "wrong": "WRONG",
                "missing": "answer key"}[v]
        if v == "wrong" and s.key in self.after_slip and s.key not in m.trivial:
            note = "WRONG, also from your own earlier answers"
        out = [f"  {s.name} = {s.formula}   ({note})"]
        if s.key in m.trivial:
            out += textwrap.wrap(f"no follow-through (trivialised): {m.trivial[s.key]}, and with the correct numbers "
                                 f"it is not", 110, initial_indent="    ", subsequent_indent="    ")
        truth = m.truth[s.key]
        a = m.given(s.key)
        per_token = is_per_token(s.name)
        T = np.atleast_2d(truth.reshape(truth.shape[0], -1) if per_token else truth)
        G = None if a is None else np.atleast_2d(a.value.reshape(T.shape))
        mine = _from_yours(m, s.key) if v == "follows" or (v == "wrong" and s.key in self.after_slip) else None
        O = None if mine is None else np.atleast_2d(mine.reshape(T.shape))
        if per_token:
            labels = list(ws.tokens)
        else:
            labels = [str(i + 1) for i in range(T.shape[0])] if truth.ndim > 1 else [""]
        base = s.name.removeprefix("d_").split("_head")[0]
        if per_token and truth.ndim == 1:
            cols = [s.name]
        elif base in ("scores", "attention_weights"):
            cols = list(ws.tokens)
        else:
            cols = [str(j + 1) for j in range(T.shape[1])]
        rows = []
        for i, lab in enumerate(labels):
            if G is not None and not np.any(a.mask.reshape(T.shape)[i]):
                if v != "missing":
                    continue
            if G is not None:
                rows.append((lab, "yours", G[i]))
            rows.append((lab if G is None else "", "correct", T[i]))
            if O is not None:
                rows.append(("", "from yours", O[i]))
        return out + format_table(rows, cols, dec)
