#!/usr/bin/env python
"""The measurements behind the default tolerances of ``transformer_np.testing`` (docs/guide/testing.md).

    nice python scripts/compare_tolerances.py                 # every case, ~3 min on 2 cores
    python scripts/compare_tolerances.py --quick              # the small cases only
    python scripts/compare_tolerances.py --out tolerances.json

For every supported case — ``nn.TransformerEncoderLayer`` / ``nn.TransformerEncoder`` variants, every Hugging Face
family (small configs, eager and SDPA attention, a padded batch; with the family's own initialisation, with every
weight random at unit gain — matrices N(0, 1/fan-in) — and, as a stress case kept out of the worst-case summary,
at gain √2, where the attention scores grow layer after layer), a BERT-base-sized layer (hidden 768,
seq 128, batch 2) of torch and of transformers, and (not with ``--quick``) a 12-layer BERT-base ``BertModel`` —
in float32 and float64, :func:`compare_with_torch` runs and, per kind of tensor (output, input gradient,
parameter gradients), two numbers are recorded:

* ``norm``: the largest norm-relative error ``norm_rel`` = ‖ours − ref‖ / N (the norm-wise criterion's quantity);
* ``elem``: the smallest rtol (with atol = rtol/10) the element-wise criterion would need,
  max |ours − ref| / (|ref| + S/10).

Then planted bugs on the BERT-base-sized torch layer (forward hooks on the torch side): the FFN output scaled by
1 + 1e-4 and by 1 + 1e-5, tanh-GELU computed where the layer's exact GELU is declared, and both LayerNorms computed
with eps 1e-12 where 1e-5 is declared — the same two numbers, which must exceed the defaults for the bug to be
caught, and whether the defaults catch it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

KINDS = ("output", "input grad", "grad")


def summarize(rep) -> dict:
    out = {}
    for kind in KINDS:
        es = [e for e in rep.entries if e.kind == kind]
        if not es:
            continue
        out[kind] = {"norm": max(e.norm_rel for e in es), "elem": max(e.violation(1.0, 0.1)[0] for e in es)}
    out["passes the defaults"] = rep.ok
    out["at the defaults"] = {"element-wise ratio": max(e.violation(rep.rtol, rep.atol)[0] for e in rep.entries),
                              "norm-wise ratio": max(e.norm_ratio(rep.norm_rtol) for e in rep.entries)}
    return out


def randomise(model, seed: int, gain: float = 1.0) -> None:
    """Every weight random: matrices and tables N(0, gain²/fan-in), biases 0.3·N(0,1), LayerNorm γ = 1 + 0.3·N(0,1)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if p.ndim == 2:
                p.copy_(z * gain / p.shape[1] ** 0.5)
            elif "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1 + 0.3 * z)
            else:
                p.copy_(0.3 * z)


def torch_cases(quick: bool):
    import torch

    d, h, f = 32, 4, 64
    for norm_first in (False, True):
        for act in ("relu", "gelu"):
            for batch_first in (True, False):
                torch.manual_seed(0)
                layer = torch.nn.TransformerEncoderLayer(d, h, f, dropout=0.0, activation=act, norm_first=norm_first,
                                                         batch_first=batch_first)
                randomise(layer, 1)
                yield (f"TransformerEncoderLayer({d}, {h}, {f}) norm_first={norm_first} {act} "
                       f"batch_first={batch_first}", layer, "x", batch_first)
    for norm_first in (False, True):
        for final in (True, False):
            torch.manual_seed(0)
            enc = torch.nn.TransformerEncoder(
                torch.nn.TransformerEncoderLayer(d, h, f, dropout=0.0, norm_first=norm_first, batch_first=True), 3,
                norm=torch.nn.LayerNorm(d) if final else None, enable_nested_tensor=False)
            randomise(enc, 2)
            yield f"TransformerEncoder 3 layers norm_first={norm_first} final norm={final}", enc, "x", True


def hf_configs():
    import transformers as T

    common = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                  max_position_embeddings=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  pad_token_id=1)
    return {"bert": T.BertConfig(**common), "ernie": T.ErnieConfig(**common),
            "roberta": T.RobertaConfig(**common), "xlm-roberta": T.XLMRobertaConfig(**common),
            "camembert": T.CamembertConfig(**common), "data2vec-text": T.Data2VecTextConfig(**common),
            "distilbert": T.DistilBertConfig(vocab_size=40, dim=16, n_layers=2, n_heads=2, hidden_dim=32,
                                             max_position_embeddings=24, dropout=0.0, attention_dropout=0.0,
                                             pad_token_id=1),
            "albert": T.AlbertConfig(**common, embedding_size=8),
            "electra": T.ElectraConfig(**common, embedding_size=8)}


def hf_cases():
    import torch
    import transformers as T

    for k, (name, cfg) in enumerate(hf_configs().items()):
        for attn in ("eager", "sdpa"):
            for init in ("HF init", "random", "stress"):
                torch.manual_seed(k)
                model = T.AutoModel.from_config(cfg, attn_implementation=attn)
                if init != "HF init":
                    randomise(model, k, 1.0 if init == "random" else 2 ** 0.5)
                yield f"{name} ({attn}, {init})", model, "ids", True


