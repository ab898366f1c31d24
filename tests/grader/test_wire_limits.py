"""The grader never blocks and stays small (issue 43, items 2 and 3): every read and write to a child has a
deadline, a received frame is bounded before it is parsed, handed-out caches are bounded in bytes, the per-call
time covers handed-out calls, limits count CPU time (a busy machine costs no marks), and cells of any size run
whole.

The attacks run in a child process as a student's cell would; where the grader's memory is the question, the
grader itself runs in a subprocess that reports its peak resident size (``ru_maxrss``), so this test process's
own history does not blur the number.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_grade import SEED, grade, notebook, solution_cells, student_cells

from transformer_np.grader import wire
from transformer_np.grader.grading import POINTS
from transformer_np.grader.sandbox import Limits

REPO = Path(__file__).resolve().parents[2]

# A cell that finds the pipe the child replies on (its number is in the child's command line; else the first
# descriptor that is a pipe's write end) and writes raw frames into it, as a student can.
_FORGE = '''
import json, os, stat, struct, sys

def _reply_fd():
    try:
        return int(json.loads(sys.argv[1])["rep_fd"])
    except Exception:
        pass
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and os.write(fd, b"") == 0:
                return fd
        except OSError:
            continue

def _frame(head: bytes, blobs: bytes = b"") -> bytes:
    payload = struct.pack(">I", len(head)) + head + blobs
    return struct.pack(">Q", len(payload)) + payload

FD = _reply_fd()
'''


def _run_grader(script: str, timeout: float = 240) -> dict:
    """Run ``script`` (which prints one JSON line last) in a fresh Python from the repository root, in its own
    session; on a timeout its whole process group is killed and the test fails saying so."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the grader was still running after {timeout} s")
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- forged frames
def test_forged_handout_frames_do_not_hang_the_run_and_the_classmate_is_graded(tmp_path):
    # the child floods its reply pipe with "handout" requests and never reads the grader's replies: once the
    # request pipe is full, a grader writing without a deadline blocks for ever
    flood = _FORGE + textwrap.dedent('''
        head = json.dumps({"op": "handout", "name": "transformer_np.ops.softmax.softmax",
                           "value": {"t": "list", "v": [{"t": "list", "v": []}, {"t": "dict", "v": []}]},
                           "blobs": []}).encode()
        one = _frame(head)
        for _ in range(50_000):
            os.write(FD, one)
        while True:
            pass
    ''')
    subs = tmp_path / "subs"
    subs.mkdir()
    notebook(subs / "a_attacker.ipynb", student_cells("01_softmax") + [flood])
    notebook(subs / "b_honest.ipynb", solution_cells("01_softmax"))
    out = tmp_path / "grades.csv"
    result = _run_grader(f'''
        import json, sys
        from transformer_np.cli import main
        code = main(["grade", "01_softmax", {str(subs)!r}, "--timeout", "2", "--submission-timeout", "30",
                     "--seed", "{SEED}", "--csv", {str(out)!r}])
        print(json.dumps({{"code": code}}))
    ''')
    assert result["code"] == 0
    rows = {Path(r["file"]).name: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    full = sum(POINTS["01_softmax"].values())
    assert float(rows["b_honest.ipynb"]["score"]) == full, rows            # exact: points are small sums
    assert float(rows["a_attacker.ipynb"]["score"]) == 0.0, rows


# ----------------------------------------------------------------------------- large and bloated messages
_MESSAGES = _FORGE + '''
import time
KIND = {kind!r}
if KIND == "32 MB":           # one frame of ~32 MB: a header of 1.2 million small values
    node = b'{{"t":"float","v":"0x1p+0"}},'
    body = node * ((32_000_000 - 64) // len(node))
    head = b'{{"op":"reply","ok":true,"blobs":[],"value":{{"t":"list","v":[' + body[:-1] + b']}}}}'
else:                         # under the frame limit, over the header's bytes
    head = b'{{"op":"reply","ok":true,"blobs":[],"value":{{"t":"str","v":"' + b"x" * 12_000_000 + b'"}}}}'
os.write(FD, _frame(head))
time.sleep(600)
'''


@pytest.mark.parametrize("kind", ["32 MB", "long header"])
def test_a_bloated_message_is_refused_before_it_is_parsed(kind):
    result = _run_grader(f'''
        import json, resource, time
        from transformer_np.grader.sandbox import Limits, Sandbox, SandboxGone
        with Sandbox(limits=Limits(call_timeout=20, submission_timeout=60)) as sb:
            base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            try:
                sb.run_cell(0, {_MESSAGES.format(kind=kind)!r})
                reason = None
            except SandboxGone as gone:
                reason = gone.reason
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
        print(json.dumps({{"reason": reason, "grown_mb": grown / 1024}}))
    ''', timeout=300)
    assert result["reason"] is not None and "malformed reply" in result["reason"], result
    # the frame is at most REPLY_LIMIT bytes, its header bounded before json.loads: the bound below is the
    # frame buffer plus a parse of MAX_HEADER_TOKENS values, with room for the allocator (was 1.7 GB)
    assert result["grown_mb"] < 120, result


def test_the_header_bounds_are_derived_from_the_node_bound():
    from transformer_np.io.jsonfile import scan_json

    assert wire.MAX_HEADER == wire.HEADER_BYTES_PER_NODE * wire.MAX_NODES
    # an honest reply of MAX_NODES values passes the header check; one value more is refused while decoding
    honest = wire.pack({"op": "reply", "ok": True}, [complex(-1e300, 1e-300)] * (wire.MAX_NODES - 1))
    header, value = wire.unpack(honest, scan=scan_json)
    assert len(value) == wire.MAX_NODES - 1
    with pytest.raises(wire.WireError, match="too large"):
        wire.pack({"op": "reply"}, [0.5] * wire.MAX_NODES)
    forged = json.dumps({"op": "reply", "blobs": [], "value": {"t": "list", "v": [{"t": "none"}] * wire.MAX_NODES}})
    with pytest.raises(wire.WireError, match="malformed"):
        wire.unpack(len(forged).to_bytes(4, "big") + forged.encode(), scan=scan_json)
    # a header short in bytes but of many values is refused by the scan, before json.loads builds anything
    lists = b'{"op":"reply","blobs":[],"value":{"t":"list","v":[' + b"[]," * 400_000 + b'[]]}}'
    assert len(lists) < wire.MAX_HEADER
    with pytest.raises(wire.WireError, match="values"):
        wire.unpack(len(lists).to_bytes(4, "big") + lists, scan=scan_json)
    deep = b'{"value":' + b"[" * 5000 + b"]" * 5000 + b"}"
    with pytest.raises(wire.WireError, match="nested"):
        wire.unpack(len(deep).to_bytes(4, "big") + deep, scan=scan_json)


# ----------------------------------------------------------------------------- handed-out functions
_CACHE_BOMB = """
import numpy as np
from transformer_np.ops.attention import attention_backward, attention_forward
rng = np.random.default_rng(0)
Q, K, V = (rng.standard_normal((1, 8, 512, 1)) for _ in range(3))     # small to send, 8 x 512 x 512 weights
caches = [attention_forward(Q, K, V)[1] for _ in range(40)]
dQ = attention_backward(np.ones((1, 8, 512, 1)), caches[-1])[0]
assert dQ.shape == Q.shape
try:
    attention_backward(np.ones((1, 8, 512, 1)), caches[0])
    FIRST = "kept"
except ValueError as e:
    FIRST = str(e)
"""


def test_handed_out_caches_are_bounded_in_bytes():
    # each call leaves a ~17 MB cache (its attention weights) in the grader; all 40 were kept (~700 MB; a
    # notebook reached 6.2 GB)
    result = _run_grader(f'''
        import json, resource
        from transformer_np.grader.sandbox import Limits, Sandbox
        allowed = ("transformer_np.ops.attention.attention_forward",
                   "transformer_np.ops.attention.attention_backward")
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with Sandbox(allowed, limits=Limits(call_timeout=120, submission_timeout=240)) as sb:
            ran = sb.run_cell(0, {_CACHE_BOMB!r})
            first = sb.run_cell(1, "assert FIRST != 'kept', FIRST\\nprint(FIRST)")
            out = sb.output
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
        print(json.dumps({{"ran": ran, "first": first, "out": out, "grown_mb": grown / 1024}}))
    ''', timeout=400)
    assert result["ran"]["ok"], result
    assert result["first"]["ok"], result                       # the oldest cache was dropped …
    assert "no longer kept" in result["out"], result           # … and the backward asked for it says so
    assert result["grown_mb"] < 250, result                    # 64 MB of caches + one call's work (was ~800 MB)


def test_a_handed_out_call_that_would_allocate_gigabytes_is_refused_before_it_runs():
    # three arrays of 40,000 numbers ask for 40,000 x 40,000 attention weights (12.8 GB) in the grader; the
    # grader runs under a 3 GB address-space limit here, so a regression is a MemoryError, not a dead machine
    result = _run_grader('''
        import json, resource
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        from transformer_np.grader.sandbox import Limits, Sandbox
        with Sandbox(("transformer_np.ops.attention.attention_forward",), limits=Limits(call_timeout=20)) as sb:
            r = sb.run_cell(0, "import numpy as np\\nfrom transformer_np.ops.attention import attention_forward\\n"
                               "q = np.ones((1, 1, 40_000, 1))\\nattention_forward(q, q, q)\\n")
        print(json.dumps(r))
    ''')
    assert not result["ok"] and result["error"]["type"] == "ValueError", result
    assert "makes at most" in result["error"]["message"], result


def test_handout_calls_in_a_loop_end_at_the_call_time_limit():
    from transformer_np.grader.sandbox import Sandbox, SandboxGone

    loop = ("import numpy as np\nfrom transformer_np.ops.erf import erf\nx = np.ones(100)\n"
            "while True:\n    erf(x)\n")
    with Sandbox(("transformer_np.ops.erf.erf",), limits=Limits(call_timeout=1.0, submission_timeout=60)) as sb:
        with pytest.raises(SandboxGone) as gone:
            sb.run_cell(0, loop)
    # the cell's own limit ended it (its CPU time, or its wall-clock cap on a loaded machine), not the
    # submission's: the time spent serving its handed-out calls counts as the call's
    reason = gone.value.reason
    assert reason.startswith("running cell 0 took longer than"), reason
    assert "1 s of CPU time" in reason, reason


def test_a_cell_that_waits_ends_at_the_wall_clock_cap_and_says_so():
    from transformer_np.grader.sandbox import Sandbox, SandboxGone

    with Sandbox(limits=Limits(call_timeout=0.5, wall_factor=4)) as sb:
        with pytest.raises(SandboxGone) as gone:
            sb.run_cell(0, "import time\ntime.sleep(100)\n")
    assert "2 s of wall-clock time" in gone.value.reason, gone.value.reason


# ----------------------------------------------------------------------------- cells of any size
def test_a_50000_character_honest_cell_scores_full_marks(tmp_path):
    cells = solution_cells("01_softmax")
    at = next(i for i, src in enumerate(cells) if "def softmax_forward" in src)
    derivation = "".join(f"# step {k}: subtracting the row maximum leaves softmax unchanged, since "
                         f"exp(x - m) / sum exp(x - m) = exp(x) / sum exp(x)\n" for k in range(600))
    cells[at] = derivation + cells[at]
    assert len(cells[at]) > 50_000
    g = grade(tmp_path, cells, "01_softmax")
    assert g.score == g.out_of, [c.feedback for c in g.checks]          # exact: points are small sums
    assert not [n for n in g.notes if f"cell {at} " in n], g.notes    # the long cell ran whole, without error


def test_the_child_side_still_cuts_its_strings():
    blobs: list = []
    sent = wire.encode("x" * (wire.MAX_STR + 5), blobs)
    assert len(sent["v"]) == wire.MAX_STR                              # exact: a length
    assert len(wire.encode("x" * (wire.MAX_STR + 5), blobs, max_str=None)["v"]) == wire.MAX_STR + 5


# ----------------------------------------------------------------------------- a busy machine
@pytest.mark.slow
def test_the_six_solutions_score_full_marks_on_a_busy_machine(tmp_path):
    burners = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"]) for _ in range(8)]
    try:
        limits = Limits(call_timeout=3.0, submission_timeout=90.0)       # the limits test_grade.py uses
        for name in sorted(POINTS):
            g = grade(tmp_path, solution_cells(name), name, limits=limits)
            assert g.score == g.out_of, (name, [c.feedback for c in g.checks if c.feedback])
    finally:
        for p in burners:
            p.kill()
        for p in burners:
            p.wait()
