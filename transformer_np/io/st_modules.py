r"""The modules of a sentence-transformers folder, read, checked and implemented — or refused.

A sentence-transformers model folder lists its modules in ``modules.json``: Transformer (the folder
itself), Pooling (``1_Pooling/config.json``, one mode, in either file format), any Dense (a module's
``config.json`` and ``model.safetensors``: one matrix, a bias and an activation, applied after pooling)
and Normalize (last); ``sentence_bert_config.json`` gives ``max_seq_length`` and
``config_sentence_transformers.json`` a default prompt (refused). Any other module type, a second pooling
mode, a module order or a setting not implemented here is a :class:`~transformer_np.errors.ModelFolderError`
naming ``modules.json[i].type`` or the file and key — never skipped silently. Module paths must stay
inside the folder (no ``..``, no absolute paths, no symlinks out).

:func:`transformer_np.io.pretrained.load_pretrained` calls ``_sentence_transformers_setup``; the
JSON files of the folder are read by ``_read_json`` (strict and bounded, shared with
``config.json``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .._validate import all_finite, mismatch_detail
from ..errors import ModelFolderError
from ..model.budget import MemoryEstimate
from .jsonfile import read_json
from .safetensors import SafetensorsFile, open_safetensors

__all__ = ["DenseModule", "DensePlan", "POOLING_MODES", "SMALL_JSON_TOKENS"]

POOLING_MODES = ("mean", "cls", "max", "mean_sqrt_len")
_FLOAT_ST = ("F16", "BF16", "F32", "F64")    # the float dtypes of a safetensors file accepted as weights


SMALL_JSON_TOKENS = 1 << 17     # config.json, modules.json, module configs: a few hundred values in practice


def _read_json(path: Path, kind: type = dict):
    """A JSON file of the folder, strictly (bounded size, depth and token count — at most
    :data:`SMALL_JSON_TOKENS`, these are settings, not tables — no NaN/Infinity, an object)."""
    return read_json(path, kind=kind, error=ModelFolderError, max_tokens=SMALL_JSON_TOKENS)


# ----------------------------------------------------------------------------- the modules
def _inside(folder: Path, rel, where: str) -> Path:
    """``folder / rel``, refused unless ``rel`` is a relative path that stays inside ``folder``."""
    if not isinstance(rel, str):
        raise ModelFolderError(f"{where} must be a string (a folder inside the model folder), got {rel!r:.60}")
    if os.path.isabs(rel) or rel.startswith(("/", "\\")):
        raise ModelFolderError(f"{where} must be relative to the model folder, got the absolute path {rel!r}")
    base = folder.resolve()
    target = (folder / rel).resolve()
    if target != base and base not in target.parents:
        raise ModelFolderError(f"{where} = {rel!r} leads outside the model folder {str(folder)!r}: refused")
    return folder / rel


# sentence-transformers' pooling flags (legacy files) and mode names (``pooling_mode``, 3.x and later) -> ours
_POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                  "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
                  "pooling_mode_weightedmean_tokens": None, "pooling_mode_lasttoken": None}
_POOLING_NAMES = {"cls": "cls", "max": "max", "mean": "mean", "mean_sqrt_len_tokens": "mean_sqrt_len",
                  "weightedmean": None, "lasttoken": None}
_MODULE_KINDS = ("Transformer", "Pooling", "Dense", "Normalize")


def _module_kind(type_name: str) -> str | None:
    """"Pooling" for ``sentence_transformers.models.Pooling`` or ``sentence_transformers.….pooling.Pooling``;
    None for any other module (refused by the caller)."""
    head, _, last = type_name.rpartition(".")
    return last if last in _MODULE_KINDS and head.startswith("sentence_transformers") else None


def _pooling_mode(pc: Path, d_model: int | None) -> str:
    """The one pooling mode of ``pc`` (a Pooling module's config.json), in either file format."""
    cfg = _read_json(pc)
    for key in ("word_embedding_dimension", "embedding_dimension"):
        v = cfg.get(key)
        if v is not None and d_model is not None and v != d_model:
            raise ModelFolderError(f"{pc}: {key} is {v!r:.40}, but the model's hidden_size is {d_model} (config.json)")
    if "include_prompt" in cfg and not isinstance(cfg["include_prompt"], bool):
        raise ModelFolderError(f"{pc}: include_prompt must be true or false, got {cfg['include_prompt']!r:.60}")
    unknown = sorted(k for k in cfg if k.startswith("pooling_mode") and k != "pooling_mode" and k not in _POOLING_FLAGS)
    if unknown:
        raise ModelFolderError(f"{pc}: {unknown[0]} is not a pooling flag this library knows; supported: "
                               f"{', '.join(k for k, v in _POOLING_FLAGS.items() if v)}")
    if "pooling_mode" in cfg:                       # sentence-transformers 3.x and later: a name or a list of names
        names = cfg["pooling_mode"]
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ModelFolderError(f"{pc}: pooling_mode must be a mode name or a list of them, got {names!r:.60}")
        flags = [f"pooling_mode = {n!r}" for n in names]
        modes = [_POOLING_NAMES.get(n, "?") for n in names]
    else:                                            # the legacy booleans; sentence-transformers means "mean" by none
        for key in _POOLING_FLAGS:
            if not isinstance(cfg.get(key, False), bool):
                raise ModelFolderError(f"{pc}: {key} must be true or false, got {cfg[key]!r:.60}")
        flags = [k for k in _POOLING_FLAGS if cfg.get(k, False)]
        modes = [_POOLING_FLAGS[k] for k in flags]
        if not flags:
            raise ModelFolderError(f"{pc}: exactly one supported pooling mode must be on, got none")
    for flag, mode in zip(flags, modes):
        if mode is None or mode == "?":
            raise ModelFolderError(f"{pc}: {flag} is not implemented here (supported: "
                                   f"{', '.join(POOLING_MODES)}); refusing rather than pooling differently")
    if len(modes) > 1:
        raise ModelFolderError(f"{pc}: {' and '.join(flags)} ask for several pooling modes concatenated, which is "
                               f"not implemented here (one mode is supported); refusing rather than dropping one")
    return modes[0]


_DENSE_ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": ("tanh", np.tanh),
    "torch.nn.modules.linear.Identity": ("identity", lambda x: x),
    "torch.nn.modules.activation.ReLU": ("relu", lambda x: np.maximum(x, x.dtype.type(0))),
    "torch.nn.modules.activation.Sigmoid": ("sigmoid", lambda x: 0.5 * (1 + np.tanh(0.5 * x))),
}


