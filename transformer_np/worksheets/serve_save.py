"""Saving what the page of ``worksheet serve`` holds into the sheet's TOML, leaving the problem untouched.

The page sends one grid of strings per step (rows × columns as it shows them, ``""`` for a blank cell).
:func:`answers_from_cells` turns them into ``[answers.layerℓ]`` entries exactly as ``check`` reads them:

* a cell is a decimal number as a person types it (``0.40``, ``-.5``, ``1e-3``); it is written to the TOML as
  typed (only made valid TOML: ``.5`` → ``0.5``, ``5.`` → ``5.0``, ``007`` → ``7``), so the value ``check``
  reads is the number the student typed and nothing is rounded for them;
* a step whose every cell is filled is written as a full array; a per-token step with only some rows complete
  as ``{ token = [row], … }`` (rows keyed by token, as the format allows); a row with some cells blank cannot be
  read by ``check`` and is left out — the page is told which (:class:`Cells` ``.not_saved``).

:func:`rewrite_answers` replaces the sheet's answer entries in its text: every ``[answers…]`` table keeps its
header and its comment lines (the generated sheets list the quantities there as comments), its key = value
entries are replaced by the new ones, and everything else in the file is kept byte for byte. The new text is
parsed again and refused unless its problem (every table but ``[answers]``) equals the old one and its answers
equal the ones meant; then it is written atomically (a temporary sibling renamed over the sheet).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field

from ..errors import WorksheetError
from .format import LIMITS, MAX_ABS, load_worksheet, quantity_shape
from .names import is_per_token
from .tomlio import MAX_FILE_BYTES, parse_toml, scan_toml

__all__ = ["NUMBER", "MAX_CELL_CHARS", "Cells", "grid_shape", "toml_number", "answers_from_cells",
           "rewrite_answers", "problem_fingerprint", "save_answers", "read_sheet_text"]

# A number as typed: optional sign, digits with an optional decimal point (or a point then digits), an optional
# exponent. The page's script uses the same pattern (static/serve.js).
NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
MAX_CELL_CHARS = 24


def grid_shape(name: str, n: int, d: int, f: int) -> tuple[int, int]:
    """The (rows, columns) the page shows for quantity ``name``: a per-token vector is a column (one row per
    token), any other vector one row."""
    shape = quantity_shape(name, n, d, f)
    if len(shape) == 2:
        return shape
    return (shape[0], 1) if is_per_token(name) else (1, shape[0])


def toml_number(cell: str) -> str:
    """The TOML literal of a typed number, with the digits as typed (a ``ValueError`` if it is not one)."""
    if len(cell) > MAX_CELL_CHARS or NUMBER.fullmatch(cell) is None:
        raise ValueError(f"not a number: {cell[:MAX_CELL_CHARS]!r}")
    m = re.fullmatch(r"([+-]?)([0-9]*)(?:\.([0-9]*))?((?:[eE][+-]?[0-9]+)?)", cell)
    sign, whole, frac, exp = m.group(1), m.group(2).lstrip("0") or "0", m.group(3), m.group(4)
    if frac is None and not exp:
        if len(whole) > 7 or int(whole) > MAX_ABS:          # compared as digits: never a garbled huge float
            raise ValueError(f"{cell!r} is beyond ±{MAX_ABS:g} (a worksheet is for hand calculation); not saved")
        return sign + whole                               # an integer, as TOML writes one (no leading zeros)
    lit = f"{sign}{whole}.{frac or '0'}{exp}"
    x = float(lit)
    if not math.isfinite(x) or abs(x) > MAX_ABS:
        raise ValueError(f"{cell!r} is beyond ±{MAX_ABS:g} (a worksheet is for hand calculation); not saved")
    if x == 0 and any(c in "123456789" for c in whole + (frac or "")):
        raise ValueError(f"{cell!r} cannot be stored as written: it is too small for a float and would be read "
                         f"as 0.0; write 0, or the number to the sheet's decimals")
    return lit


@dataclass
class Cells:
    """What the page's cells give: TOML lines per answers table, the values meant (as ``check`` will read
    them), and the rows that could not be saved (``{"layer", "name", "rows": [row indices], "reason"}``)."""

    lines: dict[str, list[str]] = field(default_factory=dict)      # "layer1" -> ['scores = [...]', …]
    values: dict[str, dict] = field(default_factory=dict)          # "layer1" -> {"scores": [[...]] or {tok: row}}
    not_saved: list[dict] = field(default_factory=list)


def _key(token: str) -> str:
    """A token as a TOML key: bare when it can be, else a basic string (JSON's escapes are TOML's)."""
    return token if re.fullmatch(r"[A-Za-z0-9_-]+", token) else json.dumps(token, ensure_ascii=False)


def _row_literal(lits: list[str]) -> str:
    return "[" + ", ".join(lits) + "]"


def _step_entry(name: str, grid: list[list[str]], ws, layer: int, out: Cells) -> None:
    """Add one step's entry (or nothing) to ``out`` from its validated grid of literals ("" = blank)."""
    full = [all(c != "" for c in row) for row in grid]
    blank = [all(c == "" for c in row) for row in grid]
    if all(blank):
        return
    shape = quantity_shape(name, ws.n, ws.d_model, ws.d_ff)
    vector = len(shape) == 1
    table = f"layer{layer}"

    def value(lits):
        return [float(x) for x in lits]

    if all(full):
        if vector:
            lits = [row[0] for row in grid] if is_per_token(name) else grid[0]
            out.lines.setdefault(table, []).append(f"{name} = {_row_literal(lits)}")
            out.values.setdefault(table, {})[name] = value(lits)
        else:
            rows = ",\n".join("  " + _row_literal(r) for r in grid)
            out.lines.setdefault(table, []).append(f"{name} = [\n{rows},\n]")
            out.values.setdefault(table, {})[name] = [value(r) for r in grid]
        return
    incomplete = [i for i, (f, b) in enumerate(zip(full, blank)) if not f and not b]
    if not is_per_token(name):
        out.not_saved.append({"layer": layer, "name": name, "rows": [i for i, b in enumerate(blank) if not b],
                              "reason": "every cell is needed: this quantity is not given row by row"})
        return
    if len(set(ws.tokens)) < len(ws.tokens):
        out.not_saved.append({"layer": layer, "name": name, "rows": [i for i, b in enumerate(blank) if not b],
                              "reason": "the sheet's tokens repeat, so rows cannot be keyed by token: fill in "
                                        "every row"})
        return
    if incomplete:
        out.not_saved.append({"layer": layer, "name": name, "rows": incomplete,
                              "reason": "a row is saved and marked once every cell of it is filled in"})
    keep = [i for i, f in enumerate(full) if f]
    if not keep:
        return
    items = [f"{_key(ws.tokens[i])} = {grid[i][0] if vector else _row_literal(grid[i])}" for i in keep]
    out.lines.setdefault(table, []).append(f"{name} = {{ " + ", ".join(items) + " }")
    out.values.setdefault(table, {})[name] = {ws.tokens[i]: (float(grid[i][0]) if vector else value(grid[i]))
                                              for i in keep}


