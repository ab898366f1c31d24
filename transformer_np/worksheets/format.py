r"""The worksheet format: a TOML file (or the same structure as a dict), validated into a :class:`Worksheet`.

::

    [setup]
    tokens = ["the", "cat", "sat"]   # required; one row of H0 per token
    d_model = 4            # default: the width of H0
    n_heads = 1            # default 1; d_k = d_model / n_heads
    d_ff = 16              # default 4 * d_model
    norm = "post"          # "post" (default) | "pre"
    activation = "gelu"    # "gelu" (default, exact erf) | "gelu_tanh" | "relu"
    eps = 1e-12            # LayerNorm epsilon, default 1e-12
    layers = 1             # default 1
    decimals = 2           # how the answers are rounded (default 2); the tolerance follows from it
    seed = 0               # default 0: weights not given are init_params(config, seed, init="xavier")
    problem_id = "3f9c0a1b2c4d5e6f"   # optional: written by worksheet new / class; check --key matches by it

    [input]
    H0 = [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]   # required; or a table of rows keyed by token
    dH = [[...], ...]      # optional dL/dH^(N): asking for backward answers needs it

    [layer1]               # any weight given here overrides the seeded one
    W_Q = "identity"       # "identity" is accepted for square weights

    [answers.layer1]       # any subset of the names in names.py; a full matrix, or rows keyed by token
    scores = [[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.5, 0.5, 1.0]]
    attention_weights = { the = [0.44, 0.16, 0.40] }

Defaults are used only for keys that are absent; a key that is present is used as given or refused
with a :class:`~transformer_np.errors.WorksheetError` that names it. Sizes are bounded (see
``LIMITS`` below; every number within ±``MAX_ABS``): a worksheet is for hand calculation.

An optional ``[marks]`` table is the mark scheme (see :meth:`Worksheet.mark_of`)::

    [marks]
    attention_weights = 2      # this quantity, in every layer that has it
    default = 1                # any other quantity (default 1; 0: only the named ones are marked)
    [marks.layer2]
    H = 3                      # layer 2's H only

An answer key (``<stem>_key.toml``, ``keys/<id>_key.toml``) carries a ``[key]`` table (``student = "id"``
under ``worksheet class``): a key is never graded as a submission (:mod:`.keys`).
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import WorksheetError
from ..model.config import EncoderConfig
from ..model.params import init_params, layer_prefix
from ..ops.activations import ACTIVATIONS
from .names import LIBRARY_PARAM, PARAM_NAMES, SETUP_KEYS, answer_names, is_per_token
from .tomlio import read_toml

__all__ = ["Answer", "Worksheet", "load_worksheet", "quantity_shape", "LIMITS", "MAX_ABS", "MAX_MARK"]

_SQUARE = ("W_Q", "W_K", "W_V", "W_O")

# The biggest sheet a person would work by hand, with room to spare: 8 tokens of width 8 (1 … 8 heads), a
# feed-forward layer of 32, two layers (the article's example is 3 tokens, width 4, d_ff 16, two layers). Every
# dimension is checked before a number is read; a sheet this size with every quantity answered, forward and
# backward, is about 13,000 numbers (docs/guide/worksheets.md, "Limits").
LIMITS = {"tokens": 8, "d_model": 8, "d_ff": 32, "layers": 2, "decimals": 8}
MAX_ABS = 1e6          # every number of a worksheet (input, weights, answers): a hand calculation stays far below
MAX_TOKEN_CHARS = 32   # a token is a word
MAX_SEED = 2 ** 63 - 1
MAX_MARK = 1000        # marks of one quantity
MAX_ID_CHARS = 64      # a problem id, a student id
_MAX_LEN = 256         # _outline reads at most this many entries per level


@dataclass
class Answer:
    """One quantity as the student gave it.

    ``value`` has the quantity's full shape with NaN where nothing was given; ``mask`` is True on the
    given entries; ``raw`` is what the student wrote (a nested list, or ``{token: row}``).
    """

    value: np.ndarray
    mask: np.ndarray
    raw: object


@dataclass
class Worksheet:
    """A validated worksheet: the problem (set-up, input, every parameter) and the student's answers."""

    tokens: tuple[str, ...]
    d_model: int
    n_heads: int
    d_ff: int
    norm: str
    activation: str
    eps: float
    layers: int
    decimals: int
    seed: int
    H0: np.ndarray                      # (n, d_model)
    dH: np.ndarray | None               # (n, d_model) or None
    params: list[dict[str, np.ndarray]]  # per layer, keyed by worksheet name (W_Q, …, gamma1, …)
    answers: dict[tuple[int, str], Answer] = field(default_factory=dict)   # (layer, name) -> Answer
    given_params: list[set[str]] = field(default_factory=list)             # names given in [layerℓ]
    source: str = "<dict>"
    marks: dict[tuple[int, str], float] = field(default_factory=dict)      # (layer, name) -> marks, from [marks]
    mark_names: dict[str, float] = field(default_factory=dict)             # name -> marks in every layer
    mark_default: float = 1.0
    has_marks: bool = False                                                # the sheet has a [marks] table
    problem_id: str | None = None                                          # [setup].problem_id
    is_key: bool = False                                                   # an answer key: has a [key] table
    key_student: str | None = None                                         # [key].student (worksheet class)
    reveal: bool = True                                                    # [setup].reveal: show correct values

    def mark_of(self, key: tuple[int, str]) -> float:
        """The marks of quantity ``key = (layer, name)``: ``[marks.layerℓ].name``, else ``[marks].name``, else
        ``[marks].default`` (1 when not given)."""
        if key in self.marks:
            return self.marks[key]
        return self.mark_names.get(key[1], self.mark_default)

    def questions(self, keys) -> list[tuple[int, str]]:
        """The quantities (of ``keys``, the sheet's steps in order) that are marked: every step of the sheet whose
        marks (:meth:`mark_of`) are > 0, answered or not — the total is out of the whole sheet, and a step left
        blank earns 0 of its marks."""
        return [k for k in keys if self.mark_of(k) > 0]

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads

    @property
    def backward(self) -> bool:
        return self.dH is not None

    def config(self) -> EncoderConfig:
        """The library's config of this problem (no dropout, no embeddings, no final LayerNorm)."""
        return worksheet_config(self.layers, self.d_model, self.n_heads, self.d_ff, self.norm, self.activation,
                                self.eps)

    def library_params(self) -> dict[str, np.ndarray]:
        """The parameters under the library's dotted names (``layers.0.attn.W_Q`` …)."""
        cfg = self.config()
        return {layer_prefix(cfg, l) + LIBRARY_PARAM[k]: v for l, p in enumerate(self.params) for k, v in p.items()}


