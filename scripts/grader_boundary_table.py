"""What each mechanism of the grader's boundary closes, measured: each attack run in a child with one mechanism on.

    python scripts/grader_boundary_table.py            # the Markdown table of docs/guide/instructors.md
    python scripts/grader_boundary_table.py --start    # + the child's start time with and without the boundary

Every child runs without its audit hook (the tests-only knob ``_audit_hook=False``), so what is measured is the
kernel's doing. Columns: no mechanism, each mechanism alone (``no_new_privs`` is always set: Landlock and seccomp
need it), and all of them (what ``grade`` uses). A cell says "refused" (the attack failed) or "WORKS". The
parent-death row is measured by SIGKILLing a small grader process and looking for its child a second later.
Needs Linux with Landlock and seccomp; run as the user who grades (the numbers in the docs: root).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformer_np.grader.confine import MECHANISMS  # noqa: E402
from transformer_np.grader.sandbox import Limits, Sandbox  # noqa: E402

COLUMNS = {"none": (), **{m: (m,) for m in MECHANISMS}, "all": MECHANISMS}


def attacks(secret: str, outside: str, port: int) -> dict[str, str]:
    """name → a cell that ends without an exception only when the attack worked."""
    return {
        "read another folder (a classmate's notebook)": f"assert open({secret!r}).read()",
        "import the library from the grader's install": (
            "import os, sys\nroot = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0]))))\n"
            "assert open(os.path.join(root, 'transformer_np', '__init__.py')).read()"),
        "read /etc/shadow (root's files)": "assert open('/etc/shadow').read()",
        "write outside its folder (the --csv file)": f"open({outside!r}, 'a').write('x')",
        "read the grader's memory (/proc/PPID/mem)": (
            "import os\nf = open(f'/proc/{os.getppid()}/mem', 'rb')\n"
            "f.seek(int(open(f'/proc/{os.getppid()}/maps').readline().split('-')[0], 16))\nassert f.read(16)"),
        "read the grader's command line": "import os\nassert open(f'/proc/{os.getppid()}/cmdline', 'rb').read()",
        "signal the grader (kill)": "import os, signal\nos.kill(os.getppid(), signal.SIGCONT)",
        "lower the grader's limits (prlimit)": (
            "import os, resource\nresource.prlimit(os.getppid(), resource.RLIMIT_CORE, "
            "resource.prlimit(os.getppid(), resource.RLIMIT_CORE))"),
        "ptrace the grader": ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                              "assert libc.ptrace(0x4206, os.getppid(), 0, 0) == 0"),
        "start a process (fork)": "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)",
        "run a program (exec /bin/sh)": "import os\nos.execv('/bin/sh', ['sh', '-c', 'exit 0'])",
        "new session (setsid)": "import os\nos.setsid()",
        "connect to 127.0.0.1": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).close()",
    }


def run_table() -> list[str]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        secret = os.path.join(tmp, "alice.ipynb")
        Path(secret).write_text("{}", encoding="utf-8")
        outside = os.path.join(tmp, "grades.csv")
        cells = attacks(secret, outside, port)
        result: dict[str, dict[str, str]] = {name: {} for name in cells}
        for col, only in COLUMNS.items():
            for name, cell in cells.items():
                with Sandbox(limits=Limits(call_timeout=10), _audit_hook=False, _only=only) as sb:
                    try:
                        r = sb.run_cell(0, cell)
                        result[name][col] = "WORKS" if r["ok"] else "refused"
                    except BaseException as e:     # SandboxGone: the child was replaced by /bin/sh
                        result[name][col] = "WORKS" if "ended" in str(e) else f"? {e}"
        result["outlive a SIGKILLed grader"] = {col: outlives(only) for col, only in COLUMNS.items()}
    listener.close()
    head = "| attack (audit hook off) | " + " | ".join(COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for name, row in result.items():
        lines.append(f"| {name} | " + " | ".join(row[c] for c in COLUMNS) + " |")
    return lines


_OUTLIVE = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from transformer_np.grader.sandbox import Sandbox
sb = Sandbox(_audit_hook=False, _only=tuple(a for a in sys.argv[2:]))
sb.start()
sb._send({"op": "cell", "index": 0}, "import time\ntime.sleep(60)")      # the child busy in a student's cell
print(sb._proc.pid, flush=True)
time.sleep(60)
"""


def outlives(only: tuple[str, ...]) -> str:
    proc = subprocess.Popen([sys.executable, "-c", _OUTLIVE, str(ROOT), *only], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    try:
        os.kill(child, 0)
        state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return "refused"
    if state == "Z":
        return "refused"
    os.kill(child, signal.SIGKILL)
    return "WORKS"


def start_times(n: int = 15) -> dict[str, float]:
    """Median wall milliseconds from Sandbox.start() to the child's ready message, with and without the boundary."""
    out = {}
    for label, kw in (("no boundary (confine=False)", {"confine": False}), ("the boundary", {})):
        Sandbox(**kw).__enter__().close()              # the run folder is made once per grader: not counted
        times = []
        for _ in range(n):
            sb = Sandbox(**kw)
            t0 = time.perf_counter()
            sb.start()
            times.append((time.perf_counter() - t0) * 1000)
            sb.close()
        out[label] = statistics.median(times)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", action="store_true", help="also time the child's start")
    args = ap.parse_args()
    print("\n".join(run_table()))
    if args.start:
        for label, ms in start_times().items():
            print(f"child start, {label}: {ms:.0f} ms (median of 15)")