class DenseModule:
    """A sentence-transformers ``Dense`` module: y = activation(e W + b), applied to the pooled sentence vector.

    W (in_features, out_features) is the file's ``linear.weight`` transposed; b (out_features,) its
    ``linear.bias`` (zero when the module has no bias). ``activation``: "tanh", "identity", "relu" or
    "sigmoid" (sigmoid(x) = (1 + tanh(x/2)) / 2, which cannot overflow)."""

    def __init__(self, W: np.ndarray, b: np.ndarray, activation: str, where: str):
        self.W, self.b, self.activation, self.where = W, b, activation, where
        self._fn = next(fn for name, fn in _DENSE_ACTIVATIONS.values() if name == activation)
        self._by_dtype: dict = {}

    def __repr__(self) -> str:
        return f"DenseModule({self.W.shape[0]} -> {self.W.shape[1]}, {self.activation})"

    def apply(self, e: np.ndarray) -> np.ndarray:
        """e (B, in_features) -> (B, out_features), in e's dtype."""
        if e.dtype not in self._by_dtype:
            self._by_dtype[e.dtype] = (self.W.astype(e.dtype), self.b.astype(e.dtype))
        W, b = self._by_dtype[e.dtype]
        return self._fn(e @ W + b)


class DensePlan(NamedTuple):
    """A Dense module checked from its config.json and its weights' header, nothing of its weights read yet:
    :meth:`estimate` is the memory :meth:`load` will need, so the caller can check it with everything else
    first."""

    st: SafetensorsFile
    n_in: int
    n_out: int
    bias: bool
    activation: str
    where: str

    def _names(self) -> list[str]:
        return ["linear.weight"] + (["linear.bias"] if self.bias else [])

    def estimate(self) -> MemoryEstimate:
        """The file's arrays as read, plus W and b converted (float32, or float64 for a float64 file) and the copy
        :meth:`DenseModule.apply` makes in the other dtype."""
        read = self.st.estimate(self._names()).total
        return MemoryEstimate({"Dense modules": read + 2 * (self.n_in + 1) * self.n_out * 8})

    def load(self) -> DenseModule:
        wpath = self.st.path
        state = self.st.read(self._names())
        for name, a in state.items():
            if not all_finite(a):
                raise ModelFolderError(f"{wpath}: tensor {name!r} contains NaN/inf values: refusing to load it")
        dt = np.float64 if all(a.dtype == np.float64 for a in state.values()) else np.float32
        W = np.ascontiguousarray(state["linear.weight"].astype(dt).T)                 # (in, out) = weightᵀ
        b = state["linear.bias"].astype(dt) if self.bias else np.zeros(self.n_out, dt)
        return DenseModule(W, b, self.activation, self.where)


