r"""The Hugging Face encoder families whose layers are this library's encoder layer.

Every family below runs, layer by layer, :func:`transformer_np.model.encoder.encoder_layer_forward`
in its Post-LN form, Z = LN₁(H + MHA(H)), H' = LN₂(Z + FFN(Z)) (MPNet with a bias added to the
attention scores); they differ in what sits around the stack and in their names:

==============  ===================  ==========================================================================
model_type      task-model prefix    what differs from BERT
==============  ===================  ==========================================================================
bert            ``bert.``            — (the reference layout; also ``ernie`` without task ids)
roberta         ``roberta.``         position ids start at padding_idx + 1 and skip padding tokens (below);
xlm-roberta     ``roberta.``         same as roberta
camembert       ``roberta.``         same as roberta
data2vec-text   ``data2vec_text.``   same as roberta
distilbert      ``distilbert.``      no token-type table, no pooler; names ``transformer.layer.{i}.*``
                                     (``q_lin``, ``sa_layer_norm``, ``ffn.lin1``, ...); LayerNorm ε fixed 1e-12
albert          ``albert.``          factorised embeddings: tables of width E (``embedding_size``), their
                                     LayerNorm over E, then a Linear E → d (``encoder.embedding_hidden_mapping_in``);
                                     one layer shared by every depth (``share_layers``)
electra         ``electra.``         factorised embeddings when ``embedding_size`` ≠ ``hidden_size`` (the Linear
                                     is ``embeddings_project``); no pooler
modernbert      ``model.``           not BERT's layer: Pre-LN, rotary positions, GeGLU, no biases, local
                                     attention in most layers (:mod:`transformer_np.model.modernbert`; config
                                     and names in :mod:`transformer_np.io.family_modernbert`)
deberta-v2      ``deberta.``         BERT's Post-LN layer with disentangled attention (content→position and
                                     position→content terms over relative embeddings shared by the layers, log
                                     buckets); embeddings masked by the attention mask; no pooler
                                     (:mod:`transformer_np.model.deberta`; :mod:`transformer_np.io.family_deberta`)
mpnet           ``mpnet.``           RoBERTa's positions with p = 1 always; no token-type table; every layer's
                                     scores get a relative position bias from one table (K, h) shared by the
                                     layers (``encoder.relative_attention_bias``, ours ``relative_bias``;
                                     :mod:`transformer_np.model.mpnet`); names ``attention.attn.{q,k,v,o}``
==============  ===================  ==========================================================================

RoBERTa's positions (fairseq's ``make_positions``): with p = padding_idx (= ``pad_token_id``),

    position_id[b, i] = p + Σ_{j ≤ i} [x_{b,j} ≠ p]   if x_{b,i} ≠ p,      p   if x_{b,i} = p,

so the first real token reads row p + 1 of the position table and a right-padded sequence of n
real tokens reads rows p + 1 … p + n: the longest input is ``max_position_embeddings − p − 1``
tokens (512 for roberta-base's 514 rows with p = 1).

Configs. A BERT ``config.json`` becomes an :class:`~transformer_np.model.config.EncoderConfig`
(as it always has); every other family becomes an :class:`HFEncoderConfig`, which holds the
family's name, the :class:`EncoderConfig` of the stack (d_model, heads, activation, ε, vocabulary,
``max_len`` = the longest input) and what lies around it (embedding width E, position-table rows,
the padding id). Every field read from ``config.json`` is validated (integers are ints — not
bools, strings, floats or null —, floats are finite, everything in range); a failure is a
:class:`~transformer_np.errors.ModelConfigError` naming the field, what was expected and what was
received.

Our parameter names for a family model: BERT's (``embeddings.word``, ``embeddings.position``,
``embeddings.token_type``, ``embeddings.ln.{gamma,beta}``, ``layers.{ℓ}.*``, optional
``pooler.{W,b}``) with the embedding tables of width E, the full position table (all
``max_position_embeddings`` rows, so HF → ours → HF is exact), plus
``embeddings.project.W`` (E, d) / ``embeddings.project.b`` (d,) for the factorised families.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from .._validate import describe
from ..errors import InputTypeError, ModelConfigError
from ..model.config import EncoderConfig
from ..model.deberta import DebertaArch, deberta_param_shapes
from ..model.modernbert import ModernBertArch, modernbert_param_shapes
from ..model.params import param_shapes
from ._config_fields import _MISSING, _Fields, _json_value
from .family_deberta import deberta_name_rows, deberta_table_size, read_deberta
from .family_modernbert import modernbert_name_rows, modernbert_table_size, read_modernbert

__all__ = ["HFEncoderConfig", "Family", "FAMILIES", "SUPPORTED_MODEL_TYPES", "HF_ACTIVATIONS", "family_of",
           "read_hf_config", "hf_param_shapes", "hf_name_table", "supported_text"]

#: HF ``hidden_act`` → our ``activation``. "gelu_new" and "gelu_pytorch_tanh" are the same
#: function ½x(1 + tanh(√(2/π)(x + 0.044715x³))), computed two ways.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


# ----------------------------------------------------------------------------- the families
@dataclass(frozen=True)
class Family:
    """Names and structure of one Hugging Face encoder family (see the module docstring).

    ``layer_rows`` are (HF suffix, our suffix, transpose?) for one layer; the HF name of layer ℓ
    is ``layer_prefix.format(i=ℓ) + suffix``.
    """

    model_type: str
    base_prefix: str
    layer_prefix: str
    layer_rows: tuple[tuple[str, str, bool], ...]
    reader: Callable[[_Fields], dict]
    architectures: tuple[str, ...]
    token_types: bool = True
    projection: str | None = None          # HF module name of the E → d Linear
    projection_always: bool = False        # ALBERT has it even when E == d
    pooler: str | None = "pooler.dense"
    offset_positions: bool = False
    shared_layers: bool = False
    position_padding_idx: int | None = None   # MPNet: position ids count from 1 whatever pad_token_id is
    relative_bias: str | None = None          # HF name of a relative-position table shared by the layers
    bare_layers: bool = True                  # whether one HF layer alone can run (MPNet's needs the bias)


def _layer_rows(linears, norms) -> tuple[tuple[str, str, bool], ...]:
    rows = []
    for mod, W, b in linears:
        rows += [(mod + ".weight", W, True), (mod + ".bias", b, False)]
    for mod, ln in norms:
        rows += [(mod + ".weight", ln + ".gamma", False), (mod + ".bias", ln + ".beta", False)]
    return tuple(rows)


_BERT_LAYER = _layer_rows(
    (("attention.self.query", "attn.W_Q", "attn.b_Q"), ("attention.self.key", "attn.W_K", "attn.b_K"),
     ("attention.self.value", "attn.W_V", "attn.b_V"), ("attention.output.dense", "attn.W_O", "attn.b_O"),
     ("intermediate.dense", "ffn.W_1", "ffn.b_1"), ("output.dense", "ffn.W_2", "ffn.b_2")),
    (("attention.output.LayerNorm", "ln1"), ("output.LayerNorm", "ln2")))
_ALBERT_LAYER = _layer_rows(
    (("attention.query", "attn.W_Q", "attn.b_Q"), ("attention.key", "attn.W_K", "attn.b_K"),
     ("attention.value", "attn.W_V", "attn.b_V"), ("attention.dense", "attn.W_O", "attn.b_O"),
     ("ffn", "ffn.W_1", "ffn.b_1"), ("ffn_output", "ffn.W_2", "ffn.b_2")),
    (("attention.LayerNorm", "ln1"), ("full_layer_layer_norm", "ln2")))
_MPNET_LAYER = _layer_rows(
    (("attention.attn.q", "attn.W_Q", "attn.b_Q"), ("attention.attn.k", "attn.W_K", "attn.b_K"),
     ("attention.attn.v", "attn.W_V", "attn.b_V"), ("attention.attn.o", "attn.W_O", "attn.b_O"),
     ("intermediate.dense", "ffn.W_1", "ffn.b_1"), ("output.dense", "ffn.W_2", "ffn.b_2")),
    (("attention.LayerNorm", "ln1"), ("output.LayerNorm", "ln2")))
_DISTILBERT_LAYER = _layer_rows(
    (("attention.q_lin", "attn.W_Q", "attn.b_Q"), ("attention.k_lin", "attn.W_K", "attn.b_K"),
     ("attention.v_lin", "attn.W_V", "attn.b_V"), ("attention.out_lin", "attn.W_O", "attn.b_O"),
     ("ffn.lin1", "ffn.W_1", "ffn.b_1"), ("ffn.lin2", "ffn.W_2", "ffn.b_2")),
    (("sa_layer_norm", "ln1"), ("output_layer_norm", "ln2")))


def _common_checks(f: _Fields) -> None:
    for flag in ("is_decoder", "add_cross_attention"):
        f.false(flag, "transformer_np builds an encoder only (no causal mask, no cross-attention)")
    pos = f.hf.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ModelConfigError(f"{f.source} field 'position_embedding_type' must be 'absolute' (learned absolute "
                               f"positions), got {_json_value(pos)}, which transformer_np does not implement")


def _read_bert_like(f: _Fields, pad_default: int | None = 0, embedding_size: bool = False,
                    act_default: str = "gelu", drop_default: float = 0.1) -> dict:
    """The fields of BertConfig and its relatives (RoBERTa, ELECTRA, ALBERT, ERNIE)."""
    _common_checks(f)
    d = f.int("hidden_size")
    spec = dict(d_model=d, n_layers=f.int("num_hidden_layers"), n_heads=f.int("num_attention_heads"),
                d_ff=f.int("intermediate_size"), vocab_size=f.int("vocab_size"),
                max_position_embeddings=f.int("max_position_embeddings", 512),
                type_vocab_size=f.int("type_vocab_size", 2),
                hidden_act=f.choice("hidden_act", HF_ACTIVATIONS, act_default),
                layer_norm_eps=f.float("layer_norm_eps", 1e-12, min_inclusive=False, maximum=1.0),
                p_hidden=f.float("hidden_dropout_prob", drop_default, maximum=1.0, max_inclusive=False),
                pad_token_id=f.int("pad_token_id", pad_default, minimum=0, allow_none=True),
                embedding_size=f.int("embedding_size", 128) if embedding_size else d,
                dropout_fields=("hidden_dropout_prob", "attention_probs_dropout_prob"))
    spec["p_attn"] = f.float("attention_probs_dropout_prob", spec["p_hidden"], maximum=1.0, max_inclusive=False)
    return spec


def _read_ernie(f: _Fields) -> dict:
    f.false("use_task_id", "ERNIE's task-type embedding is not part of the BERT layout transformer_np implements")
    return _read_bert_like(f)


def _read_roberta(f: _Fields) -> dict:
    spec = _read_bert_like(f, pad_default=1)
    if spec["pad_token_id"] is None:
        raise f._fail("pad_token_id", "an integer (RoBERTa's position ids are counted from it)", None)
    return spec


def _read_albert(f: _Fields) -> dict:
    for key in ("num_hidden_groups", "inner_group_num"):
        n = f.int(key, 1)
        if n != 1:
            raise ModelConfigError(f"{f.source} field {key!r} = {n} is not supported: transformer_np shares one "
                                   f"layer across all depths (ALBERT's num_hidden_groups = inner_group_num = 1, as in "
                                   f"every released ALBERT checkpoint)")
    return _read_bert_like(f, embedding_size=True, act_default="gelu_new", drop_default=0.0)


def _read_electra(f: _Fields) -> dict:
    return _read_bert_like(f, embedding_size=True)


#: HF's MPNetEncoder buckets every distance into 32 buckets (compute_position_bias's default), whatever
#: relative_attention_num_buckets says: the table needs that many rows at least.
MPNET_MIN_BUCKETS = 32


def _read_mpnet(f: _Fields) -> dict:
    spec = _read_bert_like(f, pad_default=1)
    spec["type_vocab_size"] = 0         # MPNet has no token-type table (HF's MPNetConfig has no such field)
    spec["relative_attention_num_buckets"] = f.int("relative_attention_num_buckets", 32, minimum=MPNET_MIN_BUCKETS)
    return spec


def _read_distilbert(f: _Fields) -> dict:
    f.false("is_decoder", "transformer_np builds an encoder only")
    d = f.int("dim")
    p_hidden = f.float("dropout", 0.1, maximum=1.0, max_inclusive=False)
    if "sinusoidal_pos_embds" in f.hf and not isinstance(f.hf["sinusoidal_pos_embds"], bool):
        raise f._fail("sinusoidal_pos_embds", "a boolean (true/false)", f.hf["sinusoidal_pos_embds"])
    # sinusoidal_pos_embds only changes how the position table is initialised: it is a stored weight either way.
    return dict(d_model=d, n_layers=f.int("n_layers"), n_heads=f.int("n_heads"), d_ff=f.int("hidden_dim"),
                vocab_size=f.int("vocab_size"), max_position_embeddings=f.int("max_position_embeddings", 512),
                type_vocab_size=0, hidden_act=f.choice("activation", HF_ACTIVATIONS, "gelu"),
                layer_norm_eps=1e-12, p_hidden=p_hidden,
                p_attn=f.float("attention_dropout", p_hidden, maximum=1.0, max_inclusive=False),
                pad_token_id=f.int("pad_token_id", 0, minimum=0, allow_none=True), embedding_size=d,
                dropout_fields=("dropout", "attention_dropout"))


def _family(model_type, base, layer_prefix, rows, reader, archs, **kw) -> Family:
    return Family(model_type, base, layer_prefix, rows, reader, archs, **kw)


_ROBERTA_KW = dict(offset_positions=True)
FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    _family("bert", "bert", "encoder.layer.{i}.", _BERT_LAYER, _read_bert_like, ("Bert",)),
    _family("ernie", "ernie", "encoder.layer.{i}.", _BERT_LAYER, _read_ernie, ("Ernie",)),
    _family("roberta", "roberta", "encoder.layer.{i}.", _BERT_LAYER, _read_roberta, ("Roberta",), **_ROBERTA_KW),
    _family("xlm-roberta", "roberta", "encoder.layer.{i}.", _BERT_LAYER, _read_roberta, ("XLMRoberta",),
            **_ROBERTA_KW),
    _family("camembert", "roberta", "encoder.layer.{i}.", _BERT_LAYER, _read_roberta, ("Camembert",),
            **_ROBERTA_KW),
    _family("data2vec-text", "data2vec_text", "encoder.layer.{i}.", _BERT_LAYER, _read_roberta,
            ("Data2VecText",), **_ROBERTA_KW),
    _family("distilbert", "distilbert", "transformer.layer.{i}.", _DISTILBERT_LAYER, _read_distilbert,
            ("DistilBert",), token_types=False, pooler=None),
    _family("albert", "albert", "encoder.albert_layer_groups.0.albert_layers.0.", _ALBERT_LAYER, _read_albert,
            ("Albert",), projection="encoder.embedding_hidden_mapping_in", projection_always=True, pooler="pooler",
            shared_layers=True),
    _family("electra", "electra", "encoder.layer.{i}.", _BERT_LAYER, _read_electra, ("Electra",),
            projection="embeddings_project", pooler=None),
    _family("mpnet", "mpnet", "encoder.layer.{i}.", _MPNET_LAYER, _read_mpnet, ("MPNet",), token_types=False,
            offset_positions=True, position_padding_idx=1, relative_bias="encoder.relative_attention_bias.weight",
            bare_layers=False),
    _family("modernbert", "model", "layers.{i}.", (), read_modernbert, ("ModernBert",), token_types=False,
            pooler=None, bare_layers=False),
    _family("deberta-v2", "deberta", "encoder.layer.{i}.", (), read_deberta, ("DebertaV2",), pooler=None,
            bare_layers=False),
)}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def supported_text() -> str:
    """The supported model types and their HF classes, for error messages."""
    return ", ".join(f"{t} ({FAMILIES[t].architectures[0]}Model)" for t in SUPPORTED_MODEL_TYPES)


def family_of(hf: Mapping, source: str = "hf_config") -> Family:
    """The :class:`Family` of a config dict: its ``model_type``, else the class names in
    ``architectures`` (``"RobertaForMaskedLM"`` → roberta), else BERT (old BERT configs have
    neither). Anything else is a ModelConfigError listing the supported architectures."""
    if not isinstance(hf, Mapping):
        raise InputTypeError(f"{source} must be a dict (a config.json), got {describe(hf)}")
    mt = hf.get("model_type", _MISSING)
    if mt is _MISSING:
        archs = hf.get("architectures")
        if archs is None:
            return FAMILIES["bert"]
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise ModelConfigError(f"{source} field 'architectures' must be a list of class names, "
                                   f"got {_json_value(archs)}")
        for a in archs:
            for fam in FAMILIES.values():
                if any(re.fullmatch(p + r"(Model|For\w+)", a) for p in fam.architectures):
                    return fam
        raise ModelConfigError(f"{source} has no model_type and its architectures {archs} are not a supported "
                               f"encoder; supported: {supported_text()}")
    if not isinstance(mt, str) or mt not in FAMILIES:
        raise ModelConfigError(f"{source} field 'model_type' must name a supported encoder (one whose layers are "
                               f"transformer_np's), got {_json_value(mt)}; supported: {supported_text()}")
    return FAMILIES[mt]


# ----------------------------------------------------------------------------- the config
@dataclass(frozen=True)
class HFEncoderConfig:
    """A Hugging Face encoder of a family other than plain BERT (or one bare HF layer).

    Attributes:
        model_type: the family ("roberta", "albert", "distilbert", "electra", ...; see :data:`FAMILIES`).
        encoder: the :class:`EncoderConfig` of the stack — d_model, n_heads, d_ff, activation, ε,
            ``share_layers`` (ALBERT) — and of the vocabulary: ``vocab_size``, ``type_vocab_size``,
            ``max_len`` (the longest input in tokens). ``vocab_size=None`` for a bare layer.
        embedding_size: E, the width of the embedding tables (= d_model unless factorised).
        max_position_embeddings: rows of the position table (≥ ``max_len``; RoBERTa: max_len + p + 1).
        pad_token_id: HF's padding id (RoBERTa family: the p of the position ids); may be None.
        bare_layer: the config of one HF layer module (``BertLayer``, ``AlbertLayer``,
            DistilBERT's ``TransformerBlock``, ...): no embeddings, the layer's own names.
        relative_attention_num_buckets: MPNet only: rows K of the relative position table (K, h), ≥ 32.
        modernbert: ModernBERT only: its :class:`~transformer_np.model.modernbert.ModernBertArch` (layer types,
            window, RoPE θ, bias flags).
        deberta: DeBERTa-v2 only: its :class:`~transformer_np.model.deberta.DebertaArch` (relative attention,
            buckets, pos_att_type, shared keys, absolute positions, embedding width).

    The stack's fields are readable directly: ``config.d_model`` is ``config.encoder.d_model``.
    """

    model_type: str
    encoder: EncoderConfig
    embedding_size: int | None = None
    max_position_embeddings: int | None = None
    pad_token_id: int | None = None
    bare_layer: bool = False
    relative_attention_num_buckets: int | None = None
    modernbert: ModernBertArch | None = None
    deberta: DebertaArch | None = None

    def __post_init__(self) -> None:
        if self.model_type not in FAMILIES:
            raise ModelConfigError(f"model_type must be one of {list(SUPPORTED_MODEL_TYPES)}, got {self.model_type!r}")
        if not isinstance(self.encoder, EncoderConfig):
            raise InputTypeError(f"encoder must be an EncoderConfig, got {describe(self.encoder)}")
        K = self.relative_attention_num_buckets
        if FAMILIES[self.model_type].relative_bias is not None:
            if isinstance(K, bool) or not isinstance(K, int) or K < MPNET_MIN_BUCKETS:
                raise ModelConfigError(f"{self.model_type}: relative_attention_num_buckets must be an int ≥ "
                                       f"{MPNET_MIN_BUCKETS} (HF buckets distances into 32), got {K!r}")
        elif K is not None:
            raise ModelConfigError(f"{self.model_type} has no relative position table: relative_attention_num_buckets "
                                   f"must be None, got {K!r}")
        if (self.model_type == "modernbert") != isinstance(self.modernbert, ModernBertArch):
            raise ModelConfigError(f"modernbert must be a ModernBertArch for model_type 'modernbert' and None "
                                   f"otherwise, got {describe(self.modernbert)} for {self.model_type!r}")
        if (self.model_type == "deberta-v2") != isinstance(self.deberta, DebertaArch):
            raise ModelConfigError(f"deberta must be a DebertaArch for model_type 'deberta-v2' and None "
                                   f"otherwise, got {describe(self.deberta)} for {self.model_type!r}")
        if self.bare_layer and not FAMILIES[self.model_type].bare_layers:
            raise ModelConfigError(f"a bare {self.model_type} layer cannot run alone (its attention reads the "
                                   f"model's relative position table): use the whole model")
        if self.bare_layer:
            if self.encoder.has_embeddings or self.encoder.n_layers != 1:
                raise ModelConfigError("a bare-layer config needs encoder.vocab_size = None and n_layers = 1, got "
                                       f"vocab_size = {self.encoder.vocab_size}, n_layers = {self.encoder.n_layers}")
            return
        if not self.encoder.has_embeddings:
            raise ModelConfigError("an HF model config needs encoder.vocab_size (the embedding table), got None")
        fam = FAMILIES[self.model_type]
        if fam.shared_layers != self.encoder.share_layers:
            raise ModelConfigError(f"{self.model_type}: encoder.share_layers must be {fam.shared_layers}")
        if not fam.token_types and self.encoder.type_vocab_size:
            raise ModelConfigError(f"{self.model_type} has no token-type embedding: encoder.type_vocab_size must be 0")
        E, P = self.embedding_size, self.max_position_embeddings
        if E is not None and (isinstance(E, bool) or not isinstance(E, int) or E < 1):
            raise ModelConfigError(f"embedding_size must be a positive int or None, got {E!r}")
        if P is not None and (isinstance(P, bool) or not isinstance(P, int) or P < self.encoder.max_len + self.offset):
            raise ModelConfigError(f"max_position_embeddings must be an int ≥ max_len + position offset = "
                                   f"{self.encoder.max_len + self.offset}, got {P!r}")
        if fam.offset_positions and not isinstance(self.position_pad, int):
            raise ModelConfigError(f"{self.model_type} counts positions from pad_token_id: it must be an int, "
                                   f"got {self.pad_token_id!r}")

    def __getattr__(self, name: str):
        # Only called when normal lookup fails: the stack's fields (d_model, n_layers, ...).
        if name.startswith("__") or name == "encoder":
            raise AttributeError(name)
        return getattr(self.encoder, name)

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    @property
    def E(self) -> int:
        """Width of the embedding tables."""
        return self.encoder.d_model if self.embedding_size is None else self.embedding_size

    @property
    def has_projection(self) -> bool:
        """A Linear E → d_model after the embedding LayerNorm (ALBERT always; ELECTRA when E ≠ d)."""
        fam = self.family
        return (not self.bare_layer and fam.projection is not None
                and (fam.projection_always or self.E != self.encoder.d_model))

    @property
    def position_pad(self) -> int | None:
        """The p of the padding-aware position ids: pad_token_id (RoBERTa), or the family's fixed id (MPNet: 1)."""
        fixed = self.family.position_padding_idx
        return self.pad_token_id if fixed is None else fixed

    @property
    def offset(self) -> int:
        """How many leading rows of the position table real tokens never read (RoBERTa: p + 1)."""
        return self.position_pad + 1 if self.family.offset_positions and not self.bare_layer else 0

    @property
    def n_positions(self) -> int:
        """Rows of the position table."""
        if self.max_position_embeddings is not None:
            return self.max_position_embeddings
        return self.encoder.max_len + self.offset

    @property
    def stack(self) -> EncoderConfig:
        """The EncoderConfig of the layers alone (no embeddings): what runs on H^(0)."""
        return self.encoder.replace(vocab_size=None, type_vocab_size=0)

    def replace(self, **changes) -> HFEncoderConfig:
        return dataclasses.replace(self, **changes)


def read_hf_config(hf: Mapping, source: str = "hf_config") -> tuple[Family, dict]:
    """(family, validated fields) of a config dict, before any config object is built."""
    fam = family_of(hf, source)
    spec = fam.reader(_Fields(hf, source))
    d, h = spec["d_model"], spec["n_heads"]
    if d % h:
        raise ModelConfigError(f"{source}: the hidden size {d} must be divisible by the number of attention heads "
                               f"{h} (d_k = d / h)")
    pad = spec["pad_token_id"]
    if pad is not None and pad >= spec["vocab_size"]:
        raise ModelConfigError(f"{source} field 'pad_token_id' must be < vocab_size = {spec['vocab_size']}, got {pad}")
    p = _position_pad(fam, spec)
    if fam.offset_positions and spec["max_position_embeddings"] <= p + 1:
        what = "pad_token_id" if fam.position_padding_idx is None else "the padding index"
        raise ModelConfigError(f"{source} field 'max_position_embeddings' must exceed {what} + 1 = {p + 1} "
                               f"({fam.model_type} positions start at {what} + 1), "
                               f"got {spec['max_position_embeddings']}")
    if spec["p_attn"] != spec["p_hidden"]:
        hid, att = spec["dropout_fields"]
        warnings.warn(f"{source} has {hid} = {spec['p_hidden']} but {att} = {spec['p_attn']}; transformer_np uses "
                      f"one dropout and takes {hid} = {spec['p_hidden']} (no effect in inference)", stacklevel=3)
    return fam, spec


def _position_pad(fam: Family, spec: dict) -> int | None:
    return spec["pad_token_id"] if fam.position_padding_idx is None else fam.position_padding_idx


def encoder_config_from_spec(fam: Family, spec: dict) -> EncoderConfig:
    """The EncoderConfig (stack + vocabulary) of validated fields."""
    offset = _position_pad(fam, spec) + 1 if fam.offset_positions else 0
    return EncoderConfig(
        n_layers=spec["n_layers"], d_model=spec["d_model"], n_heads=spec["n_heads"], d_ff=spec["d_ff"],
        activation=HF_ACTIVATIONS[spec["hidden_act"]], norm_position="post", layer_norm_eps=spec["layer_norm_eps"],
        dropout=spec["p_hidden"], vocab_size=spec["vocab_size"],
        max_len=spec["max_position_embeddings"] - offset, type_vocab_size=spec["type_vocab_size"],
        positional="learned", share_layers=fam.shared_layers, final_layer_norm=False, embedding_layer_norm=True)


# ----------------------------------------------------------------------------- names and shapes
def hf_param_shapes(config: HFEncoderConfig) -> dict[str, tuple[int, ...]]:
    """Our parameter names → shapes for a family config (without the optional pooler)."""
    if config.modernbert is not None:
        return modernbert_param_shapes(config.encoder, config.modernbert)
    if config.deberta is not None:
        return deberta_param_shapes(config.encoder, config.deberta)
    layers = param_shapes(config.stack)
    if config.bare_layer:
        return layers
    E, d = config.E, config.d_model
    shapes: dict[str, tuple[int, ...]] = {"embeddings.word": (config.vocab_size, E),
                                          "embeddings.position": (config.n_positions, E)}
    if config.type_vocab_size:
        shapes["embeddings.token_type"] = (config.type_vocab_size, E)
    shapes["embeddings.ln.gamma"] = (E,)
    shapes["embeddings.ln.beta"] = (E,)
    if config.has_projection:
        shapes["embeddings.project.W"] = (E, d)
        shapes["embeddings.project.b"] = (d,)
    if config.family.relative_bias is not None:
        shapes["relative_bias"] = (config.relative_attention_num_buckets, config.n_heads)
    shapes.update(layers)
    return shapes


def _n_distinct_layers(config) -> int:
    return 1 if config.share_layers else config.n_layers


def hf_name_table(config: HFEncoderConfig) -> Iterator[tuple[str, str, bool]]:
    """(HF name, our name, transpose?) for every tensor of ``config`` (pooler excluded), lazily."""
    fam = config.family
    if config.modernbert is not None:
        yield from modernbert_name_rows(config)
        return
    if config.deberta is not None:
        yield from deberta_name_rows(config)
        return
    if config.bare_layer:
        for hf, ours, t in fam.layer_rows:
            yield hf, "layers.0." + ours, t
        return
    emb = [("embeddings.word_embeddings.weight", "embeddings.word"),
           ("embeddings.position_embeddings.weight", "embeddings.position")]
    if config.type_vocab_size:
        emb.append(("embeddings.token_type_embeddings.weight", "embeddings.token_type"))
    emb += [("embeddings.LayerNorm.weight", "embeddings.ln.gamma"), ("embeddings.LayerNorm.bias", "embeddings.ln.beta")]
    for hf, ours in emb:
        yield hf, ours, False
    if config.has_projection:
        yield fam.projection + ".weight", "embeddings.project.W", True
        yield fam.projection + ".bias", "embeddings.project.b", False
    if fam.relative_bias is not None:
        yield fam.relative_bias, "relative_bias", False
    for i in range(_n_distinct_layers(config)):
        pre = fam.layer_prefix.format(i=i)
        for hf, ours, t in fam.layer_rows:
            yield pre + hf, f"layers.{i}." + ours, t


def hf_table_size(config: HFEncoderConfig) -> int:
    """How many rows :func:`hf_name_table` yields (computed without building it)."""
    fam = config.family
    if config.modernbert is not None:
        return modernbert_table_size(config)
    if config.deberta is not None:
        return deberta_table_size(config)
    if config.bare_layer:
        return len(fam.layer_rows)
    return (4 + bool(config.type_vocab_size) + 2 * config.has_projection + (fam.relative_bias is not None)
            + _n_distinct_layers(config) * len(fam.layer_rows))


def pooler_rows(config) -> list[tuple[str, str, bool]]:
    """The optional pooler's rows (none for DistilBERT, ELECTRA and bare layers)."""
    name = "pooler.dense" if isinstance(config, EncoderConfig) else (
        None if config.bare_layer else config.family.pooler)
    if name is None:
        return []
    return [(name + ".weight", "pooler.W", True), (name + ".bias", "pooler.b", False)]
