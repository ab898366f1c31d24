r"""Untrusted text out: to a terminal (:func:`terminal`) and to a CSV cell (:func:`csv_cell`), one policy.

A file name, a JSON key, a vocabulary token, a sheet's answer or a student's output comes from somewhere the
library did not write. Printed raw, ``"\x1b]0;…\x07"`` retitles the terminal, ``"\x1b[2J"`` clears it,
``"\r"`` or ``"\n"`` forges or hides a line, U+202E (right-to-left override) reorders what is shown and U+200B
(zero width space) hides a difference; in a spreadsheet, a cell beginning with ``=`` is a formula. Every
error message (:mod:`transformer_np.errors`) and every command's output of such text goes through here.

:func:`terminal` writes as an escape, and leaves every other character as it is (ordinary names, paths and
Unicode text print unchanged):

* the control characters C0, DEL and C1 (Unicode category Cc): ``\n``, ``\r`` and ``\t`` as such, the others
  as ``\xNN`` — newline and tab included (a printed value is one line), unless the caller keeps newlines;
* the format characters (category Cf: U+200B–U+200F, the bidirectional embeddings, overrides and isolates
  U+202A–U+202E and U+2066–U+2069, U+FEFF, U+00AD, …) and the line and paragraph separators U+2028 (Zl)
  and U+2029 (Zp), as ``\uNNNN`` (``\UNNNNNNNN`` above U+FFFF);
* a byte that was not UTF-8 (decoded by ``os.fsdecode`` or ``surrogateescape`` as U+DC80–U+DCFF) as the byte,
  ``\xNN``; any other lone surrogate as ``\uNNNN`` (it could not be encoded to the terminal at all).

:func:`csv_cell` is :func:`terminal` for a cell (numbers pass as numbers, None is empty) with the
spreadsheets' own escape: a text beginning with ``=``, ``+``, ``-``, ``@``, TAB or CR gets a leading ``'``.
"""

from __future__ import annotations

import unicodedata

__all__ = ["terminal", "csv_cell"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_FORMULA = ("=", "+", "-", "@", "\t", "\r")
_ESCAPED_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    o = ord(ch)
    if 0xDC80 <= o <= 0xDCFF:                        # an undecodable byte, kept by surrogateescape
        return f"\\x{o - 0xDC00:02x}"
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def terminal(text, newlines: bool = False) -> str:
    """``str(text)`` with every character a terminal would act on, or would not show, written as an escape
    (see the module docstring); ``newlines=True`` keeps ``"\\n"`` as a line break (a multi-line report)."""
    text = str(text)
    if text.isprintable():                           # nothing to escape (the common case, one C-level pass)
        return text
    return "".join(ch if (newlines and ch == "\n") or unicodedata.category(ch) not in _ESCAPED_CATEGORIES
                   else _escape(ch) for ch in text)


def csv_cell(value) -> object:
    """A CSV cell: an int or float as it is, None as ``""``; anything else as text through :func:`terminal`,
    with a ``'`` before a leading ``=``, ``+``, ``-``, ``@``, TAB or CR so that a spreadsheet shows it as text
    instead of evaluating it."""
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    text = str(value)
    return ("'" if text.startswith(_FORMULA) else "") + terminal(text)


#: the name this policy had in ``transformer_np._text`` (until issue 46; that path still imports it)
printable = terminal
