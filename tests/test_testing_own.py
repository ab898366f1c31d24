"""transformer_np.testing on an engineer's own encoder (issue 45 item 1): a 2-layer encoder written from nn.Linear,
nn.LayerNorm and F.scaled_dot_product_attention, Post-LN and Pre-LN, compared through ``config=`` and ``names=``.

Honest modules pass in float32 and float64 (eager and ``torch.jit.script``); each of 11 bugs of 1e-5 planted in a
sublayer (an output scaled by 1 + 1e-5) fails the float64 comparison, named by layer and sublayer with a layer map
(a scripted module's captures come from an instrumented copy of its graphs: the same table as in eager code). The
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

from transformer_np.errors import InputTypeError, InputValueError  # noqa: E402
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


TORCHSCRIPT = {"eager": lambda m: m, "script": torch.jit.script,
               "trace": lambda m: torch.jit.trace(m, torch.from_numpy(x_input()))}


@pytest.mark.parametrize("pre", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("how", list(TORCHSCRIPT))
def test_every_planted_bug_is_named_by_layer_and_sublayer(pre, how):
    named = {}
    for bug in BUGS:
        m = TORCHSCRIPT[how](encoder(pre, bug, layer=1))
        with pytest.raises(AssertionError) as err:
            assert_matches_torch(m, x_input(), dtype=torch.float64, config=config(pre), names=names(pre),
                                 sublayers=layer_map(pre))
        named[bug] = str(err.value).splitlines()[0]
    want = {bug: f"first sublayer that differs: layer 1, {expected_place(bug, pre)} " for bug in BUGS}
    assert {b: line[:len(want[b])] for b, line in named.items()} == want


def scripted(pre: bool, bug: str = "", dtype=torch.float64, sublayers=None, module=None):
    """A scripted encoder's comparison with its layer map: its captures come from its instrumented graphs."""
    return compare_with_torch(module if module is not None else torch.jit.script(encoder(pre, bug)), x_input(),
                              dtype=dtype, config=config(pre), names=names(pre), sublayers=sublayers or layer_map(pre))


@pytest.mark.parametrize("pre", [False, True], ids=["post-LN", "pre-LN"])
def test_a_scripted_module_s_table_is_the_eager_one_and_says_how_it_was_recorded(pre):
    report = scripted(pre, dtype=torch.float32)
    eager = compare_with_torch(encoder(pre), x_input(), config=config(pre), names=names(pre), sublayers=layer_map(pre))
    rows = [(r.layer, r.sublayer, r.what) for r in report.sublayers]
    assert rows == [(r.layer, r.sublayer, r.what) for r in eager.sublayers]
    assert {"input", "output"} <= {w for *_, w in rows}                 # the wiring is checked, as in eager code
    assert all(r.ok for r in report.sublayers), report.sublayers
    assert max(r.norm_rel for r in report.sublayers) > 0          # float32 round-off was measured, not skipped
    # the same values as the eager module's hooks: the graph runs the same float32 kernels on the same inputs
    np.testing.assert_allclose([r.norm_rel for r in report.sublayers], [r.norm_rel for r in eager.sublayers],
                               rtol=1e-3, atol=1e-12)
    assert any("a TorchScript module (torch.jit.script or trace) takes no forward hooks: its sublayer table records "
               "the mapped submodules' calls in an instrumented copy of its graphs" in n
               for n in report.notes), report.notes


def test_the_scripted_table_names_a_residual_bug_at_the_norm_it_reaches():
    report = scripted(False, "res1")
    bad = [r for r in report.sublayers if not r.ok]
    assert (bad[0].layer, bad[0].sublayer, bad[0].what) == (1, "norm", "input"), bad
    assert bad[0].ratio > 1e3                                  # a bug of 1e-5 against float64's round-off
    assert all(r.ok for r in report.sublayers[:report.sublayers.index(bad[0])])    # nothing before it is blamed


