r"""Text for a terminal: control characters shown as escapes, never sent raw.

A file name, a JSON key or a vocabulary token comes from a file the library did not write; printed raw,
``"\x1b]0;…\x07"`` retitles the terminal, ``"\x1b[2J"`` clears it and ``"\r"`` or ``"\n"`` forges or hides a
line. :func:`printable` escapes them the way ``repr`` does (``\x1b``, ``\n``, ``\u202e``) and leaves every
other character, so ordinary names, paths and Unicode text print unchanged.

Escaped: the C0 and C1 control characters and DEL (Unicode category Cc, tab and newline included — a printed
value is one line), the line and paragraph separators U+2028/U+2029, and the bidirectional overrides and
isolates (U+202A–U+202E, U+2066–U+2069), which reorder what a terminal shows.
"""

from __future__ import annotations

__all__ = ["printable"]

_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_ESCAPES.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
_ESCAPES.update({c: f"\\u{c:04x}" for c in (0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))})


def printable(text) -> str:
    """``str(text)`` with every control character escaped (see the module docstring); other text unchanged."""
    text = str(text)
    return text if text.isprintable() else text.translate(_ESCAPES)
