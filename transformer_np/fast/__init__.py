r"""The speed engine: the encoder's ops and layer rearranged for speed and memory, apart from the textbook.

``encoder_forward(..., fast=True)`` (the default) runs these kernels; the textbook ops
(:mod:`~transformer_np.ops.attention`, :mod:`~transformer_np.ops.layernorm`,
:mod:`~transformer_np.ops.feedforward`, :mod:`~transformer_np.ops.softmax`, …) and the textbook layer
(:mod:`transformer_np.model.encoder`) are the reference, and ``tests/ops/test_fast_path.py`` proves the two
agree (≤ 1e-12 relative in float64; in float32 ≤ 1e-6 op by op, and a whole stack as accurate as the plain
path against the same stack in float64; with masks and dropout, forward and every gradient). Read the
textbook module first: every function here has the same name, arguments and result as its textbook
kernel (:mod:`transformer_np.ops.kernels` lists them), and none checks its arguments — the public
entry points have done that once.

The map:

* this package's namespace — the kernels under the textbook names (``mha_forward``, ``ffn_backward``, …)
  and the thread settings (:func:`set_num_threads`, :func:`set_batch_threads`);
* :mod:`~transformer_np.fast.attention` — the softmax and attention core by blocks of scores;
  :mod:`~transformer_np.fast.blocks` — how the scores are cut into blocks and the blocks over threads;
* :mod:`~transformer_np.fast.mha` — the fused Q, K, V projections around the core;
* :mod:`~transformer_np.fast.ffn` — linear, LayerNorm, activations (:mod:`~transformer_np.fast.gelu64`:
  the float64 GELU) and the FFN;
* :mod:`~transformer_np.fast.layer` — the encoder layer, forward and backward, and the stack's embedding
  block and final LayerNorm; :mod:`~transformer_np.fast.inference` — the layer for inference;
* :mod:`~transformer_np.fast.threads` — the thread pool, the batch split and BLAS's thread count around a
  block (:func:`~transformer_np.fast.threads.one_blas_thread`).

What the engine is held to: :mod:`transformer_np.ops.kernels`, the textbook kernels under these names.

The rule: ``ops`` ← ``fast`` ← ``model``. This package imports the textbook ops it builds on and never
``model`` (``tests/test_layering.py`` parses the imports); the textbook ops never import it. The encoder
picks a path once per forward and once per backward (:func:`transformer_np.model.stack._kernels`). A cache
of the engine's own layout (fused Q, K, V; attention without its weights; an FFN input kept as its LayerNorm)
passed to a public textbook backward goes to the engine's backward through one dispatch table,
:data:`transformer_np.ops.cache.ENGINE_BACKWARDS`, which this package fills when it is imported. A table
rather than an error, because code above both takes a sublayer's cache from the default (engine) layer and
hands it to the public backward — the exercise grader's reference layer and the gradient-flow study do — and
a table keeps the arrow one way: the engine registers itself, the textbook never imports it.

The tricks, each measured on this machine (see ``docs/bench_notes.md`` and
``docs/guide/performance.md``):

* **Scores by blocks** (:func:`attention_forward`): S, A and their backward are computed for ~2¹⁸
  scores at a time (1 MiB in float32: within L2), so each elementwise pass of the softmax stays in
  the CPU cache instead of streaming the whole (…, n_q, n_k) array (128 MiB at n = 2048) through
  memory. A block is rows of one (batch, head) slice when a head has ≥ 2¹⁸ scores (every product
  stays tall), else as many whole heads as fit (short sequences pay no Python loop per head). Each
  row of A is the softmax of its own row of S, so the blocks are independent. Only A is kept (S is
  overwritten by A in place): the plain cache's ``"scores"`` is not stored.
* **Fewer passes over the scores** (round 4): the max subtraction is skipped for rows that a
  Cauchy–Schwarz bound proves safe from overflow and underflow (:func:`_no_max_rows`), 1/√d_k goes
  onto Q where that is exact (:func:`_folds`: √d_k a power of two), and each block's rows of O are
  computed while the block is in cache. For rows of ≥ 8·d_v keys the row sums come from the A V
  product itself, P [V | 1] = [P V | ℓ] (no sum pass), O = (P V)/ℓ is normalised on the (n, d_v)
  result, and a stored A is P ⊙ (1/ℓ) in place: exp, the two products and (A stored) one scaling
  pass per block — the NumPy limit of the bench plus that one pass.
* **Inference** (``for_backward=False``): the same loop, a cache with only the attention weights. Rows of
  fewer than 8·d_v keys (MiniLM's) are exponentiated without the bound or the max and checked by their
  row sums afterwards (:func:`_sums_safe`; a block that over- or underflowed is recomputed with the
  maxima), with the exact ÷ √d_k on the contiguous scores instead of a copy of Q.
* **Recomputed attention** (``store_attention=False``): no A kept at all; the row maxima and sums
  of the softmax are, and the backward rebuilds each block of P = exp(S − m) and works on it
  unnormalised, every 1/ℓ applied to an (n, d) array (the FlashAttention trade: one more Q Kᵀ
  product and exp per block for O(n) memory per block).
* **Fewer passes in the softmax backward**: ⟨dA_i, A_i⟩ = ⟨dO_i, O_i⟩ (an (n, d_v) product instead
  of an (n, n) one), and for rows of ≥ 8·d_v keys dA − D comes from one product
  [dO | −D] [V | 1]ᵀ, so dS = A ⊙ (dA − D) is one pass over the block (two for rows of 2–8·d_v keys).
* **In-place buffers**: the softmax (:func:`softmax` with ``out=``), the 1/√d_k scale and the mask
  are applied in the buffer that becomes A; O is written straight into the merged heads' context;
  LayerNorm reuses x − μ as x̂ and g as dx; f(U) overwrites U, and f′ ⊙ ∂L/∂f(U) is computed in
  ∂L/∂f(U)'s buffer.
* **One (M, 3d) projection output** (:func:`mha_forward`): X W_Q, X W_K, X W_V written by three
  products into the column blocks of one array (no concatenated [W_Q | W_K | W_V] copy made or
  kept), Q, K, V views of it, and the head gradients copied once into its (B, n, 3, h, d_k) layout.
  Weights that are views of one [W_Q | W_K | W_V ; b_Q | b_K | b_V] array (and [W_O ; b_O]), as
  ``load_pretrained`` lays them out (:func:`_stacked`), take one product each, the bias inside it for
  inference ([X | 1] S).
* **Flattened matmuls** (:func:`linear_forward`): (B·n, d_in) @ (d_in, d_out) is one BLAS call;
  ``np.matmul`` on a (B, n, d_in) array calls BLAS per batch entry (~20% slower here).
* **Fused exact GELU** (float32 :func:`_gelu32`, float64 :mod:`transformer_np.fast.gelu64`): one
  range, one exp (float32: exp2), no gather or select, on blocks of 32 Ki elements. float32: 29
  in-place passes (value only, :func:`_gelu32_value`: 22), within 1e-6 relative of the exact values for
  z ≥ −3; float64: 54 (value only 51), a degree-20 polynomial, within ~1e-15 relative for z ≥ −3 and
  1.6–1.8× the blocked erf. The other activations keep the plain kernels' arithmetic on blocks of 16 Ki
  elements (bit for bit the plain result).
* **Threads for the elementwise passes, opt-in** (:func:`set_num_threads`): NumPy releases the GIL
  inside a ufunc's loop, so GELU blocks, softmax rows and bias adds can run on a small thread pool;
  every element is computed the same way whatever the count. The default is one thread: with
  OpenBLAS's workers spinning between products, a second one was measured slower on every
  benchmark layer (:mod:`transformer_np.fast.threads` has the numbers).
* **A batch split over threads, for inference** (:func:`set_batch_threads`): at two threads the
  inference layer runs two halves of a batch on two threads with OpenBLAS at one thread in each
  (via threadpoolctl), and ``PretrainedEncoder.encode`` runs whole batches on them in turn: every
  product and elementwise pass of a half has a core to itself, and no OpenBLAS worker spins against
  the elementwise passes. The default is BLAS's thread count; the numbers are in
  :mod:`transformer_np.fast.threads`.
* **Cache freeing** (``free_cache=True`` in :func:`mha_backward`, :func:`ffn_backward`): each
  entry is removed as it is read (:func:`transformer_np.ops.cache.reader`), so the largest arrays
  (A, f(U), f'(U)) are released mid-backward; dW₂ is computed before ∂L/∂f(U) so that f(U) goes first.
  A freed cache's arrays are also reused as buffers (∂L/∂f(U) and dU in f(U)'s, LayerNorm's dx in x̂'s):
  an array taken out of the cache before a ``free_cache=True`` backward is overwritten by it.
* **The training layer keeps its FFN input as the LayerNorm that made it** (the encoder's fast
  training layer): z = x̂ γ + β is rebuilt by column blocks for dW₁ instead of being kept, and the
  residual sums and x̂ are written into buffers the layer owns (one bert-base fwd+bwd: peak 74 → 62 MiB).

Not a fast-path trick: the float32 coefficient set of :func:`transformer_np.ops.erf.erf` is chosen
by the dtype for both paths (it is also the more accurate one in float32: ≤ 1.5 ulp against
3.1 ulp for Cody's float64 rationals evaluated in float32).
"""

from __future__ import annotations

from ..ops.cache import ENGINE_BACKWARDS
from ..ops.kernels import dropout_backward, dropout_forward, residual_backward, residual_forward
from .attention import attention_backward, attention_forward, attention_weights, softmax
from .ffn import (
           activation_backward,
           activation_forward,
           ffn_backward,
           ffn_forward,
           layernorm_backward,
           layernorm_forward,
           linear_backward,
           linear_forward,
)
from .mha import mha_backward, mha_forward
from .threads import get_batch_threads, get_num_threads, set_batch_threads, set_num_threads

__all__ = ["attention_weights", "get_num_threads", "set_num_threads", "get_batch_threads", "set_batch_threads",
           "linear_forward", "linear_backward", "softmax", "attention_forward", "attention_backward",
           "mha_forward", "mha_backward", "layernorm_forward", "layernorm_backward", "activation_forward",
           "activation_backward", "ffn_forward", "ffn_backward", "dropout_forward", "dropout_backward",
           "residual_forward", "residual_backward"]

# the textbook backwards hand a cache of the engine's own layout to these (transformer_np.ops.cache)
ENGINE_BACKWARDS.update(mha_backward=mha_backward, ffn_backward=ffn_backward, attention_backward=attention_backward)
