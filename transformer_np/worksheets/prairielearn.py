r"""A worksheet as a PrairieLearn question: ``transformer-np worksheet prairielearn --out DIR [options]``.

On a platform the student sees the problem and submits numbers; the key stays on the server. The command writes
a PrairieLearn course folder ``DIR``:

* ``questions/<name>/info.json`` (``type: v3``, graded internally), ``question.html`` (mustache: the problem,
  then a ``pl-matrix-input`` per step, named ``l<layer>_<step>``) and ``server.py``, which holds the options,
  the mark scheme, the reveal setting and a random salt made at build time, and calls this module;
* ``serverFilesCourse/transformer_np/``: this library (it needs NumPy only), imported by ``server.py``.

``generate(data)`` (:func:`generate_variant`) draws the student's problem from PrairieLearn's
``data["variant_seed"]`` and the salt (an HMAC, as ``worksheet class`` derives seeds from its secret: the
variant's seed alone does not remake the problem) and puts it in ``data["params"]``; with ``reveal`` the rounded
correct values go to ``data["correct_answers"]`` (shown in PrairieLearn's answer panel), otherwise nothing of the
key leaves the server. ``parse(data)`` (:func:`parse_submission`) refuses an answer of the wrong shape as a
format error. ``grade(data)`` (:func:`grade_submission`) rebuilds the submission as the TOML sheet it stands for
and marks it with :func:`~transformer_np.worksheets.keys.check_with_key` against the variant's key — the same
function as ``transformer-np check --key`` — so each step is ``correct``, ``follows`` (error carried forward),
``wrong`` or ``missing``, with the same marks; ``data["partial_scores"][field]`` gets the step's fraction, its
marks as ``weight`` and the verdict (and, at the first mistake, the diagnosis) as ``feedback``;
``data["score"]`` is marks awarded / available; ``data["feedback"]`` holds ``verdicts``, ``marks`` and
``first_mistake``. Without ``reveal`` the feedback is :mod:`.withheld`'s: no correct value, no error size.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np

from ..errors import InputValueError, WorksheetError

__all__ = ["OPTION_NAMES", "copy_library", "field_name", "generate_variant", "grade_submission",
           "parse_submission", "problem_for", "write_question"]

OPTION_NAMES = ("tokens", "d_model", "heads", "norm", "backward", "layers", "d_ff", "activation", "decimals")
_SALT_PREFIX = b"transformer_np prairielearn worksheet"
_UUID_NS = uuid.UUID("5b1f3c1e-47a0-4c6e-9a51-776f726b7368")


def field_name(layer: int, name: str) -> str:
    """The answers-name of a step: ``l<layer>_<name>`` (letters, digits and underscores, as PrairieLearn needs)."""
    return f"l{layer}_{name}"


def copy_library(dest: str | os.PathLike) -> Path:
    """This package's Python source into ``dest/transformer_np`` (no caches, no data files, no examples)."""
    src = Path(__file__).resolve().parents[1]
    target = Path(dest) / "transformer_np"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "data", "static",
                                                               "examples"))
    return target


def problem_for(variant_seed: int, options: dict, salt: str, assignment: int = 0) -> dict:
    """The problem of one variant: :func:`~.generate.new_worksheet` with a seed of 63 bits of HMAC-SHA256 of the
    variant seed under ``salt`` (and ``assignment``); the seed is not kept on the problem."""
    from .generate import new_worksheet

    msg = f"{assignment}\0{int(variant_seed)}".encode("ascii")
    digest = hmac.new(_SALT_PREFIX + bytes.fromhex(salt), msg, hashlib.sha256).digest()
    raw = new_worksheet(seed=int.from_bytes(digest[:8], "big") & (2 ** 63 - 1), **_library_options(options))
    del raw["setup"]["seed"]
    return raw


def _library_options(options: dict) -> dict:
    return {k: options[k] for k in OPTION_NAMES if k in options}


# ----------------------------------------------------------------------------- showing the problem
def _num(x: float, dec: int) -> str:
    return f"{float(x):.{dec}f}".rstrip("0").rstrip(".") if float(x) != int(x) else str(int(x))