def worksheet_config(layers, d_model, n_heads, d_ff, norm, activation, eps) -> EncoderConfig:
    return EncoderConfig(n_layers=layers, d_model=d_model, n_heads=n_heads, d_ff=d_ff, activation=activation,
                         norm_position=norm, layer_norm_eps=eps, dropout=0.0, vocab_size=None,
                         final_layer_norm=False)


def quantity_shape(name: str, n: int, d: int, f: int) -> tuple[int, ...]:
    """The shape of a quantity (or its gradient ``d_`` + name) for n tokens, d_model d, d_ff f."""
    base = name[2:] if name.startswith("d_") else name
    if base in PARAM_NAMES:
        return {"W_1": (d, f), "b_1": (f,), "W_2": (f, d)}.get(base, (d, d) if base.startswith("W") else (d,))
    base = base.split("_head")[0]
    if base in ("scores", "attention_weights"):
        return (n, n)
    if base.endswith("_mean") or base.endswith("_var"):
        return (n,)
    if base in ("ffn_hidden", "ffn_activation"):
        return (n, f)
    return (n, d)


# ----------------------------------------------------------------------------- small checks
def _fail(where: str, msg: str):
    raise WorksheetError(f"{where}: {msg}")


def _nearest(key: str, valid) -> str | None:
    """The valid name closest to ``key`` (case-insensitive; ties go to the same first letter, then length)."""
    k = str(key).lower()
    best, best_score = None, 0.5
    for v in valid:
        ratio = difflib.SequenceMatcher(None, k, v.lower()).ratio()
        score = (ratio, v.lower()[:1] == k[:1], -abs(len(v) - len(k)))
        if ratio >= 0.5 and (best is None or score > best_score):
            best, best_score = v, score
    return best


