r"""The child program of the grade of record: runs one student's notebook cells and functions in its own process.

Run by :mod:`transformer_np.grader.sandbox` as ``python -I -S -B child.py CONFIG``: isolated mode (no environment
variables of Python's, no user site), no ``site`` (so no site-packages on ``sys.path``), no bytecode written. This
program imports nothing but the standard library and NumPy — never ``transformer_np`` — and loads its two
siblings, :mod:`~transformer_np.grader.wire` (the message format) and :mod:`~transformer_np.grader.confine` (the
kernel's boundary), by their paths. Before any student code runs, in this order:

1. :func:`confine.begin <transformer_np.grader.confine.begin>`: the parent-death signal, and root given up (a
   user namespace with every capability dropped) — while the process is still single-threaded;
2. ``sys.path`` becomes a folder of links to the standard library's entries (not its site-packages),
   ``lib-dynload`` and a folder holding NumPy alone; NumPy is imported; the resource limits are set;
3. :func:`confine.restrict <transformer_np.grader.confine.restrict>`: ``no_new_privs``, Landlock (read the
   standard library, NumPy and the shared libraries; read and write the working folder; nothing else) and a
   seccomp filter (no programs, processes, sessions, signals to others, ptrace, sockets, namespaces, …);
4. an audit hook (PEP 578) that only turns what the kernel will refuse anyway into a message a student can act on
   ("starting programs is not possible when grading"); it is not a boundary, and switching it off gains nothing;
5. the first message, ``{"op": "ready", "pid": …, "sandbox": {…}}``, says what was applied; the grader refuses a
   child whose account falls short.

Then it reads the student's cells from the grader, in the wire format. Every standard-library module imports; a
module that cannot work inside (``subprocess``, ``socket``, …) fails when used, with the kernel's
``PermissionError``. The functions the notebook hands out (``Exercise.allowed``) are importable under their
library names as stubs that ask the grader to run the library's function (their caches stay in the grader).
"""

from __future__ import annotations

import json
import os
import sys


def _load_sibling(name: str):
    """The module ``name`` of this folder, loaded by its path (the child cannot import ``transformer_np``)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    spec = importlib.util.spec_from_file_location(f"_tnp_grader_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


if __package__:                  # imported as transformer_np.grader.child (the grader, the tests)
    from . import wire
else:                            # run as the child program
    wire = _load_sibling("wire")

# ----------------------------------------------------------------------------- the child program
# what the message hook explains (the kernel refuses these anyway: see confine.py)
_STARTING = ("subprocess.Popen", "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
             "pty.spawn", "os.startfile")
_NETWORK = ("socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo")


class Refused(PermissionError):
    """What the message hook raises for what the kernel would refuse: names it and says why."""


def _message_hook():
    """The audit hook: messages for what a student may try that the kernel refuses anyway (never a boundary: it
    keeps no state, and removing it gains nothing)."""
    def hook(event: str, args: tuple) -> None:
        if event.startswith(_STARTING):
            raise Refused(f"starting programs is not possible when grading ({event})")
        if event in _NETWORK:
            raise Refused(f"the network is not available when grading ({event})")

    return hook


class _NotAvailable:
    """The last finder on ``sys.meta_path``: a module nothing else found gets a message saying what can be
    imported (it only words an import that fails anyway)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        root = name.split(".", 1)[0]
        what = ": write the op with NumPy" if root == "transformer_np" else ""
        raise ModuleNotFoundError(f"{name} is not available when grading{what} (only NumPy, the standard library "
                                  f"and the functions the notebook hands out can be imported)", name=name)