def _table(title: str, values, rows: list[str] | None, dec: int) -> str:
    a = np.atleast_2d(np.asarray(values, dtype=float))
    head = f"<p><strong>{html.escape(title)}</strong></p>\n<table class=\"table table-sm w-auto\">\n"
    body = []
    for i, row in enumerate(a):
        label = f"<th>{html.escape(rows[i])}</th>" if rows and i < len(rows) else ""
        body.append("<tr>" + label + "".join(f"<td>{_num(x, dec + 4)}</td>" for x in row) + "</tr>")
    return head + "\n".join(body) + "\n</table>"


def problem_html(raw: dict) -> str:
    """The problem as HTML tables: the set-up, H0 (and dH), each layer's weights."""
    from .names import PARAM_NAMES

    s = raw["setup"]
    tokens = [str(t) for t in s["tokens"]]
    out = [f"<p>Tokens: {html.escape(', '.join(tokens))}; d_model {s['d_model']}, {s['n_heads']} head(s), "
           f"d_ff {s['d_ff']}, {html.escape(str(s['norm']))}-LN, {html.escape(str(s['activation']))}, "
           f"{s['layers']} layer(s), ε = {s['eps']:g}.</p>",
           _table("H0 (one row per token)", raw["input"]["H0"], tokens, s["decimals"])]
    if "dH" in raw["input"]:
        out.append(_table("dH = ∂L/∂H of the last layer", raw["input"]["dH"], tokens, s["decimals"]))
    for layer in range(1, s["layers"] + 1):
        for name in PARAM_NAMES:
            value = raw.get(f"layer{layer}", {}).get(name)
            if value is not None:
                out.append(_table(f"layer {layer}: {name}", value, None, s["decimals"]))
    return "\n".join(out)


def _steps(raw: dict, scheme: dict) -> list[dict]:
    from .format import load_worksheet, quantity_shape
    from .steps import build_steps

    ws = load_worksheet({k: v for k, v in raw.items() if k != "answers"})
    out = []
    for st in build_steps(ws):
        shape = quantity_shape(st.name, ws.n, ws.d_model, ws.d_ff)
        out.append({"field": field_name(st.layer, st.name), "layer": st.layer, "name": st.name,
                    "shape": " × ".join(str(n) for n in shape), "formula": st.formula,
                    "marks": scheme.get(f"layer{st.layer}", {}).get(st.name, scheme.get("default", 1))})
    return out


def _to_json(a) -> dict:
    """An array as PrairieLearn's ``pl.to_json`` writes one: ``{"_type": "ndarray", "_value", "_dtype"}``."""
    a = np.asarray(a, dtype=float)
    return {"_type": "ndarray", "_value": a.tolist(), "_dtype": str(a.dtype)}


def generate_variant(data: dict, options: dict, marks: dict | None, reveal: bool, salt: str,
                     assignment: int = 0) -> None:
    """PrairieLearn's ``generate(data)``: the variant's problem, steps and mark scheme into ``data["params"]``;
    the rounded correct values into ``data["correct_answers"]`` only when ``reveal``."""
    from .generate import answer_key, mark_scheme

    raw = problem_for(data["variant_seed"], options, salt, assignment)
    scheme = mark_scheme(raw, marks)
    steps = _steps(raw, scheme)
    data["params"]["problem"] = raw
    data["params"]["marks"] = scheme
    data["params"]["reveal"] = bool(reveal)
    data["params"]["decimals"] = raw["setup"]["decimals"]
    data["params"]["problem_html"] = problem_html(raw)
    data["params"]["steps"] = steps
    if reveal:
        key = answer_key(raw)
        for st in steps:
            data["correct_answers"][st["field"]] = _to_json(key[f"layer{st['layer']}"][st["name"]])


# ----------------------------------------------------------------------------- marking a submission
def _submitted(value):
    """A submitted answer as nested lists of numbers (None when blank): PrairieLearn's ``to_json`` form of an
    array, a list, or a number."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, dict) and value.get("_type") == "ndarray":
        value = value.get("_value")
    if isinstance(value, str):
        raise ValueError("not a matrix of numbers")
    return np.asarray(value, dtype=float)


def _fitted(a: np.ndarray, shape: list[int]) -> np.ndarray:
    """``a`` in the step's shape: a vector step takes a 1×n or n×1 matrix too."""
    shape = tuple(shape)
    if a.shape == shape:
        return a
    if len(shape) == 1 and a.size == shape[0] and a.ndim == 2 and 1 in a.shape:
        return a.reshape(shape)
    want = " × ".join(str(n) for n in shape)
    got = " × ".join(str(n) for n in a.shape) or "a single number"
    raise ValueError(f"expected {want} numbers, got {got}")