def answers_from_cells(ws, cells) -> Cells:
    """Validate the page's ``{"layer1": {"scores": [["1.0", …], …], …}, …}`` against the worksheet ``ws`` and
    turn it into answer entries. A :class:`~transformer_np.errors.WorksheetError` names the first bad part
    (unknown table or step, wrong grid shape, a cell that is not a string or not a number)."""
    from .steps import build_steps

    if not isinstance(cells, dict):
        raise WorksheetError(f"answers: expected an object of tables, got {type(cells).__name__}")
    steps = {(f"layer{s.layer}", s.name) for s in build_steps(ws)}
    tables = {t for t, _ in steps}
    out = Cells()
    for table in sorted(cells, key=lambda t: (len(t), t)):
        if table not in tables:
            raise WorksheetError(f"answers: unknown table {str(table)[:40]!r}; the sheet has {sorted(tables)}")
        names = cells[table]
        if not isinstance(names, dict):
            raise WorksheetError(f"answers.{table}: expected an object of steps")
        for name, grid in names.items():
            if (table, name) not in steps:
                raise WorksheetError(f"answers.{table}: unknown step {str(name)[:40]!r}")
            rows, cols = grid_shape(name, ws.n, ws.d_model, ws.d_ff)
            where = f"answers.{table}.{name}"
            if not (isinstance(grid, list) and len(grid) == rows
                    and all(isinstance(r, list) and len(r) == cols for r in grid)):
                raise WorksheetError(f"{where}: expected {rows} rows of {cols} cells")
            lits = []
            for i, row in enumerate(grid):
                out_row = []
                for j, c in enumerate(row):
                    if not isinstance(c, str):
                        raise WorksheetError(f"{where}[{i}][{j}]: expected a string, got {type(c).__name__}")
                    c = c.strip()
                    try:
                        out_row.append("" if c == "" else toml_number(c))
                    except ValueError as e:
                        raise WorksheetError(f"{where}[{i}][{j}]: {e}") from None
                lits.append(out_row)
            _step_entry(name, lits, ws, int(table[5:]), out)
    return out


