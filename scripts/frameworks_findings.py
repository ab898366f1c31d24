#!/usr/bin/env python
"""What a reference implementation reveals about the frameworks: the measurements of docs/guide/frameworks.md.

    nice python scripts/frameworks_findings.py            # BERT-base shapes, ~5 min on 2 cores
    python scripts/frameworks_findings.py --quick         # small shapes, ~20 s (what the test runs)
    python scripts/frameworks_findings.py --out findings.json

Four measurements, each printed and returned as JSON:

1. ``attention``: float32 against the float64 truth for an ``nn.TransformerEncoderLayer`` (and, in the full run,
   a 2-layer ``BertModel``) with torch's default ``scaled_dot_product_attention`` backend and with the math
   backend, next to ours in float32. Error = max |a − t| / max |t| per tensor ("scaled max error").
2. ``pad_row``: HF's ``nn.Embedding(padding_idx)`` gradient row against ours and against a central finite
   difference of the loss, with an upstream gradient that is nonzero at padded positions.
3. ``key_bias``: |∂L/∂b_K| (zero in exact arithmetic) on both sides, next to |∂L/∂W_K|.
4. ``jax_softmax``: a float64 Flax encoder with Flax's default attention (``jax.nn.dot_product_attention``, whose
   softmax runs in float32) and with Flax's explicit path, against ours.
5. ``tolerances``: :func:`transformer_np.testing.compare_with_torch` at the default tolerances of each dtype on a
   bert-base ``nn.TransformerEncoderLayer`` and a 12-layer bert-base ``BertModel`` (B = 8, n = 128; small shapes with
   ``--quick``): the worst ratio |ours − ref| / (atol·S + rtol·|ref|) over every element of every tensor
   (≤ 1 passes) and where it is, at the per-layer element-wise defaults (the margins of the defaults, both
   criteria and every supported case, are measured by scripts/compare_tolerances.py).
6. ``families``: every supported Hugging Face family (small random configs, every weight randomised, a padded
   batch, eager and SDPA attention, float64) through :func:`compare_with_torch`: the output's and the worst
   gradient's norm-relative error (the key bias excluded: see 3.).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402


def scaled(a, t) -> float:
    a, t = np.asarray(a, np.float64), np.asarray(t, np.float64)
    return float(np.abs(a - t).max() / np.abs(t).max())


def attention(shape, with_bert: bool) -> dict:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from transformer_np.io.interop import from_torch, to_torch_state_dict
    from transformer_np.model.stack import encoder_backward, encoder_forward

    B, n, d, h, f = shape
    torch.manual_seed(0)
    layer32 = torch.nn.TransformerEncoderLayer(d, h, f, dropout=0.0, activation="gelu", batch_first=True)
    layer64 = torch.nn.TransformerEncoderLayer(d, h, f, dropout=0.0, activation="gelu", batch_first=True,
                                               dtype=torch.float64)
    layer64.load_state_dict({k: v.double() for k, v in layer32.state_dict().items()})   # the same (float32) weights
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, n, d)).astype(np.float32)
    R = rng.standard_normal((B, n, d)).astype(np.float32)
    keys = ("output", "input", "self_attn.in_proj_weight", "linear1.weight")

    def run_torch(m, dt, backend):
        for p in m.parameters():
            p.grad = None
        xt = torch.tensor(x, dtype=dt, requires_grad=True)
        with sdpa_kernel(backend) if backend is not None else _nullcontext():
            out = m(xt)
            out.backward(torch.tensor(R, dtype=dt))
        grads = dict(m.named_parameters())
        return {"output": out.detach().numpy(), "input": xt.grad.numpy(),
                **{k: grads[k].grad.numpy() for k in keys[2:]}}

    def run_ours(dt):
        config, params = from_torch(layer64, dtype=dt)
        H, cache = encoder_forward(params, config, inputs_embeds=x.astype(dt))
        g = encoder_backward(R.astype(dt), cache)
        sd = to_torch_state_dict(g, config)
        return {"output": H, "input": g["inputs_embeds"], **{k: sd[k].numpy() for k in keys[2:]}}

    truth = run_torch(layer64, torch.float64, SDPBackend.MATH)
    runs = {"torch float32, default backend": run_torch(layer32, torch.float32, None),
            "torch float32, math backend": run_torch(layer32, torch.float32, SDPBackend.MATH),
            "ours float32": run_ours(np.float32),
            "torch float64, default backend": run_torch(layer64, torch.float64, None),
            "ours float64": run_ours(np.float64)}
    q = torch.zeros(B, h, n, d // h)
    choice = {str(dt): int(torch._fused_sdp_choice(q.to(dt), q.to(dt), q.to(dt), None, 0.0, False))
              for dt in (torch.float32, torch.float64)}
    out = {"shape": list(shape), "sdpa_choice (0 math, 1 flash, 2 efficient)": choice,
           "layer": {name: {k: scaled(r[k], truth[k]) for k in keys} for name, r in runs.items()}}
    if with_bert:
        out["BertModel 2 layers, bert-base width"] = _bert_attention(B, n)
    return out


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _bert_attention(B: int, n: int) -> dict:
    import torch
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(num_hidden_layers=2, hidden_dropout_prob=0.0,
                                                           attention_probs_dropout_prob=0.0),
                                   add_pooling_layer=False).eval()
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(1000, 30000, size=(B, n)))
    R = rng.standard_normal((B, n, 768))

    def run(dt, backend):
        m = model.to(dt)
        for p in m.parameters():
            p.grad = None
        with sdpa_kernel(backend) if backend is not None else _nullcontext():
            out = m(input_ids=ids).last_hidden_state
            out.backward(torch.tensor(R, dtype=dt))
        res = {"output": out.detach().double().numpy(),
               "encoder.layer.0.attention.self.query.weight":
                   m.encoder.layer[0].attention.self.query.weight.grad.double().numpy(),
               "embeddings.word_embeddings.weight": m.embeddings.word_embeddings.weight.grad.double().numpy()}
        model.to(torch.float32)
        return res

    truth = run(torch.float64, SDPBackend.MATH)
    return {name: {k: scaled(v, truth[k]) for k, v in run(torch.float32, be).items()}
            for name, be in (("torch float32, default backend", None),
                             ("torch float32, math backend", SDPBackend.MATH))}


def _small_bert(seed: int = 0):
    import torch
    import transformers

    cfg = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, pad_token_id=0)
    model = transformers.BertModel(cfg, add_pooling_layer=False).double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            p.copy_(0.5 * z if p.ndim == 2 else (1 + 0.3 * z if name.endswith("LayerNorm.weight") else 0.3 * z))
    return model


def pad_row() -> dict:
    import torch

    from transformer_np.io.interop import from_hf, hf_backward, hf_forward, to_hf_state_dict

    model = _small_bert()
    config, params = from_hf(model)
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 30, size=(2, 8))
    am = np.ones((2, 8), dtype=np.int64)
    am[1, 5:] = 0
    ids[am == 0] = 0                                    # [PAD] = 0 at the padded positions
    R = rng.standard_normal((2, 8, 16))                 # nonzero at padded positions too
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(am)).last_hidden_state
    out.backward(torch.tensor(R))
    hf_row = model.embeddings.word_embeddings.weight.grad[0].numpy()
    H, cache = hf_forward(params, config, input_ids=ids, attention_mask=am)
    ours = to_hf_state_dict(hf_backward(R, cache), config)["embeddings.word_embeddings.weight"][0].numpy()

    def loss(p):
        return float(np.sum(hf_forward(p, config, input_ids=ids, attention_mask=am)[0] * R))

    fd = np.empty(16)
    eps = 1e-6
    for j in range(16):
        plus, minus = dict(params), dict(params)
        for p, s in ((plus, eps), (minus, -eps)):
            p["embeddings.word"] = params["embeddings.word"].copy()
            p["embeddings.word"][0, j] += s
        fd[j] = (loss(plus) - loss(minus)) / (2 * eps)
    return {"hf row [PAD] max |grad|": float(np.abs(hf_row).max()),
            "ours row [PAD] norm": float(np.linalg.norm(ours)),
            "ours vs central finite difference (scaled max error)": scaled(ours, fd),
            "finite difference row norm": float(np.linalg.norm(fd))}


def key_bias() -> dict:
    import torch

    from transformer_np.io.interop import from_hf, hf_backward, hf_forward, to_hf_state_dict

    out = {}
    for dt in (np.float64, np.float32):
        model = _small_bert().to(torch.float64 if dt == np.float64 else torch.float32)
        config, params = from_hf(model)
        rng = np.random.default_rng(2)
        ids = rng.integers(1, 30, size=(2, 8))
        R = rng.standard_normal((2, 8, 16)).astype(dt)
        model(input_ids=torch.tensor(ids)).last_hidden_state.backward(torch.tensor(R))
        H, cache = hf_forward(params, config, input_ids=ids)
        sd = to_hf_state_dict(hf_backward(R, cache), config)
        name = "encoder.layer.0.attention.self.key."
        theirs = dict(model.named_parameters())
        out[np.dtype(dt).name] = {
            "max |dL/db_K| ours": float(np.abs(sd[name + "bias"].numpy()).max()),
            "max |dL/db_K| torch": float(theirs[name + "bias"].grad.abs().max()),
            "max |dL/dW_K| torch": float(theirs[name + "weight"].grad.abs().max())}
    return out


def jax_softmax() -> dict:
    try:
        import jax
    except ImportError:
        return {"skipped": "jax/flax not installed (pip install 'transformer_np[jax]')"}
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from flax import nnx

    from transformer_np import EncoderConfig, encoder_backward, encoder_forward
    from transformer_np.io.interop_jax import from_flax, to_flax
    from transformer_np.model.gradcheck import random_params

    config = EncoderConfig(n_layers=2, d_model=16, n_heads=4, d_ff=32, layer_norm_eps=1e-6)
    params = random_params(config, seed=1)
    rng = np.random.default_rng(0)
    x, R = rng.normal(size=(2, 8, 16)), rng.normal(size=(2, 8, 16))
    H, cache = encoder_forward(params, config, inputs_embeds=x)
    g = encoder_backward(R, cache)
    res = {}
    for fast in (True, False):
        model = to_flax(params, config, fast_attention=fast)

        def loss(m, xx):
            return jnp.sum(m(inputs_embeds=xx) * R)

        gm, gx = nnx.grad(loss, argnums=(0, 1))(model, jnp.asarray(x))
        theirs = from_flax(gm, config)
        label = "jax.nn.dot_product_attention (Flax default)" if fast else "Flax explicit attention path"
        res[label] = {"output": scaled(np.asarray(model(inputs_embeds=jnp.asarray(x))), H),
                      "input grad": scaled(np.asarray(gx), g["inputs_embeds"]),
                      "worst parameter grad (b_K excluded)": max(scaled(theirs[k], g[k]) for k in theirs
                                                                 if not k.endswith("b_K"))}
    return res


def tolerances(quick: bool) -> dict:
    import torch
    import transformers

    from transformer_np.testing import TOLERANCES, compare_with_torch

    B, n, d, h, f = (2, 16, 32, 4, 64) if quick else (8, 128, 768, 12, 3072)
    L = 2 if quick else 12
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, h, f, dropout=0.0, activation="gelu", batch_first=True)
    model = transformers.BertModel(transformers.BertConfig(
        hidden_size=d, num_attention_heads=h, intermediate_size=f, num_hidden_layers=L, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0))
    x = np.random.default_rng(0).standard_normal((B, n, d))
    ids = np.random.default_rng(1).integers(1000, 30000, size=(B, n))
    out = {}
    for dt in (np.float64, np.float32):
        rtol, atol = TOLERANCES[np.dtype(dt)]
        for label, rep in ((f"nn.TransformerEncoderLayer {(B, n, d, h, f)}", compare_with_torch(layer, x, dtype=dt)),
                           (f"BertModel {L} layers, B = {B}, n = {n}", compare_with_torch(model, ids, dtype=dt))):
            worst = max(rep.entries, key=lambda e: e.violation(rtol, atol)[0])
            out[f"{np.dtype(dt).name}: {label}"] = {
                "rtol": rtol, "atol": atol, "worst ratio": worst.violation(rtol, atol)[0], "at": worst.label,
                "worst norm-relative error (key bias excluded)":
                    max(e.norm_rel for e in rep.entries if not e.name.endswith("key.bias"))}
    return out


def families() -> dict:
    import torch
    import transformers as T

    from transformer_np.testing import compare_with_torch

    common = dict(vocab_size=40, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=12,
                  max_position_embeddings=20, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  layer_norm_eps=1e-7, pad_token_id=1)
    configs = {"bert": T.BertConfig(**common), "ernie": T.ErnieConfig(**common),
               "roberta": T.RobertaConfig(**common), "xlm-roberta": T.XLMRobertaConfig(**common),
               "camembert": T.CamembertConfig(**common), "data2vec-text": T.Data2VecTextConfig(**common),
               "distilbert": T.DistilBertConfig(vocab_size=40, dim=8, n_layers=2, n_heads=2, hidden_dim=12,
                                                max_position_embeddings=20, dropout=0.0, attention_dropout=0.0,
                                                pad_token_id=1),
               "albert": T.AlbertConfig(**common, embedding_size=6), "electra": T.ElectraConfig(**common,
                                                                                             embedding_size=6)}
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 40, size=(3, 7))
    am = np.ones((3, 7), dtype=np.int64)
    am[1, 5:] = 0
    am[2, :2] = 0
    ids[am == 0] = 1
    out = {}
    for k, (name, cfg) in enumerate(configs.items()):
        for attn in ("eager", "sdpa"):
            cfg._attn_implementation = attn
            model = T.AutoModel.from_config(cfg).double()
            gen = torch.Generator().manual_seed(k)
            with torch.no_grad():
                for pname, p in model.named_parameters():
                    z = torch.randn(p.shape, generator=gen, dtype=p.dtype)
                    is_gamma = "norm" in pname.lower() and pname.endswith("weight")
                    p.copy_(0.5 * z if p.ndim == 2 else (1 + 0.3 * z if is_gamma else 0.3 * z))
            rep = compare_with_torch(model, ids, attention_mask=am)
            grads = [e.norm_rel for e in rep.grads if not e.name.endswith(("key.bias", "k_lin.bias"))]
            out[f"{name} ({attn})"] = {"output": rep["output"].norm_rel, "worst gradient": max(grads),
                                       "passes the float64 defaults": rep.ok}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small shapes (seconds), as the test runs it")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    import torch

    shape = (2, 32, 64, 4, 256) if args.quick else (8, 128, 768, 12, 3072)
    res = {"machine": {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                       "torch_threads": torch.get_num_threads(), "python": platform.python_version()},
           "attention": attention(shape, with_bert=not args.quick), "pad_row": pad_row(), "key_bias": key_bias(),
           "jax_softmax": jax_softmax(), "tolerances": tolerances(args.quick),
           "families": families()}
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
