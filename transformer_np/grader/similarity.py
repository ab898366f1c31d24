r"""The similarity report of ``transformer-np grade --similarity``: which graded functions of a class look copied
— from the library's own source, or from another submission of the same run.

How: each graded function's source (with the top-level helper functions it calls, so moving code into a helper
does not hide it) is reduced to **normalised tokens** — comments, docstrings, blank lines and indentation dropped;
every identifier becomes ``ID``, every number ``NUM``, every string ``STR``; keywords, operators and the
attribute names after a dot (``np.exp``, ``.sum``, ``.swapaxes``: they carry the algorithm) kept. Two token
lists are compared by their sets of k-grams (:data:`K` tokens in a row); the score is the share of the smaller
set found in the other (``|A ∩ B| / min(|A|, |B|)``): symmetric, in [0, 1], and 1.0 when one function is the
other with lines added around it (argument checks, prints, a wrapper). All k-grams are kept: the functions are a
few hundred tokens at most, where winnowing's sampling would only lose precision.

What it catches: a copy with variables renamed, comments changed or removed, the code reformatted, independent
lines reordered (most k-grams survive), or moved into a helper; the library's source pasted and renamed.
What it does not: a student who rewrites the code substantially (other operations, another order of the
computation, einsum for ``@``…) is not caught — it compares the shape of the code, not its meaning. And
a function short enough that there is one obvious way to write it (``return dout * cache["dgelu"]``) says
nothing: a function whose body has fewer than :data:`MIN_TOKENS` normalised tokens (a one-liner, an untouched ``...`` or
``raise NotImplementedError`` body) is left out, so a class that left a function blank is not a wall of pairs.

The report **flags, it never penalises**: a pair above the threshold is a reason for the instructor to read both
functions, not evidence. On the short ops (softmax, LayerNorm) a student who writes the textbook formula in the
library's style, and on glue code (the encoder layer chains the given sublayers in one natural order) two honest
students, can score above the threshold: see :data:`DEFAULT_THRESHOLD` for what was measured.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import keyword
import textwrap
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import combinations

from ..errors import InputTypeError, InputValueError
from .grading import CHECKS
from .source import parse_untrusted
from .specs import EXERCISES

__all__ = ["SimilarPair", "function_sources", "normalised_tokens", "similarity", "library_functions",
           "graded_functions", "body_size", "similarity_report", "DEFAULT_THRESHOLD", "MIN_TOKENS", "K"]

#: k-gram length: long enough that a shared k-gram is a shared phrase (``ID.sum(axis=-NUM``…), short
#: enough that reordered or reformatted lines keep most of theirs.
K = 6
#: functions whose bodies have fewer normalised tokens than this are not compared (the ``def`` lines do not count:
#: every submission shares them). Untouched bodies: ``...`` 1 token, ``raise NotImplementedError("…")`` 5,
#: ``out, cache = None, None`` and ``return out, cache`` 15; the one-liner ``return dout * cache["dgelu"]``
#: (gelu_backward's solution) 7. The shortest graded solution compared, softmax_backward's, has 33.
MIN_TOKENS = 20
#: Measured by tests/grader/test_similarity.py on its corpus (K = 6; run as a script, it prints these ranges):
#:   copies of the notebooks' solutions against them — renamed, comments changed, reformatted (all 1.00: the
#:   normalisation undoes them), independent lines reordered 0.72 … 0.94, code moved into a helper 0.72 … 0.96 —
#:   and the library's kernels pasted with renamed variables against the library 0.81 … 1.00;
#:   honest formulations written differently (loops, einsum, np.var, logsumexp, a tape…): 0.13 … 0.56 against
#:   the solutions, 0.11 … 0.57 against the library, 0.13 … 0.41 against each other.
#:   The threshold sits in the middle of the gap (0.57 … 0.72). The notebooks' own solutions against the library:
#:   0.23 (ffn_forward) … 0.81 (layernorm_backward) — layernorm_* (0.80, 0.81) and attention_backward (0.73)
#:   would be flagged: written in the library's style, the textbook formula line by line. Code that chains given
#:   functions (the encoder layer) has one natural order: an honest student's can score 0.79 against another's.
DEFAULT_THRESHOLD = 0.65

_LIB = "transformer_np."
#: assignment → graded function → (the library function reported, then the kernels it runs: their source is
#: compared, the public function's argument checks add nothing a student would copy). Checked against each
#: Exercise's ``reference`` / ``reference_backward`` by the tests.
_LIBRARY: dict[str, dict[str, tuple[str, ...]]] = {
    "01_softmax": {"softmax_forward": ("ops.softmax.softmax_forward", "ops.softmax._softmax"),
                   "softmax_backward": ("ops.softmax.softmax_backward", "ops.softmax._softmax_backward")},
    "02_layernorm": {"layernorm_forward": ("ops.layernorm.layernorm_forward", "ops.layernorm._layernorm_forward"),
                     "layernorm_backward": ("ops.layernorm.layernorm_backward",
                                            "ops.layernorm._layernorm_backward")},
    "03_attention": {"attention_forward": ("ops.attention.attention_forward", "ops.attention._attention_forward",
                                           "ops.softmax._softmax"),
                     "attention_backward": ("ops.attention.attention_backward",
                                            "ops.attention._attention_backward")},
    "04_multihead_attention": {
        "mha_forward": ("ops.attention.mha_forward", "ops.attention._mha_forward", "ops.linear._linear_forward",
                        "ops.head_split.split_heads", "ops.head_split.merge_heads"),
        "mha_backward": ("ops.attention.mha_backward", "ops.attention._mha_backward", "ops.linear._linear_backward",
                         "ops.head_split.split_heads", "ops.head_split.merge_heads")},
    "05_gelu_ffn": {
        "gelu_forward": ("ops.activations.activation_forward", "ops.activations._gelu", "ops.activations._gelu_cdf"),
        "gelu_backward": ("ops.activations.activation_backward", "ops.activations._activation_backward"),
        "ffn_forward": ("ops.feedforward.ffn_forward", "ops.feedforward._ffn_forward", "ops.linear._linear_forward"),
        "ffn_backward": ("ops.feedforward.ffn_backward", "ops.feedforward._ffn_backward",
                         "ops.linear._linear_backward")},
    "06_encoder_layer": {"encoder_layer_forward": ("model.encoder.encoder_layer_forward", "model.encoder._layer_train"),
                         "encoder_layer_backward": ("model.encoder.encoder_layer_backward",
                                                    "model.encoder._layer_grads")},
}


@dataclass(frozen=True)
class SimilarPair:
    """Two versions of one graded function whose normalised tokens overlap at least the threshold."""

    function: str      # the graded function's name, e.g. "softmax_backward"
    a: str             # a submission id
    b: str             # another submission id, or "library:<dotted name>"
    score: float       # 0..1


# ----------------------------------------------------------------------------- reading a notebook's functions
def _parse(cell: str) -> ast.Module | None:
    """The cell as Python with IPython magics and shell lines (``%…``, ``%%…``, ``!…``) made ``pass``; None if it
    still does not parse."""
    lines = [line[:len(line) - len(line.lstrip())] + "pass" if line.lstrip()[:1] in ("%", "!") else line
             for line in cell.splitlines()]
    return parse_untrusted("\n".join(lines))      # None: a syntax error, a NUL byte, too deep to parse safely


def function_sources(cells: list[str], names: Iterable[str]) -> dict[str, str]:
    """{name: source} for each top-level ``def name`` among ``names`` in the notebook's code cells (the last
    definition wins, as when the cells run in order), followed by the source of the top-level functions it
    refers to by name, transitively (helpers; the other functions of ``names`` are compared on their own).
    A cell that does not parse (even with its magics and shell lines blanked) is skipped; never raises on a
    cell's content."""
    wanted = set(names)
    defs: dict[str, tuple[ast.AST, str]] = {}      # top-level function name → (node, its source)
    for cell in cells:
        tree = _parse(cell) if isinstance(cell, str) else None
        for node in tree.body if tree is not None else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs[node.name] = (node, ast.get_source_segment(cell, node) or "")
    out = {}
    for name in sorted(wanted & defs.keys()):
        order, todo = [name], [name]
        while todo:                                 # helpers reached by name, in the order first met
            node = defs[todo.pop(0)][0]
            new = [r.id for r in ast.walk(node) if isinstance(r, ast.Name) and r.id in defs.keys() - wanted]
            for ref in dict.fromkeys(r for r in new if r not in order):
                order.append(ref)
                todo.append(ref)
        out[name] = "\n\n".join(defs[n][1] for n in order)
    return out