def test_a_sublayer_of_two_submodules_and_one_called_from_a_helper_method_are_recorded():
    two = {**layer_map(False), "layers.1.ffn": ("blocks.1.ffn.fc1", "blocks.1.ffn.fc2")}
    report = scripted(False, "act", sublayers=two)            # between the two: inside the FFN's row
    first = next(r for r in report.sublayers if not r.ok)
    assert (first.layer, first.sublayer, first.module) == (1, "FFN", "blocks.1.ffn.fc1 → blocks.1.ffn.fc2")

    class Helper(Block):                       # the sublayers are called from a method of the block, not forward
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.both(x)

        def both(self, x: torch.Tensor) -> torch.Tensor:
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.ffn(x))

    m = encoder(False, "ln2")
    with torch.no_grad():
        for i, b in enumerate(m.blocks):
            h = Helper(False)
            h.load_state_dict(b.state_dict())
            h.ln2.bug = b.ln2.bug
            m.blocks[i] = h
    report = scripted(False, module=torch.jit.script(m))
    first = next(r for r in report.sublayers if not r.ok)
    assert (first.layer, first.sublayer, first.prefix) == (1, "norm", "layers.1.ln2")
    assert len(report.sublayers) == 2 * 2 * 4                  # every sublayer's input (its wiring) and output


def test_a_value_changed_in_place_after_the_call_is_recorded_as_it_was():
    class InPlace(Block):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = self.attn(x)
            a += x                                      # the attention's output, overwritten by the residual sum
            x = self.ln1(a)
            f = self.ffn(x)
            f += x
            return self.ln2(f)

    m = encoder(False)
    with torch.no_grad():
        for i, b in enumerate(m.blocks):
            h = InPlace(False)
            h.load_state_dict(b.state_dict())
            m.blocks[i] = h
    for module in (m, torch.jit.script(m)):                     # hooks and graphs alike
        report = scripted(False, module=module, dtype=torch.float32)
        assert report.ok and len(report.sublayers) == 16 and all(r.ok for r in report.sublayers), report.sublayers


def test_a_mapped_submodule_the_graph_never_calls_stops_the_table_with_a_note():
    class Skips(Block):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x                                    # calls none of its sublayers

    m = encoder(False)
    m.blocks[1] = Skips(False)
    mapped = {k: v for k, v in names(False).items() if not k.startswith("blocks.1.")}
    cfg = {**config(False), "n_layers": 1}
    lm = {k: v for k, v in layer_map(False).items() if k.startswith("layers.0.")}
    lm["layers.0.ffn"] = "blocks.1.ffn"                 # a submodule that is never called
    report = compare_with_torch(torch.jit.script(m), x_input(), config=cfg, names=mapped, sublayers=lm)
    assert [(r.layer, r.sublayer, r.what) for r in report.sublayers] == [(0, "attention", "input"),
                                                                         (0, "attention", "output"),
                                                                         (0, "norm", "input"), (0, "norm", "output")]
    assert any("never call" in n and "layers.0.ffn" in n for n in report.notes), report.notes


@pytest.mark.parametrize("pre", [False, True], ids=["post-LN", "pre-LN"])
def test_honest_sublayer_table(pre):
    report = assert_matches_torch(encoder(pre), x_input(), config=config(pre), names=names(pre),
                                  sublayers=layer_map(pre))                                 # float32
    places = {(r.layer, r.sublayer) for r in report.sublayers}
    assert places >= {(i, s) for i in range(L) for s in ("attention", "FFN", "norm")}
    assert all(r.ok for r in report.sublayers), [r for r in report.sublayers if not r.ok]
    assert max(r.norm_rel for r in report.sublayers) > 0          # float32 round-off was measured, not skipped