def _shape(step: dict) -> list[int]:
    return [int(n) for n in step["shape"].split(" × ")]


def parse_submission(data: dict) -> None:
    """PrairieLearn's ``parse(data)``: an answer that is not finite numbers within ±``MAX_ABS`` (as ``check``
    requires) of the step's shape becomes ``data["format_errors"][field]`` naming what was expected and received;
    a blank stays blank (``missing``)."""
    from .format import MAX_ABS

    for st in data["params"]["steps"]:
        f = st["field"]
        try:
            a = _submitted(data["submitted_answers"].get(f))
            if a is not None:
                a = _fitted(a, _shape(st))
                if not np.all(np.isfinite(a)):
                    raise ValueError("every entry must be a finite number")
                if np.any(np.abs(a) > MAX_ABS):
                    raise ValueError(f"an entry is beyond ±{MAX_ABS:g} (a worksheet is for hand calculation)")
        except (ValueError, TypeError) as e:
            data["format_errors"][f] = f"{st['name']}: {e}"


def submission_sheet(data: dict) -> dict:
    """The worksheet the submission stands for, as ``check`` reads one from TOML: the variant's problem and mark
    scheme with the submitted answers (blank ones left out)."""
    sheet = {k: v for k, v in data["params"]["problem"].items()}
    sheet["setup"] = {**sheet["setup"], "reveal": bool(data["params"]["reveal"])}
    sheet["marks"] = data["params"]["marks"]
    answers: dict = {}
    for st in data["params"]["steps"]:
        a = _submitted(data["submitted_answers"].get(st["field"]))
        if a is not None:
            answers.setdefault(f"layer{st['layer']}", {})[st["name"]] = _fitted(a, _shape(st)).tolist()
    sheet["answers"] = answers
    return sheet


def variant_key(data: dict) -> dict:
    """The variant's key as ``worksheet new`` writes it (problem, full mark scheme, reveal, a ``[key]`` table)."""
    key = {k: v for k, v in data["params"]["problem"].items()}
    key["setup"] = {**key["setup"], "reveal": bool(data["params"]["reveal"])}
    key["marks"] = data["params"]["marks"]
    key["key"] = {}
    return key


def _feedback(step: dict, first: dict | None) -> str:
    words = {"correct": "correct", "follows": "follows: right from your own earlier numbers (error carried "
             "forward)", "wrong": "wrong", "missing": "missing: not answered"}
    text = words[step["verdict"]]
    if step.get("diagnosis") and step["verdict"] == "wrong":
        text += f" ({step['diagnosis']})"
    if first is not None and (first["layer"], first["name"]) == (step["layer"], step["name"]):
        text += ". " + first["explanation"]
    return text


def grade_submission(data: dict) -> None:
    """PrairieLearn's ``grade(data)``: mark the submitted numbers as ``check --key`` marks the equivalent TOML
    (:func:`~.keys.check_with_key`), into ``partial_scores``, ``score`` and ``feedback``."""
    from .keys import Key, check_with_key
    from .withheld import withheld_dict

    reveal = bool(data["params"]["reveal"])
    try:
        report = check_with_key(submission_sheet(data), Key(variant_key(data), "<key>"), "<submission>")
    except (WorksheetError, ValueError) as e:
        data["score"] = 0.0
        data["feedback"]["message"] = f"not marked: {e}"
        return
    d = report.to_dict() if reveal else withheld_dict(report)
    first = d["first_mistake"]
    verdicts, by = {}, {(s["layer"], s["name"]): s for s in d["steps"]}
    for st in data["params"]["steps"]:
        s = by[(st["layer"], st["name"])]
        verdicts[st["field"]] = s["verdict"]
        out_of = s["out_of"] or 0
        data["partial_scores"][st["field"]] = {
            "score": (s["marks"] / out_of) if out_of else float(s["verdict"] in ("correct", "follows")),
            "weight": out_of, "feedback": _feedback(s, first)}
    m = d["marks"]
    data["score"] = m["awarded"] / m["available"] if m["available"] else 0.0
    data["feedback"]["verdicts"] = verdicts
    data["feedback"]["marks"] = {"awarded": m["awarded"], "available": m["available"]}
    data["feedback"]["first_mistake"] = first


