r"""A third, independent autodiff: the same encoder built from Flax NNX layers, differentiated by ``jax.grad``.

:func:`flax_encoder` builds, from an :class:`~transformer_np.model.config.EncoderConfig`, an
encoder whose every part is an established Flax NNX layer — ``nnx.MultiHeadAttention`` (its own
projections, head split, scaled dot-product softmax and output projection), ``nnx.LayerNorm``,
``nnx.Linear`` for the FFN, ``nnx.Embed`` for the embedding tables — wired as the config says
(Post-LN or Pre-LN, final LayerNorm or not, one layer shared by every depth for ALBERT-style
configs, learned or sinusoidal positions, token types). :func:`to_flax` writes our params into
it and :func:`from_flax` reads a Flax state — parameters *or* the gradients ``nnx.grad`` returns —
back under our names. Nothing of this library's forward or backward runs on the JAX side.

The mapping (ours → Flax; h heads, d_k = d / h)::

    layers.{ℓ}.attn.W_Q (d, d)      layers[ℓ].attn.query.kernel (d, h, d_k)   W_Q.reshape(d, h, d_k)
    layers.{ℓ}.attn.b_Q (d,)        layers[ℓ].attn.query.bias (h, d_k)        b_Q.reshape(h, d_k)
    … W_K, W_V, b_K, b_V            …key…, …value…                            the same
    layers.{ℓ}.attn.W_O (d, d)      layers[ℓ].attn.out.kernel (h, d_k, d)     W_O.reshape(h, d_k, d)
    layers.{ℓ}.attn.b_O             layers[ℓ].attn.out.bias
    layers.{ℓ}.ffn.W_1, b_1         layers[ℓ].ffn1.kernel, .bias              as is (both use x W + b)
    layers.{ℓ}.ffn.W_2, b_2         layers[ℓ].ffn2.kernel, .bias
    layers.{ℓ}.ln{1,2}.gamma/beta   layers[ℓ].ln{1,2}.scale / .bias
    final_ln.gamma/beta             final_ln.scale / .bias
    embeddings.word/position/token_type   word/position/token_type.embedding
    embeddings.ln.gamma/beta        emb_ln.scale / .bias

The reshapes are the head split both libraries use (head j owns columns j·d_k … (j+1)·d_k − 1).
Flax's LayerNorm is built with ``use_fast_variance=False`` (the two-pass variance torch and we use).

Attention. Without dropout, Flax's default ``attention_fn`` hands the work to
``jax.nn.dot_product_attention``, which computes the softmax in float32 whatever the input dtype
(jax's source says so: "Softmax is always computed in float32"): a float64 model then agrees with
float64 arithmetic only to ~1e-7 (measured in ``docs/guide/frameworks.md``). By default we pass
Flax's own explicit path instead — ``flax.nnx.nn.attention.dot_product_attention_weights`` (scores, mask, softmax in
the input dtype) and the weighted sum of the values, exactly what ``nnx.dot_product_attention``
does when dropout or weight-sowing is on. ``fast_attention=True`` keeps the default, to reproduce
the finding.
Dropout is not built: the lane compares the deterministic function (eval mode).

jax and flax are optional (``pip install 'transformer_np[jax]'``) and imported inside the functions.
Float64 needs ``jax.config.update("jax_enable_x64", True)`` before any array is made; the
functions refuse float64 without it rather than silently compute in float32.
"""

from __future__ import annotations

import numpy as np

from .._optional import require
from .._validate import describe
from ..errors import InputTypeError, InputValueError
from ..model.config import EncoderConfig
from ..model.params import param_shapes

__all__ = ["flax_encoder", "to_flax", "from_flax", "flax_forward"]

_PIP = "pip install jax flax (or pip install 'transformer_np[jax]')"


def _require_flax():
    hint = f"the JAX lane needs jax and flax: {_PIP}"
    return require("jax", hint), require("jax.numpy", hint), require("flax.nnx", hint)


def _jax_dtype(dtype):
    jax, jnp, _ = _require_flax()
    dt = np.dtype(dtype)
    if dt == np.float64:
        if not jax.config.jax_enable_x64:
            raise InputValueError("float64 in JAX needs jax.config.update('jax_enable_x64', True) before any array "
                                  "is created; without it JAX silently computes in float32")
        return jnp.float64
    if dt == np.float32:
        return jnp.float32
    raise InputTypeError(f"dtype must be float32 or float64, got {dt}")


def _check_config(config) -> None:
    if not isinstance(config, EncoderConfig):
        raise InputTypeError(f"config must be an EncoderConfig, got {describe(config)}")


