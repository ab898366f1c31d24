"""``worksheet serve`` in a headless Chromium, driven with Selenium, offline.

A student opens the page of a generated sheet, types an honest rounded answer to every step (moving with Enter,
as the page's keyboard help says): every step is marked ``correct``, as ``check --json`` says of the saved file.
Then a slip: one number of one step changed and the later steps worked on from it — that step ``wrong``, the later
ones ``follows`` (or ``correct`` where the slip does not reach), the diagnosis shown beside the step and at the top,
all equal to ``check --json`` on the saved file. A reload restores every number typed. Arrow keys move between
cells; every cell has its own label; the page does not scroll sideways at 1280 px nor at a phone's 390 px; no
request leaves 127.0.0.1. The screenshots docs/guide/worksheets.md shows are taken here: set
``TNP_SCREENSHOTS=docs/_static`` to write them there (otherwise they go to the test's temporary folder).

A class sheet (``reveal = false``, forward and backward, one slip): with the keyboard only, Tab forward and
Shift+Tab backward through every cell, each focused cell fully visible below the sticky bar; axe-core (the npm
package, which scripts/test_browser.sh installs into .axe-core/, git-ignored; ``TNP_AXE_JS`` points elsewhere)
finds no violation; the wrong cell is highlighted, a ``follows`` step says what it follows from, and the correct
value of the slipped cell is nowhere on the page nor in ``check``'s output.

Needs Debian's ``chromium`` and ``chromium-driver`` (/usr/bin/chromedriver: Selenium is pointed at it and never
downloads a driver) and ``selenium`` (in the ``test`` extra); outside CI a missing one skips, in CI it fails
(tests/conftest.py), as tests/test_docs_offline.py does.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import serve_helpers as sh
import sheet_helpers

from transformer_np.cli import main as cli_main
from transformer_np.worksheets.generate import to_toml
from transformer_np.worksheets.serve_page import unicode_text

pytestmark = [pytest.mark.slow, pytest.mark.browser]   # the browser lane: scripts/test_browser.sh

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVERS = ("chromedriver",)
SHOTS = ("worksheet_serve_correct.png", "worksheet_serve_slip.png", "worksheet_serve_phone.png")


AXE_JS = Path(os.environ.get("TNP_AXE_JS") or
              Path(__file__).resolve().parents[2] / ".axe-core" / "node_modules" / "axe-core" / "axe.min.js")


def _which(names: tuple[str, ...], install: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(f"not found: {', '.join(names)} ({install})")


@pytest.fixture
def driver():
    webdriver = pytest.importorskip("selenium.webdriver", reason='pip install selenium (in the "test" extra)')
    from selenium.webdriver.chrome.service import Service

    browser = _which(BROWSERS, "apt-get install chromium")
    chromedriver = _which(DRIVERS, "apt-get install chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = browser            # both paths given: Selenium Manager has nothing to look up
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--window-size=1280,900",
                "--force-device-scale-factor=1", "--hide-scrollbars"):
        options.add_argument(arg)
    d = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    d.set_page_load_timeout(60)
    yield d
    d.quit()


def _settled(d, timeout: float = 60.0) -> None:
    """Wait until the page has sent its last change and shown the answer to it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = d.execute_script("var b = document.body.dataset; return [b.sync, b.sent, b.shown];")
        if b[0] == "idle" and b[1] == b[2]:
            return
        time.sleep(0.1)
    raise AssertionError(f"the page did not settle: {b}")


def _verdicts(d) -> list:
    return d.execute_script("return Array.from(document.querySelectorAll('section.step')).map(function (s) {"
                            " return [+s.dataset.layer, s.dataset.name, s.dataset.verdict]; });")


def _check_json(path: str, capsys) -> dict:
    capsys.readouterr()
    assert cli_main(["check", path, "--json"]) in (0, 1)
    return json.loads(capsys.readouterr().out)


