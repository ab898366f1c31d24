r"""The child program of the grade of record: runs one student's notebook cells and functions in its own process.

Run by :mod:`transformer_np.grader.sandbox` as ``python -I -S -B child.py CONFIG``: isolated mode (no environment
variables of Python's, no user site), no ``site`` (so no site-packages on ``sys.path``), no bytecode written. It
sets ``sys.path`` to the standard library and a folder holding NumPy alone, imports NumPy, sets its resource
limits, installs an audit hook (PEP 578) and only then reads the student's cells from the grader, in the wire
format of :mod:`transformer_np.grader.wire` (loaded by its path: this program imports nothing but the standard
library and NumPy — never ``transformer_np`` — and must stay so).

What the audit hook refuses, once installed (before any student code runs):

* imports of anything but NumPy, ``math`` and the standard library less the modules that reach the operating
  system beyond files (``ctypes``, ``subprocess``, ``multiprocessing``, ``socket``, ``ssl``, ``mmap``, …); the
  functions the notebook hands out (``Exercise.allowed``) are importable under their library names as stubs
  that ask the grader to run the library's function (their caches stay in the grader: opaque handles here);
* starting processes, signalling processes, sockets, every ``ctypes`` operation, raising resource limits;
* writing outside the working folder, reading outside the standard library, NumPy and that folder.

An audit hook is not a container (PEP 578 says so).
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
_DENIED_MODULES = frozenset({
    "ctypes", "_ctypes", "subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "socket",
    "_socket", "ssl", "_ssl", "select", "selectors", "asyncio", "_asyncio", "mmap", "pty", "tty", "termios",
    "fcntl", "resource", "_posixshmem", "urllib", "http", "ftplib", "smtplib", "imaplib", "poplib", "telnetlib",
    "xmlrpc", "socketserver", "webbrowser", "ensurepip", "venv", "idlelib", "tkinter", "_tkinter", "turtle",
    "turtledemo", "site", "distutils", "readline", "curses", "_curses", "dbm", "sqlite3", "_sqlite3", "signal",
    "_testcapi", "_testinternalcapi", "_xxsubinterpreters", "_xxinterpchannels",
})
_WRITE_FLAGS = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000      # O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND
_REFUSED_EVENTS = ("subprocess.", "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                   "os.kill", "os.killpg", "signal.", "socket.", "ctypes.", "resource.", "sys.addaudithook",
                   "pty.", "os.startfile", "_posixsubprocess", "os.setuid", "os.setgid", "mmap.", "os.link",
                   "os.symlink", "os.chroot", "os.mknod", "os.mkfifo", "os.chown", "os.lchown", "os.chflags",
                   "os.setxattr", "os.removexattr", "os.fchdir")
# events on paths: the indexes of their path arguments, each of which must be inside the working folder. A dir_fd
# argument is allowed: the only directories the child can open are inside that folder, and a relative path is
# checked from the working folder, which is never deeper than such a directory, so a path that stays inside from
# the working folder stays inside from the directory too (the child cannot make symlinks).
_PATH_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.replace": (0, 1),
                "os.truncate": (0,), "os.chmod": (0,), "os.utime": (0,), "os.chdir": (0,), "shutil.rmtree": (0,),
                "shutil.copyfile": (1,), "shutil.copytree": (1,), "shutil.move": (0, 1),
                "shutil.make_archive": (0,), "shutil.unpack_archive": (1,)}


class Refused(PermissionError):
    """What the audit hook raises: names what was refused and why."""


def _main(config: dict) -> None:
    import os

    stdlib = [p for p in sys.path if p]          # under -I -S: the standard library alone
    sys.path[:] = stdlib + [config["numpy_dir"]]
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
    read_roots = tuple(os.path.realpath(p) for p in list(config["read_roots"]) + stdlib) + (work,)
    allowed = dict(config["handouts"])            # dotted module name → [function names]
    stub_names = set(allowed) | {"transformer_np", "otter"}
    for mod in list(allowed):
        parts = mod.split(".")
        stub_names.update(".".join(parts[:i]) for i in range(1, len(parts)))
    stub_names.update({"transformer_np.course", "transformer_np.course.exercises", "transformer_np.grader",
                       "transformer_np.grader.exercises"})

    # resource limits: soft = hard, so they cannot be raised again (and raising them is refused below)
    for name, value in config["limits"].items():
        res = getattr(resource, name)
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            _, hard = resource.getrlimit(res)
            if hard != resource.RLIM_INFINITY and hard < value:
                continue           # already lower: keep it
            raise

    def inside(path: str, roots: tuple) -> bool:
        real = os.path.realpath(path)
        return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)

    def path_of(arg) -> str | None:
        if isinstance(arg, bytes):
            return os.fsdecode(arg)
        if isinstance(arg, str):
            return arg
        if isinstance(arg, os.PathLike):
            return os.fspath(arg) if isinstance(os.fspath(arg), str) else os.fsdecode(os.fspath(arg))
        return None

    def hook(event: str, args: tuple) -> None:
        if event == "import":
            name = args[0]
            root = name.split(".", 1)[0]
            if name in stub_names or root == "numpy" or root == "math":
                return
            if root == "transformer_np":
                raise ModuleNotFoundError(f"{name} is not available when grading: write the op with NumPy "
                                          f"(only NumPy, math, the standard library and the functions the "
                                          f"notebook hands out can be imported)")
            if root in _DENIED_MODULES or root not in sys.stdlib_module_names:
                raise ModuleNotFoundError(f"{name} is not available when grading (only NumPy, math, the standard "
                                          f"library and the functions the notebook hands out can be imported)")
            return
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            p = path_of(path)
            if p is None:
                return                                   # an already open file descriptor
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writing:
                if not inside(p, (work,)):
                    raise Refused(f"writing {p!r} is not allowed when grading (only inside the working folder)")
                return
            if os.path.isdir(p) and not inside(p, (work,)):
                raise Refused(f"opening the folder {p!r} is not allowed when grading")
            if not inside(p, read_roots):
                raise Refused(f"reading {p!r} is not allowed when grading")
            return
        if event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                p = path_of(args[i]) if i < len(args) else None
                if p is None or not inside(p, (work,)):
                    raise Refused(f"{event} on {args[i] if i < len(args) else '?'!r} is not allowed when grading "
                                  f"(only inside the working folder)")
            return
        if event in ("os.listdir", "os.scandir"):
            p = path_of(args[0]) if args else None
            if p is not None and not inside(p, read_roots):
                raise Refused(f"listing {p!r} is not allowed when grading")
            return
        for prefix in _REFUSED_EVENTS:
            if event.startswith(prefix):
                raise Refused(f"{event} is not allowed when grading")

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
            if spec.name in ("transformer_np.course.exercises", "transformer_np.grader.exercises"):
                mod.check_forward = mod.check_backward = formative_check
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
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                result = fn(*args, **kwargs)
        except BaseException as e:     # the student's function may raise anything; it is reported, not obeyed
            return {"ok": False, "error": error_of(e)}, None
        arrays = dict(enumerate(wire.arrays_in([args, kwargs])))
        mutated = {str(i): arrays[i] for i, before in pristine
                   if arrays[i].shape != before.shape or not np.array_equal(arrays[i], before, equal_nan=True)}
        if role == "forward" and type(result) is tuple and len(result) == 2:
            return {"ok": True}, [result[0], keep(result[1]), mutated]
        return {"ok": True}, [result, None, mutated]

    os.chdir(work)
    sys.addaudithook(hook)
    send({"op": "ready", "pid": os.getpid()})
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


if __name__ == "__main__":
    _main(json.loads(sys.argv[1]))
    sys.stdout.flush()
    import os as _os

    _os._exit(0)
