"""What the page of ``worksheet serve`` shows: the problem, one table per step, the answers saved, the marking.

:func:`page_state` reads the sheet as ``check`` reads it and describes it for the page's script (JSON): the
set-up, the problem's tables (H^(0), dH, every parameter: what the student Markdown sheet shows), then one grid
per step in the sheet's order (layer by layer, forward then backward) with its row and column labels, its
formula and the cells already saved (restored as typed, to the sheet's decimals when that is exact).
:func:`page_report` is the part of ``check``'s JSON (``Report.to_dict()``, what ``check --json`` prints) the
page shows: the verdict and marks of every step, the marks, the counts and the first mistake with its diagnosis.

The formulas are written as plain Unicode and HTML (sub- and superscripts, √, ⊙): the docs typeset their maths
with the MathJax that sphinx-mathjax-offline copies into the site (over 1 MB of script and fonts), which the
package does not ship; the few formulas of a step read as well in HTML, and the page needs no script but its own.
"""

from __future__ import annotations

import html
import os
import re

import numpy as np

from .format import quantity_shape
from .generate import _dec_exact  # the sheet's printed decimals: one definition, the generator's
from .names import PARAM_NAMES, is_per_token
from .serve_save import grid_shape, problem_fingerprint, read_sheet_text

__all__ = ["page_state", "page_report", "formula_html", "labels"]


def labels(ws, name: str) -> tuple[list[str], list[str]]:
    """Row and column labels of a step's grid, as the student sheet prints them: tokens for per-token rows, the
    key tokens for the columns of scores and attention weights, dimensions 1 … d otherwise."""
    rows, cols = grid_shape(name, ws.n, ws.d_model, ws.d_ff)
    base = name.removeprefix("d_").split("_head")[0]
    per_token = is_per_token(name)
    row_labels = list(ws.tokens) if per_token else ([str(i + 1) for i in range(rows)] if rows > 1 else [""])
    if per_token and len(quantity_shape(name, ws.n, ws.d_model, ws.d_ff)) == 1:    # one number per token
        col_labels = [name]
    elif base in ("scores", "attention_weights"):
        col_labels = list(ws.tokens)
    else:
        col_labels = [str(j + 1) for j in range(cols)]
    return row_labels, col_labels


_SUB = {"gamma1": "γ<sub>1</sub>", "gamma2": "γ<sub>2</sub>", "beta1": "β<sub>1</sub>", "beta2": "β<sub>2</sub>"}


def formula_html(text: str) -> str:
    """A step's formula (plain text, as ``check`` prints it) as HTML: ``W_Q`` → W<sub>Q</sub>, ``X^T`` →
    X<sup>T</sup>, ``H^(0)`` → H<sup>(0)</sup>, ``sqrt(d_k)`` → √d<sub>k</sub>, ``*`` → ⊙, γ, β, ε, −. Every
    character of ``text`` is escaped first; only these fixed tags are added."""
    s = html.escape(text, quote=True)
    s = re.sub(r"sqrt\(d_k\)", "√d_k", s)
    s = s.replace("sqrt(", "√(")
    s = re.sub(r"\^\((\d)\)", r"<sup>(\1)</sup>", s)
    s = re.sub(r"\^T\b", "<sup>T</sup>", s)
    s = re.sub(r"(?<![\w])([Wb])_(Q|K|V|O|1|2)(?![\w])", r"\1<sub>\2</sub>", s)
    s = re.sub(r"(?<![\w])d_k(?![\w])", "d<sub>k</sub>", s)
    s = re.sub(r"(?<![\w])(gamma[12]|beta[12])(?![\w])", lambda m: _SUB[m.group(1)], s)
    s = re.sub(r"(?<![\w])eps(?![\w])", "ε", s)
    s = s.replace(" * ", " ⊙ ").replace(" - ", " − ").replace(")^2", ")²")
    return s


def _num(x: float, dec: int) -> str:
    s = f"{x:.{dec}f}"
    return s.replace("-", "−") if float(s) != 0 else s.replace("-", "")


def _matrix(title_html: str, values, rows, cols, note: str = "") -> dict:
    a = np.atleast_2d(np.asarray(values, dtype=float))
    dec = _dec_exact(a)
    return {"title_html": title_html, "rows": rows, "cols": cols, "note": note,
            "values": [[_num(x, dec) for x in r] for r in a]}


