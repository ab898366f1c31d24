"""A worksheet as a PrairieLearn question (issue 47, item 3): ``transformer-np worksheet prairielearn``.

The question's own ``server.py`` is loaded and called as PrairieLearn calls it, with data dictionaries holding
the documented fields only (``params``, ``correct_answers``, ``variant_seed``, ``options``; then
``submitted_answers`` in ``pl.to_json``'s array form, ``format_errors``, ``partial_scores``, ``score``,
``feedback``). Answers come from the simulated pencil-and-paper student of ``sheet_helpers`` (every number
rounded to the sheet's decimals). The marks are compared with ``transformer-np check --key`` run on the
equivalent TOML files (a folder of keys, one per variant, and the submissions), in one command.
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sheet_helpers import steps_of, student

from transformer_np.cli import main
from transformer_np.worksheets.generate import answer_key, to_toml
from transformer_np.worksheets.withheld import NOTE

SALT = "5a" * 32
OPTIONS = {"tokens": 3, "d_model": 4, "d_ff": 4, "activation": "relu", "decimals": 2}


def _write(tmp: Path, reveal: bool = False, options: dict = OPTIONS, name: str = "worksheet") -> Path:
    code = main(["worksheet", "prairielearn", "--out", str(tmp), "--name", name] + (["--reveal"] if reveal else [])
                + [f"--{k.replace('_', '-')}" if v is True else f"--{k.replace('_', '-')}={v}"
                   for k, v in options.items()])
    assert code == 0
    server = tmp / "questions" / name / "server.py"
    text = server.read_text(encoding="utf-8")
    server.write_text(re.sub(r"SALT = '[0-9a-f]+'", f"SALT = {SALT!r}", text), encoding="utf-8")   # reproducible
    return tmp


def _server(course: Path, name: str = "worksheet"):
    spec = importlib.util.spec_from_file_location(f"pl_server_{name}_{id(course)}",
                                                  course / "questions" / name / "server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _generate(server, course: Path, variant_seed: int) -> dict:
    data = {"params": {}, "correct_answers": {}, "variant_seed": variant_seed,
            "options": {"server_files_course_path": str(course / "serverFilesCourse")}}
    server.generate(data)
    return data


def _as_pl(value) -> dict:
    a = np.asarray(value, dtype=float)
    return {"_type": "ndarray", "_value": a.tolist(), "_dtype": str(a.dtype)}


def _submit(server, data: dict, answers: dict, blank: set = frozenset(), valid: bool = True) -> dict:
    """Grade ``answers`` ({"layer1": {name: values}}); fields in ``blank`` are sent empty (None)."""
    sub = {}
    for st in data["params"]["steps"]:
        value = answers.get(f"layer{st['layer']}", {}).get(st["name"])
        if st["field"] in blank:
            sub[st["field"]] = None
        elif value is not None:
            sub[st["field"]] = _as_pl(value)
    data = {**data, "submitted_answers": sub, "format_errors": {}, "partial_scores": {}, "score": 0.0,
            "feedback": {}}
    server.parse(data)
    if valid:
        assert data["format_errors"] == {}
    if not data["format_errors"]:                  # PrairieLearn grades a submission without format errors only
        server.grade(data)
    return data


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("pl_course"))


@pytest.fixture(scope="module")
def server(course):
    return _server(course)


def test_variants_get_their_own_problem_and_no_key_unless_revealed(course, server):
    a, b, a2 = (_generate(server, course, s) for s in (1, 2, 1))
    assert a["params"]["problem"] == a2["params"]["problem"]           # a variant keeps its problem
    assert a["params"]["problem"]["setup"]["problem_id"] != b["params"]["problem"]["setup"]["problem_id"]
    assert "seed" not in a["params"]["problem"]["setup"]
    assert a["correct_answers"] == {}
    shown = _write(course.parent / "revealed", reveal=True)
    data = _generate(_server(shown), shown, 1)
    key = answer_key(data["params"]["problem"])
    assert data["params"]["problem"] == a["params"]["problem"]
    for st in data["params"]["steps"]:
        # exact: both are the same rounded values, written by answer_key
        assert data["correct_answers"][st["field"]]["_value"] == key[f"layer{st['layer']}"][st["name"]]


def test_an_honest_rounded_answer_set_gets_full_marks(course, server):
    data = _generate(server, course, 11)
    answers = student(data["params"]["problem"])[0]["answers"]
    out = _submit(server, data, answers)
    assert out["score"] == 1.0, out["feedback"]
    assert set(out["feedback"]["verdicts"].values()) == {"correct"}
    assert all(p["score"] == 1.0 for p in out["partial_scores"].values())


def _slip(raw: dict, at: tuple[int, str], delta: float = 0.5):
    """A planted arithmetic slip: the step worked right from the student's numbers, one entry off by ``delta``."""
    _, steps = steps_of(raw)
    step = next(s for s in steps if s.key == at)

    def wrong(vals, s=step):
        v = np.array(s.fn(*(vals[k] for k in s.inputs)), dtype=float)
        v.flat[0] += delta
        return v

    return {at: wrong}