@pytest.mark.slow                       # torch.compile: about a minute for the first module on a 2-core machine
@pytest.mark.parametrize("pre", [False, True], ids=["post-LN", "pre-LN"])
def test_a_compiled_module_is_compared_as_it_computes_and_bugs_are_named(pre):
    honest = torch.compile(encoder(pre))
    for dtype in (torch.float32, torch.float64):
        report = assert_matches_torch(honest, x_input(), dtype=dtype, config=config(pre), names=names(pre),
                                      sublayers=layer_map(pre))
        assert report.sublayers and all(r.ok for r in report.sublayers)
    for bug in BUGS:
        with pytest.raises(AssertionError) as err:
            assert_matches_torch(torch.compile(encoder(pre, bug)), x_input(), dtype=torch.float64,
                                 config=config(pre), names=names(pre), sublayers=layer_map(pre))
        want = f"first sublayer that differs: layer 1, {expected_place(bug, pre)} "
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


class ScaledLinear(nn.Linear):
    """An ``nn.Linear`` whose output is scaled by 1 + 1e-5: a planted bug inside a stock layer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) * (1.0 + 1e-5)


def test_a_scripted_stock_encoder_through_names_for_has_its_table():
    """A scripted ``nn.TransformerEncoder`` is not a stock module (refused as such); compared as an own module, its
    sublayers are called from helper methods (``_sa_block``, ``_ff_block``) with keyword arguments, and the FFN is
    two submodules: all recorded from its graphs."""
    from transformer_np.testing import names_for

    def stock(bug: bool):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True)
        enc = nn.TransformerEncoder(layer, L, enable_nested_tensor=False).eval()
        if bug:
            planted = ScaledLinear(FF, D)
            planted.load_state_dict(enc.layers[1].linear2.state_dict())
            enc.layers[1].linear2 = planted
        return enc

    with pytest.raises(InputTypeError, match=r"module is a TorchScript module \(RecursiveScriptModule of "
                       r"TransformerEncoder\), which is compared as your own module: .*names=names_for\(the eager"):
        compare_with_torch(torch.jit.script(stock(False)), x_input())          # no config=: as a stock module
    cfg = {**config(False), "activation": "relu"}
    sub = {}
    for i in range(L):
        p = f"layers.{i}."
        sub.update({f"layers.{i}.attn": p + "self_attn", f"layers.{i}.ffn": (p + "linear1", p + "linear2"),
                    f"layers.{i}.ln1": p + "norm1", f"layers.{i}.ln2": p + "norm2"})
    honest = assert_matches_torch(torch.jit.script(stock(False)), x_input(), config=cfg, names=names_for(stock(False)),
                                  sublayers=sub)
    assert len(honest.sublayers) == L * 4 * 2 and all(r.ok for r in honest.sublayers), honest.sublayers
    with pytest.raises(AssertionError) as err:
        assert_matches_torch(torch.jit.script(stock(True)), x_input(), dtype=torch.float64, config=cfg,
                             names=names_for(stock(False)), sublayers=sub)
    assert str(err.value).startswith("first sublayer that differs: layer 1, FFN (layers.1.linear1 → "
                                     "layers.1.linear2, ours layers.1.ffn): its output"), str(err.value)


def test_a_graph_that_cannot_be_instrumented_is_a_note_not_an_error(monkeypatch):
    from transformer_np.testing import scripted as scripted_module

    def refuse(graph):
        raise RuntimeError("an internal API refused the graph")

    monkeypatch.setattr(scripted_module, "_calls", refuse)
    report = scripted(False, "fc1")
    assert not report.ok and report.sublayers == []                    # still failed by the whole tensors
    assert any("could not be instrumented (RuntimeError: an internal API refused the graph)" in n
               for n in report.notes), report.notes
    with pytest.raises(AssertionError) as err:                        # the message: the whole tensors' lines
        assert_matches_torch(torch.jit.script(encoder(False, "fc1")), x_input(), dtype=torch.float64,
                             config=config(False), names=names(False), sublayers=layer_map(False))
    assert str(err.value).startswith("transformer_np and torch disagree on the output "), str(err.value)
