"""``worksheet serve`` without a browser: the page's requests made with urllib.

* the page's verdicts (what /api/answers returns, and the page shows) equal ``transformer-np check --json`` on the
  saved file, for 20 generated sheets with random answers (honest, slipped so that later steps follow, perturbed,
  garbage, blank, rows left incomplete, numbers typed in several ways);
* the answers are saved as typed and restored; the problem and the template's comments are kept byte for byte;
* refused requests (no token, a wrong one, a foreign Host or Origin, a 10 MB body, chunked, not JSON) leave the
  sheet byte-identical, and a request that is accepted does change it (so the refusals are what kept it);
* the command prints the address with its token and stops on Ctrl-C and after its idle timeout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import serve_helpers as sh
import sheet_helpers

from transformer_np.cli import main as cli_main
from transformer_np.worksheets import load_worksheet
from transformer_np.worksheets.serve import MAX_BODY
from transformer_np.worksheets.serve_save import grid_shape
from transformer_np.worksheets.steps import build_steps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _check_json(path: str, capsys) -> dict:
    capsys.readouterr()
    status = cli_main(["check", path, "--json"])
    out = capsys.readouterr().out
    assert status in (0, 1), out
    return json.loads(out)


def _config(seed: int) -> dict:
    r = np.random.default_rng(1000 + seed)
    heads = int(r.choice([1, 2]))
    return dict(tokens=int(r.integers(2, 5)), d_model=4, heads=heads, norm=str(r.choice(["post", "pre"])),
                backward=bool(r.integers(0, 2)), seed=seed, layers=int(r.integers(1, 3)),
                activation=str(r.choice(["relu", "gelu"])), decimals=int(r.integers(1, 4)))


def _typed(s: str, r) -> str:
    """The same number typed another way a person might: '+0.5', '.5', '5.0e-1', or as it is."""
    k = int(r.integers(0, 5))
    neg = s.startswith("-")
    body = s[1:] if neg else s
    if k == 0 and not neg:
        return "+" + s
    if k == 1 and body.startswith("0."):
        return ("-" if neg else "") + body[1:]
    if k == 2 and "." in body:
        whole, frac = body.split(".")
        return ("-" if neg else "") + f"{whole}{frac[:1]}.{frac[1:] or '0'}e-1"
    return s


def _random_cells(raw: dict, r) -> dict:
    """Answers a class might type: an honest pencil student, who (half the time) slips at one step and works on
    from their own numbers; then each step kept, perturbed, replaced by garbage, left blank or partly filled."""
    ws, steps = sheet_helpers.steps_of(raw)
    plant = None
    if r.random() < 0.6:
        s = steps[int(r.integers(0, len(steps)))]
        delta = float(r.choice([-1, 1])) * float(r.integers(3, 40)) * 10.0 ** -ws.decimals

        def slip(vals, s=s, delta=delta):
            v = np.array(s.fn(*(vals[k] for k in s.inputs)), dtype=float)
            v.flat[0] += delta
            return v
        plant = {s.key: slip}
    answers = sheet_helpers.student(raw, plant=plant)[0]["answers"]
    cells = sh.cells_of(answers, ws, ws.decimals)
    for names in cells.values():
        for grid in names.values():
            mode = r.choice(["keep", "keep", "keep", "perturb", "garbage", "blank", "partial"])
            for row in grid:
                for j, c in enumerate(row):
                    row[j] = _typed(c, r)
            if mode == "perturb":
                i, j = int(r.integers(0, len(grid))), int(r.integers(0, len(grid[0])))
                grid[i][j] = f"{float(grid[i][j]) + float(r.choice([-1, 1])) * 0.37:.{ws.decimals}f}"
            elif mode == "garbage":
                for row in grid:
                    for j in range(len(row)):
                        row[j] = f"{r.uniform(-3, 3):.{ws.decimals}f}"
            elif mode == "blank":
                for row in grid:
                    row[:] = [""] * len(row)
            elif mode == "partial":
                for row in grid:
                    if r.random() < 0.5:
                        row[:] = [""] * len(row)
                    elif len(row) > 1 and r.random() < 0.5:
                        row[int(r.integers(0, len(row)))] = ""
    return cells


@pytest.mark.parametrize("seed", range(20))
def test_the_pages_verdicts_are_check_json_on_the_saved_file(tmp_path, capsys, seed):
    cfg = _config(seed)
    path = sh.sheet(tmp_path, **cfg)
    raw = sh.new_worksheet(**cfg)
    cells = _random_cells(raw, np.random.default_rng(seed))
    before = open(path, encoding="utf-8").read()
    with sh.running(path) as server:
        status, state = sh.request(server, "/api/state")
        assert status == 200
        status, res = sh.request(server, "/api/answers", {"seq": 1, "fingerprint": state["fingerprint"],
                                                          "answers": cells})
        assert status == 200 and res["saved"], res
        assert res["seq"] == 1
        page = res["report"]
        status, again = sh.request(server, "/api/state")
    cli = _check_json(path, capsys)
    assert sh.projection(page) == sh.projection(cli)
    assert {(s["layer"], s["name"]): s["max_abs_error"] for s in page["steps"]} == \
        {(s["layer"], s["name"]): s["max_abs_error"] for s in cli["steps"]}
    assert sh.projection(again["report"]) == sh.projection(cli)          # what a reload shows
    # the problem, and everything before the answers, byte for byte
    head = before[:before.index("[answers.layer1]")]
    after = open(path, encoding="utf-8").read()
    assert after.startswith(head)
    # saved as typed: the values check reads are the typed numbers; rows left incomplete are not saved
    ws = load_worksheet(path)
    restored = {s["id"]: s["cells"] for s in again["steps"]}
    not_saved = {(n["layer"], n["name"]): set(n["rows"]) for n in res["not_saved"]}
    for s in build_steps(ws):
        grid = cells.get(f"layer{s.layer}", {}).get(s.name)
        rows, cols = grid_shape(s.name, ws.n, ws.d_model, ws.d_ff)
        got = restored[f"layer{s.layer}.{s.name}"]
        a = ws.answers.get(s.key)
        if grid is None or all(c == "" for row in grid for c in row):
            assert a is None and got is None
            continue
        skipped = not_saved.get(s.key, set())
        for i, row in enumerate(grid):
            complete = all(c != "" for c in row)
            if not complete or i in skipped:
                assert a is None or not a.mask.reshape(rows, cols)[i].any()
                continue
            # exact: the TOML parser and float() both round the same decimal string correctly
            assert a.value.reshape(rows, cols)[i].tolist() == [float(c) for c in row]
            assert [float(c) for c in got[i]] == [float(c) for c in row]


def test_answers_keyed_by_token_and_the_marks_table_survive_a_save(tmp_path, capsys):
    raw = sh.new_worksheet(seed=4)
    path = sh.sheet(tmp_path, seed=4)
    text = open(path, encoding="utf-8").read()
    t0 = raw["setup"]["tokens"][0]
    text = text.replace("[answers.layer1]\n", f"[answers.layer1]\nlayer_norm_mean = {{ {t0} = 0.5 }}\n", 1)
    text += "\n[marks]\nscores = 2   # the scores matter\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    ws, _ = sheet_helpers.steps_of(raw)
    answers = sheet_helpers.student(raw)[0]["answers"]
    cells = {"layer1": {"scores": sh.cells_of(answers, ws, 2)["layer1"]["scores"]}}
    with sh.running(path) as server:
        _, state = sh.request(server, "/api/state")
        restored = {s["id"]: s["cells"] for s in state["steps"]}["layer1.layer_norm_mean"]
        assert restored == [["0.50"]] + [[""]] * (ws.n - 1)
        status, res = sh.request(server, "/api/answers", {"seq": 1, "fingerprint": state["fingerprint"],
                                                          "answers": cells})
    assert res["saved"], res
    after = open(path, encoding="utf-8").read()
    # the answers' entries replaced (the old one was not sent, so it is gone), the comments and [marks] kept
    lines = "\n".join("  [" + ", ".join(r) + "]," for r in cells["layer1"]["scores"])
    want = text.replace(f"layer_norm_mean = {{ {t0} = 0.5 }}\n", "", 1)
    want = want.replace("\n\n[marks]", f"\nscores = [\n{lines}\n]\n\n[marks]", 1)
    assert after == want
    cli = _check_json(path, capsys)
    # out of the whole sheet (issue 44): scores 2, every other step 1 (the default)
    n_steps = len(cli["steps"])
    assert cli["marks"] == {"awarded": 2, "available": n_steps + 1, "blank": n_steps - 1}
    assert sh.projection(res["report"]) == sh.projection(cli)


def _unchanged(path, before: bytes, mtime: int) -> None:
    with open(path, "rb") as f:
        assert f.read() == before
    assert os.stat(path).st_mtime_ns == mtime


def test_refused_requests_leave_the_sheet_byte_identical(tmp_path):
    path = sh.sheet(tmp_path, seed=2)
    raw = sh.new_worksheet(seed=2)
    ws, _ = sheet_helpers.steps_of(raw)
    cells = sh.cells_of(sheet_helpers.student(raw)[0]["answers"], ws, 2)
    with open(path, "rb") as f:
        before = f.read()
    mtime = os.stat(path).st_mtime_ns
    with sh.running(path) as server:
        _, state = sh.request(server, "/api/state")
        body = {"seq": 1, "fingerprint": state["fingerprint"], "answers": cells}
        host = server.host_header
        good = json.dumps(body).encode()
        # no token, a wrong token, a foreign Host (DNS rebinding), a foreign Origin: 403, nothing read or written
        assert sh.request(server, "/api/answers", body, token=None)[0] == 403
        assert sh.request(server, "/api/answers", body, token="x" * 43)[0] == 403
        assert sh.request(server, "/api/state", token=None)[0] == 403
        assert sh.request(server, "/", token=None)[0] == 403
        assert sh.request(server, "/download", token=None)[0] == 403
        for foreign in ("evil.example:80", f"evil.example:{server.port}", f"localhost.evil.example:{server.port}",
                        "127.0.0.1", f"127.0.0.2:{server.port}"):
            status, data = sh.raw_request(server, f"POST /api/answers?token={server.token} HTTP/1.1\r\nHost: {foreign}"
                                          f"\r\nContent-Type: application/json\r\nContent-Length: {len(good)}", good)
            assert status == 403, (foreign, data[:200])
        status, _ = sh.request(server, "/api/answers", body, headers={"Origin": "http://evil.example"})
        assert status == 403
        _unchanged(path, before, mtime)
        # a 10 MB body: refused from its Content-Length, unread
        big = b"[" + b"0," * (5 * 1024 * 1024 - 1) + b"0]"
        assert len(big) > 10 * 1024 * 1024 > MAX_BODY
        status, data = sh.raw_request(server, f"POST /api/answers?token={server.token} HTTP/1.1\r\nHost: {host}\r\n"
                                              f"Content-Type: application/json\r\nContent-Length: {len(big)}", big)
        assert status == 413, data[:200]
        # chunked (no length), a missing length, not JSON, the wrong type: refused
        status, _ = sh.raw_request(server, f"POST /api/answers?token={server.token} HTTP/1.1\r\nHost: {host}\r\n"
                                           f"Content-Type: application/json\r\nTransfer-Encoding: chunked",
                                   b"5\r\n[1,2]\r\n0\r\n\r\n")
        assert status == 411
        status, _ = sh.raw_request(server, f"POST /api/answers?token={server.token} HTTP/1.1\r\nHost: {host}\r\n"
                                           f"Content-Type: application/json")
        assert status == 411
        assert sh.request(server, "/api/answers", b"{not json")[0] == 400
        assert sh.request(server, "/api/answers", good, headers={"Content-Type": "text/plain"})[0] == 415
        # no request names a file: only the fixed routes exist
        for route in ("/static/../serve.py", "/static/index.html", "/serve.py", "/static/serve.js/..",
                      "/..%2Fserve.py", "/api/answers/../../x"):
            assert sh.request(server, route)[0] == 404, route
        # cells that are not numbers: answered, not saved, said so
        bad = json.loads(good)
        bad["answers"]["layer1"]["Q"][0][0] = "1,5"
        status, res = sh.request(server, "/api/answers", bad)
        assert status == 200 and not res["saved"] and "not a number" in res["save_error"]
        _unchanged(path, before, mtime)
        # the same request as above, with the token and the right Host, does change the sheet
        status, res = sh.request(server, "/api/answers", body)
        assert status == 200 and res["saved"]
    with open(path, "rb") as f:
        assert f.read() != before


def test_a_sheet_whose_problem_changed_on_disk_is_not_overwritten(tmp_path):
    path = sh.sheet(tmp_path, seed=1)
    with sh.running(path) as server:
        _, state = sh.request(server, "/api/state")
        text = open(path, encoding="utf-8").read().replace("decimals = 2", "decimals = 3")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        status, res = sh.request(server, "/api/answers", {"seq": 1, "fingerprint": state["fingerprint"],
                                                          "answers": {}})
        assert status == 200 and not res["saved"] and "changed on disk" in res["save_error"]
        assert open(path, encoding="utf-8").read() == text
        _, fresh = sh.request(server, "/api/state")                 # a reload reads the new problem
        assert fresh["decimals"] == 3 and fresh["fingerprint"] != state["fingerprint"]


def test_download_gives_the_saved_file(tmp_path):
    path = sh.sheet(tmp_path, seed=6)
    with sh.running(path) as server:
        _, state = sh.request(server, "/api/state")
        cells = {"layer1": {"Q": [["1", "0", "0.5", ".25"]] + [[""] * 4] * (len(state["tokens"]) - 1)}}
        _, res = sh.request(server, "/api/answers", {"seq": 1, "fingerprint": state["fingerprint"],
                                                     "answers": cells})
        assert res["saved"]
        status, data = sh.request(server, "/download")
    assert status == 200
    with open(path, "rb") as f:
        assert data == f.read()
    assert f"{state['tokens'][0]} = [1, 0, 0.5, 0.25]" in data.decode()


def _sigint_as_at_a_terminal() -> None:
    """Ctrl-C's default disposition in the server: a test run started with ``&`` in a script inherits SIGINT
    ignored, and the Ctrl-C test would then wait in vain."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(path: str, *extra: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "transformer_np", "worksheet", "serve", path, "--no-browser",
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                            preexec_fn=_sigint_as_at_a_terminal)
    deadline = time.monotonic() + 60
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        m = re.search(r"http://127\.0\.0\.1:\d+/\?token=[\w-]{40,}", line)
        if m:
            return proc, m.group()
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"no address printed: {''.join(lines)} {proc.stderr.read()}")


def _get(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status


def test_the_command_prints_the_address_and_stops_on_ctrl_c(tmp_path):
    proc, url = _start(sh.sheet(tmp_path, seed=3))
    try:
        assert _get(url) == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert "Stopped (Ctrl-C)" in proc.stderr.read()


def test_the_command_stops_after_its_idle_timeout(tmp_path):
    proc, url = _start(sh.sheet(tmp_path, seed=3), "--idle-timeout", "1.5")
    try:
        assert _get(url) == 200
        t0 = time.monotonic()
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 20
    finally:
        proc.kill()
    assert "no request for 1.5 s" in proc.stderr.read()


def test_a_bad_sheet_or_port_is_one_line_and_status_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[setup]\ntokens = [\"a\"]\n", encoding="utf-8")
    assert cli_main(["worksheet", "serve", str(bad), "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.toml" in err and "[input]" in err
    assert cli_main(["worksheet", "serve", sh.sheet(tmp_path), "--no-browser", "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err
