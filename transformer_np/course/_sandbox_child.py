r"""The child side of the grade of record: runs a student's notebook cells and functions in its own process.

This file is two things at once:

* the **wire format** shared by the grader and the child (:func:`write_frame`, :func:`read_frame`,
  :func:`encode`, :func:`decode`): a frame is an 8-byte big-endian length and a payload; a payload is a JSON
  header (4-byte length first) describing a value tree, followed by the ``.npy`` bytes of the arrays it holds.
  No pickle anywhere: an array travels as NumPy's ``.npy`` format with ``allow_pickle=False``, and the reader
  checks the dtype (numbers only), the shape and the byte count against the frame before it builds the array.
  The grader imports these functions from here;
* the **child program**, run by :mod:`transformer_np.course.sandbox` as
  ``python -I -S -B _sandbox_child.py CONFIG``: isolated mode (no environment variables of Python's, no user
  site), no ``site`` (so no site-packages on ``sys.path``), no bytecode written. It sets ``sys.path`` to the
  standard library and a folder holding NumPy alone, imports NumPy, sets its resource limits, installs an audit
  hook (PEP 578) and only then reads the student's cells from the grader.

So this module imports nothing but the standard library and NumPy — never ``transformer_np`` — and must stay
so: the child cannot import this project.

What the audit hook refuses, once installed (before any student code runs):

* imports of anything but NumPy, ``math`` and the standard library less the modules that reach the operating
  system beyond files (``ctypes``, ``subprocess``, ``multiprocessing``, ``socket``, ``ssl``, ``mmap``, …); the
  functions the notebook hands out (``Exercise.allowed``) are importable under their library names as stubs
  that ask the grader to run the library's function (their caches stay in the grader: opaque handles here);
* starting processes (``os.system``, ``os.exec*``, ``os.fork``, ``os.posix_spawn``, ``subprocess``), signalling
  processes (``os.kill``), sockets, every ``ctypes`` operation, raising resource limits, new audit hooks;
* opening a file for writing, and creating, removing or renaming one, outside the working folder (an empty
  temporary folder of its own); reading files outside the standard library, NumPy and that folder; opening
  a directory outside it.

An audit hook is not a container (PEP 578 says so): it stops what Python code does through the interpreter's
audited doors. NumPy itself can make an array over any address of the child's memory (``__array_interface__``),
so a determined attacker can overwrite the interpreter and switch the hook off; what then still holds is the
process boundary (the grader's objects, cases and references are in another process, and it never runs or
unpickles anything the child sends — it receives numbers and checks them), the resource limits (CPU time,
address space, file size, open files), the grader's timeouts, and the operating system's permissions of the
user running the child. Run the grader as an unprivileged user, or in a container, for hostile submissions.
"""

from __future__ import annotations

import io
import json
import struct
import sys

# ----------------------------------------------------------------------------- the wire format
MAX_FRAME = 256 << 20          # bytes in one frame (a request or a reply); larger is refused before it is read
MAX_NODES = 200_000            # values in one tree (arrays, numbers, containers)
MAX_DEPTH = 32                 # nesting of containers
MAX_NDIM = 32                  # an array's dimensions
MAX_STR = 10_000               # characters of a string value (longer ones are cut)
_NUMBER_KINDS = "biufc"        # bool, int, uint, float, complex: the only dtypes an array may have


class WireError(ValueError):
    """A frame or a value that does not follow the format (too large, malformed, a disallowed dtype)."""


class Opaque:
    """A value that cannot travel (a function, a module, an object of the student's class): its type name only."""

    type_name = "object"

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


_OPAQUE_TYPES: dict[str, type] = {}


def opaque(type_name: str) -> Opaque:
    """An :class:`Opaque` whose class is named ``type_name`` (so ``type(v).__name__`` reads as the original)."""
    name = "".join(c for c in str(type_name)[:60] if c.isalnum() or c == "_") or "object"
    cls = _OPAQUE_TYPES.get(name)
    if cls is None:
        cls = _OPAQUE_TYPES[name] = type(name, (Opaque,), {"type_name": name})
    return cls()


class Handle:
    """A reference to a value kept on the other side (a student's cache in the child, a handed-out function's
    cache in the grader): only its number travels."""

    __slots__ = ("id", "kind")

    def __init__(self, kind: str, id: int):
        self.kind, self.id = kind, id

    def __repr__(self) -> str:
        return f"<cache #{self.id}>"


def _npy_bytes(a) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(a), allow_pickle=False)     # keeps 0-d arrays 0-d
    return buf.getvalue()