def _explicit_attention(query, key, value, bias=None, mask=None, broadcast_dropout=True, dropout_rng=None,
                        dropout_rate=0.0, deterministic=True, dtype=None, precision=None, module=None, **_):
    """Flax's explicit attention, in the input dtype: ``flax.nnx.nn.attention.dot_product_attention_weights``
    (scores, mask, softmax), then Σ_k A_qk V_k."""
    _, jnp, _ = _require_flax()
    from flax.nnx.nn.attention import dot_product_attention_weights

    w = dot_product_attention_weights(query, key, bias, mask, dtype=dtype, precision=precision)  # (B, h, q, k)
    return jnp.einsum("...hqk,...khd->...qhd", w, value, precision=precision)                      # (B, q, h, d_k)


def flax_encoder(config: EncoderConfig, dtype=np.float64, seed: int = 0, fast_attention: bool = False):
    """A Flax NNX module computing the encoder of ``config`` (its weights random until :func:`to_flax`).

    Call it as ``model(input_ids=..., token_type_ids=..., attention_mask=...)`` or
    ``model(inputs_embeds=H0, attention_mask=...)``; it returns H^(N) (B, n, d_model).
    ``fast_attention=True`` keeps Flax's default attention (``jax.nn.dot_product_attention``,
    softmax in float32 even for float64 inputs); the default is Flax's explicit path.
    """
    jax, jnp, nnx = _require_flax()
    _check_config(config)
    jdt = _jax_dtype(dtype)
    attn_kw = {} if fast_attention else {"attention_fn": _explicit_attention}
    d, h, f, eps = config.d_model, config.n_heads, config.d_ff, config.layer_norm_eps
    acts = {"gelu": lambda x: jax.nn.gelu(x, approximate=False),
            "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True), "relu": jax.nn.relu}
    act = acts[config.activation]
    kw = {"dtype": jdt, "param_dtype": jdt}

    def norm(rngs):
        return nnx.LayerNorm(d, epsilon=eps, use_fast_variance=False, rngs=rngs, **kw)

    class Layer(nnx.Module):
        def __init__(self, rngs):
            self.attn = nnx.MultiHeadAttention(num_heads=h, in_features=d, qkv_features=d, out_features=d,
                                               decode=False, deterministic=True, rngs=rngs, **attn_kw, **kw)
            self.ln1, self.ln2 = norm(rngs), norm(rngs)
            self.ffn1 = nnx.Linear(d, f, rngs=rngs, **kw)
            self.ffn2 = nnx.Linear(f, d, rngs=rngs, **kw)

        def __call__(self, x, mask):
            if config.norm_position == "post":
                z = self.ln1(x + self.attn(x, mask=mask))                    # Z = LN1(H + MHA(H))
                return self.ln2(z + self.ffn2(act(self.ffn1(z))))            # LN2(Z + FFN(Z))
            z = x + self.attn(self.ln1(x), mask=mask)                        # Z = H + MHA(LN1(H))
            return z + self.ffn2(act(self.ffn1(self.ln2(z))))                # Z + FFN(LN2(Z))

    class Encoder(nnx.Module):
        def __init__(self, rngs):
            n_distinct = 1 if config.share_layers else config.n_layers
            self.layers = nnx.List([Layer(rngs) for _ in range(n_distinct)])
            self.final_ln = norm(rngs) if config.use_final_layer_norm else None
            if config.has_embeddings:
                self.word = nnx.Embed(config.vocab_size, d, rngs=rngs, **kw)
                self.position = (nnx.Embed(config.max_len, d, rngs=rngs, **kw)
                                 if config.positional == "learned" else None)
                self.token_type = (nnx.Embed(config.type_vocab_size, d, rngs=rngs, **kw)
                                   if config.type_vocab_size else None)
                self.emb_ln = norm(rngs) if config.embedding_layer_norm else None

        def __call__(self, input_ids=None, token_type_ids=None, attention_mask=None, inputs_embeds=None):
            if inputs_embeds is None:
                B, n = input_ids.shape
                x = self.word(input_ids)                                     # (B, n, d)
                if self.position is not None:
                    x = x + self.position(jnp.arange(n))[None]
                elif config.positional == "sinusoidal":
                    from ..ops.embeddings import sinusoidal_positional_encoding

                    x = x + jnp.asarray(sinusoidal_positional_encoding(n, d, np.float64), dtype=jdt)
                if self.token_type is not None:
                    tt = jnp.zeros((B, n), jnp.int32) if token_type_ids is None else token_type_ids
                    x = x + self.token_type(tt)
                if self.emb_ln is not None:
                    x = self.emb_ln(x)
            else:
                x = inputs_embeds
            mask = None if attention_mask is None else (attention_mask[:, None, None, :] == 1)   # (B, 1, 1, n)
            for ell in range(config.n_layers):
                x = self.layers[0 if config.share_layers else ell](x, mask)
            return x if self.final_ln is None else self.final_ln(x)

    return Encoder(nnx.Rngs(seed))


def _flax_path(name: str, config: EncoderConfig) -> tuple[tuple, str]:
    """Our name → (path of the Flax variable, how to reshape: "qkv", "qkv_bias", "out" or "")."""
    parts = name.split(".")
    if parts[0] == "layers":
        ell, sub, leaf = int(parts[1]), parts[2], parts[3]
        if sub == "attn":
            kind, which = leaf.split("_")
            module = {"Q": "query", "K": "key", "V": "value", "O": "out"}[which]
            var = "kernel" if kind == "W" else "bias"
            reshape = "out" if (which == "O" and kind == "W") else ("" if which == "O" else
                                                                   ("qkv" if kind == "W" else "qkv_bias"))
            return ("layers", ell, "attn", module, var), reshape
        if sub == "ffn":
            return ("layers", ell, "ffn" + leaf[-1], "kernel" if leaf[0] == "W" else "bias"), ""
        return ("layers", ell, sub, "scale" if leaf == "gamma" else "bias"), ""
    if parts[0] == "final_ln":
        return ("final_ln", "scale" if parts[1] == "gamma" else "bias"), ""
    if parts[0] == "embeddings":
        if parts[1] == "ln":
            return ("emb_ln", "scale" if parts[2] == "gamma" else "bias"), ""
        return (parts[1], "embedding"), ""
    raise InputValueError(f"no Flax counterpart for the parameter {name!r}")


def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def to_flax(params: dict, config: EncoderConfig, dtype=None, seed: int = 0, fast_attention: bool = False):
    """A :func:`flax_encoder` holding ``params`` (our names; shapes checked) — in ``dtype``, default the params'."""
    jax, jnp, nnx = _require_flax()
    _check_config(config)
    shapes = param_shapes(config)
    missing = [k for k in shapes if k not in params]
    if missing:
        raise InputValueError(f"params is missing {missing[:6]} for this config")
    dtype = next(iter(params.values())).dtype if dtype is None else dtype
    model = flax_encoder(config, dtype, seed, fast_attention)
    h, dk, d = config.n_heads, config.d_k, config.d_model
    for name, shape in shapes.items():
        a = np.asarray(params[name])
        if a.shape != shape:
            raise InputValueError(f"params[{name!r}] must have shape {shape}, got shape {a.shape}")
        path, how = _flax_path(name, config)
        a = {"qkv": lambda t: t.reshape(d, h, dk), "qkv_bias": lambda t: t.reshape(h, dk),
             "out": lambda t: t.reshape(h, dk, d), "": lambda t: t}[how](a)
        obj = model
        for p in path[:-1]:
            obj = obj[p] if isinstance(p, int) else getattr(obj, p)
        var = getattr(obj, path[-1])
        old = var.get_value()
        if tuple(old.shape) != a.shape:
            raise AssertionError(f"internal: {name} → {path} has shape {old.shape}, mapped {a.shape}")
        var.set_value(jnp.asarray(a, dtype=old.dtype))
    return model


def from_flax(tree, config: EncoderConfig) -> dict[str, np.ndarray]:
    """Our params from a Flax model or a state of it — e.g. the gradients ``nnx.grad`` returns — by the
    mapping of the module docstring (kernels reshaped back to (d, d))."""
    _, _, nnx = _require_flax()
    _check_config(config)
    state = nnx.state(tree, nnx.Param) if isinstance(tree, nnx.Module) else tree
    pure = nnx.to_pure_dict(state) if isinstance(state, nnx.State) else state
    out = {}
    for name, shape in param_shapes(config).items():
        path, _ = _flax_path(name, config)
        out[name] = np.asarray(_get(pure, path)).reshape(shape)
    return out


def flax_forward(model, input_ids=None, attention_mask=None, token_type_ids=None, inputs_embeds=None):
    """Run a :func:`flax_encoder` on NumPy inputs; returns a NumPy H^(N)."""
    _, jnp, _ = _require_flax()
    conv = {k: (None if v is None else jnp.asarray(v)) for k, v in
            {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
             "inputs_embeds": inputs_embeds}.items()}
    return np.asarray(model(**conv))