def _suggest(key: str, valid, what: str) -> str:
    close = _nearest(key, list(valid))
    if close is not None:
        return f"unknown {what} {key!r}; did you mean {close!r}?"
    return f"unknown {what} {key!r}; valid: {', '.join(valid)}"


def _table(raw, where: str) -> dict:
    if not isinstance(raw, dict):
        _fail(where, f"must be a table, got {_kind(raw)}")
    return raw


def _kind(v) -> str:
    if isinstance(v, dict):
        return "a table"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, str):
        return f"the string {v!r}"
    return f"{type(v).__name__} {v!r}"


def _check_keys(table: dict, valid, where: str, what: str = "key") -> None:
    for k in table:
        if k not in valid:
            _fail(where, _suggest(k, valid, what))


def _int(table, key, where, default, lo, hi=None):
    if key not in table:
        return default
    v = table[key]
    if isinstance(v, bool) or not isinstance(v, int):
        _fail(f"{where}.{key}", f"must be an integer, got {_kind(v)}")
    if v < lo or (hi is not None and v > hi):
        rng = f"in [{lo}, {hi}]" if hi is not None and hi < MAX_SEED else f">= {lo}" if v < lo else f"<= {hi}"
        why = " (a worksheet is for hand calculation)" if hi is not None and v > hi and key != "seed" else ""
        shown = f"an integer of {v.bit_length()} bits" if v.bit_length() > 64 else f"{v}"
        _fail(f"{where}.{key}", f"must be {rng}{why}, got {shown}")
    return v


def _choice(table, key, where, default, choices):
    if key not in table:
        return default
    v = table[key]
    if v not in choices:
        if isinstance(v, str):
            _fail(f"{where}.{key}", _suggest(v, choices, "value"))
        _fail(f"{where}.{key}", f"must be one of {', '.join(map(repr, choices))}, got {_kind(v)}")
    return v


def _outline(v) -> str:
    """What an array-like value looks like, in a few words, without reading more than two levels of it."""
    if not isinstance(v, list):
        return _kind(v)
    if len(v) > _MAX_LEN:
        return f"an array of {len(v)} entries"
    rows = [x for x in v if isinstance(x, list)]
    if not rows:
        return f"shape ({len(v)},)"
    if len(rows) < len(v):
        return "rows of different lengths (a ragged array)"
    lengths = [len(r) for r in rows]
    if any(isinstance(x, list) for r in rows if len(r) <= _MAX_LEN for x in r) or max(lengths) > _MAX_LEN:
        return "arrays nested deeper than a matrix" if max(lengths) <= _MAX_LEN else \
            f"a row of {max(lengths)} entries"
    if len(set(lengths)) > 1:
        return f"rows of lengths {lengths}"
    return f"shape ({len(v)}, {lengths[0]})"


