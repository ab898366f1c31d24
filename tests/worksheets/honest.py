"""An honest student, simulated independently of the marker (imported as ``import honest``).

Plain NumPy, written from the textbook formulas (not from transformer_np.worksheets): the student
works every layer forward and backward and rounds EVERY number they produce to the sheet's decimals
— each answer, each quantity they do not write down, and each sub-step (the mean, every squared
deviation, the variance, √(σ² + ε), every x̂ of a LayerNorm; Q Kᵀ before the scale and the scale
√d_k itself; every exponential and the row sum of a softmax; Φ, φ, tanh; every term of a sum of
gradients; the row sum ⟨dA, A⟩; γ ⊙ dy and the two means of the LayerNorm backward). Variants of
honest work: rounding halves away from zero or to even; the softmax with or without the row maximum
subtracted; ``keep=None`` (the default: every number carried as rounded to the sheet's decimals), ``keep=k``
(every number carried and every sub-step rounded to k > D places, each answer written rounded to D) or
``keep="all"`` (keep the digits, round only what is written: the student computes in full precision, writes
each answer rounded to D, and carries the unrounded values forward). ``plant`` replaces one named quantity by a
mistake (a function of the student's values so far, as carried); everything after is done right from the
student's own numbers.
"""

from __future__ import annotations

import math

import numpy as np

from transformer_np.worksheets.format import load_worksheet


def _erf(x):
    return np.vectorize(math.erf)(x)


