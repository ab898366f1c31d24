"""The docs site works without a network and at a laptop's width, checked in a headless Chromium.

The site is built once for this module (``python -m sphinx -W``, as scripts/docs.sh does, into a temporary
folder; or $TNP_DOCS_HTML names a site already built), then pages are opened from disk with every host name
unresolvable, so nothing can come from a CDN:

* the math is typeset by the MathJax copied into the site (``mjx-container`` elements in the DOM), and no
  raw ``\\(…\\)`` / ``\\[…\\]`` is left in the text a reader sees;
* at 1280 px the top bar is one line, and every code block fits in its column (nothing runs past the
  column's edge or hides behind a scroll bar), a code line of up to 120 characters (the project's line
  length) without wrapping; a notebook's printed output stays in the column too (it may scroll sideways, to
  keep a table's columns aligned), and notebook 01's first output fits without scrolling.

Needs the docs packages (the ``docs`` extra, also in ``test``) and a Chromium (``apt-get install chromium``), so
these tests are the ``browser`` lane: scripts/test_browser.sh runs them (CI too), the README's test command
(scripts/test.sh) leaves them out. Run by hand without a Chromium they skip, and with CI=true they fail
(tests/conftest.py)."""

from __future__ import annotations

import html
import html.parser
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from docs_site import built_site

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[1]
MATH_PAGES = ["notebooks/01_the_cat_sat_trace.html", "guide/worksheets.html"]
LAYOUT_PAGES = ["index.html", "guide/worksheets.html", "notebooks/01_the_cat_sat_trace.html"]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _chromium() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(f"no headless browser found (looked for {', '.join(BROWSERS)}): apt-get install chromium")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The built site (tests/docs_site.py): $TNP_DOCS_HTML if set, else a fresh build of this checkout."""
    return built_site(tmp_path_factory)


def _dump_dom(url: str, width: int = 1280, budget_ms: int = 20000, extra: tuple[str, ...] = ()) -> str:
    """The page's DOM after its scripts ran (``--virtual-time-budget``), opened offline: every host name
    resolves to nothing (``--host-resolver-rules``), so a CDN script cannot load."""
    with tempfile.TemporaryDirectory() as profile:
        run = subprocess.run(
            [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={profile}",
             f"--window-size={width},900", f"--virtual-time-budget={budget_ms}", *extra, "--dump-dom", url],
            capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "<html" in run.stdout, f"chromium failed on {url}:\n{run.stderr[-2000:]}"
    return run.stdout


class _VisibleText(html.parser.HTMLParser):
    """The text a reader sees: everything outside <script>, <style>, <pre>, <code> and <textarea>
    (code may legitimately show a backslash-parenthesis), and outside MathJax's own output."""

    SKIP = frozenset({"script", "style", "pre", "code", "textarea", "mjx-container"})

    def __init__(self):
        super().__init__()
        self.depth = 0
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.depth += 1

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if not self.depth:
            self.parts.append(data)


@pytest.mark.parametrize("page", MATH_PAGES)
def test_math_is_typeset_offline(site, page):
    path = site / page
    source = path.read_text(encoding="utf-8")
    assert "_static/mathjax/tex-chtml.js" in source, f"{page} does not load the bundled MathJax"
    assert (site / "_static" / "mathjax" / "tex-chtml.js").is_file()
    n_math = source.count('class="math notranslate nohighlight"')      # Sphinx's \(…\) and \[…\] elements
    assert n_math > 0, f"{page} has no math to check"
    dom = _dump_dom(path.as_uri())
    typeset = dom.count("<mjx-container")
    assert typeset >= n_math, f"MathJax typeset {typeset} of the {n_math} formulas of {page} offline"
    text = _VisibleText()
    text.feed(dom)
    seen = "".join(text.parts)
    for raw in ("\\(", "\\)", "\\[", "\\]"):
        i = seen.find(raw)
        assert i < 0, f"raw math left in {page}: …{seen[max(0, i - 60):i + 60]}…"


