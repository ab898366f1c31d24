#!/usr/bin/env python
"""The measurements behind the half-precision defaults of ``transformer_np.testing`` (``HALF_TOLERANCES``,
docs/guide/testing.md, "Half precision").

    nice python scripts/compare_tolerances_half.py            # every case, 3 seeds; ~10 min on 2 cores
    python scripts/compare_tolerances_half.py --quick         # the small cases only
    python scripts/compare_tolerances_half.py --out half.json

The cases of ``scripts/compare_tolerances.py`` — the ``nn.TransformerEncoderLayer`` / ``nn.TransformerEncoder``
variants, the nine Hugging Face families (eager and SDPA, their own initialisation and every weight random; the
gain-√2 stress case kept out of the worst-case summary) — and bare ``BertLayer``/``RobertaLayer`` (hidden 32), a
padded batch, each with 3 input seeds (inputs and upstream gradient); then (not with ``--quick``) the
BERT-base-sized layers (hidden 768, seq 128, batch 2; torch's Post-LN and Pre-LN, transformers' ``BertLayer``).
Each runs with ``dtype=torch.float16`` and ``torch.bfloat16``: the module in that dtype, forward and backward,
against the float64 reference on the same rounded values. Per kind of
tensor (output, input gradient, parameter gradients), two numbers are recorded:

* ``norm``: the largest norm-relative error ``norm_rel`` (the norm-wise criterion's quantity);
* ``elem``: the smallest rtol (with atol = rtol/10) the element-wise criterion would need,
  max |ours − ref| / (|ref| + S/10).

Then planted bugs on the BERT-base-sized Post-LN torch layer (forward hooks on the torch side, as in
``compare_tolerances.py``): the FFN output scaled by 1 + 1e-1, 1 + 1e-2 and 1 + 1e-3, tanh-GELU where exact GELU is
declared, LayerNorm eps 1e-12 where 1e-5 is declared — and whether the defaults catch them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from compare_tolerances import (
    KINDS,
    bert_base_cases,
    hf_cases,
    padded_ids,
    plant,
    randomise,
    summarize,
    torch_cases,
)

HALF_BUGS = ("FFN output x 1 + 1e-1", "FFN output x 1 + 1e-2", "FFN output x 1 + 1e-3", "tanh-GELU for exact GELU",
             "LayerNorm eps 1e-12 for 1e-5")


def hf_layer_cases():
    """Bare Hugging Face layers (hidden 32): ``BertLayer`` and ``RobertaLayer`` at HF's initialisation and random."""
    import torch
    import transformers as T

    cfg = dict(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=1)
    for name, cls in (("BertLayer", T.BertModel), ("RobertaLayer", T.RobertaModel)):
        for init in ("HF init", "random"):
            torch.manual_seed(0)
            layer = cls(getattr(T, cls.__name__.replace("Model", "Config"))(**cfg)).eval().encoder.layer[0]
            if init == "random":
                randomise(layer, 3)
            yield f"{name}(32) ({init})", layer, "x", True


def run_small(model, what, batch_first, dt, seed, B=3, n=9):
    from transformer_np.testing import compare_with_torch

    if what == "ids":
        ids, am = padded_ids(B, n, 40, seed)
        return compare_with_torch(model, ids, attention_mask=am, dtype=dt, seed=seed)
    d = next(model.parameters()).shape[-1]
    x = np.random.default_rng(seed).standard_normal((B, n, d) if batch_first else (n, B, d))
    am = np.ones((B, n), dtype=np.int64)
    am[-1, n - n // 3:] = 0
    return compare_with_torch(model, x, attention_mask=am, dtype=dt, seed=seed)


def run_big(model, what, dt, seed):
    from transformer_np.testing import compare_with_torch

    x = np.random.default_rng(seed).standard_normal((2, 128, 768))
    return compare_with_torch(model, x, dtype=dt, seed=seed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the small cases only")
    ap.add_argument("--seeds", type=int, default=3, help="input seeds per small case (default 3)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    import torch

    from transformer_np.testing import HALF_TOLERANCES

    dtypes = (torch.float16, torch.bfloat16)
    res = {"defaults": {k: dict(zip(("rtol", "atol", "norm_rtol"), v)) for k, v in HALF_TOLERANCES.items()},
           "machine": {"torch": torch.__version__, "numpy": np.__version__}, "honest": {}, "planted": {}}
    for label, m, what, bf in list(torch_cases(args.quick)) + list(hf_layer_cases()) + list(hf_cases()):
        for dt in dtypes:
            for seed in range(args.seeds):
                key = f"{str(dt)[6:]}: {label} seed {seed}"
                res["honest"][key] = summarize(run_small(m, what, bf, dt, seed))
                print(key, res["honest"][key], flush=True)
    if not args.quick:
        for label, m, what, _ in bert_base_cases(False):
            for dt in dtypes:
                key = f"{str(dt)[6:]}: {label}"
                res["honest"][key] = summarize(run_big(m, what, dt, 0))
                print(key, res["honest"][key], flush=True)
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True)
        for bug in HALF_BUGS:
            for dt in dtypes:
                key = f"{str(dt)[6:]}: {bug}"
                res["planted"][key] = summarize(run_big(plant(layer, bug), "x", dt, 0))
                print(key, res["planted"][key], flush=True)
    for dt in ("float16", "bfloat16"):
        rows = {k: v for k, v in res["honest"].items() if k.startswith(dt + ":") and "stress" not in k}
        res[f"worst honest {dt}"] = {kind: {q: max(v[kind][q] for v in rows.values() if kind in v)
                                            for q in ("norm", "elem")} for kind in KINDS}
        res[f"worst honest {dt}"]["at the defaults"] = {
            q: max(v["at the defaults"][q] for v in rows.values()) for q in ("element-wise ratio", "norm-wise ratio")}
        worst = max(rows, key=lambda k: rows[k]["at the defaults"]["norm-wise ratio"])
        res[f"worst honest {dt}"]["worst case, norm-wise"] = worst
    print(json.dumps({k: res[k] for k in res if k.startswith("worst")}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
