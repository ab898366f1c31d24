r"""New problems for hand calculation: ``transformer-np worksheet new``.

Each seed gives its own problem, so an instructor can hand every student a different sheet. The
numbers are chosen to be worked by hand:

* H^(0): zeros and ones, no two rows alike, no constant row, no column of zeros;
* W_Q, W_K select columns (one 1 per column), W_V is a permutation, W_O the identity, their biases
  0 — so Q, K, V are columns of the attention's input, and in layer 1 of a Post-LN sheet the scores
  are integers / √d_k (for d_k = 1, 4, 9, 16: multiples of 1/√d_k); every score of layer 1 lies in
  [−2, 2] (later layers [−3, 3]; both at least [−√d_k, √d_k]) and not all are equal, so the softmax
  needs e^x for a few small x — when ten draws of a layer miss that bound (many heads of width 1 on
  normalised inputs rarely meet it) the bound widens by 1, so every size within the limits is generated
  in seconds;
* W_1, W_2: entries in {−1, −0.5, 0, 0.5, 1}, b_1 in {−0.5, 0, 0.5} (after ten failed draws of a layer
  {−0.75, −0.25, 0.25, 0.75}, off the half-grid, so that a pre-activation is not exactly 0), γ = 1, β = 0;
  with ReLU (the default activation here) no pre-activation lies within 0.05 of the kink (on a
  sheet with more than 64 pre-activations per layer: none exactly at it);
* no two tokens leave a layer with the same row (the next layer's scores would all tie), so
  ``tokens`` ≤ 2^d_model − 2 (the distinct non-constant rows of zeros and ones);
* every LayerNorm input row has variance ≥ 0.15 (no near-constant row), and (with ``--backward``)
  the upstream gradient dH has entries in {−1, 0, 1}.

A layer whose numbers break a condition is redrawn from the same seeded stream (deterministically).
The files written: ``<stem>.toml`` (the problem, with an empty ``[answers.layer1]`` for the
student), ``<stem>_student.md`` (the problem and a blank table per step), ``<stem>_key.md`` (every
step's answer) and ``<stem>_key.toml`` (the problem with the key as answers: ``check`` marks it all
``correct``).

Every key carries the full mark scheme, a ``[marks]`` table naming every step of the sheet with its marks
(:func:`mark_scheme`: one mark per step, or the weights of a ``--marks FILE``, :func:`read_marks_file`), so
that marks are out of the whole sheet whatever the student answered; with ``--marks`` the student's TOML carries
the same table (its own check then agrees with the key's).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import InputValueError
from ..ops.activations import ACTIVATIONS
from .format import LIMITS, load_worksheet, quantity_shape
from .keys import problem_id
from .names import PARAM_NAMES, is_per_token
from .notation import written_out
from .steps import DH_KEY, H0_KEY, build_steps, evaluate
from .tomlio import toml_value

__all__ = ["WORDS", "new_worksheet", "answer_key", "to_toml", "student_markdown", "key_markdown",
           "write_worksheet", "sheet_texts", "mark_scheme", "read_marks_file"]

WORDS = ("the", "cat", "sat", "on", "a", "mat", "dog", "ran", "big", "red", "sun", "sky", "bird", "sang",
         "fish", "swam", "old", "tree", "grew", "tall")
_MAX_DRAWS = 500      # draws of H0 (each followed by up to _LAYER_DRAWS draws per layer)
_LAYER_DRAWS = 50
_WIDEN_EVERY = 10     # after this many draws of a layer fail, its score bound widens by 1 (many heads of width 1)
MIN_VARIANCE = 0.15    # LayerNorm inputs with a smaller variance make 1/σ (and the rounding it amplifies) large


def _check_args(tokens, d_model, heads, norm, layers, d_ff, activation, decimals, seed):
    def bounded(v, name, lo, hi):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise InputValueError(f"{name} must be an integer, got {v!r}")
        if not lo <= v <= hi:
            raise InputValueError(f"{name} must be in [{lo}, {hi}] (a worksheet is for hand calculation), got {v}")
    bounded(tokens, "tokens", 2, LIMITS["tokens"])
    bounded(d_model, "d_model", 2, LIMITS["d_model"])
    bounded(heads, "heads", 1, d_model)
    bounded(layers, "layers", 1, LIMITS["layers"])
    bounded(decimals, "decimals", 1, LIMITS["decimals"])
    if d_ff is not None:
        bounded(d_ff, "d_ff", 1, LIMITS["d_ff"])
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputValueError(f"seed must be a non-negative integer, got {seed!r}")
    if d_model % heads:
        raise InputValueError(f"d_model = {d_model} must be divisible by heads = {heads}")
    if tokens > 2 ** d_model - 2:
        raise InputValueError(f"tokens = {tokens} needs d_model >= {int(np.ceil(np.log2(tokens + 2)))}: the rows of "
                              f"H0 are distinct, non-constant patterns of zeros and ones, and d_model = {d_model} "
                              f"has only {2 ** d_model - 2}")
    if norm not in ("post", "pre"):
        raise InputValueError(f"norm must be 'post' or 'pre', got {norm!r}")
    if activation not in ACTIVATIONS:
        raise InputValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def _draw_layer(rng, d: int, f: int, off_grid: bool = False) -> dict:
    def select():                                 # column c of x W is column r(c) of x
        return np.eye(d)[rng.integers(0, d, size=d)].T.copy()
    return {"W_Q": select(), "b_Q": np.zeros(d), "W_K": select(), "b_K": np.zeros(d),
            "W_V": np.eye(d)[rng.permutation(d)], "b_V": np.zeros(d), "W_O": np.eye(d), "b_O": np.zeros(d),
            "gamma1": np.ones(d), "beta1": np.zeros(d),
            "W_1": rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0], size=(d, f)),
            "b_1": rng.choice([-0.75, -0.25, 0.25, 0.75] if off_grid else [-0.5, 0.0, 0.5], size=f),
            "W_2": rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0], size=(f, d)), "b_2": np.zeros(d),
            "gamma2": np.ones(d), "beta2": np.zeros(d)}


def _layer_ok(raw: dict, layer: int, activation: str, H_in: np.ndarray, widen: int = 0) -> np.ndarray | None:
    """Are the numbers of layer ``layer`` (1-based) of the problem so far hand-friendly? ``H_in`` is the layer's
    input H^(layer-1) (the steps of a layer depend on nothing else): only this one layer is computed."""
    sub = {"setup": {**raw["setup"], "layers": 1}, "input": {"H0": H_in.tolist()}, "layer1": raw[f"layer{layer}"]}
    ws = load_worksheet(sub)
    steps = build_steps(ws)
    v = evaluate(steps, {H0_KEY: ws.H0})
    out = v[(1, "H")]
    if len({tuple(np.round(r, 9)) for r in out}) < len(out):    # two tokens alike: the next layer's scores tie
        return None
    for s in steps:
        x = v[s.key]
        base = s.name.split("_head")[0]
        if not np.all(np.isfinite(x)):
            return None
        bound = max(2.0 if layer == 1 else 3.0, np.sqrt(ws.d_k)) + widen
        if base == "scores" and (np.abs(x).max() > bound + 1e-9 or np.ptp(x) == 0):
            return None
        if base.endswith("_var") and x.min() < MIN_VARIANCE:
            return None
        kink = 0.05 if x.size <= 64 else 1e-9      # a hand-sized sheet keeps clear of ReLU's kink
        if base == "ffn_hidden" and activation == "relu" and np.abs(x).min() < kink:
            return None
    return out


def new_worksheet(tokens: int = 3, d_model: int = 4, heads: int = 1, norm: str = "post", backward: bool = False,
                  seed: int = 0, layers: int = 1, d_ff: int | None = None, activation: str = "relu",
                  decimals: int = 2) -> dict:
    """A fresh problem (the worksheet as a dict, without answers) chosen for hand calculation.

    Args:
        tokens: number of tokens n (2 … 16); words are drawn from ``WORDS``.
        d_model: width d (2 … 64); ``heads`` must divide it.
        heads: attention heads h.
        norm: "post" or "pre".
        backward: also give an upstream gradient dH, so the backward steps are asked for.
        seed: different seeds give different problems (the same seed the same problem).
        layers: 1 … 4.
        d_ff: feed-forward width (default d_model, to keep the hand work small).
        activation: "relu" (default: the easiest by hand), "gelu" or "gelu_tanh".
        decimals: how the answers are to be rounded.
    """
    _check_args(tokens, d_model, heads, norm, layers, d_ff, activation, decimals, seed)
    f = d_model if d_ff is None else d_ff
    rng = np.random.default_rng(seed)
    words = [str(w) for w in rng.choice(WORDS, size=tokens, replace=False)]
    for _ in range(_MAX_DRAWS):
        H0 = rng.choice([0.0, 1.0], size=(tokens, d_model))
        if len({tuple(r) for r in H0}) < tokens or np.any(np.ptp(H0, axis=1) == 0) or not H0.any(axis=0).all():
            continue
        raw = {"setup": {"tokens": words, "d_model": d_model, "n_heads": heads, "d_ff": f, "norm": norm,
                         "activation": activation, "eps": 1e-12, "layers": layers, "decimals": decimals,
                         "seed": int(seed)},
               "input": {"H0": H0.tolist()}}
        H_in = H0
        for l in range(1, layers + 1):
            for attempt in range(_LAYER_DRAWS):
                raw[f"layer{l}"] = {k: v.tolist() for k, v in
                                    _draw_layer(rng, d_model, f, attempt >= _WIDEN_EVERY).items()}
                H_out = _layer_ok(raw, l, activation, H_in, attempt // _WIDEN_EVERY)
                if H_out is not None:
                    H_in = H_out
                    break
            else:
                break
        else:
            if backward:
                dH = np.zeros((tokens, d_model))
                while not dH.any():
                    dH = rng.choice([-1.0, 0.0, 1.0], size=(tokens, d_model))
                raw["input"]["dH"] = dH.tolist()
            raw["setup"]["problem_id"] = problem_id(raw)
            return raw
    raise InputValueError(f"no problem with hand-friendly numbers found in {_MAX_DRAWS} draws for seed {seed} "
                          f"(tokens = {tokens}, d_model = {d_model}, heads = {heads}); try another seed or "
                          f"smaller sizes")


def _values(raw: dict):
    ws = load_worksheet({k: v for k, v in raw.items() if k != "answers"})
    steps = build_steps(ws)
    v = evaluate(steps, {H0_KEY: ws.H0, DH_KEY: ws.dH} if ws.backward else {H0_KEY: ws.H0})
    return ws, steps, v


def _round(x: np.ndarray, dec: int) -> np.ndarray:
    r = np.sign(x) * np.floor(np.abs(x) * 10.0 ** dec + 0.5) / 10.0 ** dec      # halves away from zero
    return r + 0.0                                                             # no -0.0


def answer_key(raw: dict) -> dict:
    """``{"layer1": {name: rounded value, …}, …}``: every step of the problem ``raw``, rounded to its decimals."""
    ws, steps, v = _values(raw)
    key: dict = {}
    for s in steps:
        key.setdefault(f"layer{s.layer}", {})[s.name] = _round(v[s.key], ws.decimals).tolist()
    return key


# ----------------------------------------------------------------------------- writing
def _is_identity(a) -> bool:
    if isinstance(a, str):                      # "identity", as read back from a sheet
        return a == "identity"
    a = np.asarray(a, dtype=float)
    return a.ndim == 2 and a.shape[0] == a.shape[1] and np.array_equal(a, np.eye(a.shape[0]))


def _title(s: dict) -> str:
    """How a sheet names its problem: the seed (``worksheet new``), or only the problem id when the seed is
    secret (``worksheet class``)."""
    if "seed" in s:
        return f"seed {s['seed']}"
    return f"problem {s['problem_id']}" if "problem_id" in s else "seed 0"


def to_toml(raw: dict, answers: dict | None = None, template: bool = True, key: bool | str = False,
            marks: dict | None = None) -> str:
    """The worksheet ``raw`` as TOML text; ``answers`` (from :func:`answer_key`) are written with the sheet's
    decimals; otherwise (``template``) an empty ``[answers.layer1]`` lists every name as a comment. ``key``: the
    sheet is an answer key, marked by a ``[key]`` table (never graded as a submission; a string is the student
    id it is for). ``marks``: a mark scheme (:func:`mark_scheme`) written as ``[marks]`` before the answers
    (else ``raw["marks"]`` when there is one)."""
    s = raw["setup"]
    dec = s.get("decimals", 2)
    what = "An answer key" if key else "A worksheet"
    out = [f"# {what} for transformer_np ({_title(s)}). Check it with:  transformer-np check FILE", "", "[setup]"]
    out += [f"{k} = {toml_value(v)}" for k, v in s.items()]
    if key:
        out += ["", "[key]"] + ([f"student = {toml_value(key)}"] if isinstance(key, str) else [])
    out += ["", "[input]"]
    out += [f"{k} = {toml_value(v)}" for k, v in raw["input"].items()]
    for l in range(1, s.get("layers", 1) + 1):
        if f"layer{l}" not in raw:
            continue
        out += ["", f"[layer{l}]"]
        for k in PARAM_NAMES:
            if k in raw[f"layer{l}"]:
                v = raw[f"layer{l}"][k]
                out.append(f"{k} = " + ('"identity"' if _is_identity(v) else toml_value(v)))
    marks = raw.get("marks") if marks is None else marks
    if marks:
        out += _marks_toml(marks)
    if answers is not None:
        for layer, table in answers.items():
            out += ["", f"[answers.{layer}]"]
            out += [f"{k} = {toml_value(v, dec)}" for k, v in table.items()]
    elif template:
        ws, steps, _ = _values(raw)
        out += ["", f"# Your answers, rounded to {dec} decimals: uncomment a line and fill it in, as a full",
                "# matrix (one row per token) or as rows keyed by token, e.g.  scores = { the = [1.0, 0.5, 0.0] }"]
        for l in range(1, ws.layers + 1):
            out += ["", f"[answers.layer{l}]"]
            for st in steps:
                if st.layer == l:
                    shape = quantity_shape(st.name, ws.n, ws.d_model, ws.d_ff)
                    out.append(f"# {st.name} = ...   # shape {shape}: {st.formula}")
    return "\n".join(out) + "\n"


def _marks_toml(marks: dict) -> list[str]:
    """The lines of a ``[marks]`` table (``name = marks``, ``default``) and its ``[marks.layerℓ]`` tables."""
    top = [f"{k} = {toml_value(v)}" for k, v in marks.items() if not isinstance(v, dict)]
    out = ["", "[marks]"] + top
    for layer, table in marks.items():
        if isinstance(table, dict):
            out += ["", f"[marks.{layer}]"] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
    return out


def _whole(x: float):
    return int(x) if float(x).is_integer() else float(x)


def mark_scheme(raw: dict, marks: dict | None = None, source: str = "--marks") -> dict:
    """The full mark scheme of problem ``raw``: ``{"default": d, "layer1": {step: marks, …}, …}`` naming every
    step of the sheet, from ``marks`` (a ``[marks]`` table: ``name = marks`` in every layer, ``default``,
    ``layerℓ = {name = marks}``; see :mod:`.format`) or one mark per step when None. A bad table is refused
    naming ``source`` and the key (:class:`~transformer_np.errors.InputValueError`), and so is a scheme that
    gives the sheet no marks at all."""
    from ..errors import WorksheetError
    from .format import parse_worksheet

    problem = {k: v for k, v in raw.items() if k not in ("answers", "marks", "key")}
    if marks is not None:
        if not isinstance(marks, dict):
            raise InputValueError(f"{source}: a mark scheme must be a table of step = marks, got "
                                  f"{type(marks).__name__}")
        problem["marks"] = marks
    try:
        ws = parse_worksheet(problem, source)
    except WorksheetError as e:
        raise InputValueError(f"{source}: {str(e).removeprefix(source + ': ')}") from None
    scheme: dict = {"default": _whole(ws.mark_default)}
    total = 0.0
    for st in build_steps(ws):
        w = ws.mark_of(st.key)
        scheme.setdefault(f"layer{st.layer}", {})[st.name] = _whole(w)
        total += w
    if total <= 0:
        raise InputValueError(f"{source}: the mark scheme gives every step of the sheet 0 marks; give at least "
                              f"one step a mark > 0")
    return scheme


def read_marks_file(path: str) -> dict:
    """The mark scheme in the TOML file ``path`` (``worksheet new/class --marks FILE``): the contents of a
    ``[marks]`` table — ``step = marks`` (every layer), ``default = marks``, ``[layerℓ]`` tables of ``step =
    marks`` — or a file with one ``[marks]`` table holding them. Unreadable files are refused naming
    ``--marks`` (:class:`~transformer_np.errors.InputValueError`); the names are checked against the problem by
    :func:`mark_scheme`."""
    from ..errors import WorksheetError
    from .tomlio import read_toml

    if not os.path.lexists(path):
        raise InputValueError(f"--marks: {path}: no such file")
    try:
        table = read_toml(path)
    except WorksheetError as e:
        raise InputValueError(f"--marks: {e}") from None
    except OSError as e:
        raise InputValueError(f"--marks: {path}: cannot read it: {e.strerror or e}") from None
    if set(table) == {"marks"} and isinstance(table["marks"], dict):
        table = table["marks"]
    if not table:
        raise InputValueError(f"--marks: {path} is empty; expected step = marks lines (e.g. attention_weights = 2, "
                              f"default = 1)")
    return table


def _md_table(values, rows, cols, dec: int | None) -> list[str]:
    out = ["| | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r, row in zip(rows, values):
        cells = ["" if dec is None else _num(x, dec) for x in row]
        out.append(f"| **{r}** | " + " | ".join(cells) + " |")
    return out


def _num(x, dec):
    s = f"{x:.{dec}f}"
    return s.replace("-", "") if float(s) == 0 else s


def _labels(ws, name: str, shape):
    base = name.removeprefix("d_").split("_head")[0]
    per_token = is_per_token(name)
    rows = list(ws.tokens) if per_token else ([str(i + 1) for i in range(shape[0])] if len(shape) > 1 else [""])
    if len(shape) == 1:
        cols = [name] if per_token else [str(j + 1) for j in range(shape[0])]
    elif base in ("scores", "attention_weights"):
        cols = list(ws.tokens)
    else:
        cols = [str(j + 1) for j in range(shape[1])]
    return rows, cols


def _as_rows(a: np.ndarray, name: str) -> np.ndarray:
    if a.ndim == 1:
        return a[:, None] if is_per_token(name) else a[None, :]
    return a


def _markdown(raw: dict, with_answers: bool, marks: dict | None = None, toml_name: str | None = None) -> str:
    ws, steps, v = _values(raw)
    dec = ws.decimals
    s = raw["setup"]
    title = "Answer key" if with_answers else "Worksheet"
    heads = f"{ws.n_heads} head{'s' if ws.n_heads > 1 else ''} (d_k = {ws.d_k})"
    pid = f" Problem id: {s['problem_id']} (keep it on your sheet: it names your problem)." \
        if "problem_id" in s else ""
    L = [f"# {title}: a Transformer encoder by hand ({_title(s)})", "",
         f"Tokens: {', '.join(ws.tokens)}. d_model = {ws.d_model}, {heads}, d_ff = {ws.d_ff}, "
         f"{'Post-LN' if ws.norm == 'post' else 'Pre-LN'}, activation {ws.activation}, LayerNorm eps = "
         f"{ws.eps:g} (treat it as 0), {ws.layers} layer{'s' if ws.layers > 1 else ''}.{pid}",
         f"Round every answer to {dec} decimals; keep more digits in between. In the score and attention "
         "tables the row is the query token and the column the key token.", "",
         "Each layer: Z = LN1(H + MHA(H)), H' = LN2(Z + FFN(Z)) (Post-LN)." if ws.norm == "post" else
         "Each layer: Z = H + MHA(LN1(H)), H' = Z + FFN(LN2(Z)) (Pre-LN, no final LayerNorm).", "",
         "## Input H^(0)", ""]
    if not with_answers:      # the student's sheet says where the answers go and how they are checked
        sections = ", ".join(f"`[answers.layer{l}]`" for l in range(1, ws.layers + 1))
        where = f"`{toml_name}`" if toml_name else "the `.toml` file handed out with it"
        L[-2:-2] = ["**Where your answers go.** Work each step below on paper, or in its blank table. To have them "
                    f"checked, type them into the {sections} section{'s' if ws.layers > 1 else ''} of the problem "
                    f"file next to this sheet, {where}: each step has a commented line there to fill in. Then run "
                    f"`transformer-np check {toml_name or 'FILE.toml'}`: it marks "
                    "each answer correct, follows (wrong, but right from your own earlier answers), wrong or "
                    "missing, and names your first mistake.", ""]
    L += _md_table(ws.H0, ws.tokens, [str(j + 1) for j in range(ws.d_model)], _dec_exact(ws.H0))
    if ws.backward:
        L += ["", "## Upstream gradient dH = dL/dH^(N)", ""]
        L += _md_table(ws.dH, ws.tokens, [str(j + 1) for j in range(ws.d_model)], _dec_exact(ws.dH))
    for l, p in enumerate(ws.params, 1):
        L += ["", f"## Layer {l} parameters", ""]
        for k in PARAM_NAMES:
            a = p[k]
            if _is_identity(a):
                L.append(f"- {k} = the identity I_{a.shape[0]}")
            elif a.ndim == 1:
                L.append(f"- {k} = [{', '.join(_num(x, _dec_exact(a)) for x in a)}]")
            else:
                L += ["", f"{k}:", ""]
                L += _md_table(a, [str(i + 1) for i in range(a.shape[0])], [str(j + 1) for j in range(a.shape[1])],
                               _dec_exact(a))
                L.append("")
    L += ["", "## Steps", ""]
    for i, st in enumerate(steps, 1):
        shape = quantity_shape(st.name, ws.n, ws.d_model, ws.d_ff)
        rows, cols = _labels(ws, st.name, shape)
        worth = "" if marks is None else marks.get(f"layer{st.layer}", {}).get(st.name)
        worth = "" if worth in ("", None) else f" ({worth:g} mark{'s' if worth != 1 else ''})"
        L += [f"### {i}. Layer {st.layer}: `{st.name}` = {written_out(st.formula)}{worth}", ""]
        vals = _as_rows(_round(v[st.key], dec), st.name) if with_answers else np.zeros((len(rows), len(cols)))
        L += _md_table(vals, rows, cols, dec if with_answers else None)
        L.append("")
    return "\n".join(L)


def _dec_exact(a) -> int:
    """The fewest decimals (≤ 6) that print every entry of ``a`` exactly."""
    a = np.asarray(a, dtype=float)
    for k in range(7):
        if np.allclose(a, np.round(a, k), rtol=0, atol=1e-12):
            return k
    return 6


def student_markdown(raw: dict, marks: dict | None = None, toml_name: str | None = None) -> str:
    """The problem and a blank table per step, in Markdown (``marks``: a full scheme, :func:`mark_scheme`, whose
    marks each step's heading then shows)."""
    return _markdown(raw, with_answers=False, marks=marks, toml_name=toml_name)


def key_markdown(raw: dict, marks: dict | None = None) -> str:
    """The problem and every step's answer (rounded to the sheet's decimals), in Markdown (``marks``: as
    :func:`student_markdown`)."""
    return _markdown(raw, with_answers=True, marks=marks)


def write_worksheet(raw: dict, out: str = ".", stem: str | None = None, force: bool = False,
                    marks: dict | None = None, marks_source: str = "--marks") -> list[str]:
    """Write ``<stem>.toml``, ``<stem>_student.md``, ``<stem>_key.md`` and ``<stem>_key.toml`` into ``out``.

    ``stem`` defaults to ``worksheet_seed<seed>``; it is a file name, not a path (no folder, no ``..``), and a
    symbolic link at any of the four targets is refused, not followed. Existing files are not overwritten unless
    ``force``; nothing is written unless all four can be, and if writing one fails none is left changed
    (:func:`~transformer_np._files.write_all_or_none`: all four are written to temporary siblings first, then
    renamed). The key TOML carries a ``[key]`` table, so ``check`` never grades it as a submission. Returns the
    four paths. The error messages name ``out``, ``stem`` and ``force`` by the ``worksheet new`` flags they come
    from: ``--out``, ``--name``, ``--force``. ``marks``: a ``[marks]`` table of weights (``--marks FILE``, as
    read by :func:`read_marks_file`; ``marks_source`` names it in errors): the key carries the full scheme
    (:func:`mark_scheme`), and so does the student's TOML when it is given.
    """
    from .._files import confined_path, write_all_or_none

    stem = f"worksheet_seed{raw['setup'].get('seed', 0)}" if stem is None else stem
    confined_path(out, stem, argument="--name")                                     # the name as given
    names = [stem + suffix for suffix in (".toml", "_student.md", "_key.md", "_key.toml")]
    targets = [confined_path(out, name, argument="--name") for name in names]       # refuses ../x, /x, symlinks
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputValueError(f"--out: {out} exists and is not a folder")
    if not force:
        existing = [t for t in targets if os.path.lexists(t)]
        if existing:
            raise InputValueError(f"{existing[0]} already exists (use --force to overwrite)")
    texts = sheet_texts(raw, marks=marks, marks_source=marks_source, toml_name=names[0])
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:         # a file on the way, no permission, an empty path: one line, not a raw [Errno …]
        raise InputValueError(f"--out: cannot create the folder {out!r}: {e.strerror or e}") from None
    return [os.fspath(p) for p in write_all_or_none(list(zip(targets, texts)), error=InputValueError)]


def sheet_texts(raw: dict, student: str | None = None, marks: dict | None = None,
                marks_source: str = "--marks", toml_name: str | None = None) -> list[str]:
    """The four texts of a problem: its TOML (for the student to fill in), the student sheet (Markdown), the key
    (Markdown) and the key as TOML, marked as a key by its ``[key]`` table (``student``: the roster id). The key
    TOML carries the full mark scheme (:func:`mark_scheme` of ``marks``, one mark per step when None); the
    student's TOML and both Markdown sheets (each step's marks in its heading) carry it too when ``marks`` is
    given. ``toml_name``: the file name the student's TOML is written under, which the sheet names."""
    scheme = mark_scheme(raw, marks, marks_source)
    shown = scheme if marks is not None else None
    return [to_toml(raw, marks=shown), student_markdown(raw, shown, toml_name), key_markdown(raw, shown),
            to_toml(raw, answers=answer_key(raw), key=student if student is not None else True, marks=scheme)]