MEASURE = """<!doctype html><html><body style="margin:0">
<iframe id="f" src="%(url)s" style="width:1280px;height:900px;border:0"></iframe>
<pre id="result">pending</pre>
<script>
document.getElementById("f").addEventListener("load", function () {
  var d = this.contentDocument, out = {};
  var items = d.querySelectorAll(".bd-header .navbar-brand, .bd-header .navbar-nav > li.nav-item, " +
                                 ".bd-header .search-button, .bd-header .search-button-field, " +
                                 ".bd-header .theme-switch-button");
  out.header_tops = []; out.header_heights = [];
  items.forEach(function (e) {
    var r = e.getBoundingClientRect();
    if (r.width > 0) { out.header_tops.push(r.top); out.header_heights.push(r.height); }
  });
  out.header_items = out.header_tops.length;
  var article = d.querySelector(".bd-article").getBoundingClientRect();
  out.blocks = 0; out.overflowing = []; out.wrapped = []; out.outputs_scrolling = [];
  d.querySelectorAll("div.highlight pre").forEach(function (p) {
    var r = p.getBoundingClientRect();
    var output = p.closest(".cell_output") !== null;   // a notebook's printed table: may scroll, in the column
    if (!output) out.blocks += 1;
    // the characters a line of this block holds: a line of the project's 120 columns must not wrap (a trailing
    // comment would land on a line of its own)
    var s = d.createElement("span"); s.textContent = "0123456789"; s.style.whiteSpace = "pre";
    p.appendChild(s); var cw = s.getBoundingClientRect().width / 10; p.removeChild(s);
    var cs = d.defaultView.getComputedStyle(p);
    var fits = (p.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight)) / cw;
    p.textContent.split("\\n").forEach(function (line) {
      if (!output && line.length <= 120 && line.length > fits) out.wrapped.push(line.slice(0, 80));
    });
    if (output) out.outputs_scrolling.push(p.scrollWidth > p.clientWidth + 1);
    if ((!output && p.scrollWidth > p.clientWidth + 1) || r.right > article.right + 1)
      out.overflowing.push(p.textContent.split("\\n")[0].slice(0, 80));
  });
  document.getElementById("result").textContent = JSON.stringify(out);
});
</script></body></html>"""


@pytest.mark.parametrize("page", LAYOUT_PAGES)
def test_top_bar_is_one_line_and_code_stays_in_the_column_at_1280px(site, page, tmp_path):
    probe = tmp_path / "probe.html"
    probe.write_text(MEASURE % {"url": (site / page).as_uri()}, encoding="utf-8")
    dom = _dump_dom(probe.as_uri(), width=1300, extra=("--allow-file-access-from-files",))
    raw = dom.split('<pre id="result">', 1)[1].split("</pre>", 1)[0]
    assert raw != "pending", f"the probe page could not measure {page}"
    m = json.loads(html.unescape(raw))
    assert m["header_items"] >= 4, f"top bar of {page}: expected brand, links, search and theme, got {m}"
    tops = m["header_tops"]
    # one line: every item of the bar starts within half an item's height of the others
    assert max(tops) - min(tops) < 0.5 * max(m["header_heights"]), f"the top bar of {page} wraps at 1280 px: {m}"
    if page == "guide/worksheets.html":
        assert m["blocks"] >= 5, f"expected the worksheets page's code blocks, found {m['blocks']}"
    assert not m["overflowing"], f"code blocks of {page} run past the column at 1280 px: {m['overflowing']}"
    assert not m["wrapped"], f"code lines of at most 120 characters wrap on {page} at 1280 px: {m['wrapped']}"
    if page.startswith("notebooks/01"):   # its first output (the setup line, 94 characters) was cut at the edge
        assert m["outputs_scrolling"] and not m["outputs_scrolling"][0], m

