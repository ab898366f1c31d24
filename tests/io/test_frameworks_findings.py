"""The findings of docs/guide/frameworks.md, reproduced: scripts/frameworks_findings.py --quick, and the properties
the page states about its numbers (the full-size numbers come from the same script without --quick)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the findings compare with PyTorch: pip install torch==2.13.0")
pytest.importorskip("transformers", reason="pip install transformers")
pytestmark = [pytest.mark.torch, pytest.mark.hf]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    out = tmp_path_factory.mktemp("findings") / "findings.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "frameworks_findings.py"), "--quick", "--out",
                          str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())


def test_float32_attention_backends_are_of_one_order(findings):
    layer = findings["attention"]["layer"]
    for name in ("torch float32, default backend", "torch float32, math backend", "ours float32"):
        assert all(1e-9 < e < 1e-5 for e in layer[name].values()), (name, layer[name])   # float32 round-off
    for name in ("torch float64, default backend", "ours float64"):
        assert all(e < 1e-13 for e in layer[name].values()), (name, layer[name])
    default, math = layer["torch float32, default backend"], layer["torch float32, math backend"]
    assert all(default[k] <= 10 * math[k] and math[k] <= 10 * default[k] for k in default), (default, math)


def test_hf_zeroes_the_pad_row_which_the_loss_depends_on(findings):
    pad = findings["pad_row"]
    assert pad["hf row [PAD] max |grad|"] == 0.0
    assert pad["finite difference row norm"] > 1.0                        # the loss does depend on that row
    assert pad["ours vs central finite difference (scaled max error)"] < 1e-6


def test_key_bias_gradient_is_round_off_on_both_sides(findings):
    for dt, rel in (("float64", 1e-14), ("float32", 1e-5)):
        kb = findings["key_bias"][dt]
        assert kb["max |dL/db_K| ours"] <= rel * kb["max |dL/dW_K| torch"], kb
        assert kb["max |dL/db_K| torch"] <= rel * kb["max |dL/dW_K| torch"], kb


def test_jax_default_attention_is_float32_inside(findings):
    pytest.importorskip("flax", reason="pip install 'transformer_np[jax]'")
    fast = findings["jax_softmax"]["jax.nn.dot_product_attention (Flax default)"]
    exact = findings["jax_softmax"]["Flax explicit attention path"]
    assert all(1e-9 < e < 1e-5 for e in fast.values()), fast
    assert all(e < 1e-13 for e in exact.values()), exact


def test_default_tolerances_pass_with_margin(findings):
    for label, t in findings["tolerances"].items():
        assert t["worst ratio"] <= 0.1, (label, t)


def test_every_family_agrees_to_float64_round_off(findings):
    fam = findings["families"]
    assert {k.split(" (")[0] for k in fam} == {"bert", "ernie", "roberta", "xlm-roberta", "camembert",
                                               "data2vec-text", "distilbert", "albert", "electra"}
    for label, r in fam.items():
        assert r["passes the float64 defaults"] and r["output"] < 1e-13 and r["worst gradient"] < 1e-12, (label, r)
