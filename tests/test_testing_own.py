"""transformer_np.testing on an engineer's own encoder (issue 45 item 1): a 2-layer encoder written from nn.Linear,
nn.LayerNorm and F.scaled_dot_product_attention, Post-LN and Pre-LN, compared through ``config=`` and ``names=``.

Honest modules pass in float32 and float64 (eager and ``torch.jit.script``); each of 11 bugs of 1e-5 planted in a
sublayer (an output scaled by 1 + 1e-5) fails the float64 comparison, named by layer and sublayer with a layer map
(a scripted module's table replays its submodules: all but the residual bug, which its whole output catches). The
name map is checked (a missing reference parameter is refused, an unmapped module parameter is listed), and an
activation given as a function is accepted when it matches the declared one on a probe, refused with the measured
difference when it does not."""

from __future__ import annotations

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="transformer_np.testing compares with PyTorch: pip install torch==2.13.0")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from transformer_np.errors import InputValueError  # noqa: E402
from transformer_np.testing import assert_matches_torch, compare_with_torch, names_for  # noqa: E402

pytestmark = pytest.mark.torch
D, H, FF, L = 16, 4, 32, 2

#: the 11 places a bug is planted: each scales that sublayer's output by 1 + 1e-5
BUGS = ("q", "k", "v", "sdpa", "o", "res1", "ln1", "fc1", "act", "fc2", "ln2")


class Planted(nn.Module):
    """A part of the encoder with a place for a planted bug: ``bug`` names the value scaled by 1 + 1e-5."""

    def __init__(self):
        super().__init__()
        self.bug = ""

    def planted(self, x: torch.Tensor, where: str) -> torch.Tensor:
        return x * (1.0 + 1e-5) if self.bug == where else x