def _dense_plan(folder: Path, d_in: int | None, where: str, files: contextlib.ExitStack) -> DensePlan:
    """A Dense module's folder (config.json + model.safetensors) checked against the input width — its config,
    and the weights' names, dtypes and shapes from the header — without reading the weights. The open weights
    file is registered with ``files`` (closed when the caller's load ends)."""
    pc = folder / "config.json"
    if not os.path.lexists(pc):
        raise ModelFolderError(f"{where}: the Dense module has no config.json in {folder}")
    cfg = _read_json(pc)
    known = {"in_features", "out_features", "bias", "activation_function", "module_input_name",
             "module_output_name", "use_residual"}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ModelFolderError(f"{pc}: {unknown[0]} is not a Dense setting this library implements; refusing "
                               f"rather than ignoring it")
    for key in ("in_features", "out_features"):
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ModelFolderError(f"{pc}: {key} must be a positive integer, got {v!r:.60}")
    if d_in is not None and cfg["in_features"] != d_in:
        raise ModelFolderError(f"{pc}: in_features is {cfg['in_features']}, but the vector it receives has {d_in} "
                               f"entries")
    if cfg["out_features"] > 1 << 16:
        raise ModelFolderError(f"{pc}: out_features {cfg['out_features']} is more than the {1 << 16} accepted")
    bias = cfg.get("bias", True)
    if not isinstance(bias, bool):
        raise ModelFolderError(f"{pc}: bias must be true or false, got {bias!r:.60}")
    if cfg.get("use_residual", False) is not False:
        raise ModelFolderError(f"{pc}: use_residual = {cfg['use_residual']!r:.20} is not implemented here; refusing "
                               f"rather than dropping the residual")
    for key in ("module_input_name", "module_output_name"):
        if cfg.get(key, "sentence_embedding") != "sentence_embedding":
            raise ModelFolderError(f"{pc}: {key} = {cfg[key]!r:.60} is not implemented here (only "
                                   f"'sentence_embedding', the pooled vector)")
    act = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
    if act not in _DENSE_ACTIVATIONS:
        raise ModelFolderError(f"{pc}: activation_function {act!r:.80} is not implemented here (supported: "
                               f"{', '.join(_DENSE_ACTIVATIONS)})")
    wpath = folder / "model.safetensors"
    if not os.path.lexists(wpath):
        extra = " (pytorch_model.bin is pickle, which is never read)" if (folder / "pytorch_model.bin").exists() else ""
        raise ModelFolderError(f"{where}: the Dense module in {folder} has no model.safetensors{extra}")
    n_in, n_out = cfg["in_features"], cfg["out_features"]
    want = {"linear.weight": (n_out, n_in), **({"linear.bias": (n_out,)} if bias else {})}
    st = files.enter_context(open_safetensors(wpath))
    header = st.shapes()
    got = {name: tuple(shape) for name, (_, shape) in header.items()}
    if set(got) != set(want):
        raise ModelFolderError(f"{wpath}: the Dense weights do not match {pc} "
                               f"({mismatch_detail(sorted(set(want) - set(got)), sorted(set(got) - set(want)))})")
    for name, shape in want.items():
        if got[name] != shape or header[name][0] not in _FLOAT_ST:
            raise ModelFolderError(f"{wpath}: tensor {name!r}: expected a float tensor of shape {shape} "
                                   f"({pc}), found {header[name][0]} {got[name]}")
    return DensePlan(st, n_in, n_out, bias, _DENSE_ACTIVATIONS[act][0], where)


def _dense_module(folder: Path, d_in: int | None, where: str) -> DenseModule:
    """A Dense module from its folder, checked (:func:`_dense_plan`) and then read."""
    with contextlib.ExitStack() as files:
        return _dense_plan(folder, d_in, where, files).load()