def _main(config: dict, confine=None, state: dict | None = None) -> None:
    """The child program. When the grader asked for the kernel's boundary (``config["confine"]``): ``confine`` is
    the confine module and ``state`` what its ``begin`` did (or ``{"error": …}``)."""
    import os

    sys.path[:] = list(config["sys_path"])
    import ast
    import builtins
    import linecache
    import resource
    import threading
    import traceback
    import types
    import warnings

    import numpy as np
    import numpy.fft
    import numpy.linalg
    import numpy.random

    req_fd, rep_fd = config["req_fd"], config["rep_fd"]
    work = os.path.realpath(config["workdir"])
    allowed = dict(config["handouts"])            # dotted module name → [function names]
    stub_names = set(allowed) | {"transformer_np", "otter"}
    for mod in list(allowed):
        parts = mod.split(".")
        stub_names.update(".".join(parts[:i]) for i in range(1, len(parts)))
    # the notebook's own checks (formative; the grade of record runs its own in the grader): inert stubs here
    formative = {f"transformer_np.{pkg}.{mod}" for pkg in ("course", "grader") for mod in ("exercises", "grading")}
    stub_names.update(formative | {"transformer_np.course", "transformer_np.grader"})

    # resource limits: soft = hard, so they cannot be raised again
    for name, value in config["limits"].items():
        res = getattr(resource, name)
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            _, hard = resource.getrlimit(res)
            if hard != resource.RLIM_INFINITY and hard < value:
                continue           # already lower: keep it
            raise

    confined = bool(config.get("confine"))
    if confined and state is not None and not state.get("error"):
        try:
            farm = config["stdlib_dir"]        # links to the standard library's entries: each target readable
            read = list(config["read"]) + [os.path.join(farm, e) for e in os.listdir(farm)]
            state = confine.restrict(state, read, [work], config["read_write_files"],
                                     tuple(confine.MECHANISMS if config.get("only") is None else config["only"]))
        except Exception as e:        # OSError from a system call; anything else from a broken machine
            why = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
            state = dict(state, error=f"the kernel's boundary could not be set: {why}")

    # ------------------------------------------------------------------ talking to the grader
    caches: dict[int, object] = {}            # the student's caches, by handle number (the newest kept)
    order: list[int] = []
    next_id = [0]
    lock = threading.Lock()

    def keep(value) -> wire.Handle:
        next_id[0] += 1
        caches[next_id[0]] = value
        order.append(next_id[0])
        while len(order) > config["max_caches"]:
            caches.pop(order.pop(0), None)
        return wire.Handle("student", next_id[0])

    def resolve(h: wire.Handle):
        if h.kind == "student":
            if h.id not in caches:
                raise wire.WireError(f"cache #{h.id} is no longer kept")
            return caches[h.id]
        return h                                       # a handed-out function's cache: kept by the grader

    def send(header: dict, value=None, keep_fn=None, strict: bool = False) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            payload = wire.pack(header, value, keep_fn)
            if len(payload) > wire.MAX_REPLY:      # the grader would refuse it unread: say so here instead
                raise wire.WireError(f"{len(payload):,} bytes is too large to send to the grader (at most "
                                     f"{wire.MAX_REPLY:,})")
        except (wire.WireError, ValueError, TypeError, OverflowError) as e:
            if strict:                             # a handed-out call: the student's error, before anything is sent
                raise ValueError(str(e)) from None
            payload = wire.pack({"op": "reply", "ok": False, "error": {"type": "WireError", "message": str(e),
                                                                  "where": ""}})
        wire.write_frame(rep_fd, payload)

    def receive() -> tuple[dict, object]:
        return wire.unpack(wire.read_frame(req_fd), resolve, max_str=None)   # the grader's cells, whole

    # ------------------------------------------------------------------ handed-out functions: ask the grader
    def handout(dotted: str):
        def call(*args, **kwargs):
            with lock:
                send({"op": "handout", "name": dotted}, [list(args), kwargs], strict=True)
                header, value = receive()
            if header.get("ok"):
                return value
            err = header.get("error", {})
            exc = getattr(builtins, str(err.get("type", "")), None)
            if not (isinstance(exc, type) and issubclass(exc, Exception)):
                exc = RuntimeError
            raise exc(str(err.get("message", "")))
        call.__name__ = call.__qualname__ = dotted.rsplit(".", 1)[1]
        call.__module__ = dotted.rsplit(".", 1)[0]
        call.__doc__ = f"{dotted}: the library's function, run by the grader on the arrays you pass."
        return call

    def sub_params(params: dict, prefix: str) -> dict:
        k = len(prefix)
        return {name[k:]: a for name, a in params.items() if name.startswith(prefix)}

    def formative_check(*args, **kwargs):
        return None                       # the notebook's own checks: formative, not run by the grade of record

    class _Notebook:                      # otter's grader object in a student notebook: nothing to do here
        def __init__(self, *args, **kwargs):
            pass

        def __getattr__(self, name):
            return lambda *a, **k: None

    class StubFinder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name not in stub_names:
                return None
            import importlib.machinery

            return importlib.machinery.ModuleSpec(name, StubFinder, is_package=True)

        @staticmethod
        def create_module(spec):
            mod = types.ModuleType(spec.name)
            mod.__path__ = []
            if spec.name == "otter":
                mod.Notebook = _Notebook
            if spec.name in formative:
                mod.check_forward = mod.check_backward = formative_check
                mod.grade_forward = mod.grade_backward = formative_check
            for fn in allowed.get(spec.name, ()):
                dotted = f"{spec.name}.{fn}"
                setattr(mod, fn, sub_params if dotted == "transformer_np.model.params.sub_params"
                        else handout(dotted))
            return mod

        @staticmethod
        def exec_module(module):
            pass

    sys.meta_path.insert(0, StubFinder)

    # ------------------------------------------------------------------ running student code
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    cell_of: dict[str, int] = {}

    def display(*objs, **kwargs):
        for o in objs:
            print(repr(o))

    def exit(code=None):              # IPython's exit()/quit(): end the cell (the grader goes on)
        raise SystemExit(code)

    builtins.display = display
    builtins.exit = builtins.quit = exit

    def student_where(exc: BaseException) -> str:
        frames = traceback.extract_tb(exc.__traceback__)
        own = [f for f in frames if f.filename.startswith("<cell ")]
        if not own:
            return ""
        f = own[-1]
        text = (f.line or "").strip()
        inside_call = frames[-1] is not f
        where = f"line {f.lineno} of {f.name}" if f.name != "<module>" else f"line {f.lineno}"
        if f.name == "<module>":
            where += f" of cell {cell_of.get(f.filename, '?')}"
        return (f" — {'in a call made at' if inside_call else 'at'} {where}: `{text}`" if text
                else f" — at {where}")

    def error_of(exc: BaseException) -> dict:
        msg = str(exc).splitlines()[0] if str(exc) else ""
        return {"type": type(exc).__name__, "message": msg[:500], "where": student_where(exc)}

    def run_cell(index: int, source: str) -> dict:
        filename = f"<cell {index}>"
        cell_of[filename] = index
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        try:
            tree = ast.parse(source, filename=filename)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec"), namespace)
            if last is not None:
                value = eval(compile(last, filename, "eval"), namespace)
                if value is not None:
                    print(repr(value)[:2000])
        except BaseException as e:     # a student's cell may raise anything, SystemExit and KeyboardInterrupt too
            return {"ok": False, "error": error_of(e)}
        return {"ok": True}

    def call_function(name: str, role: str, args: list, kwargs: dict) -> tuple[dict, object]:
        fn = namespace.get(name)
        if not callable(fn):
            return {"ok": False, "error": {"type": "NameError", "message": f"{name} is not defined", "where": ""}}, None
        pristine = [(i, a.copy()) for i, a in enumerate(wire.arrays_in([args, kwargs]))]
        complex_in: list[str] = []     # cell functions the backward called with complex arguments (complex step)

        def probe(frame, event, arg):  # on each call only (returns None: no line events), during a backward
            if event == "call" and not complex_in and frame.f_code.co_filename.startswith("<cell "):
                for v in frame.f_locals.values():
                    for w in (v if type(v) in (tuple, list) else (v,)):
                        if type(w) is complex or (issubclass(type(w), (np.ndarray, np.generic))
                                                  and np.iscomplexobj(w)):
                            complex_in.append(frame.f_code.co_name)
                            return None
            return None

        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                if role == "backward":
                    sys.settrace(probe)
                try:
                    result = fn(*args, **kwargs)
                finally:
                    if role == "backward":
                        sys.settrace(None)
        except BaseException as e:     # the student's function may raise anything; it is reported, not obeyed
            return {"ok": False, "error": error_of(e)}, None
        arrays = dict(enumerate(wire.arrays_in([args, kwargs])))
        mutated = {str(i): arrays[i] for i, before in pristine
                   if arrays[i].shape != before.shape or not np.array_equal(arrays[i], before, equal_nan=True)}
        if role == "forward" and type(result) is tuple and len(result) == 2:
            return {"ok": True}, [result[0], keep(result[1]), mutated]
        return ({"ok": True, "complex_step": complex_in[0]} if complex_in else {"ok": True}), [result, None, mutated]

    os.chdir(work)
    if config.get("audit_hook", True):
        sys.meta_path.append(_NotAvailable)
        sys.addaudithook(_message_hook())
    send({"op": "ready", "pid": os.getpid(), "sandbox": state if confined else {"confined": False}})
    if confined and (state is None or state.get("error")):
        return                                      # never run a student's code outside the boundary
    while True:
        try:
            header, value = receive()
        except EOFError:
            return
        op = header.get("op")
        if op == "cell":
            send(dict(run_cell(int(header["index"]), str(value)), op="reply"))
        elif op == "lookup":
            kinds = {n: ("function" if callable(namespace.get(n)) else
                         "missing" if n not in namespace else type(namespace[n]).__name__) for n in value}
            send({"op": "reply", "ok": True}, kinds)
        elif op == "call":
            args, kwargs = value
            head, result = call_function(str(header["name"]), str(header.get("role", "")), args, kwargs)
            send(dict(head, op="reply"), result)
        elif op == "exit":
            return


def _bootstrap(config: dict) -> None:
    confine, state = None, None
    if config.get("confine"):
        try:
            confine = _load_sibling("confine")
            only = tuple(confine.MECHANISMS if config.get("only") is None else config["only"])
            state = confine.begin(int(config["grader_pid"]), only)
        except OSError as e:
            state = {"error": f"the kernel's boundary could not be set: {e.strerror or e}"}
        except Exception as e:   # a broken machine (no ctypes…): reported, never a student's code outside it
            state = {"error": f"the kernel's boundary could not be set: {type(e).__name__}: {e}"}
    _main(config, confine, state)


if __name__ == "__main__":
    _bootstrap(json.loads(sys.argv[1]))
    sys.stdout.flush()
    import os as _os

    _os._exit(0)