def _cells(d) -> dict:
    """Every input's value, by (step id, row, column)."""
    got = d.execute_script("return Array.from(document.querySelectorAll('input[data-step]')).map(function (i) {"
                           " return [i.dataset.step, +i.dataset.r, +i.dataset.c, i.value]; });")
    return {(s, r, c): v for s, r, c, v in got}


def _typed_order(cells: dict, steps: list) -> list[str]:
    """The page's cells in its reading order (step by step, row by row) with the values to type."""
    out = []
    for s in steps:
        grid = cells[f"layer{s.layer}"][s.name]
        out += [v for row in grid for v in row]
    return out


def _no_sideways_scroll(d, width: int) -> None:
    d.set_window_size(width, 900)
    time.sleep(0.3)
    inner, page = d.execute_script("return [window.innerWidth, document.documentElement.scrollWidth];")
    assert page <= inner, f"at {width} px the page scrolls sideways ({page} > {inner})"


def _save(d, name: str, folder: Path, element=None) -> Path:
    if element is not None:
        d.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
        time.sleep(0.2)
    path = folder / name
    assert d.save_screenshot(str(path)), path
    return path


def test_type_a_sheet_slip_and_reload(driver, tmp_path, capsys):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    d = driver
    shots = Path(os.environ.get("TNP_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    cfg = dict(tokens=3, d_model=4, seed=11, activation="relu", decimals=2)
    path = sh.sheet(tmp_path, **cfg)
    raw = sh.new_worksheet(**cfg)
    ws, steps = sheet_helpers.steps_of(raw)
    honest = sh.cells_of(sheet_helpers.student(raw)[0]["answers"], ws, ws.decimals)

    with sh.running(path) as server:
        d.get(server.url)
        _settled(d)
        inputs = d.find_elements(By.CSS_SELECTOR, "input[data-step]")
        values = _typed_order(honest, steps)
        assert len(inputs) == len(values)
        labels = [i.get_attribute("aria-label") for i in inputs]
        assert all(labels) and len(set(labels)) == len(labels), "every cell needs its own label"

        # arrow keys: down to the next row, right at the end of a number to the next cell
        inputs[0].click()
        inputs[0].send_keys(Keys.ARROW_DOWN)
        assert d.switch_to.active_element == inputs[ws.d_model]          # Q has d_model columns
        d.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)
        assert d.switch_to.active_element == inputs[ws.d_model + 1]

        # the honest answer set, typed cell after cell with Enter
        inputs[0].click()
        for v in values:
            d.switch_to.active_element.send_keys(v + Keys.ENTER)
        _settled(d)
        cli = _check_json(path, capsys)
        want = [[s["layer"], s["name"], s["verdict"]] for s in cli["steps"]]
        assert {v for _, _, v in want} == {"correct"}, want
        assert _verdicts(d) == want
        assert "correct" in d.find_element(By.ID, "marks").text
        _no_sideways_scroll(d, 1280)
        _save(d, SHOTS[0], shots, d.find_element(By.CSS_SELECTOR, "h2.part"))

        # a slip: one number of attention_weights, and the later steps worked on from it
        at = next(k for k, s in enumerate(steps) if s.name == "attention_weights")
        slip = steps[at].key

        def slipped(vals, s=steps[at]):
            v = np.array(s.fn(*(vals[k] for k in s.inputs)), dtype=float)
            v[0, 0] += 0.23
            return v
        after = sh.cells_of(sheet_helpers.student(raw, plant={slip: slipped})[0]["answers"], ws, ws.decimals)
        for i, (old, new) in enumerate(zip(values, _typed_order(after, steps))):
            if old != new:
                inputs[i].click()
                inputs[i].send_keys(Keys.CONTROL, "a")
                inputs[i].send_keys(new)
        _settled(d)
        cli = _check_json(path, capsys)
        want = [[s["layer"], s["name"], s["verdict"]] for s in cli["steps"]]
        assert _verdicts(d) == want
        assert want[at][2] == "wrong" and all(v in ("follows", "correct") for _, _, v in want[at + 1:])
        assert all(v == "correct" for _, _, v in want[:at]) and "follows" in {v for _, _, v in want[at + 1:]}
        fm = cli["first_mistake"]
        assert (fm["layer"], fm["name"]) == slip
        step = d.find_element(By.ID, f"step-layer{slip[0]}.{slip[1]}")
        diagnosis = step.find_element(By.CSS_SELECTOR, ".diagnosis")
        shown_fm = unicode_text(fm["explanation"])                  # in the notation of the page's formulas
        assert diagnosis.is_displayed() and shown_fm in diagnosis.text
        assert fm["diagnosis"].replace("_", " ") in diagnosis.text
        top = d.find_element(By.ID, "mistake")
        assert top.is_displayed() and shown_fm in top.text
        _save(d, SHOTS[1], shots, step)
        d.set_window_size(390, 844)
        time.sleep(0.3)
        _no_sideways_scroll(d, 390)
        _save(d, SHOTS[2], shots, step)
        d.set_window_size(1280, 900)

        # reload: every number typed is back, and the same verdicts
        typed = _cells(d)
        d.refresh()
        _settled(d)
        assert _cells(d) == typed
        assert _verdicts(d) == want

        # offline: every resource came from this server
        urls = d.execute_script("return performance.getEntriesByType('resource').map(function (e) { return e.name; })"
                                ".concat([location.href]);")
        assert urls and all(u.startswith(f"http://{server.host_header}/") for u in urls), urls
    for name in SHOTS:
        assert (shots / name).stat().st_size < 400_000, f"{name}: keep the screenshots small"


def _focus_visible(d) -> dict:
    """Where the focused element is, against the sticky bar and the window."""
    return d.execute_script(
        "var e = document.activeElement, r = e.getBoundingClientRect(),"
        " bar = document.querySelector('header.bar').getBoundingClientRect();"
        " var sticky = getComputedStyle(document.querySelector('header.bar')).position === 'sticky';"
        " return {tag: e.tagName, cell: !!(e.dataset && e.dataset.step), i: e.dataset ? +e.dataset.i : -1,"
        " top: r.top, bottom: r.bottom, bar: sticky ? bar.bottom : 0, height: window.innerHeight,"
        " inBar: !!e.closest('header.bar') || e.classList.contains('skip')};")   # the skip link is drawn over the bar


def _walk(d, key, n_cells: int) -> list[int]:
    """Press ``key`` (Tab or Shift+Tab) until every cell was focused once in this direction; each time a cell is
    focused it must be fully visible: below the sticky bar and above the window's bottom edge."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    seen, hidden = [], []
    for _ in range(n_cells + 40):
        if key == "tab":
            ActionChains(d).send_keys(Keys.TAB).perform()
        else:
            ActionChains(d).key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT).perform()
        f = _focus_visible(d)
        if f["cell"]:
            seen.append(f["i"])
            if f["top"] < f["bar"] - 0.5 or f["bottom"] > f["height"] + 0.5:
                hidden.append(f)
        elif not f["inBar"] and f["tag"] != "BODY" and (f["top"] < f["bar"] - 0.5 or f["bottom"] > f["height"] + 0.5):
            hidden.append(f)
        if len(set(seen)) == n_cells and not f["cell"]:
            break
    assert not hidden, f"{len(hidden)} focused elements not fully visible ({key}), e.g. {hidden[:3]}"
    return seen


def _axe(d) -> list:
    d.execute_script(AXE_JS.read_text(encoding="utf-8"))
    d.set_script_timeout(60)
    return d.execute_async_script(
        "var done = arguments[arguments.length - 1];"
        " axe.run(document, {resultTypes: ['violations']}).then(function (r) {"
        " done(r.violations.map(function (v) { return {id: v.id, impact: v.impact, nodes: v.nodes.length,"
        " help: v.help, first: v.nodes[0] && v.nodes[0].target}; })); })"
        ".catch(function (e) { done([{id: 'axe-error', help: String(e)}]); });")


def test_class_sheet_keyboard_axe_and_no_answers(driver, tmp_path, capsys):
    from selenium.webdriver.common.by import By

    if not AXE_JS.is_file():
        pytest.skip(f"axe-core not found at {AXE_JS}: bash scripts/test_browser.sh installs it with npm")
    d = driver
    raw = sh.new_worksheet(tokens=3, d_model=4, d_ff=4, seed=21, backward=True, activation="relu", decimals=3)
    raw["setup"]["reveal"] = False                     # as worksheet class writes it
    ws, steps = sheet_helpers.steps_of(raw)
    at = next(k for k, s in enumerate(steps) if s.name == "ffn_hidden")
    honest, vals = sheet_helpers.student(raw)
    text0 = to_toml(honest, answers=honest["answers"], template=False)
    written = sheet_helpers.half_away(vals[steps[at].key], 3)
    # a cell past the relu (so written in ffn_activation too), its value nowhere else on the sheet
    cell = next(ix for ix, x in np.ndenumerate(written) if text0.count(f"{x:.3f}") <= 2 and x > 0.2)
    correct = f"{written[cell]:.3f}"

    def slipped(v_in, s=steps[at]):
        v = np.array(s.fn(*(v_in[k] for k in s.inputs)), dtype=float)
        v[cell] += 0.5
        return v
    answered = sheet_helpers.student(raw, plant={steps[at].key: slipped})[0]
    path = tmp_path / "class_sheet.toml"
    path.write_text(to_toml(answered, answers=answered["answers"], template=False), encoding="utf-8")

    with sh.running(str(path)) as server:
        d.get(server.url)
        _settled(d)
        n = len(d.find_elements(By.CSS_SELECTOR, "input[data-step]"))
        assert n > 100
        # keyboard only: from the top of the page, forward through every cell, then back
        d.execute_script("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0);")
        forward = _walk(d, "tab", n)
        assert forward == list(range(n)), "Tab visits every cell once, in order"
        backward = _walk(d, "shift", n)
        assert backward == list(range(n - 1, -1, -1)), "Shift+Tab visits every cell once, in reverse"
        d.set_window_size(770, 900)                   # a narrower window: the bar wraps into more lines
        time.sleep(0.3)
        assert d.execute_script("return document.querySelector('header.bar').getBoundingClientRect().height") > 100
        d.execute_script("window.scrollTo(0, document.body.scrollHeight);")
        assert _walk(d, "shift", n) == list(range(n - 1, -1, -1))
        d.set_window_size(1280, 900)
        time.sleep(0.3)

        # the marking as check gives it, the wrong cell highlighted, the follows steps explained
        cli = _check_json(str(path), capsys)
        assert _verdicts(d) == [[s["layer"], s["name"], s["verdict"]] for s in cli["steps"]]
        sec = d.find_element(By.ID, f"step-layer1.{steps[at].name}")
        off = sec.find_elements(By.CSS_SELECTOR, "input.off")
        r, c = (cell[0], cell[1]) if len(cell) == 2 else (0, cell[0])
        assert [(int(i.get_attribute("data-r")), int(i.get_attribute("data-c"))) for i in off] == [(r, c)]
        follows = d.find_elements(By.CSS_SELECTOR, "section.step[data-verdict='follows'] .follows-from")
        assert follows and all(f.text.startswith("Follows from your ") for f in follows)

        # reveal = false: the slipped cell's correct value is nowhere on the page nor in check's output
        page = d.execute_script("return document.documentElement.outerHTML + ' ' + document.body.innerText + ' ' +"
                                " Array.from(document.querySelectorAll('input')).map(function (i) {"
                                " return i.value; }).join(' ');")
        assert correct not in page
        capsys.readouterr()
        assert cli_main(["check", str(path)]) == 1
        assert correct not in capsys.readouterr().out
        assert correct not in json.dumps(cli)

        # axe-core: no violation, with the first mistake and the wrong cell on the page
        violations = _axe(d)
        assert violations == [], violations
        d.set_window_size(390, 844)
        time.sleep(0.3)
        assert _axe(d) == []
        d.set_window_size(1280, 900)
