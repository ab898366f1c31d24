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
from .notation import written_out
from .serve_save import grid_shape, problem_fingerprint, read_sheet_text

__all__ = ["page_state", "page_report", "formula_html", "unicode_text", "labels", "symbols", "SYMBOLS",
           "ACTIVATION_SYMBOLS"]


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


_SUPER = str.maketrans("0123456789()", "⁰¹²³⁴⁵⁶⁷⁸⁹⁽⁾")

def formula_html(text: str) -> str:
    """A step's formula (plain text, as ``check`` prints it) as HTML in the notation of the headings: ``W_Q`` →
    W<sub>Q</sub>, ``X^T`` → Xᵀ, ``H^(0)`` → H⁽⁰⁾, ``sqrt(d_k)`` → √dₖ, ``*`` → ⊙, ``relu'`` → relu′, γ, β, ε,
    −; the LayerNorm backward written out with x̂ and σ (see :data:`SYMBOLS`). Every character of ``text`` is
    escaped first; only these fixed tags are added."""
    text = written_out(text)
    s = re.sub(r"(\w)&#x27;\(", r"\1′(", html.escape(text, quote=True))     # relu'(z) → relu′(z); head 1's stays
    s = re.sub(r"sqrt\(d_k\)", "√dₖ", s)
    s = s.replace("sqrt(", "√(")
    s = re.sub(r"\^\((\d)\)", lambda m: f"({m.group(1)})".translate(_SUPER), s)
    s = re.sub(r"\^T\b", "ᵀ", s)
    s = re.sub(r"(?<![\w])([Wb])_(Q|K|V|O|1|2)(?![\w])", r"\1<sub>\2</sub>", s)
    s = re.sub(r"(?<![\w])d_k(?![\w])", "dₖ", s)
    s = re.sub(r"(?<![\w])(gamma[12]|beta[12])(?![\w])", lambda m: _SUB[m.group(1)], s)
    s = re.sub(r"(?<![\w])eps(?![\w])", "ε", s)
    s = s.replace(" * ", " ⊙ ").replace(" - ", " − ").replace(")^2", ")²").replace("rowsum(", "rowsum(")
    return s


_TEXT_RULES = [(r"sqrt\(d_k\)", "√dₖ"), (r"sqrt\(d_model\)", "√d_model"), (r"sqrt\(", "√("),
               (r"\^T\b", "ᵀ"), (r"\bd_k\b", "dₖ"), (r"\bxhat\b", "x̂"), (r"\b(relu|GELU|gelu)'", r"\1′"),
               (r"\bPhi\(", "Φ("), (r"\bphi\(", "φ("), (r"\beps\b", "ε"), (r"\bgamma\b", "γ"),
               (r"\)\^2", ")²"), (r" \* ", " ⊙ ")]


def unicode_text(text: str) -> str:
    """Plain text (an explanation, a diagnosis's meaning) in the page's Unicode notation: ``Q K^T`` → Q Kᵀ,
    ``1/sqrt(d_k)`` → 1/√dₖ, ``xhat`` → x̂, ``GELU'(z) = Phi(z) + z phi(z)`` → GELU′(z) = Φ(z) + z φ(z), ``*`` →
    ⊙. Text only: the page shows it with ``textContent``."""
    for pattern, repl in _TEXT_RULES:
        text = re.sub(pattern, repl, text)
    return text


# What every symbol of the page's formulas means (shown under the problem, as a definition list).
SYMBOLS = [
    ("X Y", "the matrix product (rows are tokens: y = x W + b with row vectors)"),
    ("Xᵀ", "X transposed"),
    ("⊙", "entry-by-entry product"),
    ("dₖ", "the width of one head, d<sub>model</sub> / heads; √dₖ its square root"),
    ("softmax", "of each row: e<sup>s<sub>j</sub></sup> / Σ<sub>k</sub> e<sup>s<sub>k</sub></sup>, so each row sums "
                "to 1"),
    ("μ, mean", "the mean of each row (over its d<sub>model</sub> entries)"),
    ("var", "the mean of (x − μ)² over each row (divide by d<sub>model</sub>, not d<sub>model</sub> − 1)"),
    ("σ", "√(var + ε), one per row; ε is tiny: treat it as 0"),
    ("x̂", "the normalised row, (x − μ) / σ"),
    ("γ, β", "the LayerNorm's scale and shift (γ<sub>1</sub>, β<sub>1</sub> after attention; γ<sub>2</sub>, "
             "β<sub>2</sub> after the feed-forward layer)"),
    ("rowsum", "the sum of each row, as a column"),
    ("column sums", "the sum over the tokens (the rows), one number per column"),
    ("d_X", "∂L/∂X, the gradient of the loss with respect to X"),
]

