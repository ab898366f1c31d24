"""The built docs site, shared by the tests that read it, and the checks they make on its HTML.

``built_site`` builds the site once per test process (``python -m sphinx -W``, as scripts/docs.sh does, into a
temporary folder), or returns the site $TNP_DOCS_HTML names (one scripts/docs.sh just built, e.g.
docs/_build/html). tests/test_docs_built.py reads its HTML; tests/test_docs_offline.py opens it in Chromium.

The checks are plain functions of a page's HTML text, so that they can be tried on a hand-written page too:

* ``prose_in_maths`` — formulas whose TeX is running text: MyST paired the dollars of a paragraph differently
  from Jupyter (a ``$$…$$`` written inside a paragraph read as two inline ``$`` pairs), so the words between two
  formulas were typeset as one italic formula ("The∗∗identitypath∗∗ofastack…");
* ``stray_dollars`` — a ``$`` left in the text a reader sees (outside code and formulas);
* ``dead_anchors`` — links within the site whose ``#anchor`` is no ``id`` of the page they point to.
"""

from __future__ import annotations

import html
import html.parser
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urldefrag

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BUILT: dict[str, Path] = {}


def built_site(tmp_path_factory) -> Path:
    """The built site: $TNP_DOCS_HTML if set, else a fresh build of this checkout (once per process)."""
    given = os.environ.get("TNP_DOCS_HTML")
    if given:
        html_dir = Path(given).resolve()
        assert (html_dir / "index.html").is_file(), f"TNP_DOCS_HTML={given}: no index.html there"
        return html_dir
    if "site" not in _BUILT:
        for module in ("sphinx", "myst_nb", "pydata_sphinx_theme"):
            pytest.importorskip(module, reason='the docs packages are needed: pip install -e ".[docs]"')
        if importlib.util.find_spec("sphinx-mathjax-offline") is None:
            pytest.skip('sphinx-mathjax-offline is needed: pip install -e ".[docs]"')
        out = tmp_path_factory.mktemp("site")
        build = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                                "-d", str(out / "doctrees"), str(ROOT / "docs"), str(out / "html")],
                               capture_output=True, text=True, timeout=1800)
        assert build.returncode == 0, f"the docs build failed:\n{build.stdout}\n{build.stderr}"
        _BUILT["site"] = out / "html"
    return _BUILT["site"]


def pages(site: Path) -> list[Path]:
    """Every page a reader opens: all HTML files but the theme's assets and the highlighted sources (code)."""
    return [p for p in sorted(site.rglob("*.html")) if not {"_static", "_modules", "_sources"} & set(p.parts)]


# ----------------------------------------------------------------------------- maths
_MATH = re.compile(r'<(span|div) class="math notranslate nohighlight">(.*?)</\1>', re.S)
# commands whose argument is text, not maths
_TEXT_ARG = re.compile(r"\\(?:text\w*|math(?:rm|bf|it|sf|tt)|operatorname)\s*\{[^{}]*\}")
# three words of two letters or more in a row, none a command (\log): prose, not a formula
_WORDS = re.compile(r"(?<![\\\w])[A-Za-z]{2,}(?:\s+[A-Za-z]{2,}){2,}")


def prose_in_maths(page_html: str) -> list[str]:
    """The TeX of every formula of the page that is running text: Markdown emphasis (``**``), a formula's
    delimiters inside it, or three plain words in a row outside ``\\text{…}`` and the like."""
    found = []
    for m in _MATH.finditer(page_html):
        tex = html.unescape(m.group(2)).strip()
        body = tex[2:-2] if tex[:2] in ("\\(", "\\[") else tex
        if "**" in body or any(d in body for d in ("\\(", "\\)", "\\[", "\\]")) or _WORDS.search(
                _TEXT_ARG.sub(" ", body)):
            found.append(" ".join(tex.split())[:160])
    return found


class _ReaderText(html.parser.HTMLParser):
    """The text a reader sees as prose: outside <script>, <style>, <pre>, <code>, <kbd>, <textarea> and the
    formulas (elements of class ``math``)."""

    SKIP = frozenset({"script", "style", "pre", "code", "kbd", "samp", "textarea"})
    VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
                      "track", "wbr"})

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth = 0
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        if self.depth or tag in self.SKIP or "math" in (dict(attrs).get("class") or "").split():
            self.depth += 1

    def handle_endtag(self, tag):
        if tag not in self.VOID and self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if not self.depth:
            self.parts.append(data)


def stray_dollars(page_html: str) -> list[str]:
    """Every ``$`` in the page's prose, with 50 characters either side."""
    reader = _ReaderText()
    reader.feed(page_html)
    text = "".join(reader.parts)
    return [" ".join(text[max(0, i - 50):i + 50].split()) for i, c in enumerate(text) if c == "$"]


# ----------------------------------------------------------------------------- anchors
_LINK = re.compile(r'<a\b[^>]*?\bhref="([^"]+)"')
_ID = re.compile(r'\b(?:id|name)="([^"]+)"')


def dead_anchors(site: Path) -> tuple[int, list[tuple[str, str]]]:
    """(number of links with an #anchor to a page of the site, [(page, href) of those whose anchor is missing]),
    over every HTML file of the site (the source viewer's pages included: their "[docs]" links)."""
    ids: dict[Path, set[str]] = {}
    total, dead = 0, []
    for page in sorted(site.rglob("*.html")):
        if "_static" in page.parts:
            continue
        for href in _LINK.findall(page.read_text(encoding="utf-8")):
            href = html.unescape(href)
            url, anchor = urldefrag(href)
            if not anchor or re.match(r"[a-z][a-z0-9+.-]*:", url):        # no anchor, or another site
                continue
            target = (page.parent / unquote(url)).resolve() if url else page
            if target not in ids:
                ids[target] = set(_ID.findall(target.read_text(encoding="utf-8"))) if target.is_file() else set()
            total += 1
            if unquote(anchor) not in ids[target]:
                dead.append((page.relative_to(site).as_posix(), href))
    return total, dead
