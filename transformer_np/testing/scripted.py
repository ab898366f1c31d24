r"""The sublayer captures of a ``torch.jit.script`` (or ``torch.jit.trace``) module, which takes no Python hooks (a part
of :func:`transformer_np.testing.compare_with_torch`: import from there).

A scripted module's forward is a TorchScript graph in which each submodule call is a ``prim::CallMethod`` node whose
target is reached from ``self`` by ``prim::GetAttr`` (a ``ModuleList`` loop is unrolled at compile time)::

    %ln1 = prim::GetAttr[name="ln1"](%self)
    %y   = prim::CallMethod[name="forward"](%ln1, %x)

:class:`GraphCapture` runs a *copy* of that graph with one extra input, a ``Dict[str, Any]``, and an
``aten::setdefault`` into it before each mapped call (its arguments, cloned) and after it (its output): the values the
module itself computes, in its own wiring, of the first call of each submodule — what forward hooks record on an eager
module. A mapped submodule nested deeper (``blocks.1.ln1``) is reached the same way, one module at a time: the call
of ``blocks.1`` is recorded in the top graph, then ``blocks.1``'s own graph is run on those arguments. A helper method
that calls mapped submodules (``self.sublayer(x)``) is followed likewise. The module, its graphs and its parameters
are not changed; the copies run in the autograd mode of the comparison (a module's fast path may depend on it).

A mapped submodule that the graphs never call (a call through a function the graph cannot name, or not reached on
this input) has no captures: the sublayer table stops before it, and a note names it. A graph that cannot be
instrumented (TorchScript's internal API refusing it) is said in a note, never raised: the table is a diagnosis, and
the comparison's verdict does not depend on it.
"""

from __future__ import annotations


def _calls(graph):
    """Every ``prim::CallMethod`` node of ``graph`` (in nested blocks too) with its target's dotted path from the
    graph's ``self`` ("" for ``self``) and the method's name; a target reached otherwise is skipped."""
    me = next(iter(graph.inputs()))

    def path(v):
        parts = []
        while v is not me:
            node = v.node()
            if node.kind() != "prim::GetAttr":
                return None
            parts.append(node.s("name"))
            v = node.input()
        return ".".join(reversed(parts))

    blocks, out = [graph.block()], []
    while blocks:
        for node in blocks.pop(0).nodes():
            blocks.extend(node.blocks())
            if node.kind() == "prim::CallMethod":
                p = path(node.inputsAt(0))
                if p is not None:
                    out.append((node, p, node.s("name")))
    return out


class GraphCapture:
    """The first tensor input of each input submodule and the (first) tensor output of each output submodule of
    ``layer_map``, of their first call in the scripted ``mod``'s forward on ``args`` — the same ``inputs``/``outputs``
    as :class:`transformer_np.testing.sublayers.Capture`, so the wiring is checked as for an eager module."""

    def __init__(self, mod, layer_map: dict[str, tuple[str, str]], args: tuple, torch):
        self.inputs, self.outputs, self.notes = {}, {}, []
        self._torch, self._mods = torch, dict(mod.named_modules())
        self._wanted = {m for pair in layer_map.values() for m in pair}
        self._seen: dict[str, tuple[list, object]] = {}        # path -> (arguments, output) of its first call
        try:
            self._probe("", mod, "forward", list(args))
        except (RuntimeError, TypeError, ValueError, AttributeError, KeyError) as e:    # TorchScript's internals
            self.notes.append(f"the scripted module's graphs could not be instrumented ({type(e).__name__}: "
                              f"{(str(e).strip().splitlines() or [''])[0][:160]}): its sublayer table has what was "
                              "recorded before")
        missing = []
        for prefix, (m_in, m_out) in layer_map.items():
            a, o = self._seen.get(m_in), self._seen.get(m_out)
            x = next((v for v in a[0] if isinstance(v, torch.Tensor)), None) if a else None
            y = o[1][0] if o and isinstance(o[1], (tuple, list)) and o[1] else (o[1] if o else None)
            if x is None or not isinstance(y, torch.Tensor):
                missing.append(prefix)
                continue
            self.inputs[prefix], self.outputs[prefix] = x.detach(), y.detach()
        if missing:
            self.notes.append(f"the scripted module's graphs never call (or pass no tensor to) the submodules of "
                              f"{', '.join(missing)}: its sublayer table stops before the first of them")

    def _below(self, path: str) -> bool:
        """Whether a mapped submodule lies strictly below ``path`` ("" is the module itself)."""
        return any(not path or w.startswith(path + ".") for w in self._wanted)

    def _probe(self, at: str, smod, method: str, args: list) -> None:
        """Run ``smod.method`` (at dotted path ``at``) as an instrumented copy of its graph on ``args``; record the
        mapped calls, then follow the calls that lead to mapped submodules below."""
        torch = self._torch
        fn = smod._c._get_method(method)
        params = fn.schema.arguments[1:]                        # after self
        args = args + [a.default_value for a in params[len(args):]]          # a forward's defaults (the top call)
        g = fn.graph.copy()
        stash = g.addInput("stash")
        stash.setType(torch._C.DictType(torch._C.StringType.get(), torch._C.AnyType.get()))
        watched = []
        for node, rel, name in _calls(g):
            full = ".".join(p for p in (at, rel) if p)
            if full not in self._mods:                          # an attribute that is not a submodule (a class)
                continue
            leads = self._below(full) and bool(_calls(self._mods[full]._c._get_method(name).graph))
            if not (leads or (name == "forward" and full in self._wanted)):
                continue
            i = len(watched)
            watched.append((full, name, node.inputsSize() - 1, leads))
            g.setInsertPoint(node)                              # before the call: its arguments
            for j, v in enumerate(list(node.inputs())[1:]):
                if v.type().kind() == "TensorType":             # a copy: an in-place op later cannot change it
                    v = g.insert("aten::clone", [v])
                g.insert("aten::setdefault", [stash, g.insertConstant(f"{i}.{j}"), v])
            key, out = g.insertConstant(f"{i}.out"), node.output()
            if out.type().kind() == "TensorType":
                copy = g.create("aten::clone", [out, g.insertConstant(None)], 1)
                copy.output().setType(out.type())
                copy.insertAfter(node)
                node, out = copy, copy.output()
            after = g.create("aten::setdefault", [stash, key, out], 1)
            after.output().setType(torch._C.AnyType.get())
            after.insertAfter(node)                             # after the call: its output
        if not watched:
            return
        g.registerOutput(stash)
        g.makeMultiOutputIntoTuple()
        run = torch._C._create_function_from_graph(f"transformer_np_capture_{method}", g)
        _, got = run(smod._c, *args, {})
        for i, (full, name, n_args, leads) in enumerate(watched):
            if f"{i}.out" not in got:                           # not called on this input
                continue
            call_args = [got[f"{i}.{j}"] for j in range(n_args)]
            if name == "forward" and full in self._wanted and full not in self._seen:
                self._seen[full] = (call_args, got[f"{i}.out"])
            if leads:
                self._probe(full, self._mods[full], name, call_args)
