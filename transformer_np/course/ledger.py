r"""The claims ledger as data: one source of truth for every verdict on the two seed documents.

``transformer_np/data/claims.json`` holds each checkable claim of the article (A1 …) and the lesson (L1 …): the
claim, where it appears, what the library computes, a verdict — ``holds``, ``wrong`` or ``holds with a
qualification`` — and the tests and notebooks that compute it, plus the worked example's errata.

Everything that states a verdict reads it from here: :func:`transformer_np.course.trace.run_trace` (its ``claims``
carry the ledger id and verdict), the notebooks (they print :func:`tag`), and ``docs/claims.md``, which is
*rendered* from the data (:func:`render_markdown`; ``python -m transformer_np.course.ledger --write``). In other
prose a verdict is written as a tag, ``[A11: holds with a qualification]``; ``tests/course/test_claims_ledger.py``
checks every tag in the docs and notebooks against the data, so the two cannot disagree.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from pathlib import Path

__all__ = [
    "CLAIMS_MD",
    "LEDGER_JSON",
    "TAG",
    "VERDICTS",
    "load",
    "main",
    "render_markdown",
    "row",
    "rows",
    "summary",
    "tag",
    "verdict",
]

LEDGER_JSON = Path(__file__).resolve().parents[1] / "data" / "claims.json"
CLAIMS_MD = Path(__file__).resolve().parents[2] / "docs" / "claims.md"     # in a source checkout
VERDICTS = ("holds", "wrong", "holds with a qualification")
#: how prose outside the ledger states a verdict: [A11: holds with a qualification]
TAG = re.compile(r"\[([AL]\d+): (holds with a qualification|holds|wrong)\]")


@functools.lru_cache(maxsize=1)
def _cached(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def load(path: str | Path = LEDGER_JSON) -> dict:
    """The ledger (a fresh copy of the parsed JSON)."""
    return json.loads(json.dumps(_cached(str(path))))


def rows(path: str | Path = LEDGER_JSON) -> list[dict]:
    """Every claim row, article first: dicts with id, claim, where, computed, verdict, checked_by."""
    return [r for s in _cached(str(path))["sections"] for r in s["rows"]]


def row(claim_id: str, path: str | Path = LEDGER_JSON) -> dict:
    """The row ``claim_id`` ("A11", "L21", …); ValueError naming the id when there is none."""
    for r in rows(path):
        if r["id"] == claim_id:
            return dict(r)
    raise ValueError(f"claim_id must be a row of the ledger {Path(path).name} (A1 …, L1 …), got {claim_id!r}")


def verdict(claim_id: str, path: str | Path = LEDGER_JSON) -> str:
    """The ledger's verdict on ``claim_id``: one of :data:`VERDICTS`."""
    return row(claim_id, path)["verdict"]


def tag(claim_id: str, path: str | Path = LEDGER_JSON) -> str:
    """``[A11: holds with a qualification]`` — how a notebook or a doc quotes a verdict."""
    return f"[{claim_id}: {verdict(claim_id, path)}]"


def summary(path: str | Path = LEDGER_JSON) -> dict:
    """Counts: total, article, lesson, and one per verdict."""
    rs = rows(path)
    out = {"total": len(rs), "article": sum(r["id"].startswith("A") for r in rs),
           "lesson": sum(r["id"].startswith("L") for r in rs)}
    out.update({v: sum(r["verdict"] == v for r in rs) for v in VERDICTS})
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(path: str | Path = LEDGER_JSON) -> str:
    """docs/claims.md, rendered from the data."""
    d = _cached(str(path))
    s = summary(path)
    line = (f"**Summary:** {s['total']} claims checked ({s['article']} from the article, {s['lesson']} from the "
            f"lesson): {s['holds']} hold, {s['wrong']} are wrong, {s['holds with a qualification']} hold with a "
            f"qualification.")
    out = [f"# {d['title']}", "", d["intro"], "", line, ""]
    for sec in d["sections"]:
        header = "| # | claim (quoted briefly) | where | computed by the library | verdict | checked by |"
        out += [f"## {sec['heading']}", "", header, "|---|---|---|---|---|---|"]
        for r in sec["rows"]:
            refs = ", ".join(f"`{x}`" for x in r["checked_by"])
            out.append(f"| {r['id']} | {_cell(r['claim'])} | {_cell(r['where'])} | {_cell(r['computed'])} | "
                       f"{r['verdict']} | {refs} |")
        out.append("")
    e = d["errata"]
    out += [f"## {e['heading']}", "", e["intro"], "",
            "| quantity | article | computed | ledger row |", "|---|---|---|---|"]
    out += [f"| `{x['quantity']}` | {x['article']} | {x['computed']} | {x['row']} |" for x in e["rows"]]
    out += ["", f"## {d['not_checkable']['heading']}", "", d["not_checkable"]["text"], ""]
    return "\n".join(out)


def main(argv=None) -> int:
    """``python -m transformer_np.course.ledger [--write | --check]``: print, write or check docs/claims.md."""
    ap = argparse.ArgumentParser(prog="python -m transformer_np.course.ledger", description=main.__doc__)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"write {CLAIMS_MD}")
    g.add_argument("--check", action="store_true", help=f"exit 1 if {CLAIMS_MD} is not what the data renders")
    args = ap.parse_args(argv)
    text = render_markdown()
    if args.write:
        CLAIMS_MD.write_text(text, encoding="utf-8")
        print(f"wrote {CLAIMS_MD}")
    elif args.check:
        same = CLAIMS_MD.is_file() and CLAIMS_MD.read_text(encoding="utf-8") == text
        print(f"{CLAIMS_MD}: {'up to date' if same else 'differs from the ledger data: run --write'}")
        return 0 if same else 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
