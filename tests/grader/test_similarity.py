"""The similarity report (issue 35, item 5): copies flagged, honest work not, blanks never.

The corpus: (1) the solution functions of exercises/*.ipynb; (2) copies of them — variables renamed, comments
changed, reformatted, independent lines reordered, code moved into a helper — and the library's own source pasted
with renamed variables; (3) honest formulations written differently (loops, einsum, np.var, logsumexp, a tape…).
DEFAULT_THRESHOLD must flag every copy against its source and no honest pair (against the solutions, the library
or each other). ``PYTHONPATH=. python tests/grader/test_similarity.py`` prints the measured ranges.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from itertools import combinations
from pathlib import Path

import pytest

from transformer_np.course import similarity as sim
from transformer_np.errors import InputValueError
from transformer_np.grader.grading import CHECKS
from transformer_np.grader.similarity import (
    DEFAULT_THRESHOLD,
    MIN_TOKENS,
    SimilarPair,
    body_size,
    function_sources,
    graded_functions,
    library_functions,
    normalised_tokens,
    similarity,
    similarity_report,
)
from transformer_np.grader.specs import EXERCISES

REPO = Path(__file__).resolve().parents[2]


def _solution_cells(exercise: str) -> list[str]:
    nb = json.loads((REPO / "exercises" / f"{exercise}.ipynb").read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


SOLUTIONS = {ex: function_sources(_solution_cells(ex), graded_functions(ex)) for ex in CHECKS}
#: (exercise, function) of every solution function long enough to be compared
COMPARED = [(ex, fn) for ex, fns in SOLUTIONS.items() for fn, src in fns.items()
            if body_size(normalised_tokens(src)) >= MIN_TOKENS]


def score(a: str, b: str) -> float:
    return similarity(normalised_tokens(a), normalised_tokens(b))


def lib_source(ex: str, fn: str) -> str:
    return sim._library_sources(ex)[fn][1]


def src_of(cell: str, ex: str, fn: str) -> str:
    return function_sources([cell], graded_functions(ex))[fn]


# ============================================================================= (2) copies, made by program
def _rename(src: str) -> str:
    """Every identifier that is not an attribute name, a builtin or ``np`` renamed (as a student hiding a copy
    would, strings and comments included)."""
    names = sorted({n.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Name)}
                   | {a.arg for a in ast.walk(ast.parse(src)) if isinstance(a, ast.arg)}, key=len, reverse=True)
    keep = {"np", "range", "zip", "tuple", "len", "dict", "sum", "None", "True", "False"}
    for i, name in enumerate(n for n in names if n not in keep):
        src = re.sub(rf"(?<![.\w]){re.escape(name)}\b", f"my_var_{i}", src)
    return src


def _recomment(src: str) -> str:
    """Comments and docstrings removed, other comments added on every other line."""
    lines = src.splitlines()
    for tok in reversed(list(tokenize.generate_tokens(io.StringIO(src).readline))):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col].rstrip()
    lines = [line for line in lines if '"""' not in line]
    return "\n".join(line + (f"  # my own working, step {i}" if i % 2 and line.strip() else "")
                     for i, line in enumerate(lines))


