"""The class summary as one figure (``check … --roster R --figure FILE.png``): matplotlib, imported only here.

Three panels, read left to right: how the class scored (a histogram of the percentages, with the students who
handed nothing in or whose file could not be read counted beside it), which steps went wrong (students per
step, ``wrong`` and ``missing`` stacked; the steps most often wrong or missing first, at most 15), and which
mistakes came first (students per diagnosis of the first mistake).
"""

from __future__ import annotations

import os

__all__ = ["summary_figure", "require_matplotlib", "DPI"]

DPI = 150
_WRONG, _MISSING, _OK = "#b3261e", "#9aa4ae", "#1a7f37"


def require_matplotlib():
    """matplotlib, or an ImportError that says how to install it (called before the class is marked)."""
    from .._optional import require

    return require("matplotlib", "--figure needs matplotlib: pip install 'transformer-np[plot]' (or pip install "
                                 "matplotlib)")


def summary_figure(s: dict, path: str, title: str = "Worksheet class summary") -> str:
    """Draw the summary ``s`` (:func:`.gradebook.summary`) into ``path`` (PNG, or any format matplotlib
    writes, at :data:`DPI`). Raises ImportError with the install hint when matplotlib is missing."""
    matplotlib = require_matplotlib()

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 5.2), gridspec_kw={"width_ratios": [1, 1.5, 1.1]})
    try:
        _scores(a, s)
        _steps(b, s)
        _first(c, s)
        fig.suptitle(f"{title}: {s['students']} students, {s['sheets_marked']} sheets marked"
                     + (f", mean {s['mean_percent']:.1f}%" if s["mean_percent"] is not None else ""), fontsize=13)
        fig.tight_layout()
        from .._files import replace_atomically

        fmt = os.path.splitext(os.fspath(path))[1].lstrip(".").lower() or "png"
        replace_atomically(path, lambda f: fig.savefig(f, dpi=DPI, format=fmt))     # all or nothing
    finally:
        plt.close(fig)
    return path


def _scores(ax, s: dict) -> None:
    bins = list(range(0, 101, 10))
    pct = [min(max(p, 0), 100) for p in s["percents"]]
    ax.hist(pct, bins=bins, color=_OK, edgecolor="white")
    ax.set_xlim(0, 100)
    missing = s["no_submission"] + s["unreadable"]
    ax.set_xlabel("percent of the marks" + (f"\nnot marked: {s['no_submission']} no submission, "
                                            f"{s['unreadable']} unreadable" if missing else ""))
    ax.set_ylabel("students")
    ax.set_title("Scores")
    ax.yaxis.get_major_locator().set_params(integer=True)


def _steps(ax, s: dict) -> None:
    wrong = {d["step"]: d["students"] for d in s["steps_wrong"]}
    missing = {d["step"]: d["students"] for d in s["steps_missing"]}
    ranked = sorted(set(wrong) | set(missing), key=lambda k: (-(wrong.get(k, 0) + missing.get(k, 0)),
                                                               -wrong.get(k, 0), s["steps"].index(k)
                                                               if k in s["steps"] else 0))[:15]
    ax.set_title("Steps most often wrong or missing")
    if not ranked:
        ax.text(0.5, 0.5, "every answered step correct", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    y = list(range(len(ranked)))[::-1]
    w = [wrong.get(k, 0) for k in ranked]
    m = [missing.get(k, 0) for k in ranked]
    ax.barh(y, w, color=_WRONG, label="wrong", height=0.7)
    ax.barh(y, m, left=w, color=_MISSING, label="missing", height=0.7)
    ax.set_yticks(y, ranked, fontsize=8)
    ax.set_xlabel("students")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="lower right", fontsize=9)


def _first(ax, s: dict) -> None:
    ax.set_title("First mistakes by diagnosis")
    items = s["first_mistakes_by_diagnosis"][:10]
    if not items:
        ax.text(0.5, 0.5, "no mistakes", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    top = max(len(items), 4) - 1                    # a few bars stay at the top, as thick as the middle panel's
    y = list(range(top, top - len(items), -1))
    ax.barh(y, [d["students"] for d in items], color=_WRONG, height=0.6)
    ax.set_ylim(-0.8, max(len(items), 4) - 0.2)
    ax.set_yticks(y, [d["diagnosis"].replace("_", " ") for d in items], fontsize=9)
    ax.set_xlabel("students")
    ax.xaxis.get_major_locator().set_params(integer=True)
