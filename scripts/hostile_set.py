"""Generate issue 37's hostile-folder set and refuse every case in a fresh process under RLIMIT_AS = 4 GB.

    python scripts/hostile_set.py [--quick] [--json]

Cases (each a copy of a tiny random BERT folder, or a tiny training run, with one file replaced):
safetensors headers of 1-100 MB in every JSON shape of tests/hostile.header_shapes, lying shapes and offsets,
sparse tensors of 3-16 GiB (no disk used), a vocabulary of 10 M lines, and every special file (FIFO, /dev/zero,
socket, folder, /proc/self/pagemap) in place of each file of the folder and of the checkpoint. Each child runs
``transformer-np embed`` (or ``train --resume``) and reports exit status, stderr, CPU seconds of the refusal and
its peak RSS (VmHWM); a case passes when it exits 2 with one line naming the file, in < 1 s of CPU and < 200 MB,
and the folder is byte-identical afterwards. Prints every case and the slowest and the largest refusal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from hostile import GIB, header_shapes, make_special, special_kinds, write_long_vocab, write_st  # noqa: E402
from hostile import write_st_sparse as write_st_sparse  # noqa: E402

AS_LIMIT = 4 * GIB
FOLDER_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "modules.json", "1_Pooling/config.json",
                "sentence_bert_config.json", "model.safetensors", "vocab.txt"]

_CHILD = r"""
import contextlib, io, json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from transformer_np.cli import build_parser, main
build_parser()
err = io.StringIO()
t0 = time.process_time()
with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    code = main({argv!r})
cpu = time.process_time() - t0
hwm = [int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps({{"exit": code, "stderr": err.getvalue(), "cpu": cpu, "rss_mb": hwm}}))
"""


def tiny_folder(root: Path) -> Path:
    """The reliability tests' tiny BERT folder (tests/reliability/conftest.py), at ``root/tiny``."""
    sys.path.insert(0, str(REPO / "tests" / "reliability"))
    from conftest import write_tiny_folder

    return write_tiny_folder(root / "tiny")


def snapshot(folder: Path) -> dict:
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out[str(p)] = (st.st_mode, st.st_size, os.readlink(p) if p.is_symlink() else
                       (p.read_bytes() if p.is_file() and st.st_size < 2 ** 20 else st.st_mtime_ns))
    return out


def refuse(argv: list[str], folder: Path, name: str) -> dict:
    before = snapshot(folder)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRANSFORMER_NP_MAX_BYTES": "8G"}
    r = subprocess.run([sys.executable, "-c", _CHILD.format(limit=AS_LIMIT, argv=argv)], capture_output=True,
                       text=True, env=env, timeout=120)
    try:
        rep = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        rep = {"exit": r.returncode, "stderr": r.stderr[-500:], "cpu": float("nan"), "rss_mb": float("nan")}
    lines = [ln for ln in rep["stderr"].splitlines() if ln.strip()]
    rep["line"] = lines[0] if lines else ""
    rep["ok"] = (rep["exit"] == 2 and len(lines) == 1 and name in lines[0] and rep["cpu"] < 1.0
                 and rep["rss_mb"] < 200 and snapshot(folder) == before)
    return rep


def cases(root: Path, quick: bool):
    """Yield (label, argv, folder, name expected in the line, cleanup)."""
    sizes = [1, 16, 100] if quick else [1, 4, 16, 64, 100]
    for mb in sizes:
        for shape, raw in header_shapes(mb * 10 ** 6).items():
            f = tiny_folder(root / f"h{mb}-{shape.replace(' ', '_')}")
            write_st(f / "model.safetensors", raw)
            yield f"header {mb} MB: {shape}", f, "model.safetensors"
    f = tiny_folder(root / "rank65")
    write_st(f / "model.safetensors", {"t": {"dtype": "F32", "shape": [1] * 65, "data_offsets": [0, 4]}}, b"\0" * 4)
    yield "shape of 65 dimensions", f, "model.safetensors"
    f = tiny_folder(root / "offsets")
    write_st(f / "model.safetensors", {"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 2 ** 40]}}, b"\0" * 16)
    yield "offsets past the end of the file", f, "model.safetensors"
    f = tiny_folder(root / "product")
    write_st(f / "model.safetensors", {"t": {"dtype": "F32", "shape": [2 ** 17, 2 ** 17],
                                             "data_offsets": [0, 2 ** 36]}}, data_len=2 ** 20)
    yield "a shape whose product passes the file", f, "model.safetensors"
    for gib in (3, 16):
        f = tiny_folder(root / f"sparse{gib}")
        from transformer_np.io.safetensors import load_safetensors
        state = load_safetensors(f / "model.safetensors")
        write_st_sparse(f / "model.safetensors", state, {"extra.weight": ("F32", (gib * 2 ** 28,))})
        yield f"unexpected sparse tensor of {gib} GiB", f, "extra.weight"
        f = tiny_folder(root / f"sparse-emb{gib}")
        state = load_safetensors(f / "model.safetensors")
        del state["embeddings.word_embeddings.weight"]
        write_st_sparse(f / "model.safetensors", state,
                        {"embeddings.word_embeddings.weight": ("F32", (gib * 2 ** 24, 16))})
        yield f"misshapen sparse embedding of {gib} GiB", f, "embeddings.word_embeddings.weight"
    f = tiny_folder(root / "vocab10m")
    (f / "tokenizer.json").unlink()
    write_long_vocab(f / "vocab.txt")
    yield "vocab.txt of 10 M lines", f, "vocab.txt"
    for name in FOLDER_FILES:
        for kind in special_kinds():
            f = tiny_folder(root / f"special-{name.replace('/', '_')}-{kind}")
            if name == "vocab.txt":
                (f / "tokenizer.json").unlink()
            sock = make_special(f / name, kind)
            yield f"{kind} in place of {name}", f, name
            if sock is not None:
                sock.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="header sizes 1, 16 and 100 MB only")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for label, folder, name in cases(root, args.quick):
            rep = refuse(["embed", "--model", str(folder), "a sentence"], folder, name)
            results.append({"case": label, **{k: rep[k] for k in ("ok", "exit", "cpu", "rss_mb", "line")}})
            if not args.json:
                print(f"{'ok  ' if rep['ok'] else 'FAIL'} {rep['cpu']:6.3f} s {rep['rss_mb']:6.1f} MB  {label}: "
                      f"{rep['line'][:150]}", flush=True)
            shutil.rmtree(folder.parent, ignore_errors=True)
    slowest = max(results, key=lambda r: r["cpu"])
    largest = max(results, key=lambda r: r["rss_mb"])
    summary = {"cases": len(results), "failed": [r["case"] for r in results if not r["ok"]],
               "slowest": slowest, "largest": largest}
    if args.json:
        print(json.dumps({"results": results, **summary}, indent=1))
    else:
        print(f"\n{len(results)} cases, {len(summary['failed'])} failed {summary['failed']}")
        print(f"slowest: {slowest['cpu']:.3f} s CPU — {slowest['case']}")
        print(f"largest: {largest['rss_mb']:.1f} MB peak — {largest['case']}")
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
