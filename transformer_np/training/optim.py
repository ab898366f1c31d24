r"""Optimisers, gradient clipping and learning-rate schedules on the flat params/grads dicts.

Every optimiser walks the same structure as the model: ``params`` is the dict of
:func:`transformer_np.init_params` (dotted name -> array, updated IN PLACE) and ``grads``
the dict of :func:`transformer_np.encoder_backward` (same names and shapes). A parameter
that has no entry in ``grads`` (e.g. BERT's unused pooler) is skipped: its state and its
step count do not advance, as in PyTorch.

AdamW (Loshchilov & Hutter; exactly ``torch.optim.AdamW``, amsgrad=False), for step t = 1, 2, …
of a parameter θ with gradient g:
    θ ← θ − η λ θ                                   decoupled weight decay (before the update)
    m ← β₁ m + (1 − β₁) g,     v ← β₂ v + (1 − β₂) g²
    θ ← θ − (η / (1 − β₁ᵗ)) · m / ( √v / √(1 − β₂ᵗ) + ε )
With λ = 0 this is Adam.

SGD with momentum μ, dampening τ, (coupled) weight decay λ, as ``torch.optim.SGD``:
    g ← g + λ θ;   b ← g (first step) else μ b + (1 − τ) g;   g ← g + μ b (Nesterov) or b;
    θ ← θ − η g

The learning rate η may be a float or a schedule: any callable ``step -> lr``, called with
the number of optimiser steps already taken (0 for the first update), like PyTorch's
``LambdaLR``. Schedules here follow Hugging Face's conventions (``get_linear_schedule_with_warmup``,
``get_cosine_schedule_with_warmup``): during linear warm-up lr(t) = η_max · t / T_w, so the
very first update (t = 0) uses lr = 0.

Every value is checked where it is used: a schedule that returns NaN, ±inf, a negative number
(which would turn the update into gradient ascent) or a non-number stops the step with an error
naming the step, before any parameter changes. A state dict is checked in full before anything is
restored: step counts are non-negative integers not above ``t``, moments have the parameter's
shape, are finite, and Adam's second moment is ≥ 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .._validate import check_bool, check_float, check_int, describe
from ..errors import InputTypeError, InputValueError, NonFiniteError

__all__ = ["AdamW", "SGD", "clip_grad_norm", "global_grad_norm", "ConstantSchedule", "WarmupLinearSchedule",
           "WarmupCosineSchedule", "InverseSqrtSchedule", "noam_schedule", "make_schedule"]


# ----------------------------------------------------------------------------- schedules
class ConstantSchedule:
    """lr(t) = η for every step t (a float lr, as a schedule object that can be saved)."""

    def __init__(self, lr: float):
        check_float(lr, "lr", 0.0)
        self.lr = float(lr)

    def __call__(self, step: int) -> float:
        return self.lr

    def to_dict(self) -> dict:
        return {"kind": "constant", "lr": self.lr}


class WarmupLinearSchedule:
    r"""Linear warm-up to η_max over T_w steps, then linear decay to 0 at T (HF's formula):

        lr(t) = η_max · t / T_w                        for t < T_w
        lr(t) = η_max · max(0, (T − t) / (T − T_w))   for t ≥ T_w

    ``total_steps=None`` keeps η_max after warm-up (warm-up then constant).
    """

    def __init__(self, peak_lr: float, warmup_steps: int, total_steps: int | None = None):
        check_float(peak_lr, "peak_lr", 0.0)
        check_int(warmup_steps, "warmup_steps", minimum=0)
        check_int(total_steps, "total_steps", minimum=1, allow_none=True)
        if total_steps is not None and total_steps < warmup_steps:
            raise ValueError(f"total_steps must be >= warmup_steps = {warmup_steps}, got {total_steps}")
        self.peak_lr, self.warmup_steps, self.total_steps = float(peak_lr), warmup_steps, total_steps

    def factor(self, step: int) -> float:
        w, T = self.warmup_steps, self.total_steps
        if step < w:
            return step / max(1, w)
        if T is None:
            return 1.0
        return max(0.0, (T - step) / max(1, T - w))

    def __call__(self, step: int) -> float:
        check_int(step, "step", minimum=0)
        return self.peak_lr * self.factor(step)

    def to_dict(self) -> dict:
        return {"kind": "linear", "peak_lr": self.peak_lr, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps}


class WarmupCosineSchedule(WarmupLinearSchedule):
    r"""Linear warm-up, then half a cosine from η_max down to 0 at T (HF's formula, 0.5 cycles):

        lr(t) = η_max · t / T_w                                    for t < T_w
        lr(t) = η_max · max(0, ½ (1 + cos(π (t − T_w) / (T − T_w))))   for t ≥ T_w
    """

    def __init__(self, peak_lr: float, warmup_steps: int, total_steps: int):
        check_int(total_steps, "total_steps", minimum=1)
        super().__init__(peak_lr, warmup_steps, total_steps)

    def factor(self, step: int) -> float:
        w, T = self.warmup_steps, self.total_steps
        if step < w:
            return step / max(1, w)
        progress = (step - w) / max(1, T - w)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    def to_dict(self) -> dict:
        return {**super().to_dict(), "kind": "cosine"}


class InverseSqrtSchedule:
    r"""Inverse-square-root decay with linear warm-up ("Noam", Vaswani et al. 2017, §5.3).

    With s = t + 1 (the paper counts steps from 1):
        lr(t) = η_max · min( s / T_w,  √(T_w / s) )
    rising linearly to η_max at s = T_w, then ∝ 1/√s. The paper's
    lrate = d_model^{-1/2} · min(s^{-1/2}, s · T_w^{-3/2}) is the case
    η_max = (d_model · T_w)^{-1/2} (see :func:`noam_schedule`).
    """

    def __init__(self, peak_lr: float, warmup_steps: int):
        check_float(peak_lr, "peak_lr", 0.0)
        check_int(warmup_steps, "warmup_steps", minimum=1)
        self.peak_lr, self.warmup_steps = float(peak_lr), warmup_steps

    def __call__(self, step: int) -> float:
        check_int(step, "step", minimum=0)
        s, w = step + 1, self.warmup_steps
        return self.peak_lr * min(s / w, math.sqrt(w / s))

    def to_dict(self) -> dict:
        return {"kind": "inverse_sqrt", "peak_lr": self.peak_lr, "warmup_steps": self.warmup_steps}


def noam_schedule(d_model: int, warmup_steps: int = 4000, factor: float = 1.0) -> InverseSqrtSchedule:
    """The paper's schedule: factor · d_model^{-1/2} · min(s^{-1/2}, s · T_w^{-3/2}), s = t + 1."""
    check_int(d_model, "d_model", minimum=1)
    check_int(warmup_steps, "warmup_steps", minimum=1)
    check_float(factor, "factor", 0.0, min_inclusive=False)
    return InverseSqrtSchedule(factor / math.sqrt(d_model * warmup_steps), warmup_steps)


_SCHEDULES = {"constant": ConstantSchedule, "linear": WarmupLinearSchedule, "cosine": WarmupCosineSchedule,
              "inverse_sqrt": InverseSqrtSchedule}


def make_schedule(spec: dict):
    """Rebuild a schedule from its ``to_dict()`` (how checkpoints store it)."""
    if not isinstance(spec, dict) or spec.get("kind") not in _SCHEDULES:
        raise ValueError(f"schedule spec must be a dict with kind in {sorted(_SCHEDULES)}, got {spec!r}")
    kwargs = {k: v for k, v in spec.items() if k != "kind"}
    return _SCHEDULES[spec["kind"]](**kwargs)


# ----------------------------------------------------------------------------- clipping
def _check_grads(grads) -> None:
    if not isinstance(grads, dict):
        raise TypeError(f"grads must be a dict of name -> numpy array, got {describe(grads)}")
    for k, g in grads.items():
        if not isinstance(g, np.ndarray) or not np.issubdtype(g.dtype, np.floating):
            raise TypeError(f"grads[{k!r}] must be a float numpy array, got {describe(g)}")


def global_grad_norm(grads: dict) -> float:
    """‖g‖₂ over every entry of every array in ``grads`` (accumulated in float64)."""
    _check_grads(grads)
    return math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads.values()))


