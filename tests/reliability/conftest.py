"""Fixtures of the reliability suite (issue 16): hostile files built in tmp_path, the command line run
in-process, and a subprocess that reports its own time and peak RSS for the "tiny input, huge size"
cases.

The memory limit is pinned to 8 GB for every test here (``TRANSFORMER_NP_MAX_BYTES=8G``) so the
refusals do not depend on the machine: every hostile case asks for far more than that.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
LIMIT = "8G"


@pytest.fixture(autouse=True)
def _pinned_limit(monkeypatch):
    monkeypatch.setenv("TRANSFORMER_NP_MAX_BYTES", LIMIT)


@pytest.fixture
def cli(capsys):
    """Run ``transformer-np ARGS`` in-process; returns (exit status, stdout, stderr lines)."""
    from transformer_np.cli import main

    def run(*argv):
        code = main([str(a) for a in argv])
        out = capsys.readouterr()
        return code, out.out, [line for line in out.err.splitlines() if line.strip()]
    return run


@pytest.fixture
def refused_cli(cli):
    """Run a command that must be refused: exit 2, exactly one line on stderr, no traceback; returns it."""
    def run(*argv):
        code, _, err = cli(*argv)
        assert code == 2, (code, err)
        assert len(err) == 1, err
        assert "Traceback" not in err[0]
        return err[0]
    return run


_PROBE = """
import json, resource, sys, time
if {rlimit_as}:          # an address-space limit, as a container or `ulimit -v` sets one
    resource.setrlimit(resource.RLIMIT_AS, ({rlimit_as}, {rlimit_as}))

def peak_rss_mb():
    # VmHWM is the peak RSS of this process's own memory map, fresh at exec. ru_maxrss is not: Linux
    # carries the pre-exec peak over, which after a (v)fork is the parent's — a big pytest worker.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

t0, c0 = time.perf_counter(), time.process_time()
out = {{"error": None, "message": "", "exit": None}}
try:
{body}
except BaseException as e:
    out.update(error=type(e).__name__, message=str(e), bases=[c.__name__ for c in type(e).__mro__])
out["seconds"] = time.process_time() - c0          # CPU seconds: the work, whatever else the machine runs
out["wall_seconds"] = time.perf_counter() - t0
out["max_rss_mb"] = peak_rss_mb()
print("PROBE " + json.dumps(out))
"""


@pytest.fixture
def probe():
    """Run ``body`` (Python statements; may set out["exit"]) in a fresh interpreter with the repository
    on the path and the 8 GB limit (``limit``; None = no TRANSFORMER_NP_MAX_BYTES, the machine's own limit) and,
    with ``rlimit_as``, that address-space limit (RLIMIT_AS, bytes); returns the child's own report: error class
    name and message, its bases, the CPU seconds the body took (``seconds``: the work done, not the neighbours'
    load on a shared machine; ``wall_seconds`` beside it) and the child's peak RSS in MB (interpreter and imports
    included)."""
    def run(body: str, timeout: float = 120, rlimit_as: int = 0, limit: str | None = LIMIT) -> dict:
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}
        env.pop("TRANSFORMER_NP_MAX_BYTES", None)
        if limit is not None:
            env["TRANSFORMER_NP_MAX_BYTES"] = limit
        code = _PROBE.format(body=textwrap.indent(textwrap.dedent(body).strip(), "    "), rlimit_as=int(rlimit_as))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")]
        assert lines, f"no report from the child (status {r.returncode}): {r.stderr[-2000:]}"
        rep = json.loads(lines[-1][len("PROBE "):])
        rep["stderr"] = r.stderr
        return rep
    return run


# ----------------------------------------------------------------------------- model folders
TINY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "bank", "river", ".", ","] + \
    [chr(c) for c in range(ord("a"), ord("z") + 1)]


def _tiny_tokenizer_json(vocab: dict) -> dict:
    return {"version": "1.0", "added_tokens": [{"id": vocab[t], "content": t, "special": True}
                                               for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t in vocab],
            "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                           "strip_accents": None, "lowercase": True},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}},
                                          {"SpecialToken": {"id": "[SEP]", "type_id": 0}}]},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 100, "vocab": vocab}}


@pytest.fixture
def tiny_folder(tmp_path):
    """A random 2-layer BERT folder written with NumPy only (:func:`write_tiny_folder`)."""
    return write_tiny_folder(tmp_path / "tiny")


def write_tiny_folder(folder):
    """A random 2-layer BERT folder written with NumPy only, at ``folder`` (made): config.json, model.safetensors,
    tokenizer.json, tokenizer_config.json, modules.json, 1_Pooling/config.json, sentence_bert_config.json.
    (scripts/hostile_set.py builds its set on the same folder.)"""
    from transformer_np.io.interop import hf_dict_from_config, hf_state_dict_from_params
    from transformer_np.io.safetensors import save_safetensors
    from transformer_np.model.config import EncoderConfig
    from transformer_np.model.params import init_params

    folder.mkdir(parents=True)
    cfg = EncoderConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, vocab_size=len(TINY_VOCAB), max_len=32,
                        type_vocab_size=2, norm_position="post", final_layer_norm=False)
    params = init_params(cfg, seed=0, dtype=np.float32)
    params["pooler.W"] = np.zeros((16, 16), np.float32)
    params["pooler.b"] = np.zeros(16, np.float32)
    save_safetensors(folder / "model.safetensors", hf_state_dict_from_params(params, cfg))
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", **hf_dict_from_config(cfg)}))
    vocab = {t: i for i, t in enumerate(TINY_VOCAB)}
    (folder / "tokenizer.json").write_text(json.dumps(_tiny_tokenizer_json(vocab)))
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 32}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 16, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 24}))
    return folder


@pytest.fixture
def minilm_folder(tmp_path):
    """A copy of the installed all-MiniLM-L6-v2 folder in tmp_path (its 90 MB weights symlinked)."""
    from transformer_np.io.pretrained import model_folder

    try:
        src = model_folder("all-MiniLM-L6-v2")
    except ImportError as e:
        pytest.skip(str(e))
    dst = tmp_path / "minilm"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "*.bin", "*.onnx", "*.h5"))
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    return dst


def edit_json(path: Path, fn) -> None:
    """Rewrite the JSON file ``path`` after ``fn(value)`` changed the parsed value in place
    (``fn``'s return value is ignored)."""
    value = json.loads(path.read_text())
    fn(value)
    path.write_text(json.dumps(value))


@pytest.fixture
def edit():
    return edit_json