# ----------------------------------------------------------------------------- the sheet's text
_BARE = r"[A-Za-z0-9_-]+"
_QUOTED = r'"(?:[^"\\\n]|\\.)*"|' + r"'[^'\n]*'"
_KEYPART = rf"(?:{_BARE}|{_QUOTED})"
_STRING = re.compile(_QUOTED)
_HEADER = re.compile(rf"[ \t]*\[(\[?)[ \t]*({_KEYPART}(?:[ \t]*\.[ \t]*{_KEYPART})*)[ \t]*\]\]?")


def _key_parts(dotted: str) -> tuple[str, ...]:
    parts = re.findall(rf"{_KEYPART}", dotted)
    return tuple(json.loads(p) if p.startswith('"') else p.strip("'") for p in parts)


def _lines(text: str) -> list[tuple[str, bool]]:
    """The lines of ``text`` (with their ends), each with whether it starts outside any value (at depth 0 and not
    inside a multi-line string): only such a line can be a header, a comment line or the start of an entry."""
    out = []
    depth, ml = 0, None                          # ml: the delimiter of the multi-line string we are in
    for line in text.splitlines(keepends=True):
        out.append((line, depth == 0 and ml is None))
        i, n = 0, len(line)
        while i < n:
            if ml is not None:
                end = line.find(ml, i)
                if end < 0:
                    break
                i, ml = end + 3, None
                continue
            c = line[i]
            if c == "#":
                break
            if c in "\"'":
                if line.startswith(c * 3, i):
                    ml, i = c * 3, i + 3
                    continue
                m = _STRING.match(line, i)
                i = m.end() if m else n
                continue
            if c in "[{":
                depth += 1
            elif c in "]}":
                depth = max(depth - 1, 0)
            i += 1
    return out


def _blocks(text: str) -> list[dict]:
    """The file as blocks: the part before the first header, then one block per ``[table]`` header (its lines up
    to the next header). Each block: ``{"key": tuple or None, "lines": [(line, free)]}``."""
    blocks = [{"key": None, "lines": []}]
    for line, free in _lines(text):
        m = _HEADER.match(line) if free else None
        rest = line[m.end():].strip() if m is not None else None
        if m is not None and (rest == "" or rest.startswith("#")):
            blocks.append({"key": _key_parts(m.group(2)), "array": bool(m.group(1)), "lines": [(line, free)]})
        else:
            blocks[-1]["lines"].append((line, free))
    return blocks


def _strip_entries(lines: list[tuple[str, bool]]) -> list[str]:
    """A block's lines without its key = value entries: the header, comment lines and blank lines stay."""
    keep, in_entry = [], False
    for i, (line, free) in enumerate(lines):
        if i == 0 and _HEADER.match(line):
            keep.append(line)
            continue
        stripped = line.strip()
        if free:
            in_entry = not (stripped == "" or stripped.startswith("#"))
        if not in_entry:
            keep.append(line)
    return keep


def _ends_with_newline(lines: list[str]) -> list[str]:
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return lines


def rewrite_answers(text: str, cells: Cells) -> str:
    """``text`` with its answer entries replaced by ``cells``' (see the module docstring); not yet checked."""
    blocks = _blocks(text)
    out: list[str] = []
    written: set[str] = set()
    last_answers = None
    for b in blocks:
        key = b["key"]
        lines = [line for line, _ in b["lines"]]
        if key and key[0] == "answers" and not b.get("array"):
            kept = _ends_with_newline(_strip_entries(b["lines"]))
            while len(kept) > 1 and kept[-1].strip() == "":
                kept.pop()
            tail = len(lines) - len(kept)
            table = key[1] if len(key) == 2 else None
            if table in cells.lines:
                kept += [e + "\n" for e in cells.lines[table]]
                written.add(table)
            out += kept + ["\n"] * (1 if tail > 0 else 0)
            last_answers = len(out)
        else:
            out += lines
    rest = [t for t in cells.lines if t not in written]
    if rest:
        new = []
        for t in sorted(rest, key=lambda t: int(t[5:])):
            new += [f"[answers.{t}]\n"] + [e + "\n" for e in cells.lines[t]] + ["\n"]
        if last_answers is None:
            _ends_with_newline(out)
            if out and out[-1].strip() != "":
                out.append("\n")
            out += new[:-1]
        else:
            out[last_answers:last_answers] = new
    return "".join(out)


