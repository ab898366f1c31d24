r"""The names a worksheet uses: set-up keys, parameters, quantities, verdicts and diagnosis codes.

These names are a contract (issue 14): a worksheet written today must keep meaning the same thing.

Quantities of one layer, in the order they are computed (``n`` tokens, ``d`` = ``d_model``,
``h`` heads of width ``d_k = d / h``, ``f`` = ``d_ff``; "per head" names get ``_head1`` …
``_head{h}`` when ``h > 1``):

===================== ====== ============================== ===================================
name                  shape  Post-LN (BERT)                 Pre-LN
===================== ====== ============================== ===================================
``layer_norm_mean``   (n,)   mean of ``residual``           mean of the layer input x
``layer_norm_var``    (n,)   variance (÷ d) of ``residual`` variance (÷ d) of x
``layer_norm``        (n, d) LN_1(``residual``)             LN_1(x), the attention's input
``Q`` ``K`` ``V``     (n, d) x W + b                        LN_1(x) W + b
``scores``            (n, n) Q_h K_hᵀ / √d_k, per head      same
``attention_weights`` (n, n) softmax of each row of scores  same
``context``           (n, d) [A_1 V_1 | … | A_h V_h]        same
``attention_output``  (n, d) context W_O + b_O              same
``residual``          (n, d) x + attention_output           same
``layer_norm2_mean``  (n,)   mean of ``residual2``          mean of ``residual``
``layer_norm2_var``   (n,)   variance of ``residual2``      variance of ``residual``
``layer_norm2``       (n, d) — (it is ``H``)                LN_2(``residual``), the FFN's input
``ffn_hidden``        (n, f) layer_norm W_1 + b_1           layer_norm2 W_1 + b_1
``ffn_activation``    (n, f) act(ffn_hidden)                same
``ffn_output``        (n, d) ffn_activation W_2 + b_2       same
``residual2``         (n, d) layer_norm + ffn_output        residual + ffn_output
``H``                 (n, d) LN_2(residual2)                residual2 (no final LayerNorm)
===================== ====== ============================== ===================================

So ``layer_norm`` is always the output of the layer's *first* LayerNorm and ``residual`` always the
first residual sum; in Pre-LN the first LayerNorm comes before attention, in Post-LN after it.

Backward (when ``[input].dH`` = ∂L/∂H^(N) is given): ``d_`` + any forward name except the
LayerNorm statistics (``d_scores``, ``d_layer_norm``, …), ``d_`` + any parameter name (``d_W_2``,
``d_gamma1``, …) and, in layer 1, ``d_H0`` = ∂L/∂H^(0). ``d_H`` of layer ℓ < N is the gradient
reaching that layer's output from layer ℓ + 1; of the last layer it is ``[input].dH`` itself.
"""

from __future__ import annotations

__all__ = ["SETUP_KEYS", "PARAM_NAMES", "LIBRARY_PARAM", "VERDICTS", "DIAGNOSES",
           "head_names", "forward_names", "backward_names", "answer_names", "is_per_token"]

# [setup] keys and their defaults (None = required or derived; see format.py)
SETUP_KEYS = ("tokens", "d_model", "n_heads", "d_ff", "norm", "activation", "eps", "layers", "decimals", "seed",
              "problem_id")

# worksheet parameter name -> the library's name inside one layer (``layers.ℓ.`` + this)
LIBRARY_PARAM = {
    "W_Q": "attn.W_Q", "b_Q": "attn.b_Q", "W_K": "attn.W_K", "b_K": "attn.b_K",
    "W_V": "attn.W_V", "b_V": "attn.b_V", "W_O": "attn.W_O", "b_O": "attn.b_O",
    "gamma1": "ln1.gamma", "beta1": "ln1.beta",
    "W_1": "ffn.W_1", "b_1": "ffn.b_1", "W_2": "ffn.W_2", "b_2": "ffn.b_2",
    "gamma2": "ln2.gamma", "beta2": "ln2.beta",
}
PARAM_NAMES = tuple(LIBRARY_PARAM)

VERDICTS = ("correct", "follows", "wrong", "missing")