def _entry(x, where: str, path: str) -> float:
    """One finite number of a worksheet, |x| <= MAX_ABS (checked on the integer itself: no float overflow)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        _fail(where, f"expected numbers, got {_kind(x) if not isinstance(x, list) else 'an array'}{path}")
    if isinstance(x, float) and not math.isfinite(x):
        _fail(where, f"non-finite number {x!r}{path} (NaN and infinity are not allowed)")
    if abs(x) > MAX_ABS:
        shown = f"{x!r}" if not isinstance(x, int) or x.bit_length() <= 64 else \
            f"an integer of {len(str(abs(x)))} digits" if x.bit_length() < 10_000 else \
            f"an integer of {x.bit_length()} bits"
        _fail(where, f"{shown}{path} is beyond ±{MAX_ABS:g} (a worksheet is for hand calculation)")
    return float(x)


def _plain_numbers(v: list, ndim: int) -> np.ndarray | None:
    """The common case quickly: plain ints and floats, all finite and within ±MAX_ABS; None sends the value to
    the entry-by-entry path, which finds the first bad entry and names it."""
    rows = v if ndim == 2 else [v]
    if not all(type(x) is float or type(x) is int for r in rows for x in r):     # bool is not int here
        return None
    try:
        a = np.array(v, dtype=np.float64)
    except OverflowError:
        return None
    return a if np.all(np.abs(a) <= MAX_ABS) else None           # NaN fails the comparison too


def _shaped(v, where: str, shape: tuple[int, ...]) -> np.ndarray:
    """A nested list of exactly ``shape`` (1-D or 2-D) as a float array: the lengths are checked level by level
    before any number is read, so a huge or deeply nested value is refused after looking at its first levels."""
    if not shape:                        # one number (a row of a per-token statistic, e.g. layer_norm_mean)
        if isinstance(v, list):
            _fail(where, f"expected one number, got {_outline(v)}")
        return np.array(_entry(v, where, ""), dtype=np.float64)
    if not isinstance(v, list):
        _fail(where, f"expected an array of shape {shape}, got {_kind(v)}")
    ok = len(v) == shape[0] and (all(not isinstance(x, list) for x in v) if len(shape) == 1 else
                                 all(isinstance(r, list) and len(r) == shape[1] and
                                     not any(isinstance(x, list) for x in r) for r in v))
    if not ok:
        _fail(where, f"expected shape {shape}, got {_outline(v)}")
    fast = _plain_numbers(v, len(shape))
    if fast is not None:
        return fast
    if len(shape) == 1:
        return np.array([_entry(x, where, f"[{i}]") for i, x in enumerate(v)], dtype=np.float64)
    return np.array([[_entry(x, where, f"[{i}][{j}]") for j, x in enumerate(r)] for i, r in enumerate(v)],
                    dtype=np.float64).reshape(shape)


def _rows(v, where: str, shape: tuple[int, ...], tokens: tuple[str, ...], per_token: bool, partial: bool):
    """A full array, or (if ``per_token``) a table of rows keyed by token. Returns (value, mask, raw)."""
    if not isinstance(v, dict):
        a = _shaped(v, where, shape)
        return a, np.ones(shape, bool), a.tolist()
    if not per_token:
        _fail(where, f"is not one row per token: give the whole array of shape {shape}, not a table")
    if not v:
        _fail(where, "an empty table gives no rows")
    value, mask, raw = np.full(shape, np.nan), np.zeros(shape, bool), {}
    for tok, row in v.items():
        if tok not in tokens:
            _fail(f"{where}.{tok}", _suggest(tok, tokens, "token") + f" (tokens are {list(tokens)})")
        if tokens.count(tok) > 1:
            _fail(f"{where}.{tok}", f"the token {tok!r} appears {tokens.count(tok)} times in setup.tokens: "
                                    f"give the whole array instead of rows keyed by token")
        i = tokens.index(tok)
        value[i] = _shaped(row, f"{where}.{tok}", shape[1:])
        mask[i] = True
        raw[tok] = value[i].tolist()
    if not partial and not mask.all():
        missing = [t for t, m in zip(tokens, mask.reshape(len(tokens), -1).all(axis=1)) if not m]
        _fail(where, f"every token needs a row; missing {missing}")
    return value, mask, raw


# ----------------------------------------------------------------------------- sections
def _setup(raw: dict, where: str = "[setup]") -> dict:
    s = _table(raw, where)
    _check_keys(s, SETUP_KEYS + ("reveal",), where)
    if "tokens" not in s:
        _fail(where, "tokens is required, e.g. tokens = [\"the\", \"cat\", \"sat\"]")
    tokens = s["tokens"]
    if not isinstance(tokens, list) or not tokens:
        _fail(f"{where}.tokens", f"must be a non-empty array of non-empty strings, got {_kind(tokens)}")
    if len(tokens) > LIMITS["tokens"]:
        _fail(f"{where}.tokens", f"at most {LIMITS['tokens']} tokens (a worksheet is for hand calculation), "
                                 f"got {len(tokens)}")
    if not all(isinstance(t, str) and t for t in tokens):
        _fail(f"{where}.tokens", f"must be a non-empty array of non-empty strings, got {_kind(tokens)}")
    long = next((t for t in tokens if len(t) > MAX_TOKEN_CHARS), None)
    if long is not None:
        _fail(f"{where}.tokens", f"a token is a word of at most {MAX_TOKEN_CHARS} characters, got one of {len(long)}")
    out = {"tokens": tuple(str(t) for t in tokens)}      # str(): a NumPy string would print as np.str_('…')
    out["d_model"] = _int(s, "d_model", where, None, 1, LIMITS["d_model"])
    out["n_heads"] = _int(s, "n_heads", where, 1, 1, LIMITS["d_model"])
    out["d_ff"] = _int(s, "d_ff", where, None, 1, LIMITS["d_ff"])
    out["layers"] = _int(s, "layers", where, 1, 1, LIMITS["layers"])
    out["decimals"] = _int(s, "decimals", where, 2, 0, LIMITS["decimals"])
    out["seed"] = _int(s, "seed", where, 0, 0, MAX_SEED)
    out["norm"] = _choice(s, "norm", where, "post", ("post", "pre"))
    out["activation"] = _choice(s, "activation", where, "gelu", ACTIVATIONS)
    eps = s.get("eps", 1e-12)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps <= 1 or not math.isfinite(eps):
        shown = f"an integer of {eps.bit_length()} bits" if isinstance(eps, int) and eps.bit_length() > 64 \
            else _kind(eps)
        _fail(f"{where}.eps", f"must be a positive finite number at most 1, got {shown}")
    out["eps"] = float(eps)
    out["problem_id"] = _problem_id(s, where)
    out["reveal"] = s.get("reveal", True)
    if not isinstance(out["reveal"], bool):
        _fail(f"{where}.reveal", f"must be true or false (whether check and the page show correct values), got "
                                 f"{_kind(out['reveal'])}")
    return out


def _problem_id(table: dict, where: str) -> str | None:
    """``[setup].problem_id``: the id ``worksheet new`` / ``worksheet class`` write on every sheet, by which
    ``check --key`` finds a submission's key (letters, digits, ``-`` and ``_``, at most 64)."""
    if "problem_id" not in table:
        return None
    v = table["problem_id"]
    if not isinstance(v, str) or not 1 <= len(v) <= MAX_ID_CHARS or not all(c.isascii() and (c.isalnum() or c in "-_")
                                                                           for c in v):
        _fail(f"{where}.problem_id", f"must be a string of 1 to {MAX_ID_CHARS} letters, digits, '-' or '_', got "
                                     f"{_kind(v) if not isinstance(v, str) or len(v) <= 80 else 'a long string'}")
    return v