def _numbers(v):
    """A parsed TOML value with every number as a float (TOML reads ``1`` as an int, ``1.0`` as a float)."""
    if isinstance(v, dict):
        return {k: _numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_numbers(x) for x in v]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return v


def _problem(raw: dict) -> dict:
    return {k: v for k, v in raw.items() if k != "answers"}


def problem_fingerprint(raw: dict) -> str:
    """A digest of a parsed sheet's problem (every table but ``[answers]``): the page sends it back with its
    answers, so answers typed against one problem are never saved into a sheet whose problem has changed."""
    text = json.dumps(_numbers(_problem(raw)), sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def read_sheet_text(path: str) -> tuple[bytes, str, dict]:
    """The sheet's bytes, its text and the parsed TOML, as ``check`` reads them (bounded, UTF-8, scanned)."""
    from .._files import read_bytes_bounded

    data = read_bytes_bounded(path, MAX_FILE_BYTES, error=WorksheetError, what="worksheet file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WorksheetError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    bom = text.startswith("\ufeff")
    body = text.removeprefix("\ufeff")
    scan_toml(body, path)
    return data, ("\ufeff" if bom else "") + body, parse_toml(body, path)


def save_answers(path: str, cells_json, fingerprint: str) -> Cells:
    """Validate the page's cells against the sheet at ``path``, rewrite its answers and write it atomically.

    Raises :class:`~transformer_np.errors.WorksheetError` (nothing is written) when the cells are malformed, the
    sheet's problem no longer has ``fingerprint`` (it was edited since the page loaded it), the sheet gives its
    answers in a form this rewrite cannot keep apart from the problem, or the result would not be a sheet
    ``check`` reads."""
    from .._files import write_atomic

    _, text, raw = read_sheet_text(path)
    if problem_fingerprint(raw) != fingerprint:
        raise WorksheetError(f"{path}: the sheet's problem changed on disk since the page was opened; reload the "
                             f"page (your answers there were not saved)")
    ws = load_worksheet(_problem(raw))
    cells = answers_from_cells(ws, cells_json)
    bom = text.startswith("\ufeff")
    new_text = ("\ufeff" if bom else "") + rewrite_answers(text.removeprefix("\ufeff"), cells)
    data = new_text.encode("utf-8")
    if len(data) > MAX_FILE_BYTES:
        raise WorksheetError(f"{path}: with these answers the sheet would be {len(data)} bytes, more than the "
                             f"{MAX_FILE_BYTES} a worksheet file may have")
    body = new_text.removeprefix("\ufeff")
    scan_toml(body, path)
    new_raw = parse_toml(body, path)
    if _numbers(_problem(new_raw)) != _numbers(_problem(raw)) or \
            _numbers(new_raw.get("answers", {})) != _numbers(_meant(raw, cells)):
        raise WorksheetError(f"{path}: the sheet gives its answers in a form the page cannot rewrite without "
                             f"touching the rest (e.g. dotted keys or an inline [answers] table); give them as "
                             f"[answers.layerN] tables")
    load_worksheet(new_raw)                       # the sheet check will read: refused here, never written
    if new_text == text:
        return cells                              # nothing changed: the file is not rewritten
    mode = os.stat(path).st_mode & 0o777
    write_atomic(path, data, error=WorksheetError)
    try:
        os.chmod(path, mode)                      # the new file keeps the sheet's permissions
    except OSError:
        pass
    return cells


def _meant(raw: dict, cells: Cells) -> dict:
    """The ``answers`` table the rewritten sheet should parse to: the tables the old one had (now empty, their
    headers kept) plus the cells' entries."""
    old = raw.get("answers", {})
    meant = {k: {} for k, v in old.items() if isinstance(v, dict)} if isinstance(old, dict) else {}
    for table, values in cells.values.items():
        meant[table] = dict(values)
    return meant


def max_cells() -> int:
    """The most cells a page can hold: every quantity of the largest sheet ``LIMITS`` allows, forward and
    backward (used to bound a request's size)."""
    n, d, f, L = LIMITS["tokens"], LIMITS["d_model"], LIMITS["d_ff"], LIMITS["layers"]
    from .names import answer_names

    total = 0
    for layer in range(1, L + 1):
        for name in answer_names("pre", d, layer, True):
            r, c = grid_shape(name, n, d, f)
            total += r * c
    return total
