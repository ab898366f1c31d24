"""Render this project's plain-text docstrings faithfully in the API reference.

The library's docstrings are written to be read with ``help()``: numpy-style sections, Unicode
maths, ``|x|`` for an absolute value or norm, and a formula or derivation set on its own indented
lines under the sentence that introduces it. Two of those habits are not reStructuredText:

* ``|x|`` is an RST *substitution reference* (and this project defines no substitutions), so every
  bar outside inline literals, roles and literal blocks is escaped: it is shown as the bar it is;
* an indented block directly under a paragraph line (or directly followed by text again) is an RST
  error ("Unexpected indentation", "… ends without a blank line"), so exactly such a block is made a
  literal block: shown as written, monospaced, alignment kept.

Nothing else is changed: valid RST (field lists, bullets, definition lists with their blank line,
``::`` blocks, directives, tables) passes through untouched, and any other markup error still fails
the build (warnings are errors).
"""

from __future__ import annotations

import re

_FIELD_OR_LIST = re.compile(r"^(:[^:]+:|[-*+•]\s|\d+[.)]\s|#\.\s|\.\.\s|>>>)")
_ITEM = re.compile(r"^\s*([-*+•]|\d+[.)]|#\.)\s+")                 # a bullet or enumerated item
_BORDER = re.compile(r"^\s*=+(\s+=+)+\s*$")                          # a simple table's border
_INLINE = re.compile(r"(``.+?``|:\w+:`[^`]*`|`[^`]*`_?_?)")
_TABLE_LINE = re.compile(r"^\s*[+|].*[+|]\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _content_indent(line: str) -> int:
    """Where the text starts: after the marker for a list item, else the line's indent."""
    m = _ITEM.match(line)
    return m.end() if m else _indent(line)


def _table_lines(lines: list[str]) -> set[int]:
    """Indices of the lines of RST simple tables (the non-blank run around a ``=== ===`` border)."""
    inside: set[int] = set()
    for k, line in enumerate(lines):
        if _BORDER.match(line) and k not in inside:
            a = k
            while a > 0 and lines[a - 1].strip():
                a -= 1
            b = k
            while b + 1 < len(lines) and lines[b + 1].strip():
                b += 1
            inside.update(range(a, b + 1))
    return inside


def _plain(line: str) -> bool:
    """A line of ordinary paragraph text (not a field, bullet, enumerator, directive or prompt)."""
    s = line.strip()
    return bool(s) and not _FIELD_OR_LIST.match(s) and not s.endswith("::")


def escape_bars(line: str) -> str:
    """Escape ``|`` outside inline literals and roles."""
    if "|" not in line or _TABLE_LINE.match(line):
        return line
    parts = _INLINE.split(line)
    return "".join(p if i % 2 else p.replace("\\|", "|").replace("|", "\\|") for i, p in enumerate(parts))


def display_blocks(lines: list[str]) -> list[str]:
    """Turn each indented block that RST would reject (directly under a paragraph line, or directly
    followed by less-indented text) into a literal block."""
    out: list[str] = []
    tables = _table_lines(lines)
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        out.append(line)
        nxt = lines[i + 1] if i + 1 < n else ""
        item = bool(_ITEM.match(line))
        opens = (_plain(line) or (item and not line.rstrip().endswith("::"))) and i not in tables
        a = _content_indent(line)
        if not (opens and nxt.strip() and _indent(nxt) > a):
            i += 1
            continue
        j = i + 1
        while j < n and lines[j].strip() and _indent(lines[j]) > a:
            j += 1
        prev = lines[i - 1] if i > 0 else ""
        under_paragraph = not item and bool(prev.strip()) and _indent(prev) == a and _plain(prev)
        runs_on = j < n and bool(lines[j].strip())
        if under_paragraph or runs_on:
            out += ["", " " * a + "::", ""] + lines[i + 1:j]
            if runs_on:
                out.append("")
            i = j
        else:
            i += 1
    return out


def escape_bars_in_table_row(line: str) -> str:
    """Escape bars in a row of a simple table without moving its columns: each added backslash is taken
    back from the next run of two or more spaces."""
    if "|" not in line:
        return line
    out, deficit = [], 0
    for i, part in enumerate(_INLINE.split(line)):
        if i % 2:  # an inline literal or role: unchanged
            out.append(part)
            continue
        k = 0
        while k < len(part):
            ch = part[k]
            if ch == "|" and not (k and part[k - 1] == "\\"):
                out.append("\\|")
                deficit += 1
                k += 1
            elif ch == " " and deficit:
                run = len(part[k:]) - len(part[k:].lstrip(" "))
                take = min(deficit, run - 1) if run >= 2 else 0
                out.append(" " * (run - take))
                deficit -= take
                k += run
            else:
                out.append(ch)
                k += 1
    return "".join(out)


def normalise(lines: list[str]) -> list[str]:
    """Both rules, skipping literal blocks that are already marked with ``::``."""
    lines = display_blocks(lines)
    tables = _table_lines(lines)
    result, literal_indent = [], None
    for k, line in enumerate(lines):
        if k in tables:
            result.append(escape_bars_in_table_row(line))
            continue
        if literal_indent is not None:
            if line.strip() and _indent(line) <= literal_indent:
                literal_indent = None
            else:
                result.append(line)
                continue
        result.append(escape_bars(line))
        if line.rstrip().endswith("::"):
            literal_indent = _indent(line)
    return result


def _process(app, what, name, obj, options, lines):
    lines[:] = normalise(lines)


def setup(app):
    app.connect("autodoc-process-docstring", _process, priority=600)  # after napoleon (500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