def _key_table(raw, where: str = "[key]") -> str | None:
    """``[key]``: present on an answer key (never graded as a submission); ``student`` is the roster id of the
    student whose problem it is (``worksheet class``)."""
    t = _table(raw, where)
    _check_keys(t, ("student",), where)
    if "student" not in t:
        return None
    v = t["student"]
    if not isinstance(v, str) or not 1 <= len(v) <= MAX_ID_CHARS:
        _fail(f"{where}.student", f"must be a string of 1 to {MAX_ID_CHARS} characters, got "
                                  f"{_kind(v) if not isinstance(v, str) or len(v) <= 80 else 'a long string'}")
    return v


def _params(raw: dict, where: str, d: int, f: int, defaults: dict) -> tuple[dict, set]:
    t = _table(raw, where)
    _check_keys(t, PARAM_NAMES, where, "parameter")
    p, given = dict(defaults), set()
    for k, v in t.items():
        shape = quantity_shape(k, 1, d, f)
        if isinstance(v, str):
            if v != "identity":
                _fail(f"{where}.{k}", f"the only word accepted is \"identity\", got {v!r}")
            if len(shape) != 2 or shape[0] != shape[1]:
                _fail(f"{where}.{k}", f"\"identity\" needs a square matrix, but {k} has shape {shape}")
            p[k] = np.eye(shape[0])
        else:
            p[k] = _shaped(v, f"{where}.{k}", shape)
        given.add(k)
    return p, given