class Attention(Planted):
    def __init__(self):
        super().__init__()
        self.h = H
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, n, d = x.shape
        q = self.planted(self.q(x), "q").view(B, n, self.h, d // self.h).transpose(1, 2)      # (B, h, n, d_k)
        k = self.planted(self.k(x), "k").view(B, n, self.h, d // self.h).transpose(1, 2)
        v = self.planted(self.v(x), "v").view(B, n, self.h, d // self.h).transpose(1, 2)
        a = self.planted(F.scaled_dot_product_attention(q, k, v), "sdpa")
        return self.planted(self.o(a.transpose(1, 2).reshape(B, n, d)), "o")


class FFN(Planted):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.planted(self.fc2(self.planted(F.gelu(self.planted(self.fc1(x), "fc1")), "act")), "fc2")


class Norm(Planted):
    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.weight, self.bias = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.planted(F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, 1e-5), self.name)


class Block(Planted):
    def __init__(self, pre: bool):
        super().__init__()
        self.pre = pre
        self.attn, self.ffn = Attention(), FFN()
        self.ln1, self.ln2 = Norm("ln1"), Norm("ln2")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre:
            x = self.planted(x + self.attn(self.ln1(x)), "res1")
            return x + self.ffn(self.ln2(x))
        x = self.ln1(self.planted(x + self.attn(x), "res1"))
        return self.ln2(x + self.ffn(x))


class Encoder(nn.Module):
    def __init__(self, pre: bool):
        super().__init__()
        self.blocks = nn.ModuleList([Block(pre) for _ in range(L)])
        self.norm = nn.LayerNorm(D, eps=1e-5) if pre else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.norm(x)


LAYER_NAMES = {"attn.q.weight": "attn.W_Q", "attn.q.bias": "attn.b_Q", "attn.k.weight": "attn.W_K",
               "attn.k.bias": "attn.b_K", "attn.v.weight": "attn.W_V", "attn.v.bias": "attn.b_V",
               "attn.o.weight": "attn.W_O", "attn.o.bias": "attn.b_O", "ln1.weight": "ln1.gamma",
               "ln1.bias": "ln1.beta", "ln2.weight": "ln2.gamma", "ln2.bias": "ln2.beta", "ffn.fc1.weight": "ffn.W_1",
               "ffn.fc1.bias": "ffn.b_1", "ffn.fc2.weight": "ffn.W_2", "ffn.fc2.bias": "ffn.b_2"}


def names(pre: bool) -> dict:
    out = {f"blocks.{i}.{k}": f"layers.{i}.{v}" for i in range(L) for k, v in LAYER_NAMES.items()}
    if pre:
        out.update({"norm.weight": "final_ln.gamma", "norm.bias": "final_ln.beta"})
    return out


def config(pre: bool) -> dict:
    return dict(n_layers=L, d_model=D, n_heads=H, d_ff=FF, activation="gelu", norm_position="pre" if pre else "post",
                layer_norm_eps=1e-5)


def encoder(pre: bool, bug: str = "", layer: int = 1) -> Encoder:
    torch.manual_seed(0)
    m = Encoder(pre).eval()
    with torch.no_grad():                       # LayerNorms away from their (1, 0) initialisation: a bug shows
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    for part in m.blocks[layer].modules():
        if isinstance(part, Planted):
            part.bug = bug
    return m


def x_input(seed=0):
    return np.random.default_rng(seed).normal(size=(2, 5, D)).astype(np.float32)


@pytest.mark.parametrize("pre", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("script", [False, True], ids=["eager", "script"])
def test_own_encoder_passes_honestly(pre, dtype, script):
    m = encoder(pre)
    if script:
        m = torch.jit.script(m)
    report = assert_matches_torch(m, x_input(), dtype=dtype, config=config(pre), names=names(pre))
    grads = [e.name for e in report.entries if e.kind == "grad"]
    assert len(grads) == len(names(pre))                  # every mapped parameter's gradient was compared
    assert any(e.kind == "input grad" for e in report.entries)


@pytest.mark.parametrize("pre", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("script", [False, True], ids=["eager", "script"])
def test_every_planted_bug_of_1e_5_is_caught_in_float64(pre, script):
    caught = []
    for bug in BUGS:
        m = encoder(pre, bug)
        if script:
            m = torch.jit.script(m)
        report = compare_with_torch(m, x_input(), dtype=torch.float64, config=config(pre), names=names(pre))
        if not report.ok:
            caught.append(bug)
    assert caught == list(BUGS)


def test_the_name_map_is_checked_and_nothing_is_ignored_silently():
    m = encoder(False)
    partial = {k: v for k, v in names(False).items() if k != "blocks.1.ffn.fc2.bias"}
    with pytest.raises(InputValueError, match=r"needs 1 parameters.*layers\.1\.ffn\.b_2"):
        compare_with_torch(m, x_input(), config=config(False), names=partial)
    with pytest.raises(InputValueError, match="does not have"):
        compare_with_torch(m, x_input(), config=config(False), names={**names(False), "blocks.7.q.weight": "x"})
    with pytest.raises(InputValueError, match=r"shape \(16, 16\).*layers\.0\.ffn\.W_1"):
        compare_with_torch(m, x_input(), config=config(False),
                           names={**names(False), "blocks.0.attn.q.weight": "layers.0.ffn.W_1",
                                  "blocks.0.ffn.fc1.weight": "layers.0.attn.W_Q"})
    m.extra = nn.Parameter(torch.zeros(3))                # a parameter the output does not depend on
    report = assert_matches_torch(m, x_input(), config=config(False), names=names(False))
    assert any(n.startswith("extra:") and "not in names=" in n for n in report.notes), report.notes
    by_callable = assert_matches_torch(m, x_input(), config=config(False), names=names(False).get)
    assert [e.name for e in by_callable.entries] == [e.name for e in report.entries]


class ActFFN(FFN):
    """An FFN whose activation is a function attribute."""

    def __init__(self, act):
        super().__init__()
        self.act = act

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def act_block(act) -> Block:
    torch.manual_seed(0)
    block = Block(False)
    block.ffn = ActFFN(act)
    return block.eval()


def _my_gelu(x):
    return F.gelu(x)


def test_an_activation_function_is_probed_against_the_declared_one():
    cfg = dict(config(False), n_layers=1)
    nm = {k: f"layers.0.{v}" for k, v in LAYER_NAMES.items()}
    report = assert_matches_torch(act_block(_my_gelu), x_input(), dtype=torch.float64, config=cfg, names=nm)
    assert any("act (_my_gelu): matches the declared activation 'gelu'" in n for n in report.notes), report.notes
    tanh = act_block(functools.partial(F.gelu, approximate="tanh"))
    assert_matches_torch(tanh, x_input(), dtype=torch.float64, config=dict(cfg, activation="gelu_tanh"), names=nm)
    with pytest.raises(InputValueError, match=r"act \(partial\) differs from the declared 'gelu' by [0-9.e-]+"):
        compare_with_torch(tanh, x_input(), dtype=torch.float64, config=cfg, names=nm)


def test_a_stock_module_through_its_map():
    layer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, dtype=torch.float64).eval()
    nm = names_for(layer)
    assert nm["self_attn.in_proj_weight"] == "layers.0.attn.W_Q|W_K|W_V"
    cfg = dict(n_layers=1, d_model=D, n_heads=H, d_ff=FF, activation="relu", norm_position="post",
               layer_norm_eps=1e-5)
    own = assert_matches_torch(layer, x_input().astype(np.float64), config=cfg, names=nm)
    stock = assert_matches_torch(layer, x_input().astype(np.float64))
    assert [e.name for e in own.entries] == [e.name for e in stock.entries]


# ----------------------------------------------------------------------------- the first sublayer that differs
SUBLAYERS = {"q": "attention", "k": "attention", "v": "attention", "sdpa": "attention", "o": "attention",
             "fc1": "FFN", "act": "FFN", "fc2": "FFN"}


def layer_map(pre: bool) -> dict:
    out = {}
    for i in range(L):
        b = f"blocks.{i}."
        out.update({f"layers.{i}.attn": b + "attn", f"layers.{i}.ffn": b + "ffn", f"layers.{i}.ln1": b + "ln1",
                    f"layers.{i}.ln2": b + "ln2"})
    if pre:
        out["final_ln"] = "norm"
    return out


def expected_place(bug: str, pre: bool) -> str:
    """Where the bug shows first: inside a sublayer's op, or at the input of the sublayer its value reaches."""
    if bug in SUBLAYERS:
        return SUBLAYERS[bug]
    return "norm"        # ln1/ln2 themselves; the residual sum reaches LN₁ (Post-LN) or LN₂ (Pre-LN) first


@pytest.mark.parametrize("pre", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("script", [False, True], ids=["eager", "script"])
def test_every_planted_bug_is_named_by_layer_and_sublayer(pre, script):
    named = {}
    for bug in BUGS:
        m = encoder(pre, bug, layer=1)
        with pytest.raises(AssertionError) as err:
            assert_matches_torch(torch.jit.script(m) if script else m, x_input(), dtype=torch.float64,
                                 config=config(pre), names=names(pre), sublayers=layer_map(pre))
        named[bug] = str(err.value).splitlines()[0]
    want = {bug: f"first sublayer that differs: layer 1, {expected_place(bug, pre)} " for bug in BUGS}
    if script:         # replayed: each sublayer gets the wiring's input, so a residual bug is not localised; the
        want["res1"] = "transformer_np and torch disagree on the output "          # whole output still catches it
    assert {b: line[:len(want[b])] for b, line in named.items()} == want


def replayed(pre: bool, bug: str = "", dtype=torch.float64, sublayers=None):
    """A scripted encoder's comparison with its layer map: its sublayer table is a replay."""
    return compare_with_torch(torch.jit.script(encoder(pre, bug)), x_input(), dtype=dtype, config=config(pre),
                              names=names(pre), sublayers=sublayers or layer_map(pre))


@pytest.mark.parametrize("pre", [False, True], ids=["post-LN", "pre-LN"])
def test_a_scripted_module_s_sublayer_table_is_replayed_and_says_so(pre):
    report = replayed(pre, dtype=torch.float32)
    places = [(r.layer, r.sublayer) for r in report.sublayers]
    order = ["norm", "attention", "norm", "FFN"] if pre else ["attention", "norm", "FFN", "norm"]
    assert places == [(i, s) for i in range(L) for s in order] + ([(None, "norm")] if pre else [])
    assert all(r.what == "output" and r.ok for r in report.sublayers), report.sublayers    # no wiring rows
    assert max(r.norm_rel for r in report.sublayers) > 0          # float32 round-off was measured, not skipped
    assert any("its sublayer table replays its scripted submodules" in n and "wiring between sublayers is not "
               "checked" in n for n in report.notes), report.notes


def test_the_replayed_table_fails_at_the_planted_bug_and_stops_where_one_call_cannot_replay():
    report = replayed(False, "fc2")
    rows = [(r.layer, r.sublayer, r.ok) for r in report.sublayers]
    assert rows[:7] == [(0, "attention", True), (0, "norm", True), (0, "FFN", True), (0, "norm", True),
                        (1, "attention", True), (1, "norm", True), (1, "FFN", False)], rows
    assert report.sublayers[6].ratio > 1e3                     # a bug of 1e-5 against float64's round-off
    two = {**layer_map(False), "layers.1.ffn": ("blocks.1.ffn.fc1", "blocks.1.ffn.fc2")}
    stopped = replayed(False, "fc2", sublayers=two)
    assert [(r.layer, r.sublayer) for r in stopped.sublayers] == [(0, "attention"), (0, "norm"), (0, "FFN"),
                                                                 (0, "norm"), (1, "attention"), (1, "norm")]
    assert any(n.startswith("layers.1.ffn (blocks.1.ffn.fc1 → blocks.1.ffn.fc2): two submodules") for n in
               stopped.notes), stopped.notes
    assert not stopped.ok                                      # still caught by the whole tensors


@pytest.mark.parametrize("pre", [False, True], ids=["post-LN", "pre-LN"])
def test_honest_sublayer_table(pre):
    report = assert_matches_torch(encoder(pre), x_input(), config=config(pre), names=names(pre),
                                  sublayers=layer_map(pre))                                 # float32
    places = {(r.layer, r.sublayer) for r in report.sublayers}
    assert places >= {(i, s) for i in range(L) for s in ("attention", "FFN", "norm")}
    assert all(r.ok for r in report.sublayers), [r for r in report.sublayers if not r.ok]
    assert max(r.norm_rel for r in report.sublayers) > 0          # float32 round-off was measured, not skipped


@pytest.mark.slow                       # torch.compile: about a minute for the first module on a 2-core machine
def test_a_compiled_module_is_compared_as_it_computes_and_bugs_are_named():
    honest = torch.compile(encoder(False))
    for dtype in (torch.float32, torch.float64):
        report = assert_matches_torch(honest, x_input(), dtype=dtype, config=config(False), names=names(False),
                                      sublayers=layer_map(False))
        assert report.sublayers and all(r.ok for r in report.sublayers)
    for bug in BUGS:
        with pytest.raises(AssertionError) as err:
            assert_matches_torch(torch.compile(encoder(False, bug)), x_input(), dtype=torch.float64,
                                 config=config(False), names=names(False), sublayers=layer_map(False))
        want = f"first sublayer that differs: layer 1, {expected_place(bug, False)} "
        assert str(err.value).splitlines()[0].startswith(want), (bug, str(err.value))


def test_a_bad_layer_map_is_named():
    m, cfg, nm = encoder(False), config(False), names(False)
    with pytest.raises(InputValueError, match=r"sublayers key 'layers\.2\.ffn' must be"):
        compare_with_torch(m, x_input(), config=cfg, names=nm, sublayers={"layers.2.ffn": "blocks.1.ffn"})
    with pytest.raises(InputValueError, match=r"sublayers\['layers\.1\.ffn'\] = 'blocks\.1\.mlp'"):
        compare_with_torch(m, x_input(), config=cfg, names=nm, sublayers={"layers.1.ffn": "blocks.1.mlp"})
    layer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True).eval()
    with pytest.raises(InputValueError, match="a stock module's is built in"):
        compare_with_torch(layer, x_input(), sublayers={"layers.0.ffn": "linear1"})
    report = compare_with_torch(m, x_input(), config=cfg, names=nm)
    assert report.sublayers == [] and any("no sublayers= given" in n for n in report.notes), report.notes