def _sentence_transformers_setup(folder: Path, d_model: int | None = None, files: contextlib.ExitStack | None = None
                                 ) -> tuple[str, bool, int | None, list]:
    """(pooling mode, normalize?, max_seq_length, Dense modules in order) from the sentence-transformers files;
    plain BERT folders get mean pooling, normalisation, no max_seq_length and no Dense module.

    With ``files`` (an ExitStack the caller closes) the Dense modules are plans (:class:`DensePlan`) — checked, their
    weights not read — so the caller can check their memory with the model's before reading anything; without
    it they are read here (:class:`DenseModule`).

    Every module of ``modules.json`` is implemented or refused: Transformer (the folder itself, path ""),
    Pooling (one mode), Dense (after pooling; see :class:`DenseModule`) and Normalize (last); any other type,
    a second pooling mode, a Normalize before a Dense, or a setting not implemented is a ModelFolderError
    naming ``modules.json[i].type`` or the file and key — never skipped silently."""
    mode, normalize, max_seq, dense = "mean", True, None, []
    modules = folder / "modules.json"
    if os.path.lexists(modules):
        mods = _read_json(modules, kind=list)
        for i, m in enumerate(mods):
            if not isinstance(m, dict):
                raise ModelFolderError(f"{modules}: entry [{i}] must be an object with type and path, got {m!r:.60}")
            if not isinstance(m.get("type", ""), str):
                raise ModelFolderError(f"{modules}: [{i}].type must be a string, got {m.get('type')!r:.60}")
            if "path" in m:
                _inside(folder, m["path"], f"{modules}: [{i}].path")
        kinds = []
        for i, m in enumerate(mods):
            kind = _module_kind(m.get("type", ""))
            if kind is None:
                raise ModelFolderError(f"{modules}: [{i}].type = {m.get('type', '')!r:.80} is a module this library "
                                       f"does not implement (supported: sentence-transformers' "
                                       f"{', '.join(_MODULE_KINDS)}); refusing rather than skipping it")
            kinds.append(kind)
        expected_order = "Transformer, Pooling, any Dense, then Normalize"
        if (kinds and kinds[0] != "Transformer") or kinds.count("Transformer") > 1 or kinds.count("Pooling") > 1 or \
                kinds.count("Normalize") > 1 or ("Pooling" in kinds and kinds.index("Pooling") != 1) or \
                ("Normalize" in kinds and kinds.index("Normalize") != len(kinds) - 1) or \
                ("Dense" in kinds and "Pooling" not in kinds):
            raise ModelFolderError(f"{modules}: the modules {kinds} are not in an order this library implements "
                                   f"({expected_order})")
        if kinds and mods[0].get("path", "") not in ("", "."):
            raise ModelFolderError(f"{modules}: [0].path = {mods[0].get('path')!r:.60}: the Transformer module must be "
                                   f"the model folder itself (path \"\")")
        normalize = "Normalize" in kinds
        width = d_model
        for i, (m, kind) in enumerate(zip(mods, kinds)):
            sub = _inside(folder, m.get("path", ""), f"{modules}: [{i}].path")
            if kind == "Pooling":
                pc = sub / "config.json"
                if os.path.lexists(pc):
                    mode = _pooling_mode(pc, d_model)
            elif kind == "Dense":
                module = _dense_plan(sub, width, f"{modules}: [{i}]", files) if files is not None else \
                    _dense_module(sub, width, f"{modules}: [{i}]")
                dense.append(module)
                width = module.n_out if files is not None else module.W.shape[1]
    sbc = folder / "sentence_bert_config.json"
    if os.path.lexists(sbc):
        v = _read_json(sbc).get("max_seq_length")
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 2):
            raise ModelFolderError(f"{sbc}: max_seq_length must be an integer >= 2 (tokens, [CLS] and [SEP] "
                                   f"included), got {v!r:.60}")
        max_seq = v
    _check_prompts(folder)
    return mode, normalize, max_seq, dense


def _check_prompts(folder: Path) -> None:
    """A default prompt (sentence-transformers prepends it to every sentence) is not implemented: refused."""
    path = folder / "config_sentence_transformers.json"
    if not os.path.lexists(path):
        return
    cfg = _read_json(path)
    name = cfg.get("default_prompt_name")
    prompts = cfg.get("prompts") or {}
    if name is not None and (not isinstance(prompts, dict) or prompts.get(name, "") != ""):
        raise ModelFolderError(f"{path}: default_prompt_name = {name!r:.60} (a prompt prepended to every sentence) is "
                               f"not implemented here; refusing rather than embedding without it")