# diagnosis code -> one-line meaning (the explanation of a diagnosis adds the student's numbers)
DIAGNOSES = {
    "missing_scale": "the scores were not divided by sqrt(d_k)",
    "wrong_scale": "the scores were divided by d_k, or by sqrt(d_model), instead of sqrt(d_k)",
    "softmax_axis": "the softmax was taken down the columns instead of along each row",
    "transposed_scores": "the score matrix is transposed (K Q^T instead of Q K^T)",
    "sample_variance": "the LayerNorm variance divides by d - 1 (sample variance) instead of d",
    "ln_before_residual": "Post-LN: the sublayer output was normalised before the residual was added",
    "ln_after_residual": "Pre-LN: the residual sum was normalised (Post-LN wiring)",
    "no_residual": "the residual (skip) connection was left out",
    "wrong_activation": "another activation was used (ReLU / GELU / tanh-GELU)",
    "early_rounding": "the inputs of the step were rounded to fewer decimals than the sheet asks",
    "softmax_jacobian": "softmax backward without the row-sum term: dS = A * dA (or dS = dA) instead of "
                        "A * (dA - rowsum(dA * A))",
    "ln_stats_constant": "LayerNorm backward that ignores the dependence of the mean and the variance on the input",
    "activation_derivative": "a wrong derivative of the activation (e.g. GELU'(z) taken as Phi(z))",
    "missing_bias": "the bias of a linear layer was not added",
    "transposed_weight": "a weight matrix used transposed (x W^T for x W, or dy W for dy W^T)",
    "miscopied_input": "one number of the sheet (an entry of H0, dH or a weight) was copied wrongly",
    "arithmetic": "none of the common mistakes reproduces the numbers: a slip in the arithmetic",
    "trivialised": "right from the student's own earlier numbers, but those numbers make the step trivial (all "
                   "zeros, a constant row, the identity, or a value that is the same for any input): no "
                   "follow-through credit",
}

# A worksheet is for hand calculation: sizes beyond these are refused.


def head_names(base: str, n_heads: int) -> list[str]:
    """``["scores"]`` for one head, ``["scores_head1", …]`` for several."""
    return [base] if n_heads == 1 else [f"{base}_head{i + 1}" for i in range(n_heads)]


def _attention_names(n_heads: int) -> list[str]:
    return (["Q", "K", "V"] + head_names("scores", n_heads) + head_names("attention_weights", n_heads)
            + ["context", "attention_output", "residual"])


def forward_names(norm: str, n_heads: int) -> list[str]:
    """The forward quantities of one layer, in the order they are computed."""
    ln1 = ["layer_norm_mean", "layer_norm_var", "layer_norm"]
    ffn = ["ffn_hidden", "ffn_activation", "ffn_output", "residual2"]
    if norm == "post":
        return _attention_names(n_heads) + ln1 + ffn + ["layer_norm2_mean", "layer_norm2_var", "H"]
    return ln1 + _attention_names(n_heads) + ["layer_norm2_mean", "layer_norm2_var", "layer_norm2"] + ffn + ["H"]


def backward_names(norm: str, n_heads: int, layer: int) -> list[str]:
    """The backward quantities of one layer (1-based ``layer``), in the order they are computed."""
    att = (["d_attention_output", "d_context", "d_W_O", "d_b_O"] + head_names("d_attention_weights", n_heads)
           + head_names("d_scores", n_heads) + ["d_Q", "d_K", "d_V", "d_W_Q", "d_b_Q", "d_W_K", "d_b_K",
                                                  "d_W_V", "d_b_V"])
    ffn = ["d_ffn_output", "d_ffn_activation", "d_W_2", "d_b_2", "d_ffn_hidden", "d_W_1", "d_b_1"]
    if norm == "post":
        names = (["d_H", "d_residual2", "d_gamma2", "d_beta2"] + ffn
                 + ["d_layer_norm", "d_residual", "d_gamma1", "d_beta1"] + att)
    else:
        names = (["d_H", "d_residual2"] + ffn + ["d_layer_norm2", "d_residual", "d_gamma2", "d_beta2"] + att
                 + ["d_layer_norm", "d_gamma1", "d_beta1"])
    return names + (["d_H0"] if layer == 1 else [])


def answer_names(norm: str, n_heads: int, layer: int, backward: bool) -> list[str]:
    """Every name an ``[answers.layerℓ]`` table may hold."""
    return forward_names(norm, n_heads) + (backward_names(norm, n_heads, layer) if backward else [])


def is_per_token(name: str) -> bool:
    """Does the quantity have one row per token (so a table keyed by token can give some rows)?

    Parameter gradients (``d_W_Q``, ``d_b_1``, ``d_gamma1``, …) do not.
    """
    base = name[2:] if name.startswith("d_") else name
    return base not in PARAM_NAMES