def clip_grad_norm(grads: dict, max_norm: float) -> float:
    r"""Scale all gradients IN PLACE so their global norm is at most ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_``: with n = ‖g‖₂ (all arrays together),
    c = max_norm / (n + 10⁻⁶); if c < 1 every gradient is multiplied by c.
    Returns n, the norm BEFORE clipping (what one logs).
    """
    check_float(max_norm, "max_norm", 0.0, min_inclusive=False)
    norm = global_grad_norm(grads)
    if not math.isfinite(norm):
        raise NonFiniteError(f"grads contain NaN/inf values (global norm {norm}): there is nothing to clip; "
                             f"the run has diverged (lower the lr, add warm-up)")
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for g in grads.values():
            g *= g.dtype.type(coef)
    return norm


# ----------------------------------------------------------------------------- optimisers
class _Optimizer:
    """Shared bookkeeping: params dict, lr (float or schedule), per-parameter state, save/load."""

    _slots: tuple[str, ...] = ()

    def __init__(self, params: dict, lr):
        if not isinstance(params, dict) or not params:
            raise TypeError(f"params must be a non-empty dict of name -> numpy array, got {describe(params)}")
        for k, p in params.items():
            if not isinstance(p, np.ndarray) or not np.issubdtype(p.dtype, np.floating):
                raise TypeError(f"params[{k!r}] must be a float numpy array, got {describe(p)}")
        if callable(lr):
            self.schedule: Callable[[int], float] = lr
        else:
            self.schedule = ConstantSchedule(lr)
        self.params = params
        self.t = 0                          # optimiser steps taken (the schedule's argument)
        self.state: dict[str, dict] = {}    # name -> {"step": int, slot: array}

    @property
    def lr(self) -> float:
        """The learning rate the NEXT step will use (checked: a finite number >= 0)."""
        return self._lr_at(self.t)

    def _lr_at(self, t: int) -> float:
        lr = self.schedule(t)
        if isinstance(lr, (bool, np.bool_)) or not isinstance(lr, (int, float, np.integer, np.floating)):
            raise InputTypeError(f"the learning-rate schedule must return a number at step {t}, "
                                 f"got {describe(lr)}")
        lr = float(lr)
        if not math.isfinite(lr):
            raise NonFiniteError(f"the learning-rate schedule returned {lr} at step {t}; a "
                                 f"learning rate must be finite (no parameter was changed)")
        if lr < 0:
            raise InputValueError(f"the learning-rate schedule returned {lr} at step {t}; a "
                                  f"learning rate must be >= 0 (a negative one is gradient ascent; no parameter "
                                  f"was changed)")
        return lr

    def _check_step_grads(self, grads: dict) -> None:
        _check_grads(grads)
        unknown = [k for k in grads if k not in self.params]
        if unknown:
            raise InputValueError(f"grads has names that are not parameters: {unknown[:5]}")
        for k, g in grads.items():
            if g.shape != self.params[k].shape:
                raise InputValueError(f"grads[{k!r}] must have the parameter's shape {self.params[k].shape}, "
                                 f"got shape {g.shape}")
            if not np.all(np.isfinite(g)):
                # one NaN would silently poison the parameter and its Adam moments forever
                raise NonFiniteError(f"grads[{k!r}] contains NaN/inf values: refusing to update (the run has "
                                 f"diverged; lower the lr, add warm-up or clip gradients)")

    def step(self, grads: dict) -> float:
        """One update of every parameter that has a gradient; returns the lr used."""
        self._check_step_grads(grads)
        lr = self._lr_at(self.t)                            # validated before anything changes
        for name, g in grads.items():
            p = self.params[name]
            st = self.state.setdefault(name, {"step": 0})
            st["step"] += 1
            self._update(p, g, st, lr)
        self.t += 1
        return lr

    def _update(self, p, g, st, lr):  # pragma: no cover - abstract
        raise NotImplementedError

    # ---- save / load: a flat dict of arrays, so it fits in an .npz next to the params
    def state_dict(self) -> dict[str, np.ndarray]:
        """{"t": (), "step.<name>": (), "<slot>.<name>": like the param} — copies."""
        out = {"t": np.array(self.t, dtype=np.int64)}
        for name, st in self.state.items():
            out["step." + name] = np.array(st["step"], dtype=np.int64)
            for slot in self._slots:
                if slot in st:
                    out[f"{slot}.{name}"] = st[slot].copy()
        return out

    def _required_slots(self) -> tuple[str, ...]:
        """The slots every parameter with step > 0 must have."""
        return self._slots

    def load_state_dict(self, d: dict) -> None:
        """Restore what :meth:`state_dict` returned (the params are restored separately).

        Everything is checked before anything changes: ``t`` and every ``step.<name>`` are
        integer scalars with 0 <= step <= t; every key is ``t``, ``step.<name>`` or
        ``<slot>.<name>`` for a parameter ``name``; a parameter with step > 0 has all its slots,
        one with step 0 none; slots have the parameter's shape, finite values, and Adam's
        ``exp_avg_sq`` is >= 0. Raises InputValueError/InputTypeError naming the entry.
        """
        if not isinstance(d, dict) or "t" not in d:
            raise InputTypeError(f"state must be a dict made by state_dict() with key 't', got {describe(d)}")
        t = _int_scalar(d["t"], "state['t']", 0)
        steps: dict[str, int] = {}
        slots: dict[str, dict[str, np.ndarray]] = {}
        for key, a in d.items():
            if key == "t":
                continue
            if not isinstance(key, str) or "." not in key:
                raise InputValueError(f"optimizer state key {key!r} must be 't', 'step.<param>' or "
                                      f"'<slot>.<param>' with slot in {list(self._slots)}")
            kind, name = key.split(".", 1)
            if kind != "step" and kind not in self._slots:
                raise InputValueError(f"unknown optimizer state entry {key!r}: the kind {kind!r} must be 'step' "
                                      f"or one of {list(self._slots)} for {type(self).__name__}")
            if name not in self.params:
                raise InputValueError(f"optimizer state {key!r} names a parameter that does not exist: {name!r}")
            if kind == "step":
                steps[name] = _int_scalar(a, f"optimizer state {key!r}", 0, t, "t = " + str(t))
                continue
            p = self.params[name]
            if not isinstance(a, np.ndarray) or not np.issubdtype(a.dtype, np.floating):
                raise InputTypeError(f"optimizer state {key!r} must be a float numpy array, got {describe(a)}")
            if a.shape != p.shape:
                raise InputValueError(f"optimizer state {key!r} must have shape {p.shape}, got {a.shape}")
            if not np.all(np.isfinite(a)):
                raise NonFiniteError(f"optimizer state {key!r} contains NaN/inf values")
            if kind == "exp_avg_sq" and a.size and float(a.min()) < 0:
                raise InputValueError(f"optimizer state {key!r} must be >= 0 (a mean of squared gradients), "
                                      f"got a minimum of {float(a.min())}")
            slots.setdefault(name, {})[kind] = a
        for name in sorted(set(steps) | set(slots)):
            have = sorted(slots.get(name, {}))
            step = steps.get(name)
            if step is None:
                raise InputValueError(f"optimizer state has {have} for {name!r} but no 'step.{name}'")
            want = sorted(self._required_slots()) if step > 0 else []
            if have != want:
                raise InputValueError(f"optimizer state for {name!r} at step {step} must have the entries "
                                      f"{want or 'none'} ({type(self).__name__}), got {have or 'none'}")
        state: dict[str, dict] = {}
        for name, step in steps.items():
            st = state[name] = {"step": step}
            for kind, a in slots.get(name, {}).items():
                st[kind] = np.array(a, dtype=self.params[name].dtype, copy=True)
        self.t = t
        self.state = state