# ----------------------------------------------------------------------------- tokens and score
_SKIP = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
_STATEMENT_EDGE = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)    # Python ≥ 3.12 splits f-strings into parts
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)


def _canonical(source: str) -> str:
    """``source`` re-printed from its syntax tree without type hints (parentheses, quotes, line breaks and
    spacing made canonical); as it is when it does not parse."""
    source = textwrap.dedent(source)
    tree = parse_untrusted(source)
    if tree is None:
        return source
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            node.annotation = None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
    try:
        return ast.unparse(tree)
    except (RecursionError, MemoryError):          # a tree deeper than the recursion limit: compare it as written
        return source


def _raw_tokens(source: str) -> list[tokenize.TokenInfo]:
    toks = []
    try:
        toks += (t for t in tokenize.generate_tokens(io.StringIO(_canonical(source)).readline)
                 if t.type not in (tokenize.COMMENT, tokenize.NL) and (t.string.strip() or t.type in _SKIP))
    except (tokenize.TokenError, SyntaxError):      # unterminated or badly indented: keep what was read
        pass
    return toks


def normalised_tokens(source: str) -> list[str]:
    """The tokens of ``source`` (re-printed from its syntax tree without type hints when it parses, so spacing,
    line breaks, quotes and redundant parentheses do not count) without comments, docstrings (any string that is
    a whole statement), blank lines and indentation; identifiers → ``"ID"`` except the attribute names after a
    ``.`` (kept, like keywords and operators); numbers → ``"NUM"``; strings (f-strings too) → ``"STR"``."""
    toks = _raw_tokens(source)
    out: list[str] = []
    depth = 0                                       # inside an f-string (Python ≥ 3.12): one STR for all of it
    for i, tok in enumerate(toks):
        if tok.type == _FSTRING_START:
            depth += 1
            if depth == 1:
                out.append("STR")
            continue
        if depth:
            depth -= tok.type == _FSTRING_END
            continue
        if tok.type in _SKIP:
            continue
        if tok.type == tokenize.STRING:
            before = toks[i - 1].type if i else tokenize.ENCODING
            after = toks[i + 1].type if i + 1 < len(toks) else tokenize.ENDMARKER
            if before in _STATEMENT_EDGE and after in (tokenize.NEWLINE, tokenize.ENDMARKER):
                continue                            # a docstring (or a bare string statement)
            out.append("STR")
        elif tok.type == tokenize.NUMBER:
            out.append("NUM")
        elif tok.type == tokenize.NAME:
            after_dot = i and toks[i - 1].type == tokenize.OP and toks[i - 1].string == "."
            out.append(tok.string if after_dot or keyword.iskeyword(tok.string) else "ID")
        else:
            out.append(tok.string)
    return out


