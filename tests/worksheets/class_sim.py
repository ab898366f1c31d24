"""Hand-ins as a class writes them, simulated independently of the marker (imported as ``import class_sim``).

The students are :class:`honest.Student` (plain NumPy, textbook formulas): every number is the student's own,
rounded by one of four habits (``HABITS``), and a one-slip student replaces one quantity by a mistake (``SLIPS``,
plain NumPy again) computed from the values they carry, then works everything after right from their own
numbers. Nothing here calls the marker.
"""

from __future__ import annotations

import honest
import numpy as np

# the four rounding habits of honest work
HABITS = {
    "round_everything": {},                                             # every number rounded to D, halves away
    "half_even_no_max": {"half_even": True, "subtract_max": False},     # halves to even, softmax without the max
    "one_more_digit": {"keep": "D+1"},                                  # carries D + 1 decimals, writes D
    "keep_the_digits": {"keep": "all"},                                 # full precision, rounds only what it writes
}


def _heads(ws, name: str) -> str:
    return name if ws.n_heads == 1 else f"{name}_head1"


def _softmax(S, axis):
    E = np.exp(S - S.max(axis=axis, keepdims=True))
    return E / E.sum(axis=axis, keepdims=True)


def slips(ws) -> dict:
    """{name: (key, plant)}: five one-slip students, forward and backward — the variance over d − 1, the softmax
    down the columns, an arithmetic slip in the context, the softmax Jacobian without its row sum, an arithmetic
    slip in d_layer_norm."""
    L = ws.layers
    A, dS = _heads(ws, "attention_weights"), _heads(ws, "d_scores")
    a_key, ds_key = (1, A), (L, dS)
    ln1_in = (1, "residual") if ws.norm == "post" else None

    def sample_variance(v):
        x = v[ln1_in] if ln1_in is not None else v[(1, "input")]
        mu = v[(1, "layer_norm_mean")]
        return ((x - mu[:, None]) ** 2).sum(axis=1) / (x.shape[1] - 1)

    def softmax_columns(v):
        return _softmax(v[(1, _heads(ws, "scores"))], axis=0)

    def context_slip(v):
        V, dk = v[(1, "V")], ws.d_k
        C = np.concatenate([v[(1, _name(ws, "attention_weights", i))] @ V[:, i * dk:(i + 1) * dk]
                            for i in range(ws.n_heads)], axis=1)
        C[1, 0] += 0.3
        return C

    def jacobian_without_row_sum(v):
        return v[(L, A)] * v[(L, _heads(ws, "d_attention_weights"))]

    def d_layer_norm_slip(v):
        p = ws.params[0]
        if ws.norm == "post":
            g = v[(1, "d_residual2")] + v[(1, "d_ffn_hidden")] @ p["W_1"].T
        else:
            g = sum(v[(1, f"d_{n}")] @ p[f"W_{n}"].T for n in "QKV")
        g = g.copy()
        g[0, 1] -= 0.4
        return g

    out = {"sample_variance": ((1, "layer_norm_var"), sample_variance),
           "softmax_columns": (a_key, softmax_columns),
           "context_arithmetic": ((1, "context"), context_slip)}
    if ws.backward:
        out["jacobian_without_row_sum"] = (ds_key, jacobian_without_row_sum)
        out["d_layer_norm_arithmetic"] = ((1, "d_layer_norm"), d_layer_norm_slip)
    return out


def _name(ws, name: str, i: int) -> str:
    return name if ws.n_heads == 1 else f"{name}_head{i + 1}"


def student(raw: dict, habit: str, slip: str | None = None, written=None) -> tuple[dict, tuple | None]:
    """(the hand-in: ``raw`` with the student's [answers], the key of the slipped step or None)."""
    ws = honest.Student(raw).ws
    kw = dict(HABITS[habit])
    if kw.get("keep") == "D+1":
        kw["keep"] = ws.decimals + 1
    plant, key = None, None
    if slip is not None:
        key, f = slips(ws)[slip]
        plant = {key: f}
    st = honest.Student(raw, plant=plant, **kw).run()
    answers = st.answers(written)
    return {**{k: v for k, v in raw.items() if k != "answers"}, "answers": answers}, key