# the sheet's activation and its derivative (only the sheet's own are listed)
ACTIVATION_SYMBOLS = {
    "relu": [("relu", "relu(z) = max(0, z)"),
             ("relu′", "the derivative of relu: 1 where its input is positive, 0 elsewhere")],
    "gelu": [("gelu", "gelu(z) = z Φ(z) (Φ, φ: the standard normal's CDF and density)"),
             ("gelu′", "the derivative of gelu: Φ(z) + z φ(z)")],
    "gelu_tanh": [("gelu_tanh", "the tanh approximation of gelu: ½ z (1 + tanh(√(2/π) (z + 0.044715 z³)))"),
                  ("gelu_tanh′", "its derivative, with t = tanh(√(2/π) (z + 0.044715 z³)): ½ (1 + t) + ½ z (1 − t²) "
                                 "√(2/π) (1 + 3 · 0.044715 z²)")],
}


def symbols(activation: str) -> list[tuple[str, str]]:
    """The Symbols list of a sheet: :data:`SYMBOLS` and its activation's entries."""
    return SYMBOLS + ACTIVATION_SYMBOLS.get(activation, [])


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


def _wrong_cells(report, layer: int, name: str) -> list[list[bool]] | None:
    """Which cells of a ``wrong`` step are off both from the truth and from the student's own earlier answers
    (the page highlights them); None for any other step."""
    from .marking import FLOAT_SLACK

    m, ws = report.marking, report.worksheet
    key = (layer, name)
    a = m.given(key)
    if a is None or m.verdict[key] != "wrong":
        return None
    g = a.value
    off_true = np.abs(g - m.truth[key]) > m.tol[key] + FLOAT_SLACK
    own, own_tol = m.own.get(key), m.own_tol.get(key) if isinstance(m.own_tol, dict) else None
    off = off_true if own is None or own_tol is None else off_true & (np.abs(g - own) > own_tol + FLOAT_SLACK)
    off = off & a.mask
    if not off.any():                    # wrong as a whole (e.g. a row that does not sum to 1): every given cell
        off = a.mask
    rows, cols = grid_shape(name, ws.n, ws.d_model, ws.d_ff)
    return np.asarray(off).reshape(rows, cols).tolist()


def _follows_from(report, layer: int, name: str, verdicts: dict) -> str | None:
    """The student's own earlier answers that make a ``follows`` step differ from the truth: the inputs it was
    recomputed from that are themselves ``wrong`` or ``follows`` (all the student's inputs when none is, e.g.
    after a slip in work not written down), e.g. "attention_weights"; None for a step without such inputs."""
    step = next((s for s in report.marking.steps if s.key == (layer, name)), None)
    if step is None:
        return None
    mine = [k for k in step.inputs if k[0] > 0]
    off = [k for k in mine if verdicts.get(k) in ("wrong", "follows")]
    names = [n for _, n in (off or mine)]
    return ", ".join(names) if names else None


def page_report(report) -> dict:
    """The page's view of a :class:`~.report.Report`: ``Report.to_dict()`` (the JSON ``check --json`` prints)
    without the numbers themselves (``given`` is on the page already; ``expected`` is not shown), with the
    cells of each wrong step that are off (``wrong_cells``) and what a ``follows`` step follows from
    (``follows_from``). A sheet with ``[setup] reveal = false`` gets no error size and a first mistake told
    without numbers (:mod:`.withheld`)."""
    from .withheld import reveals, withheld_dict

    reveal = reveals(report)
    d = report.to_dict() if reveal else withheld_dict(report)
    steps = []
    verdicts = {(s["layer"], s["name"]): s["verdict"] for s in d["steps"]}
    for s in d["steps"]:
        step = {k: s[k] for k in ("layer", "name", "verdict", "marks", "out_of")}
        step["max_abs_error"] = s["max_abs_error"] if reveal else None
        step["wrong_cells"] = _wrong_cells(report, s["layer"], s["name"])
        step["follows_from"] = (_follows_from(report, s["layer"], s["name"], verdicts) if s["verdict"] == "follows"
                                else None)
        steps.append(step)
    fm = d["first_mistake"]
    if fm is not None:                   # the explanation in the formulas' notation (check prints it as written)
        fm = {**fm, "explanation": unicode_text(fm["explanation"])}
    return {"steps": steps, "first_mistake": fm, "marks": d["marks"], "counts": d["counts"], "reveal": reveal}


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
            "symbols": [{"symbol_html": a, "meaning_html": b} for a, b in symbols(ws.activation)],
            "problem": _problem_tables(ws), "steps": steps, "report": page_report(report)}
