"""The ``embed`` command: sentence embeddings with a pretrained encoder (see :mod:`transformer_np.io.pretrained`)."""

from __future__ import annotations

import argparse
import json

import numpy as np

from ..io.pretrained import MODEL_NAME, cosine_similarity_matrix, load_pretrained


# ----------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sentences", nargs="+", help="sentences to embed")
    parser.add_argument("--model", default=MODEL_NAME,
                        help=f"a BERT-family folder (config.json + model.safetensors) or {MODEL_NAME!r} (default)")
    parser.add_argument("--json", action="store_true", help="print the embeddings as JSON instead of the cosine matrix")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--no-normalize", action="store_true", help="skip the final L2 normalisation")


def run(args) -> int:
    model = load_pretrained(args.model)
    E = model.encode(list(args.sentences), normalize=not args.no_normalize, dtype=np.dtype(args.dtype))
    if args.json:
        print(json.dumps({"model": str(args.model), "dim": int(E.shape[1]), "sentences": list(args.sentences),
                          "embeddings": [[float(v) for v in row] for row in E]}))
        return 0
    S = cosine_similarity_matrix(E)
    n = len(args.sentences)
    print(f"cosine similarity ({E.shape[1]}-d {model.pooling}-pooled embeddings, {args.model})")
    for i, s in enumerate(args.sentences):
        print(f"  [{i}] {s}")
    print("      " + "".join(f"{f'[{j}]':>8}" for j in range(n)))
    for i in range(n):
        print(f"  [{i}] " + "".join(f"{S[i, j]:8.4f}" for j in range(n)))
    return 0