def test_a_slip_makes_that_step_wrong_and_the_later_steps_follow(course, server):
    data = _generate(server, course, 12)
    raw = data["params"]["problem"]
    answers = student(raw, plant=_slip(raw, (1, "context")))[0]["answers"]
    out = _submit(server, data, answers)
    v = out["feedback"]["verdicts"]
    fields = [st["field"] for st in data["params"]["steps"]]
    at = fields.index("l1_context")
    assert v["l1_context"] == "wrong" and out["partial_scores"]["l1_context"]["score"] == 0
    later = [v[f] for f in fields[at + 1:]]
    assert "follows" in later and "wrong" not in later, v
    assert at > 0 and {v[f] for f in fields[:at]} == {"correct"}
    assert out["feedback"]["first_mistake"]["name"] == "context"
    assert out["score"] == pytest.approx(1 - 1 / len(fields), abs=1e-12)
    fb = out["partial_scores"]["l1_context"]["feedback"]
    assert fb.startswith("wrong") and NOTE in fb                       # the diagnosis, told without numbers
    assert not re.search(r"\d\.\d", fb), fb                            # no value of the key's


def test_blanks_are_missing(course, server):
    data = _generate(server, course, 13)
    answers = student(data["params"]["problem"])[0]["answers"]
    answers["layer1"].pop("scores")                                    # not sent at all
    out = _submit(server, data, answers, blank={"l1_Q", "l1_H"})       # sent empty
    v = out["feedback"]["verdicts"]
    assert v["l1_scores"] == v["l1_Q"] == v["l1_H"] == "missing"
    assert {x for f, x in v.items() if f not in ("l1_scores", "l1_Q", "l1_H")} == {"correct"}
    n = len(v)
    assert out["score"] == pytest.approx((n - 3) / n, abs=1e-12)
    assert out["partial_scores"]["l1_H"]["score"] == 0


def test_a_wrong_shape_is_a_format_error_naming_the_shapes(course, server):
    data = _generate(server, course, 14)
    data.update(submitted_answers={"l1_Q": _as_pl([[1.0, 2.0]])}, format_errors={})
    server.parse(data)
    assert data["format_errors"]["l1_Q"] == "Q: expected 3 × 4 numbers, got 1 × 2"


def test_the_same_marks_as_check_key_on_the_equivalent_toml_for_50_cases(course, server, tmp_path, capsys):
    rng = np.random.default_rng(47)
    keys, subs = tmp_path / "keys", tmp_path / "subs"
    keys.mkdir()
    subs.mkdir()
    graded = {}
    for case in range(50):
        data = _generate(server, course, 1000 + case)
        raw, fields = data["params"]["problem"], [st for st in data["params"]["steps"]]
        plant = None
        if case % 3:                                                   # two in three carry a slip
            st = fields[int(rng.integers(len(fields)))]
            plant = _slip(raw, (st["layer"], st["name"]), float(rng.choice([-1.0, 0.25, 2.0])))
        answers = student(raw, plant=plant)[0]["answers"]
        blank = {st["field"] for st in fields if rng.random() < 0.15}
        out = _submit(server, data, answers, blank, valid=False)
        graded[case] = out
        sent = {layer: {n: v for n, v in t.items() if f"l{layer[5:]}_{n}" not in blank}
                for layer, t in answers.items()}
        key = {**raw, "setup": {**raw["setup"], "reveal": False}}
        (keys / f"k{case}.toml").write_text(to_toml(key, answers=answer_key(raw), key=True,
                                                    marks=data["params"]["marks"]), encoding="utf-8")
        (subs / f"s{case:02d}.toml").write_text(to_toml({**raw, "answers": sent}, answers=sent, template=False),
                                                encoding="utf-8")
    capsys.readouterr()
    main(["check", "--key", str(keys), str(subs), "--json"])
    sheets = json.loads(capsys.readouterr().out)["sheets"]
    assert len(sheets) == 50
    kinds = set()
    for item in sheets:
        case = int(Path(item["file"]).stem[1:])
        report, out = item["report"], graded[case]
        if item["error"] is not None:              # check refuses the sheet: PrairieLearn asks for the answer again
            assert "beyond ±1e+06" in item["error"] and out["format_errors"], (item["error"], out["format_errors"])
            assert all("beyond ±1e+06" in e for e in out["format_errors"].values())
            kinds.add("refused")
            continue
        assert not out["format_errors"]
        for s in report["steps"]:
            field = f"l{s['layer']}_{s['name']}"
            assert out["feedback"]["verdicts"][field] == s["verdict"], (case, field)
            ps = out["partial_scores"][field]
            assert ps["weight"] == s["out_of"] and ps["score"] * ps["weight"] == s["marks"], (case, field)
            kinds.add(s["verdict"])
        assert out["feedback"]["marks"]["awarded"] == report["marks"]["awarded"]
        assert out["feedback"]["marks"]["available"] == report["marks"]["available"]
        assert out["feedback"]["first_mistake"] == report["first_mistake"], case
    assert {"correct", "follows", "wrong", "missing"} <= kinds       # every verdict was exercised


