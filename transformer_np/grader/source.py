"""Parsing a student's source in the grader's process, without letting it crash that process.

The grader reads submissions as data: it parses cells to name the cell that failed to define a function and to
build the similarity report, and never runs them (the child does). But parsing is not free of risk: a chain of
200,000 ``+`` (or ``.a``, ``()``, unary ``-``) makes a syntax tree that deep, and on Python 3.10 ``ast.parse``
then overflows the C stack and the whole grader dies with a segmentation fault (3.11 and later raise
RecursionError). :func:`parse_untrusted` first counts, statement by statement, the tokens that can deepen a tree
(with :mod:`tokenize`, which is iterative), and treats a statement with more than :data:`MAX_CHAIN` of them as
unparsable — as a syntax error is: the child still runs the cell and reports whatever it does.
"""

from __future__ import annotations

import ast
import io
import tokenize

__all__ = ["MAX_CHAIN", "parse_untrusted"]

#: tokens that can nest a syntax tree one level deeper, at most, per logical line (measured: Python 3.10 parses a
#: chain of 100,000 ``+`` and dies at 200,000; honest code has a few dozen)
MAX_CHAIN = 20_000
_FLAT = {",", ":", ";", ")", "]", "}", "=", "->"}
_DEEPENING_NAMES = {"not", "and", "or", "if", "else", "lambda", "await", "in", "is"}


def too_deep(src: str) -> bool:
    """Whether some statement of ``src`` has more than :data:`MAX_CHAIN` tree-deepening tokens (or ``src`` cannot
    even be tokenised)."""
    count = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.NEWLINE:               # the end of a statement (NL: a line inside one)
                count = 0
            elif (tok.type == tokenize.OP and tok.string not in _FLAT) or \
                    (tok.type == tokenize.NAME and tok.string in _DEEPENING_NAMES):
                count += 1
                if count > MAX_CHAIN:
                    return True
    except (tokenize.TokenError, SyntaxError, ValueError):   # unterminated, bad indentation, a NUL byte
        return True
    return False


def parse_untrusted(src: str) -> ast.Module | None:
    """The syntax tree of ``src``, or None when it does not parse, is too deep to parse safely, or too large."""
    if too_deep(src):
        return None
    try:
        return ast.parse(src)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
