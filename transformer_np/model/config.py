r"""EncoderConfig: the hyperparameters of an encoder stack, validated on construction.

Notation of the seeds: N = ``n_layers``, d_model = ``d_model``, h = ``n_heads``
(d_k = d_model / h), d_ff = ``d_ff``.

Parameter count of one layer (row-vector weights, all with biases):
    attention  W_Q, W_K, W_V, W_O: 4 d² + 4 d
    FFN        W_1, W_2:           2 d d_ff + d_ff + d
    2 LayerNorms (γ, β):           4 d
    total (d_ff = 4d):             12 d² + 13 d      — the seeds' "≈ 12 d² per layer", made exact.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .._validate import check_bool, check_choice, check_float, check_int, describe
from ..ops.activations import ACTIVATIONS

__all__ = ["EncoderConfig", "count_parameters", "encoder_param_count"]

NORM_POSITIONS = ("post", "pre")
POSITIONALS = ("learned", "sinusoidal", "none")


@dataclass(frozen=True)
class EncoderConfig:
    """Hyperparameters of the encoder stack.

    Attributes:
        n_layers: N, the number of encoder layers (≥ 1).
        d_model: d, the width of the residual stream (divisible by ``n_heads``).
        n_heads: h, attention heads per layer; d_k = d_model / h.
        d_ff: width of the feed-forward hidden layer (4·d_model in BERT).
        activation: "gelu" (exact, erf), "gelu_tanh" or "relu".
        norm_position: "post" (BERT, LN(x + F(x))) or "pre" (x + F(LN(x)), final LN after the stack).
        layer_norm_eps: ε inside every LayerNorm's √(σ² + ε) (BERT 1e-12, PyTorch 1e-5).
        dropout: probability for embedding, attention-weight and sublayer-output dropout.
        vocab_size: rows of the token embedding; None = no embedding block (feed ``inputs_embeds``).
        max_len: longest sequence accepted (rows of the learned positional embedding).
        type_vocab_size: segment/token-type embedding rows (BERT: 2); 0 = none.
        positional: "learned", "sinusoidal" or "none" (the last only to demonstrate why it is needed).
        share_layers: ALBERT-style: one set of layer weights used at every depth.
        final_layer_norm: LayerNorm after the last layer; None = the placement's default
            (True for "pre", False for "post").
        embedding_layer_norm: BERT's LayerNorm on the summed embeddings.
    """

    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int
    activation: str = "gelu"
    norm_position: str = "post"
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1
    vocab_size: int | None = None
    max_len: int = 512
    type_vocab_size: int = 0
    positional: str = "learned"
    share_layers: bool = False
    final_layer_norm: bool | None = None
    embedding_layer_norm: bool = True

    def __post_init__(self) -> None:
        check_int(self.n_layers, "n_layers", minimum=1)
        check_int(self.d_model, "d_model", minimum=1)
        check_int(self.n_heads, "n_heads", minimum=1)
        check_int(self.d_ff, "d_ff", minimum=1)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be divisible by n_heads (d_k = d_model / n_heads), "
                             f"got d_model = {self.d_model} and n_heads = {self.n_heads}")
        check_choice(self.activation, "activation", ACTIVATIONS)
        check_choice(self.norm_position, "norm_position", NORM_POSITIONS)
        check_float(self.layer_norm_eps, "layer_norm_eps", 0.0, min_inclusive=False)
        check_float(self.dropout, "dropout", 0.0, 1.0, max_inclusive=False)
        check_int(self.vocab_size, "vocab_size", minimum=1, allow_none=True)
        check_int(self.max_len, "max_len", minimum=1)
        check_int(self.type_vocab_size, "type_vocab_size", minimum=0)
        check_choice(self.positional, "positional", POSITIONALS)
        check_bool(self.share_layers, "share_layers")
        if self.final_layer_norm is not None:
            check_bool(self.final_layer_norm, "final_layer_norm")
        check_bool(self.embedding_layer_norm, "embedding_layer_norm")
        if self.vocab_size is None and self.type_vocab_size:
            raise ValueError("type_vocab_size > 0 needs a token embedding: set vocab_size, "
                             f"got vocab_size = None and type_vocab_size = {self.type_vocab_size}")

    # ---- derived quantities -------------------------------------------------
    @property
    def d_k(self) -> int:
        """Per-head width d_model / h."""
        return self.d_model // self.n_heads

    @property
    def has_embeddings(self) -> bool:
        return self.vocab_size is not None

    @property
    def use_final_layer_norm(self) -> bool:
        if self.final_layer_norm is None:
            return self.norm_position == "pre"
        return bool(self.final_layer_norm)

    def replace(self, **changes) -> EncoderConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EncoderConfig:
        if not isinstance(d, dict):
            raise TypeError(f"config must be a dict, got {describe(d)}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown EncoderConfig fields {unknown}; known fields are {sorted(known)}")
        return cls(**d)

    # ---- presets --------------------------------------------------------------
    @classmethod
    def bert_base(cls, **overrides) -> EncoderConfig:
        """BERT-base: N = 12, d = 768, h = 12, d_ff = 3072, vocabulary 30,522, 512 positions."""
        base = dict(n_layers=12, d_model=768, n_heads=12, d_ff=3072, activation="gelu",
                    norm_position="post", layer_norm_eps=1e-12, dropout=0.1, vocab_size=30522,
                    max_len=512, type_vocab_size=2, positional="learned")
        base.update(overrides)
        return cls(**base)

    @classmethod
    def bert_large(cls, **overrides) -> EncoderConfig:
        """BERT-large: N = 24, d = 1024, h = 16, d_ff = 4096."""
        return cls.bert_base(**{"n_layers": 24, "d_model": 1024, "n_heads": 16, "d_ff": 4096, **overrides})


def _layer_param_count(d: int, f: int) -> int:
    return 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d


def encoder_param_count(config) -> int:
    """Scalar parameters of :func:`~transformer_np.model.params.init_params` for ``config``, in O(1)
    (the same number as :func:`~transformer_np.model.config.count_parameters`)."""
    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config must be an EncoderConfig, got {describe(config)}")
    d, f = config.d_model, config.d_ff
    n = 0
    if config.has_embeddings:
        n += config.vocab_size * d
        if config.positional == "learned":
            n += config.max_len * d
        n += config.type_vocab_size * d
        if config.embedding_layer_norm:
            n += 2 * d
    n += (1 if config.share_layers else config.n_layers) * _layer_param_count(d, f)
    if config.use_final_layer_norm:
        n += 2 * d
    return n


def count_parameters(config: EncoderConfig, embeddings: bool = True) -> int:
    """Number of scalar parameters of :func:`init_params` (embeddings + layers + final LN).

    With ``embeddings=False`` only the layers (and final LayerNorm, if any) are counted.
    Computed from the sizes in O(1), without building the parameter table (any depth is instant).
    BERT-base: 108,891,648 with embeddings, 85,054,464 = 12·(12d² + 13d) without.
    """
    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config must be an EncoderConfig, got {describe(config)}")
    if not isinstance(embeddings, bool):
        raise TypeError(f"embeddings must be a bool, got {describe(embeddings)}")
    if embeddings:
        return encoder_param_count(config)
    return encoder_param_count(config.replace(vocab_size=None, type_vocab_size=0))