def _answer_name_error(name: str, where: str, norm: str, h: int, layer: int, backward: bool, valid) -> None:
    base = name.split("_head")[0]
    if name in ("scores", "attention_weights", "d_scores", "d_attention_weights") and h > 1:
        _fail(f"{where}.{name}", f"with n_heads = {h} give it per head: "
                                 + ", ".join(f"{name}_head{i + 1}" for i in range(h)))
    if "_head" in name and base in ("scores", "attention_weights", "d_scores", "d_attention_weights"):
        if h == 1:
            _fail(f"{where}.{name}", f"with one head the name is {base!r}")
        _fail(f"{where}.{name}", f"n_heads = {h}: the heads are {base}_head1 … {base}_head{h}")
    if name.startswith("d_") and not backward and name in answer_names(norm, h, layer, True):
        _fail(f"{where}.{name}", "backward answers need the upstream gradient: add dH to [input]")
    if name == "d_H0" and layer != 1:
        _fail(f"{where}.{name}", "d_H0 is the gradient of layer 1's input: put it in [answers.layer1]")
    if name in ("layer_norm2", "d_layer_norm2") and norm == "post":
        _fail(f"{where}.{name}", "in Post-LN the second LayerNorm's output is the layer output H")
    if name.startswith("d_layer_norm") and (name.endswith("_mean") or name.endswith("_var")):
        _fail(f"{where}.{name}", "the LayerNorm statistics have no gradient entry (the LayerNorm backward is one "
                                 "step): give d_layer_norm / d_residual instead")
    _fail(where, _suggest(name, valid, "quantity"))


def _answers(raw: dict, ws: Worksheet) -> dict:
    t = _table(raw, "[answers]")
    layers = [f"layer{l + 1}" for l in range(ws.layers)]
    out = {}
    for key, v in t.items():
        if key == "d_H0":
            if not ws.backward:
                _fail("[answers].d_H0", "backward answers need the upstream gradient: add dH to [input]")
            continue
        if key not in layers:
            if key.startswith("layer") and key[5:].isdigit():
                _fail(f"[answers.{key}]", f"the worksheet has setup.layers = {ws.layers}")
            _fail("[answers]", _suggest(key, layers + (["d_H0"] if ws.backward else []), "key"))
        layer = int(key[5:])
        where = f"[answers.{key}]"
        valid = answer_names(ws.norm, ws.n_heads, layer, ws.backward)
        for name, val in _table(v, where).items():
            if name not in valid:
                _answer_name_error(name, where, ws.norm, ws.n_heads, layer, ws.backward, valid)
            shape = quantity_shape(name, ws.n, ws.d_model, ws.d_ff)
            out[(layer, name)] = Answer(*_rows(val, f"{where}.{name}", shape, ws.tokens, is_per_token(name), True))
    if "d_H0" in t:
        if (1, "d_H0") in out:
            _fail("[answers].d_H0", "given twice: here and in [answers.layer1]")
        shape = (ws.n, ws.d_model)
        out[(1, "d_H0")] = Answer(*_rows(t["d_H0"], "[answers].d_H0", shape, ws.tokens, True, True))
    return out


def parse_worksheet(raw: dict, source: str = "<dict>") -> Worksheet:
    """Validate the parsed TOML structure ``raw`` (a dict) into a :class:`Worksheet`."""
    try:
        return _parse(raw)
    except WorksheetError as e:
        raise WorksheetError(f"{source}: {e}") from None