def _problem_tables(ws) -> list[dict]:
    d, f = ws.d_model, ws.d_ff
    dims = [str(j + 1) for j in range(d)]
    out = [{"group": "Input", "tables": [_matrix("H<sup>(0)</sup>", ws.H0, list(ws.tokens), dims,
                                                 "one row per token")]}]
    if ws.backward:
        out[0]["tables"].append(_matrix("dH = ∂L/∂H<sup>(N)</sup>", ws.dH, list(ws.tokens), dims,
                                        "the upstream gradient"))
    for layer, p in enumerate(ws.params, 1):
        tables = []
        for k in PARAM_NAMES:
            a = np.asarray(p[k], dtype=float)
            title = formula_html(k)
            if a.ndim == 2 and a.shape[0] == a.shape[1] and np.array_equal(a, np.eye(a.shape[0])):
                tables.append({"title_html": title, "identity": a.shape[0]})
            elif a.ndim == 1:
                tables.append(_matrix(title, a[None, :], [""], [str(j + 1) for j in range(a.shape[0])]))
            else:
                tables.append(_matrix(title, a, [str(i + 1) for i in range(a.shape[0])],
                                      [str(j + 1) for j in range(a.shape[1])]))
        out.append({"group": f"Layer {layer} parameters", "tables": tables,
                    "note_html": formula_html(f"W_1 is {d} × {f}, W_2 is {f} × {d}; y = x W + b (row vectors)")})
    return out


def _restored(ws, layer: int, name: str) -> list[list[str]] | None:
    """The cells of a saved answer, as the student would have typed them: to the sheet's decimals when that
    prints the number exactly, else the shortest form that does."""
    a = ws.answers.get((layer, name))
    if a is None:
        return None
    rows, cols = grid_shape(name, ws.n, ws.d_model, ws.d_ff)
    v, m = a.value.reshape(rows, cols), a.mask.reshape(rows, cols)
    out = []
    for vr, mr in zip(v, m):
        row = []
        for x, given in zip(vr, mr):
            if not given:
                row.append("")
                continue
            s = f"{x:.{ws.decimals}f}"
            row.append(s if float(s) == x else repr(float(x)))
        out.append(row)
    return out


def _summary(ws) -> dict:
    heads = f"{ws.n_heads} head{'s' if ws.n_heads > 1 else ''} (d<sub>k</sub> = {ws.d_k})"
    wiring = ("Z = LN<sub>1</sub>(H + MHA(H)), H′ = LN<sub>2</sub>(Z + FFN(Z))" if ws.norm == "post" else
              "Z = H + MHA(LN<sub>1</sub>(H)), H′ = Z + FFN(LN<sub>2</sub>(Z)) (no final LayerNorm)")
    return {"tokens": list(ws.tokens), "decimals": ws.decimals, "layers": ws.layers, "backward": ws.backward,
            "setup_html": (f"d<sub>model</sub> = {ws.d_model}, {heads}, d<sub>ff</sub> = {ws.d_ff}, "
                           f"{'Post' if ws.norm == 'post' else 'Pre'}-LN, activation {html.escape(ws.activation)}, "
                           f"LayerNorm ε = {ws.eps:g} (treat it as 0), {ws.layers} layer"
                           f"{'s' if ws.layers > 1 else ''}."),
            "wiring_html": f"Each layer: {wiring}."}


def page_report(report) -> dict:
    """The page's view of a :class:`~.report.Report`: ``Report.to_dict()`` (the JSON ``check --json`` prints)
    without the numbers themselves (``given`` is on the page already; ``expected`` is not shown)."""
    d = report.to_dict()
    return {"steps": [{k: s[k] for k in ("layer", "name", "verdict", "marks", "out_of", "max_abs_error")}
                      for s in d["steps"]],
            "first_mistake": d["first_mistake"], "marks": d["marks"], "counts": d["counts"]}


def page_state(path: str) -> dict:
    """Everything the page needs to draw itself for the sheet at ``path``, and the sheet's marking now."""
    from . import check
    from .format import load_worksheet
    from .steps import build_steps

    _, _, raw = read_sheet_text(path)
    ws = load_worksheet(path)
    report = check(path)
    steps = []
    for s in build_steps(ws):
        rows, cols = labels(ws, s.name)
        steps.append({"id": f"layer{s.layer}.{s.name}", "layer": s.layer, "name": s.name,
                      "part": "backward" if s.name.startswith("d_") else "forward",
                      "formula_html": formula_html(s.formula), "rows": rows, "cols": cols,
                      "per_token": is_per_token(s.name), "cells": _restored(ws, s.layer, s.name)})
    return {"file": os.path.basename(path), "fingerprint": problem_fingerprint(raw), **_summary(ws),
            "problem": _problem_tables(ws), "steps": steps, "report": page_report(report)}