def encode(value, blobs: list, keep=None, depth: int = 0, count: list | None = None):
    """``value`` as a JSON-able tree; arrays appended to ``blobs`` as ``.npy`` bytes. ``keep(value)`` (the
    sender's choice) may return a :class:`Handle` for a value to keep on this side instead of sending it."""
    import numpy as np

    count = count if count is not None else [0]
    count[0] += 1
    if count[0] > MAX_NODES or depth > MAX_DEPTH:
        raise WireError(f"the value is too large to send (more than {MAX_NODES} values or {MAX_DEPTH} levels)")
    if value is None:
        return {"t": "none"}
    if isinstance(value, Handle):
        return {"t": "handle", "kind": value.kind, "id": value.id}
    if isinstance(value, bool):
        return {"t": "bool", "v": value}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _NUMBER_KINDS or value.dtype.fields is not None or value.ndim > MAX_NDIM:
            return {"t": "opaque", "type": f"ndarray[{value.dtype}]"}
        blobs.append(_npy_bytes(value))
        return {"t": "array", "i": len(blobs) - 1}
    if isinstance(value, np.generic):
        if value.dtype.kind not in _NUMBER_KINDS:
            return {"t": "opaque", "type": type(value).__name__}
        blobs.append(_npy_bytes(np.asarray(value)))
        return {"t": "npscalar", "i": len(blobs) - 1}
    if isinstance(value, int) and type(value) is int:
        if abs(value) < 1 << 63:
            return {"t": "int", "v": value}
        return {"t": "opaque", "type": "int"}
    if isinstance(value, float) and type(value) is float:
        return {"t": "float", "v": value.hex()}
    if isinstance(value, complex) and type(value) is complex:
        return {"t": "complex", "v": [value.real.hex(), value.imag.hex()]}
    if isinstance(value, str) and type(value) is str:
        return {"t": "str", "v": value[:MAX_STR]}
    if type(value) in (tuple, list):
        return {"t": type(value).__name__, "v": [encode(v, blobs, keep, depth + 1, count) for v in value]}
    if type(value) is dict:
        items = []
        for k, v in value.items():
            if not (type(k) is str or type(k) is int):
                return {"t": "opaque", "type": "dict"}
            items.append([encode(k, blobs, None, depth + 1, count), encode(v, blobs, keep, depth + 1, count)])
        return {"t": "dict", "v": items}
    if keep is not None:
        handle = keep(value)
        if handle is not None:
            return encode(handle, blobs)
    return {"t": "opaque", "type": type(value).__name__}


def _read_npy(data: memoryview):
    """An array from ``.npy`` bytes, with its dtype, shape and size checked before anything is allocated."""
    import numpy as np

    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise WireError(f"an array in version {version} of the .npy format")
    except WireError:
        raise
    except Exception as e:       # NumPy's header parser raises ValueError and others on a malformed header
        raise WireError(f"a malformed array header ({type(e).__name__}: {e})") from None
    if dtype.kind not in _NUMBER_KINDS or dtype.fields is not None or dtype.hasobject:
        raise WireError(f"an array of dtype {dtype} (only numbers travel)")
    if len(shape) > MAX_NDIM or any((not isinstance(n, int)) or n < 0 for n in shape):
        raise WireError(f"an array of shape {shape}")
    size = 1
    for n in shape:
        size *= n
    offset = f.tell()
    if size * dtype.itemsize != len(data) - offset:
        raise WireError(f"an array of shape {shape} and dtype {dtype} whose data has {len(data) - offset} bytes, "
                        f"not {size * dtype.itemsize}")
    arr = np.frombuffer(data, dtype=dtype, count=size, offset=offset)
    return arr.reshape(shape, order="F" if fortran else "C").copy()


def decode(tree, blobs: list, resolve=None, depth: int = 0):
    """The value of a tree made by :func:`encode`. ``resolve(handle)`` maps a received handle to what it stands
    for on this side (default: the :class:`Handle` itself)."""
    if depth > MAX_DEPTH or not isinstance(tree, dict):
        raise WireError("a malformed value")
    t = tree.get("t")
    if t == "none":
        return None
    if t == "bool":
        return bool(tree["v"])
    if t == "int":
        v = tree["v"]
        if type(v) is not int or abs(v) >= 1 << 63:
            raise WireError("a malformed integer")
        return v
    if t == "float":
        return float.fromhex(str(tree["v"]))
    if t == "complex":
        re, im = tree["v"]
        return complex(float.fromhex(str(re)), float.fromhex(str(im)))
    if t == "str":
        return str(tree["v"])[:MAX_STR]
    if t in ("array", "npscalar"):
        i = tree.get("i")
        if type(i) is not int or not 0 <= i < len(blobs):
            raise WireError("an array reference out of range")
        arr = _read_npy(blobs[i])
        return arr if t == "array" else (arr[()] if arr.ndim == 0 else arr)
    if t in ("tuple", "list"):
        items = [decode(v, blobs, resolve, depth + 1) for v in tree["v"]]
        return tuple(items) if t == "tuple" else items
    if t == "dict":
        out = {}
        for pair in tree["v"]:
            k = decode(pair[0], blobs, None, depth + 1)
            if not isinstance(k, (str, int)):
                raise WireError("a dict key that is not a string or an integer")
            out[k] = decode(pair[1], blobs, resolve, depth + 1)
        return out
    if t == "handle":
        h = Handle(str(tree.get("kind", ""))[:40], int(tree["id"]))
        return resolve(h) if resolve is not None else h
    if t == "opaque":
        return opaque(tree.get("type", "object"))
    raise WireError(f"an unknown value type {t!r}")