def _parse(raw) -> Worksheet:
    if not isinstance(raw, dict):
        raise WorksheetError(f"a worksheet must be a table (dict), got {_kind(raw)}")
    if "setup" not in raw:
        _fail("the worksheet", "the [setup] section is required")
    if "input" not in raw:
        _fail("the worksheet", "the [input] section (with H0) is required")
    setup = _setup(raw["setup"])
    L = setup["layers"]
    sections = ["setup", "input", "answers", "marks", "key"] + [f"layer{l + 1}" for l in range(L)]
    for k in raw:
        if k not in sections:
            if k.startswith("layer") and k[5:].isdigit():
                _fail(f"[{k}]", f"the worksheet has setup.layers = {L} (sections layer1 … layer{L})")
            _fail("the worksheet", _suggest(k, sections, "section"))
    tokens, n = setup["tokens"], len(setup["tokens"])
    inp = _table(raw["input"], "[input]")
    _check_keys(inp, ("H0", "dH"), "[input]")
    if "H0" not in inp:
        _fail("[input]", "H0 is required (one row per token)")
    d = setup["d_model"]
    if d is None:       # derive d_model from H0's rows
        rows = inp["H0"] if isinstance(inp["H0"], list) else list(_table(inp["H0"], "[input].H0").values())
        d = len(rows[0]) if rows and isinstance(rows[0], list) else 0
        if not 1 <= d <= LIMITS["d_model"]:
            _fail("[input].H0", f"cannot tell d_model from it (rows of 1 … {LIMITS['d_model']} numbers "
                                "expected); give setup.d_model")
    H0 = _rows(inp["H0"], "[input].H0", (n, d), tokens, True, False)[0]
    dH = _rows(inp["dH"], "[input].dH", (n, d), tokens, True, False)[0] if "dH" in inp else None
    h = setup["n_heads"]
    if d % h:
        _fail("[setup].n_heads", f"d_model = {d} must be divisible by n_heads = {h} (d_k = d_model / n_heads)")
    f = setup["d_ff"] if setup["d_ff"] is not None else min(4 * d, LIMITS["d_ff"])
    cfg = worksheet_config(L, d, h, f, setup["norm"], setup["activation"], setup["eps"])
    seeded = init_params(cfg, seed=setup["seed"], dtype=np.float64, init="xavier")
    params, given = [], []
    for l in range(L):
        defaults = {k: seeded[layer_prefix(cfg, l) + v] for k, v in LIBRARY_PARAM.items()}
        p, g = _params(raw.get(f"layer{l + 1}", {}), f"[layer{l + 1}]", d, f, defaults)
        params.append(p)
        given.append(g)
    ws = Worksheet(tokens=tokens, d_model=d, n_heads=h, d_ff=f, norm=setup["norm"],
                   activation=setup["activation"], eps=setup["eps"], layers=L, decimals=setup["decimals"],
                   seed=setup["seed"], H0=H0, dH=dH, params=params, given_params=given)
    ws.problem_id = setup["problem_id"]
    ws.reveal = setup["reveal"]
    if "key" in raw:
        ws.is_key, ws.key_student = True, _key_table(raw["key"])
    ws.answers = _answers(raw.get("answers", {}), ws)
    if "marks" in raw:
        _marks(raw["marks"], ws)
    return ws


def _mark(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= MAX_MARK or \
            (isinstance(v, float) and not math.isfinite(v)):
        _fail(where, f"marks must be a number in [0, {MAX_MARK}], got {_kind(v)}")
    return float(v)


def _marks(raw, ws: Worksheet) -> None:
    """The mark scheme: ``[marks]`` name = marks (every layer), default = marks, ``[marks.layerℓ]`` name = marks."""
    t = _table(raw, "[marks]")
    layers = [f"layer{l + 1}" for l in range(ws.layers)]
    every = set()
    for layer in range(1, ws.layers + 1):
        every.update(answer_names(ws.norm, ws.n_heads, layer, ws.backward))
    ws.has_marks = True
    for key, v in t.items():
        if key == "default":
            ws.mark_default = _mark(v, "[marks].default")
        elif key in layers:
            layer = int(key[5:])
            valid = answer_names(ws.norm, ws.n_heads, layer, ws.backward)
            for name, m in _table(v, f"[marks.{key}]").items():
                if name not in valid:
                    _fail(f"[marks.{key}]", _suggest(name, valid, "quantity"))
                ws.marks[(layer, name)] = _mark(m, f"[marks.{key}].{name}")
        elif key in every:
            ws.mark_names[key] = _mark(v, f"[marks].{key}")
        elif key.startswith("layer") and key[5:].isdigit():
            _fail(f"[marks.{key}]", f"the worksheet has setup.layers = {ws.layers}")
        else:
            _fail("[marks]", _suggest(key, ["default"] + layers + sorted(every), "quantity"))


def load_worksheet(source) -> Worksheet:
    """A :class:`Worksheet` from a TOML file path or from a dict of the same structure.

    Raises :class:`~transformer_np.errors.WorksheetError` (a ``ValueError``) naming the file, the
    section and key, what was expected and what was given.
    """
    if isinstance(source, Worksheet):
        return source
    if isinstance(source, dict):
        return parse_worksheet(source, "<dict>")
    if isinstance(source, (str, os.PathLike)):
        ws = parse_worksheet(read_toml(source), os.fspath(source))
        ws.source = os.fspath(source)
        return ws
    from ..errors import InputTypeError
    raise InputTypeError(f"worksheet must be a path to a TOML file or a dict, got {type(source).__name__}")