def body_size(tokens: list[str]) -> int:
    """The number of normalised tokens outside the ``def NAME(...):`` lines (what :data:`MIN_TOKENS` counts)."""
    size, header, depth = 0, False, 0
    for tok in tokens:
        if tok == "def":
            header = True
        elif header:
            depth += (tok in "([{") - (tok in ")]}")
            header = not (tok == ":" and depth == 0)
        else:
            size += 1
    return size


def _kgrams(tokens: list[str]) -> set[tuple[str, ...]]:
    return {tuple(tokens[i:i + K]) for i in range(len(tokens) - K + 1)}


def _score(a: set, b: set) -> float:
    return len(a & b) / min(len(a), len(b)) if a and b else 0.0


def similarity(a: list[str], b: list[str]) -> float:
    """|A ∩ B| / min(|A|, |B|) over the two token lists' sets of :data:`K`-grams: symmetric, in [0, 1]; 0.0 when
    either is shorter than K."""
    return _score(_kgrams(a), _kgrams(b))


# ----------------------------------------------------------------------------- the assignments
def _check_exercise(exercise) -> None:
    if not isinstance(exercise, str) or exercise not in CHECKS:
        raise InputValueError(f"exercise must be one of {', '.join(CHECKS)}; got {exercise!r}")


def graded_functions(exercise: str) -> list[str]:
    """The names of the functions a student writes for ``exercise`` (e.g. ``["softmax_forward",
    "softmax_backward"]``), from :data:`~transformer_np.grader.grading.CHECKS` and the exercises' specs."""
    _check_exercise(exercise)
    return list(dict.fromkeys(getattr(EXERCISES[ex], kind) for kind, names in CHECKS[exercise].values()
                              for ex in names))


