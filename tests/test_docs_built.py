"""The built docs site, read as HTML: every paragraph's maths renders as written, and every anchor link lands.

The checks (tests/docs_site.py) are tried first on hand-written HTML, copied from what the site showed before
docs/conf.py set ``myst_dmath_double_inline`` (fast lane), then on the whole built site (``slow``: one Sphinx
build per test process, or the site $TNP_DOCS_HTML names; needs the docs packages, which ``.[test]`` installs).
"""

from __future__ import annotations

import pytest
from docs_site import built_site, dead_anchors, pages, prose_in_maths, stray_dollars


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return built_site(tmp_path_factory)


# notebook 02 §1 as the site showed it while MyST read a "$$…$$" inside a paragraph as inline "$" pairs (copied from
# the built page; M = the opening tag of an inline formula)
M = '<span class="math notranslate nohighlight">'
BROKEN_02 = ("By the chain rule its Jacobian is\n$" + M
             + r"\(\frac{\partial y}{\partial x} = D\,(s I + J_B), \qquad D = \partial N \ (= I \text{ without a "
             + r"LayerNorm}).\)</span>" + M + "\\(\nThe **identity path** of a stack is the product with every branch "
             + r"Jacobian \)</span>J_B" + M + r"\( dropped, \)</span>\prod D,s" + M + r"\(: exactly \)</span>I" + M
             + "\\( for\nPre-LN (no \\)</span>D" + M + r"\( on the skip), a product of LayerNorm Jacobians for "
             + r"Post-LN, and \)</span>0$ without skips.</p>")
# the same paragraph as it renders now (and as Jupyter shows it), copied from the built page
FIXED_02 = ('By the chain rule its Jacobian is\n<div class="math notranslate nohighlight">\n'
            + r"\[\frac{\partial y}{\partial x} = D\,(s I + J_B), \qquad D = \partial N \ (= I \text{ without a "
            + r"LayerNorm}).\]</div>" + "\n\nThe <strong>identity path</strong> of a stack is the product with every "
            + "branch Jacobian " + M + r"\(J_B\)</span> dropped, " + M + r"\(\prod D\,s\)</span>: exactly " + M
            + r"\(I\)</span> for")


def test_the_checks_catch_the_old_rendering_of_notebook_02():
    prose = prose_in_maths(BROKEN_02)
    assert len(prose) == 2 and "identity path" in prose[0], prose
    assert len(stray_dollars(BROKEN_02)) == 2
    assert prose_in_maths(FIXED_02) == [] and stray_dollars(FIXED_02) == []


def test_the_checks_leave_real_formulas_and_code_alone():
    page = ('<p>cost <span class="math notranslate nohighlight">\\(\\log p + \\mathrm{softmax of the row}'
            '\\)</span> and <code>$HOME</code>, <pre>echo $x</pre> <kbd>$</kbd></p>'
            '<div class="math notranslate nohighlight">\\[\\sum_i x_i \\text{ over all the tokens}\\]</div>')
    assert prose_in_maths(page) == [] and stray_dollars(page) == []
    assert stray_dollars("<p>costs $5</p>") == ["costs $5"]


@pytest.mark.slow
def test_no_paragraph_renders_prose_as_maths_or_shows_a_dollar(site):
    """Notebook 02 §1 (the identity path of a stack), 05a §3 (the reach) and 05b (order sensitivity, the cost
    fit) ran together as italic maths; the plotting functions' docstrings showed $…$ in the API reference."""
    checked = pages(site)
    assert len(checked) > 50 and any(p.name == "02_gradient_flow.html" for p in checked)
    bad = {}
    for page in checked:
        text = page.read_text(encoding="utf-8")
        found = [f"maths: {t}" for t in prose_in_maths(text)] + [f"$: {t}" for t in stray_dollars(text)]
        if found:
            bad[page.relative_to(site).as_posix()] = found
    assert not bad, "paragraphs that do not render as written:\n" + "\n".join(
        f"{page}:\n    " + "\n    ".join(found[:4]) for page, found in bad.items())


@pytest.mark.slow
def test_every_anchor_link_lands(site):
    """The source viewer's "[docs]" links pointed 137 times (of 569) to an anchor that does not exist: an object
    documented on its module's page and again on a re-exporting module's page got the one's page and the other's
    anchor (docs/_ext/viewcode_backlinks.py)."""
    total, dead = dead_anchors(site)
    backlinks = sum(1 for p in (site / "_modules").rglob("*.html") for _ in
                    p.read_text(encoding="utf-8").split('class="viewcode-back"')[1:])
    assert total > 1000 and backlinks > 300, (total, backlinks)
    assert not dead, f"{len(dead)} of {total} links with an anchor land nowhere, e.g.:\n" + "\n".join(
        f"  {page} -> {href}" for page, href in dead[:10])
