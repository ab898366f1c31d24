"""docs/claims.md: every row has a verdict and names tests/notebooks that exist; errata agree with the trace."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / "docs" / "claims.md"
VERDICTS = ("holds", "wrong", "holds with a qualification")
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")
NB_REF = re.compile(r"`(notebooks/[\w.\-]+\.ipynb)`")


def _tables(text: str) -> dict[str, list[list[str]]]:
    """{section heading: rows (cells stripped)} for every Markdown table, header and rule dropped."""
    out: dict[str, list[list[str]]] = {}
    section = None
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("|") and section is not None:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out.setdefault(section, []).append(cells)
    return {k: [r for r in rows[2:]] for k, rows in out.items()}   # drop header + |---| rule


@pytest.fixture(scope="module")
def tables():
    assert LEDGER.exists(), "docs/claims.md is missing"
    return _tables(LEDGER.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def claim_rows(tables):
    rows = []
    for section, body in tables.items():
        if section.startswith(("Article", "Lesson")):
            rows += body
    return rows


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_both_seeds_are_covered(tables, claim_rows):
    article = [r for s, b in tables.items() if s.startswith("Article") for r in b]
    lesson = [r for s, b in tables.items() if s.startswith("Lesson") for r in b]
    assert len(article) >= 25 and len(lesson) >= 15
    ids = [r[0] for r in claim_rows]
    assert len(ids) == len(set(ids)), "row ids must be unique"
    assert all(re.fullmatch(r"[AL]\d+", i) for i in ids)


def test_every_row_has_six_cells_and_a_verdict(claim_rows):
    for row in claim_rows:
        assert len(row) == 6, f"row {row[0]} has {len(row)} cells, expected 6"
        assert row[4] in VERDICTS, f"row {row[0]}: verdict {row[4]!r} is not one of {VERDICTS}"
        assert row[3], f"row {row[0]} has no computed value"


def test_every_named_test_and_notebook_exists(claim_rows):
    cache: dict[str, set[str]] = {}
    for row in claim_rows:
        refs = TEST_REF.findall(row[5])
        nbs = NB_REF.findall(row[5])
        assert refs or nbs, f"row {row[0]} names no test or notebook"
        for path, func in refs:
            f = ROOT / path
            assert f.exists(), f"row {row[0]}: {path} does not exist"
            if func:
                names = cache.setdefault(path, _functions(f))
                assert func in names, f"row {row[0]}: {path} has no function {func}"
        for nb in nbs:
            assert (ROOT / nb).exists(), f"row {row[0]}: {nb} does not exist"


def test_the_worked_example_has_every_verdict_kind(claim_rows):
    verdicts = {r[4] for r in claim_rows}
    assert set(VERDICTS) <= verdicts


def _numbers(cell: str) -> np.ndarray:
    return np.array([float(x) for x in re.findall(r"-?\d+\.\d+|-?\d+", cell)])


def test_errata_agree_with_the_trace(tables, claim_rows):
    trace = pytest.importorskip("transformer_np.course.trace", reason="the trace module (issue 4) is not present")
    errata = {e["quantity"]: e for e in trace.run_trace()["errata"]}
    rows = tables["Errata (the worked example)"]
    listed = {r[0].strip("`"): r for r in rows}
    assert set(listed) == set(errata), f"ledger errata {sorted(listed)} vs trace errata {sorted(errata)}"
    by_id = {r[0]: r for r in claim_rows}
    for q, row in listed.items():
        e = errata[q]
        np.testing.assert_allclose(_numbers(row[1]), np.ravel(e["article"]), atol=1e-12)
        np.testing.assert_allclose(_numbers(row[2]), np.round(np.ravel(e["computed"]), 4), atol=1e-12)
        assert by_id[row[3]][4] == "wrong", f"erratum {q} points at row {row[3]}, whose verdict is not 'wrong'"
        assert _numbers(row[2]).size and np.allclose(_numbers(by_id[row[3]][3])[: _numbers(row[2]).size],
                                                     _numbers(row[2]), atol=1e-12)


def test_wrong_rows_of_the_worked_example_are_errata(tables, claim_rows):
    """Every 'wrong' row about the worked example's printed numbers appears among the errata."""
    errata_rows = {r[3] for r in tables["Errata (the worked example)"]}
    numeric_wrong = {r[0] for r in claim_rows if r[4] == "wrong" and r[2].startswith("Worked example")
                     and re.search(r"\d\.\d", r[1])}
    assert numeric_wrong == errata_rows