def _resolve(dotted: str):
    module, _, attr = (_LIB + dotted).rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _library_sources(exercise: str) -> dict[str, tuple[str, str]]:
    """graded function → (dotted library name, the source of the kernels that compute it)."""
    _check_exercise(exercise)
    return {fn: (_LIB + names[0], "\n\n".join(inspect.getsource(_resolve(n)) for n in names[1:]))
            for fn, names in _LIBRARY[exercise].items()}


def library_functions(exercise: str) -> dict[str, str]:
    """{dotted library name: source} of the library functions that compute what ``exercise``'s graded functions
    compute. The source is that of the kernels the public function runs once it has checked its arguments
    (``transformer_np.ops.softmax.softmax_forward`` → ``_softmax``; ``mha_forward`` → ``_mha_forward``,
    ``_linear_forward``, ``split_heads``, ``merge_heads``): what a student would copy. Unknown ``exercise`` →
    InputValueError naming the known ones."""
    return dict(_library_sources(exercise).values())


# ----------------------------------------------------------------------------- the report
def _check_submissions(submissions) -> None:
    if not isinstance(submissions, dict):
        raise InputTypeError(f"submissions must be a dict {{id: {{function name: source}}}}; got {submissions!r:.80}")
    for sid, funcs in submissions.items():
        if not isinstance(sid, str) or sid.startswith("library:"):
            raise InputValueError(f"submissions: each id must be a str not starting with 'library:'; got {sid!r}")
        if not isinstance(funcs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in funcs.items()):
            raise InputTypeError(f"submissions[{sid!r}] must be a dict {{function name: source str}} (from "
                                 f"function_sources); got {funcs!r:.80}")


def similarity_report(submissions: dict[str, dict[str, str]], exercise: str,
                      threshold: float = DEFAULT_THRESHOLD) -> list[SimilarPair]:
    """The pairs to read: each graded function of each submission against the library's (see
    :func:`library_functions`) and against the same function of every other submission; those scoring at least
    ``threshold``, highest first (then by function, a, b). A function whose body has fewer than
    :data:`MIN_TOKENS` normalised tokens (blank, one line: :func:`body_size`) is left out. A flag for the
    instructor, never a penalty."""
    _check_submissions(submissions)
    lib = _library_sources(exercise)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise InputValueError(f"threshold must be a number in [0, 1]; got {threshold!r}")
    pairs = []
    for fn in graded_functions(exercise):
        grams = {}
        for sid in sorted(submissions):
            tokens = normalised_tokens(submissions[sid].get(fn, ""))
            if body_size(tokens) >= MIN_TOKENS:
                grams[sid] = _kgrams(tokens)
        if fn in lib:
            name, source = lib[fn]
            lib_grams = _kgrams(normalised_tokens(source))
            pairs += [SimilarPair(fn, sid, "library:" + name, _score(g, lib_grams)) for sid, g in grams.items()]
        pairs += [SimilarPair(fn, a, b, _score(grams[a], grams[b])) for a, b in combinations(grams, 2)]
    return sorted((p for p in pairs if p.score >= threshold), key=lambda p: (-p.score, p.function, p.a, p.b))