def _reformat(src: str) -> str:
    """Re-printed by the ast (one statement a line, canonical spacing and parentheses), then re-indented by 2."""
    return "\n".join(re.sub(r"^((    )+)", lambda m: "  " * (len(m.group(1)) // 4), line)
                     for line in ast.unparse(ast.parse(src)).splitlines())


TRANSFORMS = {"renamed": _rename, "comments changed": _recomment, "reformatted": _reformat,
              "renamed + recommented + reformatted": lambda s: _reformat(_recomment(_rename(s)))}


# ============================================================================= (2) copies, written by hand
# Each: a solution's (or the library's) code with independent lines reordered / moved into a helper / pasted.
REORDERED = {
    ("02_layernorm", "layernorm_backward"): '''
def layernorm_backward(upstream, saved):
    gamma, rstd, xhat = saved["gamma"], saved["rstd"], saved["xhat"]
    lead = tuple(range(upstream.ndim - 1))
    g = upstream * gamma
    db = upstream.sum(axis=lead)
    dg = (upstream * xhat).sum(axis=lead)
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, dg, db
''',
    ("03_attention", "attention_backward"): '''
def attention_backward(dout, cache):
    A, V, K, Q = cache["A"], cache["V"], cache["K"], cache["Q"]
    dA = dout @ V.swapaxes(-1, -2)
    dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))
    scale = 1.0 / np.sqrt(Q.shape[-1])
    dK = dS.swapaxes(-1, -2) @ Q * scale
    dQ = dS @ K * scale
    dV = A.swapaxes(-1, -2) @ dout
    return dQ, dK, dV
''',
    ("04_multihead_attention", "mha_forward"): '''
def merge(t):
    B, h, n, d_k = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, n, h * d_k)

def split(t, n_heads):
    B, n, d = t.shape
    return t.reshape(B, n, n_heads, d // n_heads).transpose(0, 2, 1, 3)

def mha_forward(x, p, n_heads, mask=None):
    V = split(x @ p["W_V"] + p["b_V"], n_heads)
    Q = split(x @ p["W_Q"] + p["b_Q"], n_heads)
    K = split(x @ p["W_K"] + p["b_K"], n_heads)
    O, attn_cache = attention_forward(Q, K, V, mask)
    ctx = merge(O)
    out = ctx @ p["W_O"] + p["b_O"]
    return out, {"x": x, "p": p, "n_heads": n_heads, "attn": attn_cache, "ctx": ctx}
''',
    ("05_gelu_ffn", "ffn_backward"): '''
def ffn_backward(dout, cache):
    p, a, x = cache["p"], cache["a"], cache["x"]
    d_model, d_ff = p["W_1"].shape
    da = dout @ p["W_2"].T
    dout2 = dout.reshape(-1, d_model)
    dh = gelu_backward(da, cache["gelu"])
    grads = {"b_2": dout2.sum(axis=0), "W_2": a.reshape(-1, d_ff).T @ dout2}
    dx = dh @ p["W_1"].T
    grads["b_1"] = dh.reshape(-1, d_ff).sum(axis=0)
    grads["W_1"] = x.reshape(-1, d_model).T @ dh.reshape(-1, d_ff)
    return dx, grads
''',
    ("06_encoder_layer", "encoder_layer_forward"): '''
def encoder_layer_forward(x, p, norm, n_heads, mask=None, eps=1e-5):
    g2, b2, g1, b1 = p["ln2.gamma"], p["ln2.beta"], p["ln1.gamma"], p["ln1.beta"]
    ffn_p, attn_p = sub_params(p, "ffn."), sub_params(p, "attn.")
    cache = {"norm": norm}
    if norm != "post":
        y, cache["ln1"] = layernorm_forward(x, g1, b1, eps)
        a, cache["attn"] = mha_forward(y, attn_p, n_heads, mask)
        z = x + a
        y2, cache["ln2"] = layernorm_forward(z, g2, b2, eps)
        f, cache["ffn"] = ffn_forward(y2, ffn_p)
        out = z + f
    else:
        a, cache["attn"] = mha_forward(x, attn_p, n_heads, mask)
        z, cache["ln1"] = layernorm_forward(x + a, g1, b1, eps)
        f, cache["ffn"] = ffn_forward(z, ffn_p)
        out, cache["ln2"] = layernorm_forward(z + f, g2, b2, eps)
    return out, cache
''',
}

HELPER_COPIES = {
    ("01_softmax", "softmax_forward"): '''
def _shifted_exp(v):
    shifted = v - v.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e

def softmax_forward(v):
    e = _shifted_exp(v)
    res = e / e.sum(axis=-1, keepdims=True)
    cache = {"s": res}
    return res, cache
''',
    ("02_layernorm", "layernorm_forward"): '''
def _normalise(inp, eps):
    mu = inp.mean(axis=-1, keepdims=True)
    centred = inp - mu
    var = (centred * centred).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    return centred * rstd, rstd

def layernorm_forward(inp, gamma, beta, eps=1e-5):
    xhat, rstd = _normalise(inp, eps)
    out = gamma * xhat + beta
    return out, {"xhat": xhat, "rstd": rstd, "gamma": gamma}
''',
    ("03_attention", "attention_forward"): '''
def _row_softmax(scores):
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    return e / e.sum(axis=-1, keepdims=True)

def attention_forward(Q, K, V, mask=None):
    d_k = Q.shape[-1]
    scores = Q @ K.swapaxes(-1, -2) / np.sqrt(d_k)
    if mask is not None:
        scores = scores + mask
    A = _row_softmax(scores)
    out = A @ V
    return out, {"Q": Q, "K": K, "V": V, "A": A}
''',
    ("04_multihead_attention", "mha_backward"): '''
def _proj_grads(name, d_heads, x2, p, d, grads):
    dP = merge_heads(d_heads)
    grads["W_" + name] = x2.T @ dP.reshape(-1, d)
    grads["b_" + name] = dP.reshape(-1, d).sum(axis=0)
    return dP @ p["W_" + name].T

def split_heads(t, n_heads):
    B, n, d = t.shape
    return t.reshape(B, n, n_heads, d // n_heads).transpose(0, 2, 1, 3)

def merge_heads(t):
    B, h, n, d_k = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, n, h * d_k)

def mha_backward(dout, cache):
    x, p, h, ctx = cache["x"], cache["p"], cache["n_heads"], cache["ctx"]
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    grads = {"W_O": ctx.reshape(-1, d).T @ dout.reshape(-1, d),
             "b_O": dout.reshape(-1, d).sum(axis=0)}
    dctx = dout @ p["W_O"].T
    dQ, dK, dV = attention_backward(split_heads(dctx, h), cache["attn"])
    dx = np.zeros_like(x)
    for name, d_heads in zip("QKV", (dQ, dK, dV)):
        dx = dx + _proj_grads(name, d_heads, x2, p, d, grads)
    return dx, grads
''',
    ("05_gelu_ffn", "ffn_forward"): '''
def _hidden(inp, p):
    h = inp @ p["W_1"] + p["b_1"]
    a, gelu_cache = gelu_forward(h)
    return a, gelu_cache

def ffn_forward(inp, p):
    a, gelu_cache = _hidden(inp, p)
    out = a @ p["W_2"] + p["b_2"]
    cache = {"x": inp, "a": a, "p": p, "gelu": gelu_cache}
    return out, cache
''',
}

# The library's kernels pasted into the notebook's signatures, variables renamed (what copying the source does).
LIBRARY_PASTES = {
    ("01_softmax", "softmax_forward"): '''
def softmax_forward(z):
    ez = np.exp(z - z.max(axis=-1, keepdims=True))
    probs = ez / ez.sum(axis=-1, keepdims=True)
    return probs, {"kind": "softmax", "s": probs}
''',
    ("01_softmax", "softmax_backward"): '''
def softmax_backward(g, cache):
    p = cache["s"]
    return p * (g - (g * p).sum(axis=-1, keepdims=True))
''',
    ("02_layernorm", "layernorm_forward"): '''
def layernorm_forward(x, gamma, beta, eps=1e-5):
    m = x.mean(axis=-1, keepdims=True)
    c = x - m
    v = (c * c).mean(axis=-1, keepdims=True)
    inv = 1.0 / np.sqrt(v + eps)
    xn = c * inv
    y = gamma * xn + beta
    return y, {"kind": "layernorm", "xhat": xn, "rstd": inv, "gamma": gamma}
''',
    ("02_layernorm", "layernorm_backward"): '''
def layernorm_backward(dout, cache):
    xn, inv, g_ = cache["xhat"], cache["rstd"], cache["gamma"]
    axes = tuple(range(xn.ndim - 1))
    dg = (dout * xn).sum(axis=axes)
    db = dout.sum(axis=axes)
    t = dout * g_
    m1 = t.mean(axis=-1, keepdims=True)
    m2 = (t * xn).mean(axis=-1, keepdims=True)
    dx = inv * (t - m1 - xn * m2)
    return dx, dg, db
''',
    ("03_attention", "attention_forward"): '''
import math

def _softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)

def attention_forward(q, k, v, mask=None):
    dk = q.shape[-1]
    m = 0.0 if mask is None else mask
    s = q @ k.swapaxes(-1, -2) / math.sqrt(dk) + m
    a = _softmax(s)
    o = a @ v
    cache = {"kind": "attention", "Q": q, "K": k, "V": v, "scale": 1.0 / math.sqrt(dk), "scores": s, "weights": a}
    return o, cache
''',
    ("03_attention", "attention_backward"): '''
import math

def attention_backward(dout, cache):
    q, k, v, a = cache["Q"], cache["K"], cache["V"], cache["weights"]
    dk = q.shape[-1]
    dv = a.swapaxes(-1, -2) @ dout
    da = dout @ v.swapaxes(-1, -2)
    ds = a * (da - (da * a).sum(axis=-1, keepdims=True))
    dq = ds @ k / math.sqrt(dk)
    dkk = ds.swapaxes(-1, -2) @ q / math.sqrt(dk)
    return dq, dkk, dv
''',
    ("04_multihead_attention", "mha_forward"): '''
def lin(t, W, b=None):
    y = t @ W
    if b is not None:
        y = y + b
    return y, {"kind": "linear", "x": t, "W": W, "has_bias": b is not None}

def split_heads(t, n_heads):
    B, n, d = t.shape
    return t.reshape(B, n, n_heads, d // n_heads).transpose(0, 2, 1, 3)

def merge_heads(t):
    B, h, n, dk = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, n, h * dk)

def mha_forward(x, p, n_heads, mask=None):
    c = {"kind": "mha", "n_heads": n_heads}
    q, c["q"] = lin(x, p["W_Q"], p["b_Q"])
    k, c["k"] = lin(x, p["W_K"], p["b_K"])
    v, c["v"] = lin(x, p["W_V"], p["b_V"])
    q, k, v = (split_heads(t, n_heads) for t in (q, k, v))
    o, c["attn"] = attention_forward(q, k, v, mask)
    out, c["o"] = lin(merge_heads(o), p["W_O"], p["b_O"])
    return out, c
''',
    ("04_multihead_attention", "mha_backward"): '''
def lin_back(dy, cache):
    x, W = cache["x"], cache["W"]
    X = x.reshape(-1, x.shape[-1])
    dY = dy.reshape(-1, dy.shape[-1])
    dx = dy @ W.T
    dW = X.T @ dY
    db = dY.sum(axis=0) if cache["has_bias"] else None
    return dx, dW, db

def split_heads(t, n_heads):
    B, n, d = t.shape
    return t.reshape(B, n, n_heads, d // n_heads).transpose(0, 2, 1, 3)

def merge_heads(t):
    B, h, n, dk = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, n, h * dk)

def mha_backward(dout, cache):
    h = cache["n_heads"]
    dctx, dWo, dbo = lin_back(dout, cache["o"])
    dq, dk, dv = attention_backward(split_heads(dctx, h), cache["attn"])
    dxq, dWq, dbq = lin_back(merge_heads(dq), cache["q"])
    dxk, dWk, dbk = lin_back(merge_heads(dk), cache["k"])
    dxv, dWv, dbv = lin_back(merge_heads(dv), cache["v"])
    dx = dxq + dxk + dxv
    grads = {"W_Q": dWq, "b_Q": dbq, "W_K": dWk, "b_K": dbk, "W_V": dWv, "b_V": dbv, "W_O": dWo, "b_O": dbo}
    return dx, grads
''',
    ("05_gelu_ffn", "gelu_forward"): '''
INV_SQRT2 = 1 / np.sqrt(2.0)
INV_SQRT_2PI = 1 / np.sqrt(2 * np.pi)

def cdf(u):
    return 0.5 * (1.0 + erf(u * INV_SQRT2))

def gelu_forward(u):
    c = cdf(u)
    pdf = np.exp(-0.5 * u * u) * INV_SQRT_2PI
    return u * c, {"kind": "activation", "activation": "gelu", "grad": c + u * pdf}
''',
    ("05_gelu_ffn", "ffn_backward"): '''
def lin_back(dy, cache):
    x, W = cache["x"], cache["W"]
    X = x.reshape(-1, x.shape[-1])
    dY = dy.reshape(-1, dy.shape[-1])
    dx = dy @ W.T
    dW = X.T @ dY
    db = dY.sum(axis=0) if cache["has_bias"] else None
    return dx, dW, db

def ffn_backward(dout, cache):
    df, dW2, db2 = lin_back(dout, cache["lin2"])
    du = gelu_backward(df, cache["act"])
    dz, dW1, db1 = lin_back(du, cache["lin1"])
    return dz, {"W_1": dW1, "b_1": db1, "W_2": dW2, "b_2": db2}
''',
}


def copy_scores() -> dict[str, list[tuple[str, float]]]:
    """Each kind of copy → [(label, score against its source)]."""
    out: dict[str, list[tuple[str, float]]] = {}
    for ex, fn in COMPARED:
        for kind, transform in TRANSFORMS.items():
            out.setdefault(kind, []).append((fn, score(transform(SOLUTIONS[ex][fn]), SOLUTIONS[ex][fn])))
    for kind, table in (("lines reordered", REORDERED), ("moved into a helper", HELPER_COPIES)):
        out[kind] = [(fn, score(src_of(cell, ex, fn), SOLUTIONS[ex][fn])) for (ex, fn), cell in table.items()]
    out["library pasted, renamed"] = [(fn, score(src_of(cell, ex, fn), lib_source(ex, fn)))
                                      for (ex, fn), cell in LIBRARY_PASTES.items()]
    return out


# ============================================================================= (3) honest work, written differently
HONEST = {
    "01_softmax": {
        "softmax_forward": ['''
def softmax_forward(x):
    flat = x.reshape(-1, x.shape[-1])
    out = np.empty_like(flat)
    for i in range(flat.shape[0]):
        row = flat[i] - np.max(flat[i])
        w = np.exp(row)
        out[i] = w / np.sum(w)
    out = out.reshape(x.shape)
    return out, out
''', '''
def softmax_forward(x):
    m = np.max(x, axis=-1, keepdims=True)
    lse = m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))
    probs = np.exp(x - lse)
    return probs, {"probs": probs}
''', '''
def softmax_forward(x):
    e = np.exp(x - np.amax(x, axis=-1)[..., None])
    s = e / np.einsum("...i->...", e)[..., None]
    return s, (s,)
'''],
        "softmax_backward": ['''
def softmax_backward(dout, cache):
    s = cache
    n = s.shape[-1]
    flat_s, flat_d = s.reshape(-1, n), dout.reshape(-1, n)
    dx = np.zeros_like(flat_s)
    for i in range(flat_s.shape[0]):
        jac = np.diag(flat_s[i]) - np.outer(flat_s[i], flat_s[i])
        dx[i] = jac @ flat_d[i]
    return dx.reshape(s.shape)
''', '''
def softmax_backward(dout, cache):
    (s,) = cache
    return s * dout - s * np.einsum("...i,...i->...", dout, s)[..., None]
''', '''
def softmax_backward(dout, cache):
    probs = cache["probs"]
    weighted = np.sum(probs * dout, axis=-1)
    return probs * (dout - weighted[..., np.newaxis])
''']},
    "02_layernorm": {
        "layernorm_forward": ['''
def layernorm_forward(x, gamma, beta, eps=1e-5):
    xc = x - np.mean(x, axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(np.var(x, axis=-1, keepdims=True) + eps)
    xhat = xc * r
    return gamma * xhat + beta, (xhat, r, gamma)
''', '''
def layernorm_forward(x, gamma, beta, eps=1e-5):
    d = x.shape[-1]
    mean = np.sum(x, axis=-1, keepdims=True) / d
    var = np.sum((x - mean) ** 2, axis=-1, keepdims=True) / d
    std = np.sqrt(var + eps)
    normed = (x - mean) / std
    return normed * gamma + beta, {"x": x, "mean": mean, "std": std, "normed": normed, "gamma": gamma}
''', '''
def layernorm_forward(x, gamma, beta, eps=1e-5):
    mu = np.mean(x, -1)[..., None]
    sigma = np.std(x, -1)[..., None]
    inv = (sigma ** 2 + eps) ** -0.5
    z = (x - mu) * inv
    out = np.multiply(z, gamma) + beta
    return out, (z, inv, gamma)
'''],
        "layernorm_backward": ['''
def layernorm_backward(dout, cache):
    xhat, r, gamma = cache
    d = xhat.shape[-1]
    g = dout * gamma
    dx = (r / d) * (d * g - g.sum(-1, keepdims=True) - xhat * (g * xhat).sum(-1, keepdims=True))
    lead = tuple(range(dout.ndim - 1))
    return dx, np.sum(dout * xhat, axis=lead), np.sum(dout, axis=lead)
''', '''
def layernorm_backward(dout, cache):
    x, mean, std, normed, gamma = cache["x"], cache["mean"], cache["std"], cache["normed"], cache["gamma"]
    d = x.shape[-1]
    axes = tuple(range(x.ndim - 1))
    dbeta = np.sum(dout, axis=axes)
    dgamma = np.sum(dout * normed, axis=axes)
    dnormed = dout * gamma
    dvar = np.sum(dnormed * (x - mean), axis=-1, keepdims=True) * -0.5 * std ** -3
    dmean = -np.sum(dnormed, axis=-1, keepdims=True) / std - 2 * dvar * np.mean(x - mean, axis=-1, keepdims=True)
    dx = dnormed / std + dvar * 2 * (x - mean) / d + dmean / d
    return dx, dgamma, dbeta
''']},
    "03_attention": {
        "attention_forward": ['''
def attention_forward(Q, K, V, mask=None, scale=None):
    c = 1 / math.sqrt(Q.shape[-1]) if scale is None else scale
    S = np.einsum("...qd,...kd->...qk", Q, K) * c
    if mask is not None:
        S = S + mask
    A = np.exp(S - S.max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)
    return np.einsum("...qk,...kv->...qv", A, V), (Q, K, V, A, c)
''', '''
def attention_forward(Q, K, V, mask=None):
    lead = Q.shape[:-2]
    q = Q.reshape(-1, *Q.shape[-2:])
    k = K.reshape(-1, *K.shape[-2:])
    v = V.reshape(-1, *V.shape[-2:])
    m = np.zeros((1, 1, 1)) if mask is None else np.broadcast_to(mask, lead + (Q.shape[-2], K.shape[-2]))
    m = m.reshape(-1, *m.shape[-2:])
    weights = []
    outs = []
    for b in range(q.shape[0]):
        logits = np.matmul(q[b], np.transpose(k[b])) / np.sqrt(q.shape[-1]) + m[min(b, len(m) - 1)]
        w = np.exp(logits - np.max(logits, axis=1, keepdims=True))
        w = w / np.sum(w, axis=1, keepdims=True)
        weights.append(w)
        outs.append(np.matmul(w, v[b]))
    A = np.stack(weights).reshape(lead + weights[0].shape)
    return np.stack(outs).reshape(lead + outs[0].shape), {"q": Q, "k": K, "v": V, "w": A}
''', '''
def attention_forward(Q, K, V, mask=None):
    scores = np.matmul(Q, np.swapaxes(K, -1, -2)) * Q.shape[-1] ** -0.5
    scores = scores if mask is None else scores + mask
    lse = scores.max(-1, keepdims=True)
    lse = lse + np.log(np.exp(scores - lse).sum(-1, keepdims=True))
    probs = np.exp(scores - lse)
    return np.matmul(probs, V), dict(q=Q, k=K, v=V, probs=probs)
'''],
        "attention_backward": ['''
def attention_backward(dout, cache):
    Q, K, V, A, c = cache
    dV = np.einsum("...qk,...qv->...kv", A, dout)
    dA = np.einsum("...qv,...kv->...qk", dout, V)
    dS = A * (dA - np.einsum("...qk,...qk->...q", dA, A)[..., None])
    return np.einsum("...qk,...kd->...qd", dS, K) * c, np.einsum("...qk,...qd->...kd", dS, Q) * c, dV
''', '''
def attention_backward(dout, cache):
    q, k, v, probs = cache["q"], cache["k"], cache["v"], cache["probs"]
    c = q.shape[-1] ** -0.5
    dprobs = np.matmul(dout, np.swapaxes(v, -1, -2))
    inner = np.sum(dprobs * probs, axis=-1)[..., np.newaxis]
    dscores = probs * dprobs - probs * inner
    dq = c * np.matmul(dscores, k)
    dk = c * np.matmul(np.swapaxes(dscores, -1, -2), q)
    dv = np.matmul(np.swapaxes(probs, -1, -2), dout)
    return dq, dk, dv
''']},
    "04_multihead_attention": {
        "mha_forward": ['''
def _split(t, h):
    B, n, d = t.shape
    return np.swapaxes(t.reshape(B, n, h, d // h), 1, 2)

def _merge(t):
    B, h, n, dk = t.shape
    return np.swapaxes(t, 1, 2).reshape(B, n, h * dk)

def mha_forward(x, p, n_heads, mask=None, q_factor=1.0):
    heads = [_split(np.einsum("bnd,de->bne", x, p["W_" + c]) + p["b_" + c], n_heads) for c in "QKV"]
    O, ac = attention_forward(heads[0] * q_factor, heads[1], heads[2], mask)
    ctx = _merge(O)
    return np.einsum("bnd,de->bne", ctx, p["W_O"]) + p["b_O"], (x, p, n_heads, ac, ctx, q_factor)
''', '''
def mha_forward(x, p, n_heads, mask=None):
    B, n, d = x.shape
    dk = d // n_heads
    proj = {c: np.matmul(x, p["W_" + c]) + p["b_" + c] for c in "QKV"}
    head_outs, head_caches = [], []
    for i in range(n_heads):
        cols = slice(i * dk, (i + 1) * dk)
        m = None if mask is None else mask[:, 0]
        o, hc = attention_forward(proj["Q"][:, :, cols], proj["K"][:, :, cols], proj["V"][:, :, cols], m)
        head_outs.append(o)
        head_caches.append(hc)
    concat = np.concatenate(head_outs, axis=-1)
    return np.matmul(concat, p["W_O"]) + p["b_O"], {"x": x, "p": p, "h": n_heads, "heads": head_caches,
                                                    "concat": concat}
'''],
        "mha_backward": ['''
def _split(t, h):
    B, n, d = t.shape
    return np.swapaxes(t.reshape(B, n, h, d // h), 1, 2)

def _merge(t):
    B, h, n, dk = t.shape
    return np.swapaxes(t, 1, 2).reshape(B, n, h * dk)

def mha_backward(dout, cache):
    x, p, h, ac, ctx, q_factor = cache
    d = x.shape[-1]
    rows = lambda t: t.reshape(-1, d)
    g = {"W_O": rows(ctx).T @ rows(dout), "b_O": rows(dout).sum(0)}
    dQ, dK, dV = attention_backward(_split(dout @ p["W_O"].T, h), ac)
    dx = np.zeros_like(x)
    for c, dh in zip("QKV", (dQ * q_factor, dK, dV)):
        dP = _merge(dh)
        g["W_" + c], g["b_" + c] = rows(x).T @ rows(dP), rows(dP).sum(0)
        dx += dP @ p["W_" + c].T
    return dx, g
''', '''
def mha_backward(dout, cache):
    x, p, n_heads, concat = cache["x"], cache["p"], cache["h"], cache["concat"]
    d = x.shape[-1]
    dk = d // n_heads
    grads = {"W_O": np.einsum("bni,bnj->ij", concat, dout), "b_O": np.einsum("bnj->j", dout)}
    dconcat = np.einsum("bnj,ij->bni", dout, p["W_O"])
    dproj = {c: np.zeros_like(x) for c in "QKV"}
    for i, hc in enumerate(cache["heads"]):
        cols = slice(i * dk, (i + 1) * dk)
        dq, dk_, dv = attention_backward(dconcat[:, :, cols], hc)
        dproj["Q"][:, :, cols], dproj["K"][:, :, cols], dproj["V"][:, :, cols] = dq, dk_, dv
    dx = 0
    for c in "QKV":
        grads["W_" + c] = np.einsum("bni,bnj->ij", x, dproj[c])
        grads["b_" + c] = np.einsum("bnj->j", dproj[c])
        dx = dx + np.einsum("bnj,ij->bni", dproj[c], p["W_" + c])
    return dx, grads
''']},
    "05_gelu_ffn": {
        "gelu_forward": ['''
_VERF = np.vectorize(math.erf)

def gelu_forward(z):
    Phi = 0.5 * (1 + _VERF(z / math.sqrt(2)))
    return z * Phi, Phi + z * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
''', '''
def gelu_forward(z):
    half = erf(z * (1 / np.sqrt(2)))
    Phi = (half + 1) / 2
    density = np.exp(-(z ** 2) / 2) / np.sqrt(2 * np.pi)
    deriv = Phi + z * density
    result = z * Phi
    return result, deriv
'''],
        "ffn_forward": ['''
def ffn_forward(x, p, act=None):
    act = act or (gelu_forward, gelu_backward)
    h = np.tensordot(x, p["W_1"], axes=1) + p["b_1"]
    a, ac = act[0](h)
    return np.tensordot(a, p["W_2"], axes=1) + p["b_2"], (x, a, ac, p, act)
''', '''
def ffn_forward(x, p):
    pre = np.einsum("...i,ij->...j", x, p["W_1"])
    pre += p["b_1"]
    act, deriv = gelu_forward(pre)
    y = np.einsum("...j,jk->...k", act, p["W_2"]) + p["b_2"]
    return y, [x, act, deriv, p]
'''],
        "ffn_backward": ['''
def ffn_backward(dout, cache):
    x, a, ac, p, act = cache
    d, f = p["W_1"].shape
    dh = act[1](np.tensordot(dout, p["W_2"].T, axes=1), ac)
    return np.tensordot(dh, p["W_1"].T, axes=1), {
        "W_2": a.reshape(-1, f).T @ dout.reshape(-1, d), "b_2": dout.reshape(-1, d).sum(0),
        "W_1": x.reshape(-1, d).T @ dh.reshape(-1, f), "b_1": dh.reshape(-1, f).sum(0)}
''', '''
def ffn_backward(dout, cache):
    x, act, deriv, p = cache
    lead = "".join("abcdefgh"[: dout.ndim - 1])
    dact = np.einsum("...k,jk->...j", dout, p["W_2"])
    dpre = gelu_backward(dact, deriv)
    grads = {
        "W_2": np.einsum(lead + "j," + lead + "k->jk", act, dout),
        "b_2": np.einsum(lead + "k->k", dout),
        "W_1": np.einsum(lead + "i," + lead + "j->ij", x, dpre),
        "b_1": np.einsum(lead + "j->j", dpre),
    }
    return np.einsum("...j,ij->...i", dpre, p["W_1"]), grads
''']},
    "06_encoder_layer": {
        "encoder_layer_forward": ['''
def _post(x, p, h, mask, eps):
    c = {"norm": "post"}
    a, c["attn"] = mha_forward(x, sub_params(p, "attn."), h, mask)
    z, c["ln1"] = layernorm_forward(x + a, p["ln1.gamma"], p["ln1.beta"], eps)
    f, c["ffn"] = ffn_forward(z, sub_params(p, "ffn."))
    out, c["ln2"] = layernorm_forward(z + f, p["ln2.gamma"], p["ln2.beta"], eps)
    return out, c

def _pre(x, p, h, mask, eps):
    c = {"norm": "pre"}
    y, c["ln1"] = layernorm_forward(x, p["ln1.gamma"], p["ln1.beta"], eps)
    a, c["attn"] = mha_forward(y, sub_params(p, "attn."), h, mask)
    z = x + a
    y2, c["ln2"] = layernorm_forward(z, p["ln2.gamma"], p["ln2.beta"], eps)
    f, c["ffn"] = ffn_forward(y2, sub_params(p, "ffn."))
    return z + f, c

def encoder_layer_forward(x, p, norm, n_heads, mask=None, eps=1e-5):
    return (_post if norm == "post" else _pre)(x, p, n_heads, mask, eps)
''', '''
def encoder_layer_forward(x, p, norm, n_heads, mask=None, eps=1e-5):
    tape = []

    def ln(t, i):
        y, c = layernorm_forward(t, p[f"ln{i}.gamma"], p[f"ln{i}.beta"], eps)
        tape.append(("ln", i, c))
        return y

    def attn(t):
        y, c = mha_forward(t, sub_params(p, "attn."), n_heads, mask)
        tape.append(("attn", None, c))
        return y

    def ffn(t):
        y, c = ffn_forward(t, sub_params(p, "ffn."))
        tape.append(("ffn", None, c))
        return y

    if norm == "pre":
        h = x + attn(ln(x, 1))
        return h + ffn(ln(h, 2)), (norm, tape)
    h = ln(x + attn(x), 1)
    return ln(h + ffn(h), 2), (norm, tape)
'''],
        "encoder_layer_backward": ['''
def encoder_layer_backward(dout, cache):
    norm, tape = cache
    grads = {}
    backward = {"ln": layernorm_backward, "attn": mha_backward, "ffn": ffn_backward}
    skip = None
    grad = dout
    for kind, i, c in reversed(tape):
        if kind == "ln":
            grad, grads[f"ln{i}.gamma"], grads[f"ln{i}.beta"] = backward[kind](grad, c)
            if norm == "pre":
                grad = grad + skip
        else:
            upstream = grad
            grad, g = backward[kind](grad, c)
            grads.update({f"{kind}.{k}": v for k, v in g.items()})
            if norm == "post":
                grad = grad + upstream
            else:
                skip = upstream
    return grad, grads
''']},
}


def honest_scores() -> dict[str, list[tuple[str, float]]]:
    """Each honest variant against the solution and the library, and against the other honest variants."""
    out: dict[str, list[tuple[str, float]]] = {"vs solution": [], "vs library": [], "vs each other": []}
    for ex, fns in HONEST.items():
        for fn, cells in fns.items():
            srcs = [src_of(cell, ex, fn) for cell in cells]
            for i, src in enumerate(srcs):
                out["vs solution"].append((f"{fn}[{i}]", score(src, SOLUTIONS[ex][fn])))
                out["vs library"].append((f"{fn}[{i}]", score(src, lib_source(ex, fn))))
            out["vs each other"] += [(f"{fn}[{i}~{j}]", score(srcs[i], srcs[j]))
                                     for i, j in combinations(range(len(srcs)), 2)]
    return out


def solution_vs_library() -> list[tuple[str, float]]:
    return [(fn, score(SOLUTIONS[ex][fn], lib_source(ex, fn))) for ex, fn in COMPARED]


if __name__ == "__main__":                       # the measured ranges (quoted next to DEFAULT_THRESHOLD)
    for title, groups in (("copies, against their source", copy_scores()), ("honest", honest_scores())):
        for kind, rows in groups.items():
            lo, hi = min(s for _, s in rows), max(s for _, s in rows)
            low, high = min(rows, key=lambda r: r[1])[0], max(rows, key=lambda r: r[1])[0]
            print(f"{title:30s} {kind:38s} {lo:.2f} … {hi:.2f}   (n={len(rows)}; lowest {low}, highest {high})")
    for fn, s in solution_vs_library():
        print(f"solution vs library  {fn:24s} {s:.2f}")


# ============================================================================= the tests
@pytest.mark.parametrize("kind", [*TRANSFORMS, "lines reordered", "moved into a helper", "library pasted, renamed"])
def test_every_copy_is_flagged(kind):
    rows = copy_scores()[kind]
    assert rows and all(s >= DEFAULT_THRESHOLD for _, s in rows), rows


def test_no_honest_variant_is_flagged():
    for group, rows in honest_scores().items():
        assert rows and all(s < DEFAULT_THRESHOLD for _, s in rows), (group, rows)


def test_the_corpus_covers_every_compared_function():
    honest = {(ex, fn) for ex, fns in HONEST.items() for fn in fns}
    assert set(COMPARED) <= honest
    assert {fn for ex, fn in COMPARED} == {fn for ex in CHECKS for fn in graded_functions(ex)} - {"gelu_backward"}


BLANKS = ["{sig}:\n    ...\n", '{sig}:\n    """Docstring."""\n    # YOUR CODE HERE\n    raise NotImplementedError()\n',
          '{sig}:\n    raise NotImplementedError("implement me, see the formula above")\n', "{sig}:\n    pass\n",
          "{sig}:\n    out, cache = None, None\n    return out, cache\n"]


def _signature(ex: str, fn: str) -> str:
    return SOLUTIONS[ex][fn].splitlines()[0].rstrip(":")


@pytest.mark.parametrize("ex", list(CHECKS))
def test_blank_functions_are_never_flagged(ex):
    """Half a class leaves every function blank (five ways): no pair involves them; the other half is flagged."""
    fns = graded_functions(ex)
    subs = {f"blank{i}": {fn: blank.format(sig=_signature(ex, fn)) for fn in fns} for i, blank in enumerate(BLANKS)}
    subs.update({f"copy{i}": {fn: TRANSFORMS["renamed"](SOLUTIONS[ex][fn]) for fn in fns} for i in range(5)})
    for sub in subs.values():
        for src in sub.values():
            assert set(graded_functions(ex)) & function_sources([src], fns).keys()
    report = similarity_report(subs, ex)
    assert not [p for p in report if "blank" in p.a + p.b]
    compared = [fn for fn in fns if (ex, fn) in COMPARED]
    assert {(p.function, p.a, p.b) for p in report if not p.b.startswith("library:")} == {
        (fn, f"copy{i}", f"copy{j}") for fn in compared for i, j in combinations(range(5), 2)}


def test_a_one_line_function_is_left_out_even_when_identical():
    sol = SOLUTIONS["05_gelu_ffn"]["gelu_backward"]
    assert body_size(normalised_tokens(sol)) < MIN_TOKENS
    assert not [p for p in similarity_report({"a": {"gelu_backward": sol}, "b": {"gelu_backward": sol}},
                                             "05_gelu_ffn", threshold=0.0)]


def test_code_moved_into_a_helper_is_still_compared():
    ex, fn = "02_layernorm", "layernorm_forward"
    cell = HELPER_COPIES[(ex, fn)]
    src = src_of(cell, ex, fn)
    assert "def _normalise" in src and src.index("def layernorm_forward") < src.index("def _normalise")
    assert score(src, SOLUTIONS[ex][fn]) >= DEFAULT_THRESHOLD
    alone = ast.get_source_segment(cell, next(n for n in ast.parse(cell).body if getattr(n, "name", "") == fn))
    assert score(alone, SOLUTIONS[ex][fn]) < DEFAULT_THRESHOLD        # without its helper it would not be flagged


def test_helpers_are_followed_transitively_but_not_into_other_graded_functions():
    cells = ["def c():\n    return 3\n", "def b():\n    return c()\n",
             "def gelu_forward(z):\n    return b() + unused\n", "def unused_helper():\n    return 1\n",
             "def ffn_forward(x, p):\n    return gelu_forward(x), list(map(b, x))\n"]
    srcs = function_sources(cells, ["gelu_forward", "ffn_forward"])
    assert [ln for ln in srcs["gelu_forward"].splitlines() if ln.startswith("def")] == [
        "def gelu_forward(z):", "def b():", "def c():"]
    assert "def gelu_forward" not in srcs["ffn_forward"] and "def b():" in srcs["ffn_forward"]
    assert "unused_helper" not in srcs["gelu_forward"] + srcs["ffn_forward"]


def test_magics_shell_lines_and_syntax_errors_are_tolerated():
    cells = ["%matplotlib inline\nimport numpy as np\n!pip install scipy\n",
             "def softmax_forward(x):\n    return 1\n",
             "def softmax_forward(x)\n    return 2   # a syntax error: this cell is skipped\n",
             "%%time\ndef softmax_backward(dout, cache):\n    %time y = 1\n    return dout\n",
             "%%bash\necho this is not python\n",
             "x = !ls\n", "def softmax_forward(x):\n    return 3  # the last definition wins\n",
             "def broken(:\n", "", "print('\\x00')\0"]
    srcs = function_sources(cells, ["softmax_forward", "softmax_backward", "missing"])
    assert srcs == {"softmax_forward": "def softmax_forward(x):\n    return 3",      # the text as written
                    "softmax_backward": "def softmax_backward(dout, cache):\n    %time y = 1\n    return dout"}
    for src in cells:                                      # tokens of anything, never an exception
        assert isinstance(normalised_tokens(src), list)


def test_normalised_tokens_keep_the_algorithm_and_drop_the_rest():
    a = ('def f(x: np.ndarray) -> float:\n    """Doc."""\n    # note\n'
         '    return np.exp(x).sum(axis=-1) * 2.5, "s", f"{x}"\n')
    b = "def g(y):\n  return (np.exp(y).sum(axis = -1)*7,\n          'other', 'fmt')\n"
    assert normalised_tokens(a) == normalised_tokens(b) == [
        "def", "ID", "(", "ID", ")", ":", "return", "(", "ID", ".", "exp", "(", "ID", ")", ".", "sum", "(", "ID",
        "=", "-", "NUM", ")", "*", "NUM", ",", "STR", ",", "STR", ")"]
    assert normalised_tokens("x.max()") != normalised_tokens("x.min()")


def test_the_score_is_symmetric_and_in_the_unit_interval():
    srcs = [SOLUTIONS[ex][fn] for ex, fn in COMPARED] + [lib_source(ex, fn) for ex, fn in COMPARED]
    toks = [normalised_tokens(s) for s in srcs]
    for a, b in combinations(toks, 2):
        s = similarity(a, b)
        assert s == similarity(b, a) and 0.0 <= s <= 1.0     # exact: set sizes, the same division
    assert similarity(toks[0], toks[0]) == 1.0
    assert similarity([], toks[0]) == similarity(["a"], ["a"]) == 0.0    # shorter than K: nothing to compare


def test_the_report_lists_pairs_highest_first():
    ex = "02_layernorm"
    fns = graded_functions(ex)
    subs = {"s1": dict(SOLUTIONS[ex]), "s2": {fn: _reformat(_rename(SOLUTIONS[ex][fn])) for fn in fns},
            "s3": {fn: src_of(c, ex, fn) for fn, c in zip(fns, (HONEST[ex][fn][1] for fn in fns))},
            "s0": {"layernorm_forward": src_of(LIBRARY_PASTES[(ex, "layernorm_forward")], ex, "layernorm_forward")}}
    report = similarity_report(subs, ex)
    assert report == sorted(report, key=lambda p: (-p.score, p.function, p.a, p.b))
    assert all(isinstance(p, SimilarPair) and p.score >= DEFAULT_THRESHOLD for p in report)
    pairs = {(p.function, p.a, p.b) for p in report}
    assert {(fn, "s1", "s2") for fn in fns} <= pairs
    assert ("layernorm_forward", "s0", "library:transformer_np.ops.layernorm.layernorm_forward") in pairs
    assert not [p for p in report if "s3" in (p.a, p.b)]
    assert report[0].score == 1.0
    everything = similarity_report(subs, ex, threshold=0.0)
    assert len(everything) == len(fns) * (3 + 3) + 1 + 3     # per function: 3 vs library, 3 pairs; s0's one
    assert similarity_report(subs, ex, threshold=1.0) == [p for p in everything if p.score == 1.0]


def test_unknown_exercise_and_bad_arguments_are_refused():
    for call in (lambda: library_functions("07_decoder"), lambda: similarity_report({}, "softmax"),
                 lambda: graded_functions("01-softmax")):
        with pytest.raises(InputValueError, match="01_softmax, 02_layernorm.*06_encoder_layer"):
            call()
    with pytest.raises(InputValueError, match="threshold"):
        similarity_report({}, "01_softmax", threshold=1.5)
    with pytest.raises(TypeError, match=r"submissions\['a'\]"):
        similarity_report({"a": ["def f(): pass"]}, "01_softmax")
    with pytest.raises(InputValueError, match="library:"):
        similarity_report({"library:x": {}}, "01_softmax")


def test_library_functions_are_the_specs_references():
    """Each exercise's library functions are the ones its Exercise's reference / reference_backward call."""
    def called(f) -> set:
        names = set(f.__code__.co_names) | {c for c in f.__code__.co_consts if isinstance(c, str)}
        for name in list(names):                           # one level of module-level helpers (_layer_reference)
            g = f.__globals__.get(name)
            if callable(getattr(g, "__code__", None)) and g.__module__ == f.__module__:
                names |= set(g.__code__.co_names)
        return names
    for ex in CHECKS:
        lib = library_functions(ex)
        assert set(sim._LIBRARY[ex]) == set(graded_functions(ex))
        refs = set()
        for _kind, names in CHECKS[ex].values():
            for name in names:
                refs |= called(EXERCISES[name].reference) | called(EXERCISES[name].reference_backward)
        for fn, (public, *kernels) in sim._LIBRARY[ex].items():
            short = public.rsplit(".", 1)[1]
            # gelu's reference backward is activation_backward's own line, dout * cache["grad"]
            assert short in refs or (short == "activation_backward" and "grad" in refs), (ex, fn, public)
            assert lib["transformer_np." + public] and all(k.rsplit(".", 1)[1] in lib["transformer_np." + public]
                                                           for k in kernels)