@pytest.mark.parametrize("topic,pattern", [
    ("worked example softmax", r"softmax\(1\.0, 0\.0, 0\.5\)"),
    ("residual mean", r"mean ≈ 0\.75"),
    ("complexity", r"O\(n²d \+ nd²\)"),
    ("crossover", r"n\* = 2d \+ d_ff"),
    ("12d² per layer", r"12d²"),
    ("BERT-base/large configurations", r"N = 24, d = 1024, h = 16"),
    ("gradient flow", r"∏\(I \+ ∂Sublayer/∂X\)"),
    ("permutation equivariance", r"permutation-equivariant"),
    ("PE added once", r"injected only once"),
    ("reach after one layer", r"After one layer, H\^\(1\)_i depends on every input token"),
    ("padding mask the only surviving mask", r"only surviving mask is the padding mask"),
])
def test_the_issue_topics_are_covered(claim_rows, topic, pattern):
    assert any(re.search(pattern, r[1]) or re.search(pattern, r[3]) for r in claim_rows), \
        f"no ledger row covers {topic}"


def test_summary_counts_match_the_rows(claim_rows):
    m = re.search(r"\*\*Summary:\*\* (\d+) claims checked \((\d+) from the article, (\d+) from the lesson\): "
                  r"(\d+) hold, (\d+) are wrong, (\d+) hold with a qualification\.", LEDGER.read_text(encoding="utf-8"))
    assert m, "the summary line is missing or reworded"
    total, art, les, ok, wrong, qual = map(int, m.groups())
    verdicts = [r[4] for r in claim_rows]
    assert total == len(claim_rows)
    assert art == sum(r[0].startswith("A") for r in claim_rows) and les == sum(r[0].startswith("L") for r in claim_rows)
    assert (ok, wrong, qual) == (verdicts.count("holds"), verdicts.count("wrong"),
                                 verdicts.count("holds with a qualification"))


# ----------------------------------------------------------------------------- one source of truth
def test_the_page_is_rendered_from_the_data():
    from transformer_np.course import ledger
    assert LEDGER.read_text(encoding="utf-8") == ledger.render_markdown(), \
        "docs/claims.md differs from transformer_np/data/claims.json: python scripts/render_claims.py --write"


def test_every_verdict_is_one_of_three():
    from transformer_np.course import ledger
    assert all(r["verdict"] in ledger.VERDICTS for r in ledger.rows())
    with pytest.raises(ValueError, match="claim_id must be a row of the ledger"):
        ledger.verdict("A999")


def test_the_ledger_and_trace_agree_on_every_verdict():
    """Every claim `trace` checks names a ledger row, prints the ledger's verdict, and its own computation
    agrees with it (holds <-> 'holds' / 'holds with a qualification'; fails <-> 'wrong')."""
    from transformer_np.course import ledger
    from transformer_np.course.trace import format_trace, run_trace
    t = run_trace()
    assert len(t["claims"]) >= 5
    text = format_trace(t)
    for c in t["claims"]:
        v = ledger.verdict(c["ledger"])
        assert c["verdict"] == v
        assert c["holds"] == (v != "wrong"), f"trace finds {c['claim']!r} {'holds' if c['holds'] else 'fails'}, " \
                                             f"the ledger says {c['ledger']}: {v}"
        assert f"{c['ledger']} [ledger: {v}]" in c["claim"] and c["claim"] in text


def test_every_verdict_tag_in_the_docs_and_notebooks_is_the_ledgers():
    """Prose outside the ledger quotes a verdict as [A11: holds with a qualification]; each must match."""
    import json as _json

    from transformer_np.course import ledger
    texts = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md") if p.name != "claims.md"}
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        cells = _json.loads(nb.read_text(encoding="utf-8"))["cells"]
        parts = ["".join(c["source"]) for c in cells]
        parts += ["".join(o.get("text", "")) for c in cells for o in c.get("outputs", [])]
        texts[nb.name] = "\n".join(parts)
    seen = 0
    for name, text in texts.items():
        for cid, verdict in ledger.TAG.findall(text):
            seen += 1
            assert ledger.verdict(cid) == verdict, f"{name} says [{cid}: {verdict}], the ledger says {ledger.tag(cid)}"
    assert seen >= 10, "the lessons and docs should quote the ledger's verdicts as tags"


def test_training_numbers_in_A43_are_the_stored_experiments():
    """A43/L21 quote the stored runs; every 'mean (min–max)' they give matches
    transformer_np/data/training_stability.json."""
    import json as _json

    from transformer_np.course import ledger, stability
    table = stability.stability_table(_json.loads(stability.STABILITY_JSON.read_text())["runs"])
    quoted = ledger.row("A43").get("data", [])
    assert len(quoted) >= 8
    for q in quoted:
        r = stability.find_row(table, **q["condition"])
        assert (r["loss_mean"], r["loss_min"], r["loss_max"], r["stalled"]) == \
               (q["loss_mean"], q["loss_min"], q["loss_max"], q["stalled"]), q["condition"]
        assert f"{q['loss_mean']:.2f}" in ledger.row("A43")["computed"]