def arrays_in(value) -> list:
    """The arrays in a call's arguments (lists, tuples and dicts walked in order): both sides number them alike, so
    the child can say which input the student's code changed in place."""
    import numpy as np

    found: list = []

    def walk(v) -> None:
        if isinstance(v, np.ndarray):
            found.append(v)
        elif type(v) in (list, tuple):
            for x in v:
                walk(x)
        elif type(v) is dict:
            for x in v.values():
                walk(x)

    walk(value)
    return found


def pack(header: dict, value=None, keep=None) -> bytes:
    """One payload: ``header`` (a dict) with ``value`` encoded under the key "value"."""
    blobs: list = []
    if value is not None or "value" not in header:
        header = dict(header, value=encode(value, blobs, keep))
    header["blobs"] = [len(b) for b in blobs]
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([struct.pack(">I", len(head)), head] + blobs)


def unpack(payload: bytes, resolve=None) -> tuple[dict, object]:
    """(header, value) of a payload made by :func:`pack`; every length checked against the payload."""
    view = memoryview(payload)
    if len(view) < 4:
        raise WireError("a truncated message")
    (n,) = struct.unpack(">I", view[:4])
    if n > len(view) - 4:
        raise WireError("a message header longer than the message")
    try:
        header = json.loads(bytes(view[4:4 + n]))
    except ValueError:
        raise WireError("a message header that is not JSON") from None
    if not isinstance(header, dict):
        raise WireError("a message header that is not an object")
    sizes = header.get("blobs", [])
    if not isinstance(sizes, list) or not all(type(s) is int and s >= 0 for s in sizes):
        raise WireError("malformed array sizes")
    if 4 + n + sum(sizes) != len(view):
        raise WireError("array sizes that do not add up to the message")
    blobs, at = [], 4 + n
    for s in sizes:
        blobs.append(view[at:at + s])
        at += s
    value = decode(header["value"], blobs, resolve) if "value" in header else None
    return header, value


def write_frame(fd: int, payload: bytes) -> None:
    import os

    data = memoryview(struct.pack(">Q", len(payload)) + payload)
    while data:
        n = os.write(fd, data)
        data = data[n:]


def read_exact(fd: int, n: int, wait=None) -> bytes:
    """``n`` bytes from ``fd``; ``wait()`` (the grader's deadline check) is called before each read."""
    import os

    chunks, left = [], n
    while left:
        if wait is not None:
            wait()
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, wait=None, limit: int = MAX_FRAME) -> bytes:
    (n,) = struct.unpack(">Q", read_exact(fd, 8, wait))
    if n > limit:
        raise WireError(f"a message of {n} bytes (the limit is {limit})")
    return read_exact(fd, n, wait)


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
    stub_names.update({"transformer_np.course", "transformer_np.course.exercises"})

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

    def keep(value) -> Handle:
        next_id[0] += 1
        caches[next_id[0]] = value
        order.append(next_id[0])
        while len(order) > config["max_caches"]:
            caches.pop(order.pop(0), None)
        return Handle("student", next_id[0])

    def resolve(h: Handle):
        if h.kind == "student":
            if h.id not in caches:
                raise WireError(f"cache #{h.id} is no longer kept")
            return caches[h.id]
        return h                                       # a handed-out function's cache: kept by the grader

    def send(header: dict, value=None, keep_fn=None) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            payload = pack(header, value, keep_fn)
        except (WireError, ValueError, TypeError, OverflowError) as e:
            payload = pack({"op": "reply", "ok": False, "error": {"type": "WireError", "message": str(e),
                                                                  "where": ""}})
        write_frame(rep_fd, payload)

    def receive() -> tuple[dict, object]:
        return unpack(read_frame(req_fd), resolve)

    # ------------------------------------------------------------------ handed-out functions: ask the grader
    def handout(dotted: str):
        def call(*args, **kwargs):
            with lock:
                send({"op": "handout", "name": dotted}, [list(args), kwargs])
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
            if spec.name == "transformer_np.course.exercises":
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
        pristine = [(i, a.copy()) for i, a in enumerate(arrays_in([args, kwargs]))]
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                result = fn(*args, **kwargs)
        except BaseException as e:     # the student's function may raise anything; it is reported, not obeyed
            return {"ok": False, "error": error_of(e)}, None
        arrays = dict(enumerate(arrays_in([args, kwargs])))
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