def _int_scalar(a, what: str, minimum: int, maximum: int | None = None, max_name: str = "") -> int:
    """An integer 0-d value (Python int or integer ndarray) within [minimum, maximum]."""
    if isinstance(a, np.ndarray):
        if a.ndim != 0 or a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
            raise InputTypeError(f"{what} must be an integer scalar, got {describe(a)}")
        a = int(a)
    elif isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
        raise InputTypeError(f"{what} must be an integer scalar, got {describe(a)}")
    a = int(a)
    if a < minimum:
        raise InputValueError(f"{what} must be >= {minimum}, got {a}")
    if maximum is not None and a > maximum:
        raise InputValueError(f"{what} must be <= {max_name or maximum}, got {a}")
    return a


class AdamW(_Optimizer):
    """AdamW exactly as ``torch.optim.AdamW`` (amsgrad=False, maximize=False); see the module docstring.

    Args:
        params: dict name -> array, updated in place.
        lr: float, or a schedule ``step -> lr``.
        betas: (β₁, β₂).
        eps: ε added to √v̂ (outside the root, as torch).
        weight_decay: λ, decoupled: θ ← θ (1 − η λ) before the Adam update. torch's default is 0.01.
    """

    _slots = ("exp_avg", "exp_avg_sq")

    def __init__(self, params: dict, lr=1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        if not callable(lr):
            check_float(lr, "lr", 0.0)
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise TypeError(f"betas must be a pair (beta1, beta2), got {describe(betas)}")
        check_float(betas[0], "betas[0]", 0.0, 1.0, max_inclusive=False)
        check_float(betas[1], "betas[1]", 0.0, 1.0, max_inclusive=False)
        check_float(eps, "eps", 0.0, min_inclusive=False)   # eps = 0 divides 0 by 0 where v = 0
        check_float(weight_decay, "weight_decay", 0.0)
        super().__init__(params, lr)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps, self.weight_decay = float(eps), float(weight_decay)

    def _update(self, p, g, st, lr):
        b1, b2 = self.betas
        if "exp_avg" not in st:
            st["exp_avg"] = np.zeros_like(p)
            st["exp_avg_sq"] = np.zeros_like(p)
        m, v, t = st["exp_avg"], st["exp_avg_sq"], st["step"]
        if self.weight_decay:
            p *= 1.0 - lr * self.weight_decay                  # decoupled: not through m, v
        m += (1.0 - b1) * (g - m)                              # = β₁ m + (1 − β₁) g (torch's lerp)
        v *= b2
        v += (1.0 - b2) * g * g
        step_size = lr / (1.0 - b1 ** t)
        denom = np.sqrt(v) / math.sqrt(1.0 - b2 ** t) + self.eps
        p -= step_size * (m / denom)


class SGD(_Optimizer):
    """SGD with momentum exactly as ``torch.optim.SGD`` (see the module docstring)."""

    _slots = ("momentum_buffer",)

    def __init__(self, params: dict, lr=1e-2, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        if not callable(lr):
            check_float(lr, "lr", 0.0)
        check_float(momentum, "momentum", 0.0)
        check_float(dampening, "dampening", 0.0)
        check_float(weight_decay, "weight_decay", 0.0)
        check_bool(nesterov, "nesterov")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(f"nesterov needs momentum > 0 and dampening = 0, got momentum = {momentum}, "
                             f"dampening = {dampening}")
        super().__init__(params, lr)
        self.momentum, self.dampening = float(momentum), float(dampening)
        self.weight_decay, self.nesterov = float(weight_decay), bool(nesterov)

    def _required_slots(self) -> tuple[str, ...]:
        return self._slots if self.momentum else ()

    def _update(self, p, g, st, lr):
        if self.weight_decay:
            g = g + self.weight_decay * p                      # coupled (L2) decay, as torch's SGD
        if self.momentum:
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = np.array(g, copy=True)
            else:
                buf = st["momentum_buffer"]
                buf *= self.momentum
                buf += (1.0 - self.dampening) * g
            buf = st["momentum_buffer"]
            g = g + self.momentum * buf if self.nesterov else buf
        p -= lr * g