def padded_ids(B, n, vocab, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, vocab, size=(B, n))
    am = np.ones((B, n), dtype=np.int64)
    am[-1, n - n // 3:] = 0
    ids[am == 0] = 1
    return ids, am


def run_case(model, what, batch_first, dt, B=3, n=9):
    from transformer_np.testing import compare_with_torch

    if what == "ids":
        ids, am = padded_ids(B, n, 40, 0)
        return compare_with_torch(model, ids, attention_mask=am, dtype=dt)
    d = next(model.parameters()).shape[-1]
    x = np.random.default_rng(0).standard_normal((B, n, d) if batch_first else (n, B, d))
    am = np.ones((B, n), dtype=np.int64)
    am[-1, n - n // 3:] = 0
    return compare_with_torch(model, x, attention_mask=am, dtype=dt)


def bert_base_cases(full: bool):
    import torch
    import transformers as T

    torch.manual_seed(0)
    for norm_first in (False, True):
        layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True,
                                                 norm_first=norm_first)
        yield f"TransformerEncoderLayer(768, 12, 3072) gelu norm_first={norm_first}", layer, "x", True
    cfg = T.BertConfig(num_hidden_layers=1 if not full else 12, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    model = T.BertModel(cfg)
    yield "BertLayer (bert-base)", model.encoder.layer[0], "x", True
    if full:
        yield "BertModel 12 layers (bert-base)", model, "bert-ids", True


def run_big(model, what, dt):
    from transformer_np.testing import compare_with_torch

    if what == "bert-ids":
        ids = np.random.default_rng(1).integers(1000, 30000, size=(2, 128))
        return compare_with_torch(model, ids, dtype=dt)
    x = np.random.default_rng(0).standard_normal((2, 128, 768))
    return compare_with_torch(model, x, dtype=dt)


def plant(layer, bug: str):
    """Forward hooks on (a copy of) the torch layer: the torch side computes the bug, its declared config does not."""
    import copy

    import torch
    import torch.nn.functional as F

    m = copy.deepcopy(layer)
    if bug.startswith("FFN output x"):
        factor = 1 + float(bug.split("1 + ")[1])
        m.linear2.register_forward_hook(lambda mod, inp, out: out * factor)
    elif bug == "tanh-GELU for exact GELU":
        seen = {}
        m.linear1.register_forward_hook(lambda mod, inp, out: seen.__setitem__("h", out))
        m.linear2.register_forward_pre_hook(lambda mod, inp: (F.gelu(seen["h"], approximate="tanh"),))
    elif bug == "LayerNorm eps 1e-12 for 1e-5":
        for norm in (m.norm1, m.norm2):
            norm.register_forward_hook(lambda mod, inp, out: F.layer_norm(inp[0], mod.normalized_shape, mod.weight,
                                                                          mod.bias, 1e-12))
    else:
        raise ValueError(bug)
    assert isinstance(m, torch.nn.Module)
    return m


BUGS = ("FFN output x 1 + 1e-4", "FFN output x 1 + 1e-5", "tanh-GELU for exact GELU", "LayerNorm eps 1e-12 for 1e-5")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the small cases only")
    ap.add_argument("--full", action="store_true", help="also the 12-layer BERT-base model")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    import torch

    from transformer_np.testing import NORM_TOLERANCES, TOLERANCES

    res = {"defaults": {np.dtype(dt).name: {"rtol": TOLERANCES[np.dtype(dt)][0], "atol": TOLERANCES[np.dtype(dt)][1],
                                            "norm_rtol": NORM_TOLERANCES[np.dtype(dt)]}
                        for dt in (np.float32, np.float64)},
           "machine": {"torch": torch.__version__, "numpy": np.__version__}, "honest": {}, "planted": {}}
    cases = [(label, m, what, bf, False) for label, m, what, bf in list(torch_cases(args.quick)) + list(hf_cases())]
    if not args.quick:
        cases += [(label, m, what, True, True) for label, m, what, _ in bert_base_cases(args.full)]
    for label, m, what, bf, big in cases:
        for dt in (np.float32, np.float64):
            rep = run_big(m, what, dt) if big else run_case(m, what, bf, dt)
            res["honest"][f"{np.dtype(dt).name}: {label}"] = summarize(rep)
            print(np.dtype(dt).name, label, res["honest"][f"{np.dtype(dt).name}: {label}"], flush=True)
    if not args.quick:
        from transformer_np.testing import compare_with_torch

        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True)
        x = np.random.default_rng(0).standard_normal((2, 128, 768))
        for bug in BUGS:
            for dt in (np.float32, np.float64):
                rep = compare_with_torch(plant(layer, bug), x, dtype=dt)
                s = summarize(rep)
                res["planted"][f"{np.dtype(dt).name}: {bug}"] = s
                print(np.dtype(dt).name, bug, s, flush=True)
    for dt in ("float32", "float64"):
        rows = {k: v for k, v in res["honest"].items() if k.startswith(dt) and "stress" not in k}
        res[f"worst honest {dt}"] = {kind: {q: max(v[kind][q] for v in rows.values() if kind in v)
                                            for q in ("norm", "elem")} for kind in KINDS}
        res[f"worst honest {dt}"]["at the defaults"] = {
            q: max(v["at the defaults"][q] for v in rows.values()) for q in ("element-wise ratio", "norm-wise ratio")}
    text = json.dumps(res, indent=2)
    print(json.dumps({k: res[k] for k in res if k.startswith("worst")}, indent=2))
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