class Student:
    def __init__(self, raw: dict, half_even: bool = False, subtract_max: bool = True, plant=None, keep=None):
        self.ws = load_worksheet({k: v for k, v in raw.items() if k != "answers"})
        self.D = self.ws.decimals
        self.keep = self.D if keep is None else keep          # the decimals carried ("all": no rounding)
        self.half_even, self.subtract_max = half_even, subtract_max
        self.plant = plant or {}
        self.v: dict = {}          # (layer, name) -> value the student carries
        self.w: dict = {}          # (layer, name) -> value the student writes (rounded to D)
        self.ln: dict = {}         # (layer, which) -> (xhat, sd) of the forward LayerNorms

    def _round(self, x, k):
        x = np.asarray(x, dtype=float)
        if self.half_even:
            return np.round(x, k) + 0.0
        f = 10.0 ** k
        return np.sign(x) * np.floor(np.abs(x) * f + 0.5) / f + 0.0

    def R(self, x):
        """A number as the student carries it (a sub-step, or a quantity not written)."""
        return np.asarray(x, dtype=float) + 0.0 if self.keep == "all" else self._round(x, self.keep)

    def put(self, l, name, value):
        key = (l, name)
        if key in self.plant:
            value = self.plant[key](self.v)
        self.w[key] = self._round(value, self.D)
        self.v[key] = self.w[key] if self.keep == self.D else self.R(value)
        return self.v[key]

    # ------------------------------------------------------------------ forward
    def layernorm(self, l, x, which, mean_name, var_name, out_name, p):
        R = self.R
        mu = self.put(l, mean_name, x.mean(axis=1))
        sq = R((x - mu[:, None]) ** 2)
        var = self.put(l, var_name, sq.mean(axis=1))
        sd = R(np.sqrt(np.maximum(var, 0) + self.ws.eps))
        xh = R((x - mu[:, None]) / sd[:, None])
        self.ln[(l, which)] = (xh, sd)
        return self.put(l, out_name, p[f"gamma{which}"] * xh + p[f"beta{which}"])

    def heads(self, name):
        h = self.ws.n_heads
        return [name] if h == 1 else [f"{name}_head{i + 1}" for i in range(h)]

    def attention(self, l, x, p):
        R, dk = self.R, self.ws.d_k
        Q = self.put(l, "Q", x @ p["W_Q"] + p["b_Q"])
        K = self.put(l, "K", x @ p["W_K"] + p["b_K"])
        V = self.put(l, "V", x @ p["W_V"] + p["b_V"])
        sq = R(math.sqrt(dk))
        ctx = []
        for i, (sn, an) in enumerate(zip(self.heads("scores"), self.heads("attention_weights"))):
            c = slice(i * dk, (i + 1) * dk)
            S = self.put(l, sn, R(Q[:, c] @ K[:, c].T) / sq)
            m = S.max(axis=1, keepdims=True)      # without it, only where no exponential rounds to 0 (s ≥ −2)
            m = m if self.subtract_max else np.where(m < -2, m, 0.0)
            E = R(np.exp(S - m))
            A = self.put(l, an, E / R(E.sum(axis=1, keepdims=True)))
            ctx.append(A @ V[:, c])
        C = self.put(l, "context", np.concatenate(ctx, axis=1))
        return self.put(l, "attention_output", C @ p["W_O"] + p["b_O"])

    def act(self, z):
        R, a = self.R, self.ws.activation
        if a == "relu":
            return np.maximum(z, 0)
        if a == "gelu":
            return z * R(0.5 * (1 + _erf(z / math.sqrt(2))))
        return 0.5 * z * (1 + R(np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3))))

    def act_grad(self, z):
        R, a = self.R, self.ws.activation
        if a == "relu":
            return (z > 0).astype(float)
        if a == "gelu":
            return R(R(0.5 * (1 + _erf(z / math.sqrt(2)))) + z * R(np.exp(-z * z / 2) / math.sqrt(2 * math.pi)))
        c = math.sqrt(2 / math.pi)
        t = R(np.tanh(c * (z + 0.044715 * z ** 3)))
        return R(0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z))

    def ffn(self, l, x, p):
        z = self.put(l, "ffn_hidden", x @ p["W_1"] + p["b_1"])
        a = self.put(l, "ffn_activation", self.act(z))
        return self.put(l, "ffn_output", a @ p["W_2"] + p["b_2"])

    def forward(self):
        x = self.ws.H0
        for l in range(1, self.ws.layers + 1):
            p = self.ws.params[l - 1]
            self.v[(l, "input")] = x
            if self.ws.norm == "post":
                ao = self.attention(l, x, p)
                r = self.put(l, "residual", x + ao)
                ln = self.layernorm(l, r, "1", "layer_norm_mean", "layer_norm_var", "layer_norm", p)
                fo = self.ffn(l, ln, p)
                r2 = self.put(l, "residual2", ln + fo)
                x = self.layernorm(l, r2, "2", "layer_norm2_mean", "layer_norm2_var", "H", p)
            else:
                ln = self.layernorm(l, x, "1", "layer_norm_mean", "layer_norm_var", "layer_norm", p)
                ao = self.attention(l, ln, p)
                r = self.put(l, "residual", x + ao)
                ln2 = self.layernorm(l, r, "2", "layer_norm2_mean", "layer_norm2_var", "layer_norm2", p)
                fo = self.ffn(l, ln2, p)
                r2 = self.put(l, "residual2", r + fo)
                x = self.put(l, "H", r2)

    # ------------------------------------------------------------------ backward
    def ln_back(self, l, which, dy, p):
        R = self.R
        xh, sd = self.ln[(l, which)]
        g = R(dy * p[f"gamma{which}"])
        m1 = R(g.mean(axis=1, keepdims=True))
        m2 = R((g * xh).mean(axis=1, keepdims=True))
        return (g - m1 - xh * m2) / sd[:, None], (dy * xh).sum(axis=0), dy.sum(axis=0)

    def ffn_back(self, l, dfo, x_in, p):
        R = self.R
        self.put(l, "d_ffn_output", dfo)
        da = self.put(l, "d_ffn_activation", dfo @ p["W_2"].T)
        self.put(l, "d_W_2", self.v[(l, "ffn_activation")].T @ dfo)
        self.put(l, "d_b_2", dfo.sum(axis=0))
        dz = self.put(l, "d_ffn_hidden", da * self.act_grad(self.v[(l, "ffn_hidden")]))
        self.put(l, "d_W_1", x_in.T @ dz)
        self.put(l, "d_b_1", dz.sum(axis=0))
        return R(dz @ p["W_1"].T)

    def attention_back(self, l, dao, x_in, p):
        R, dk = self.R, self.ws.d_k
        dao = self.put(l, "d_attention_output", dao)
        dctx = self.put(l, "d_context", dao @ p["W_O"].T)
        self.put(l, "d_W_O", self.v[(l, "context")].T @ dao)
        self.put(l, "d_b_O", dao.sum(axis=0))
        Q, K, V = self.v[(l, "Q")], self.v[(l, "K")], self.v[(l, "V")]
        sq = R(math.sqrt(dk))
        dQ, dK, dV = [], [], []
        names = zip(self.heads("attention_weights"), self.heads("d_attention_weights"), self.heads("d_scores"))
        dAs = []
        for i, (_, dan, _) in enumerate(names):
            c = slice(i * dk, (i + 1) * dk)
            dAs.append(self.put(l, dan, dctx[:, c] @ V[:, c].T))
        for i, (an, dsn) in enumerate(zip(self.heads("attention_weights"), self.heads("d_scores"))):
            c = slice(i * dk, (i + 1) * dk)
            A, dA = self.v[(l, an)], dAs[i]
            dS = self.put(l, dsn, A * (dA - R((dA * A).sum(axis=1, keepdims=True))))
            dQ.append(R(dS @ K[:, c]))
            dK.append(R(dS.T @ Q[:, c]))
            dV.append(A.T @ dctx[:, c])
        dQ = self.put(l, "d_Q", np.concatenate(dQ, axis=1) / sq)
        dK = self.put(l, "d_K", np.concatenate(dK, axis=1) / sq)
        dV = self.put(l, "d_V", np.concatenate(dV, axis=1))
        for n, g in (("Q", dQ), ("K", dK), ("V", dV)):
            self.put(l, f"d_W_{n}", x_in.T @ g)
            self.put(l, f"d_b_{n}", g.sum(axis=0))
        return R(dQ @ p["W_Q"].T) + R(dK @ p["W_K"].T) + R(dV @ p["W_V"].T)

    def backward(self):
        R = self.R
        g = self.ws.dH
        for l in range(self.ws.layers, 0, -1):
            p = self.ws.params[l - 1]
            out = "d_H0" if l == 1 else None
            g = self.put(l, "d_H", g) if l == self.ws.layers else g
            x = self.v[(l, "input")]
            if self.ws.norm == "post":
                dx, dg, db = self.ln_back(l, "2", g, p)
                dr2 = self.put(l, "d_residual2", dx)
                self.put(l, "d_gamma2", dg)
                self.put(l, "d_beta2", db)
                dln = self.put(l, "d_layer_norm", dr2 + self.ffn_back(l, dr2, self.v[(l, "layer_norm")], p))
                dx, dg, db = self.ln_back(l, "1", dln, p)
                dr = self.put(l, "d_residual", dx)
                self.put(l, "d_gamma1", dg)
                self.put(l, "d_beta1", db)
                proj = self.attention_back(l, dr, x, p)
                gin = dr + proj
            else:
                dr2 = self.put(l, "d_residual2", g)
                dln2 = self.put(l, "d_layer_norm2", self.ffn_back(l, dr2, self.v[(l, "layer_norm2")], p))
                dx, dg, db = self.ln_back(l, "2", dln2, p)
                dr = self.put(l, "d_residual", dr2 + R(dx))
                self.put(l, "d_gamma2", dg)
                self.put(l, "d_beta2", db)
                proj = self.attention_back(l, dr, self.v[(l, "layer_norm")], p)
                dln = self.put(l, "d_layer_norm", proj)
                dx, dg, db = self.ln_back(l, "1", dln, p)
                self.put(l, "d_gamma1", dg)
                self.put(l, "d_beta1", db)
                gin = dr + R(dx)
            if out:
                self.put(1, "d_H0", gin)
            else:
                g = self.put(l - 1, "d_H", gin)

    def run(self):
        self.forward()
        if self.ws.backward:
            self.backward()
        return self

    def answers(self, written=None) -> dict:
        """The [answers] tables: every quantity the student computed, or those in ``written``."""
        out: dict = {}
        for (l, name), val in self.w.items():
            if written is not None and (l, name) not in written:
                continue
            out.setdefault(f"layer{l}", {})[name] = np.asarray(val).tolist()
        return out