# ----------------------------------------------------------------------------- writing the question
_QUESTION_HTML = """<pl-question-panel>
  <p>Work this small Transformer encoder by hand. Round every answer to {{params.decimals}} decimals and enter
  each step as a matrix, one row per token (a vector as one row). A step left blank earns no marks; a step
  computed correctly from your own earlier (wrong) numbers earns its marks ("follows").</p>
  {{{params.problem_html}}}
</pl-question-panel>

{{#params.steps}}
<p><strong>Layer {{layer}}: {{name}}</strong> ({{shape}}, {{marks}} marks) — {{formula}}</p>
<pl-matrix-input answers-name="{{field}}" label="{{name}} =" allow-blank="true"></pl-matrix-input>
{{/params.steps}}

<pl-submission-panel>
  {{#feedback.first_mistake}}<p>First mistake: layer {{layer}}, {{name}} ({{diagnosis}}). {{explanation}}</p>
  {{/feedback.first_mistake}}
</pl-submission-panel>
"""

_SERVER_PY = '''"""A transformer_np worksheet question: each variant its own problem, marked as `check --key` marks.

Written by `transformer-np worksheet prairielearn`; the library is in serverFilesCourse/transformer_np (NumPy only).
Keep this file private: SALT with a variant's seed remakes its problem.
"""
import sys

OPTIONS = {options}
MARKS = {marks}
REVEAL = {reveal}
SALT = {salt!r}
ASSIGNMENT = {assignment}


def _library(data):
    path = data.get("options", {{}}).get("server_files_course_path")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    from transformer_np.worksheets import prairielearn

    return prairielearn


def generate(data):
    _library(data).generate_variant(data, OPTIONS, MARKS, REVEAL, SALT, ASSIGNMENT)


def parse(data):
    _library(data).parse_submission(data)


def grade(data):
    _library(data).grade_submission(data)
'''


def write_question(out: str | os.PathLike, options: dict, *, marks: dict | None = None, reveal: bool = False,
                   name: str = "worksheet", assignment: int = 0, salt: str | None = None,
                   force: bool = False) -> list[Path]:
    """Write the question ``out/questions/<name>/`` (info.json, question.html, server.py) and the library into
    ``out/serverFilesCourse/``. ``options``: :func:`~.generate.new_worksheet`'s (tokens, d_model, heads, norm,
    backward, layers, d_ff, activation, decimals), checked here by drawing one problem; ``marks``: a
    ``[marks]`` table (``--marks``); ``salt``: hex (default: 32 random bytes). Returns the files written."""
    import secrets

    from .._files import confined_path
    from .generate import mark_scheme, new_worksheet

    options = _library_options(options)
    probe = new_worksheet(seed=0, **options)                       # bad options: refused here, naming them
    mark_scheme(probe, marks)                                       # a bad mark scheme too
    q = confined_path(Path(out) / "questions", name, argument="--name")
    files = [q / "info.json", q / "question.html", q / "server.py"]
    if not force:
        existing = [f for f in files if f.exists()]
        if existing:
            raise InputValueError(f"{existing[0]} already exists (use --force to overwrite)")
    salt = secrets.token_hex(32) if salt is None else salt
    bytes.fromhex(salt)
    try:
        q.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputValueError(f"--out: cannot create the folder {str(q)!r}: {e.strerror or e}") from None
    info = {"uuid": str(uuid.uuid5(_UUID_NS, f"{name}/{salt}")), "type": "v3",
            "title": f"Hand calculation: a Transformer encoder ({options.get('norm', 'post')}-LN)",
            "topic": "Transformer encoder", "tags": ["transformer_np", "worksheet"]}
    files[0].write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    files[1].write_text(_QUESTION_HTML, encoding="utf-8")
    files[2].write_text(_SERVER_PY.format(options=repr(options), marks=repr(marks), reveal=bool(reveal),
                                          salt=salt, assignment=int(assignment)), encoding="utf-8")
    copy_library(Path(out) / "serverFilesCourse")
    return files