# ----------------------------------------------------------------------------- the question's HTML
def _lookup(stack: list, name: str):
    if name == ".":
        return stack[-1]
    for ctx in reversed(stack):
        value, found = ctx, True
        for part in name.split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            else:
                found = False
                break
        if found:
            return value
    return None


def mustache(template: str, context: dict) -> str:
    """A small mustache renderer: {{name}} (escaped), {{{name}}} (raw), {{#name}}…{{/name}} (a list repeats,
    a dict or a truthy value enters once), {{^name}}…{{/name}}, dotted names looked up through the stack."""
    def render(text: str, stack: list) -> str:
        out, i = [], 0
        tag = re.compile(r"\{\{\{\s*([\w.]+)\s*\}\}\}|\{\{\s*([#^/]?)\s*([\w.]+)\s*\}\}")
        while True:
            m = tag.search(text, i)
            if m is None:
                return "".join(out) + text[i:]
            out.append(text[i:m.start()])
            if m.group(1):
                out.append(str(_lookup(stack, m.group(1)) or ""))
                i = m.end()
                continue
            kind, name = m.group(2), m.group(3)
            if kind in "#^" and kind:
                depth, j = 1, m.end()
                inner = re.compile(r"\{\{\s*([#^/])\s*" + re.escape(name) + r"\s*\}\}")
                while depth:
                    n = inner.search(text, j)
                    assert n is not None, f"unclosed section {name}"
                    depth += 1 if n.group(1) in "#^" else -1
                    j = n.end()
                body = text[m.end():n.start()]
                value = _lookup(stack, name)
                if kind == "^":
                    out.append("" if value else render(body, stack))
                elif isinstance(value, list):
                    out.extend(render(body, stack + [item]) for item in value)
                elif value:
                    out.append(render(body, stack + ([value] if isinstance(value, dict) else [])))
                i = j
            else:
                value = _lookup(stack, name)
                out.append(html.escape("" if value is None else str(value)))
                i = m.end()

    return render(template, [context])


def test_the_mustache_renderer_can_fail():
    assert mustache("{{#a}}[{{b}}]{{/a}}{{^c}}none{{/c}}", {"a": [{"b": "<x>"}, {"b": 2}]}) == "[&lt;x&gt;][2]none"
    assert mustache("{{#a}}{{b}}{{/a}}", {"a": []}) == ""


@pytest.mark.parametrize("backward", [False, True])
def test_the_rendered_question_names_every_steps_answer_field(backward, tmp_path):
    course = _write(tmp_path, options={**OPTIONS, "backward": backward} if backward else OPTIONS)
    server = _server(course)
    data = _generate(server, course, 5)
    page = mustache((course / "questions" / "worksheet" / "question.html").read_text(encoding="utf-8"),
                    {"params": data["params"], "correct_answers": data["correct_answers"], "feedback": {}})
    named = re.findall(r'<pl-matrix-input answers-name="(\w+)"', page)
    fields = [st["field"] for st in data["params"]["steps"]]
    assert named == fields and len(fields) == len(set(fields))
    assert ("l1_d_H0" in fields) == backward
    assert "{{" not in page and "<table" in page                      # everything filled in, the problem shown
    for token in data["params"]["problem"]["setup"]["tokens"]:
        assert f"<th>{html.escape(token)}</th>" in page


def test_the_question_runs_on_the_copied_library_with_numpy_alone(course, tmp_path):
    """A fresh interpreter with no PYTHONPATH, outside the checkout: server.py imports the copy in
    serverFilesCourse (and NumPy) only."""
    script = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("server", {str(course / 'questions' / 'worksheet' / 'server.py')!r})
server = importlib.util.module_from_spec(spec); spec.loader.exec_module(server)
data = {{"params": {{}}, "correct_answers": {{}}, "variant_seed": 3,
        "options": {{"server_files_course_path": {str(course / 'serverFilesCourse')!r}}}}}
server.generate(data)
data.update(submitted_answers={{}}, format_errors={{}}, partial_scores={{}}, score=1.0, feedback={{}})
server.parse(data); server.grade(data)
import transformer_np
print(json.dumps([transformer_np.__file__, data["score"], sorted(set(data["feedback"]["verdicts"].values())),
                  sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "scipy", "jax", "pandas"))]))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    where, score, verdicts, frameworks = json.loads(proc.stdout)
    assert where.startswith(str(course / "serverFilesCourse")), where
    assert score == 0.0 and verdicts == ["missing"] and frameworks == []
