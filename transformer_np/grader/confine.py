r"""The kernel's boundary around a submission's child process: Landlock, seccomp-bpf, a user namespace, PDEATHSIG.

Two users of this file:

* the grader calls :func:`probe` (what the machine lacks, as a list of words; empty when everything is there)
  and :func:`stdlib_layout` (the folders the child will be allowed to read);
* the child program (:mod:`transformer_np.grader.child`, which loads this file by its path: it imports only the
  standard library) calls :func:`begin` before it imports NumPy and :func:`restrict` after, before any student
  code runs. Everything is done with ``ctypes`` system calls; nothing here can be undone by the code that runs
  after it (each step is one the kernel never lets a process take back).

What the child ends up with, in this order:

1. ``PR_SET_PDEATHSIG`` = SIGKILL: the kernel kills it when the grader dies, even by SIGKILL (and it exits at
   once if the grader is already gone);
2. when run as root: a new user namespace (and network and IPC namespaces) in which uid 0 maps to the grader's
   uid 0 only, then every capability dropped (bounding set, ambient set, effective/permitted/inheritable, with
   the securebits that keep root from regaining them locked): root's name without root's power;
   as a normal user: a user and network namespace when the kernel allows it (best effort; recorded);
3. ``PR_SET_NO_NEW_PRIVS``;
4. Landlock: every filesystem right of the running ABI is handled; reading is allowed beneath the standard
   library's entries (not its ``site-packages``), ``lib-dynload``, NumPy and its bundled libraries, the system's
   shared-library folders, ``/dev/null`` and the time zones; reading and writing beneath the child's own working
   folder. TCP bind/connect are handled with no rule (ABI ≥ 4); abstract UNIX sockets and signals are scoped to
   the child (ABI ≥ 6). Landlock also keeps the child from ptracing anything outside its domain;
5. seccomp-bpf: a foreign architecture kills the process; execve, fork, new sessions and process groups, ptrace
   and cross-process memory, sockets, namespaces, mounts, keys, BPF, io_uring, modules and more fail with EPERM;
   clone only makes threads; kill and friends reach only the child itself; prlimit and the scheduler calls only
   the child itself; the parent-death signal cannot be changed.

The child reports what it applied (:func:`restrict` returns the state) in its first message, and the grader
refuses a child whose state falls short (:func:`state_problem`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import stat
import struct
import sys

__all__ = ["probe", "begin", "restrict", "state_problem", "stdlib_layout", "ConfinementUnavailable"]

HOW_TO_GRADE_ELSEWHERE = ("grade in a Linux VM or container whose kernel offers Landlock and seccomp (Linux ≥ 5.13; "
                          "e.g. a current Debian or Ubuntu), or pass --no-sandbox for formative grades")


class ConfinementUnavailable(RuntimeError):
    """The machine lacks what the kernel boundary needs (see :func:`probe`)."""


# ----------------------------------------------------------------------------- system-call numbers
_ARCH = {   # machine: (AUDIT_ARCH, syscall numbers)
    "x86_64": (0xC000003E, dict(
        seccomp=317, landlock_create_ruleset=444, landlock_add_rule=445, landlock_restrict_self=446,
        execve=59, execveat=322, fork=57, vfork=58, clone=56, clone3=435, setsid=112, setpgid=109, ptrace=101,
        process_vm_readv=310, process_vm_writev=311, kill=62, tkill=200, tgkill=234, rt_sigqueueinfo=129,
        rt_tgsigqueueinfo=297, pidfd_open=434, pidfd_send_signal=424, pidfd_getfd=438, socket=41, socketpair=53,
        connect=42, accept=43, bind=49, listen=50, accept4=288, unshare=272, setns=308, mount=165, umount2=166,
        pivot_root=155, chroot=161, keyctl=250, add_key=248, request_key=249, bpf=321, perf_event_open=298,
        userfaultfd=323, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, kexec_load=246,
        kexec_file_load=320, init_module=175, finit_module=313, delete_module=176, reboot=169, swapon=167,
        swapoff=168, open_by_handle_at=304, name_to_handle_at=303, fanotify_init=300, personality=135,
        quotactl=179, mknod=133, mknodat=259, setuid=105, setgid=106, setreuid=113, setregid=114, setresuid=117,
        setresgid=119, setgroups=116, setfsuid=122, setfsgid=123, capset=126, prctl=157, prlimit64=302,
        sched_setaffinity=203, sched_setscheduler=144, sched_setparam=142, sched_setattr=314, setpriority=141,
        ioprio_set=251, fsopen=430, fsconfig=431, fsmount=432, fspick=433, open_tree=428, move_mount=429,
        mount_setattr=442, process_madvise=440, kcmp=312, migrate_pages=256, move_pages=279, uselib=134,
        acct=163, iopl=172, ioperm=173, process_mrelease=448)),
}
_X32_BIT = 0x40000000                      # x86_64's x32 ABI numbers: refused outright

# what seccomp refuses with EPERM whatever the arguments
_DENY = ("execve", "execveat", "fork", "vfork", "setsid", "setpgid", "ptrace", "process_vm_readv",
         "process_vm_writev", "tkill", "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "socket", "socketpair",
         "connect", "accept", "bind", "listen", "accept4", "unshare", "setns", "mount", "umount2", "pivot_root",
         "chroot", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
         "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load", "init_module", "finit_module",
         "delete_module", "reboot", "swapon", "swapoff", "open_by_handle_at", "name_to_handle_at", "fanotify_init",
         "personality", "quotactl", "mknod", "mknodat", "setuid", "setgid", "setreuid", "setregid", "setresuid",
         "setresgid", "setgroups", "setfsuid", "setfsgid", "capset", "setpriority", "ioprio_set", "fsopen",
         "fsconfig", "fsmount", "fspick", "open_tree", "move_mount", "mount_setattr", "process_madvise", "kcmp",
         "migrate_pages", "move_pages", "uselib", "acct", "iopl", "ioperm", "process_mrelease")
_SELF_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")          # arg0 must be the child's pid
_SELF_OR_ZERO = ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr")

# ----------------------------------------------------------------------------- constants of the kernel's ABI
PR_SET_PDEATHSIG, PR_GET_SECCOMP, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 21, 24, 28
PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 39, 47, 4
CLONE_THREAD, CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x10000, 0x20000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x10000000, 0x20000000, 0x40000000
_CLONE_NS = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
SECBITS_ALL_LOCKED = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80   # NOROOT, NO_SETUID_FIXUP, no ambient raise
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38

# Landlock (include/uapi/linux/landlock.h)
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

SYSTEM_LIBRARY_PATHS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache", "/usr/share/zoneinfo")


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return libc


def _arch() -> tuple[int, dict[str, int]] | None:
    return _ARCH.get(os.uname().machine) if sys.platform.startswith("linux") else None


def _sys(libc: ctypes.CDLL, nr: int, *args: object) -> int:
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def _prctl(libc: ctypes.CDLL, *args: int) -> int:
    ctypes.set_errno(0)
    r = libc.prctl(*[ctypes.c_ulong(a) for a in args] + [ctypes.c_ulong(0)] * (5 - len(args)))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl{args[:1]}: {os.strerror(e)}")
    return r


def landlock_abi(libc: ctypes.CDLL | None = None) -> int:
    """The Landlock ABI version the running kernel offers (0: none)."""
    arch = _arch()
    if arch is None:
        return 0
    try:
        return _sys(libc or _libc(), arch[1]["landlock_create_ruleset"], None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    except OSError:
        return 0


# ----------------------------------------------------------------------------- the grader's side
def probe() -> list[str]:
    """What this machine lacks for the kernel boundary, one short phrase each (empty: everything is there)."""
    if not sys.platform.startswith("linux"):
        return [f"a Linux kernel (this is {sys.platform})"]
    if _arch() is None:
        return [f"a supported architecture (x86_64; this is {os.uname().machine})"]
    missing = []
    try:
        libc = _libc()
    except OSError:
        return ["the C library (ctypes cannot load it)"]
    try:
        _prctl(libc, PR_GET_SECCOMP)
    except OSError:
        missing.append("seccomp (prctl PR_GET_SECCOMP fails)")
    if landlock_abi(libc) < 1:
        missing.append("Landlock (Linux ≥ 5.13 with landlock in the boot's lsm= list)")
    if os.geteuid() == 0 and not _can_unshare_user():
        missing.append("user namespaces, which a child needs to give root up (unshare(CLONE_NEWUSER) is refused "
                       "here; grading as a normal user needs none)")
    return missing


@functools.lru_cache(maxsize=1)
def _can_unshare_user() -> bool:
    """Whether a new process may enter a new user and network namespace (tried once, in a throwaway
    interpreter)."""
    import subprocess

    code = ("import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"sys.exit(0 if libc.unshare({CLONE_NEWUSER | CLONE_NEWNET}) == 0 else 1)\n")
    try:
        return subprocess.run([sys.executable, "-I", "-S", "-c", code], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def stdlib_layout() -> dict[str, object]:
    """Where this interpreter's standard library lives: ``stdlib`` (its folder), ``entries`` (the entries of that
    folder the child may read: everything but ``site-packages``/``dist-packages`` and ``lib-dynload``) and
    ``dynload`` (the folder of its C extension modules)."""
    stdlib = os.path.dirname(os.path.realpath(os.__file__))
    dynload = [os.path.realpath(p) for p in sys.path if os.path.basename(p.rstrip("/")) == "lib-dynload"]
    if not dynload:
        import _json

        dynload = [os.path.dirname(os.path.realpath(getattr(_json, "__file__", stdlib)))]
    skip = {"site-packages", "dist-packages", "lib-dynload"}
    entries = sorted(e for e in os.listdir(stdlib) if e not in skip)
    return {"stdlib": stdlib, "entries": entries, "dynload": dynload[0]}


def state_problem(state: object, root: bool) -> str | None:
    """Why a child's reported confinement ``state`` is not enough (None: it is). ``root``: the grader runs as root."""
    if not isinstance(state, dict):
        return "it sent no account of its confinement"
    if state.get("error"):
        return str(state["error"])[:300]
    if not (isinstance(state.get("landlock_abi"), int) and state["landlock_abi"] >= 1):
        return "Landlock was not applied"
    if state.get("seccomp") is not True or state.get("no_new_privs") is not True:
        return "seccomp or no_new_privs was not applied"
    if state.get("pdeathsig") is not True:
        return "the parent-death signal was not set"
    if root and not (state.get("uid") != 0 or (state.get("userns") is True and state.get("caps") == 0)):
        return "it kept root's privileges"
    return None


# ----------------------------------------------------------------------------- the child's side
MECHANISMS = ("pdeathsig", "userns", "landlock", "seccomp")


def begin(grader_pid: int, only: tuple[str, ...] = MECHANISMS) -> dict:
    """Steps 1–2, before NumPy is imported (a new user namespace needs a single-threaded process): the
    parent-death signal, then root given up. Returns the state so far. ``only``: the mechanisms to apply (all;
    fewer only to measure what each one closes — the grader refuses such a child)."""
    libc = _libc()
    state: dict = {"pdeathsig": False, "userns": False, "caps": None, "uid": os.getuid()}
    if "pdeathsig" in only:
        _parent_death(libc, grader_pid)
    if "userns" in only and os.geteuid() == 0:
        _user_namespace(libc, CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC)
        state["userns"] = True
        _drop_capabilities(libc)
    elif "userns" in only:
        try:                     # best effort for a normal user: no network, no uid of anyone else's
            _user_namespace(libc, CLONE_NEWUSER | CLONE_NEWNET)
            state["userns"] = True
            _drop_capabilities(libc)
        except OSError as e:
            state["userns_error"] = e.strerror
    if "pdeathsig" in only:
        _parent_death(libc, grader_pid)   # a change of credentials clears it: set it again, and check again
        state["pdeathsig"] = True
    state["uid"] = os.getuid()
    state["caps"] = _capabilities()
    return state


def restrict(state: dict, read: list[str], write: list[str], read_write_files: list[str],
             only: tuple[str, ...] = MECHANISMS) -> dict:
    """Steps 3–5, after NumPy is imported and before any student code: no_new_privs, Landlock (``read``: folders
    and files readable beneath; ``write``: folders readable and writable beneath; ``read_write_files``: single
    files such as /dev/null), seccomp. The process must still be single-threaded (Landlock binds the calling
    thread only). Returns ``state`` completed."""
    libc = _libc()
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise OSError(0, f"the child has {threads} threads before its confinement (one expected)")
    _prctl(libc, PR_SET_NO_NEW_PRIVS, 1)
    state["no_new_privs"] = _prctl(libc, PR_GET_NO_NEW_PRIVS) == 1
    if "landlock" in only:
        state["landlock_abi"] = _landlock(libc, read, write, read_write_files)
    if "seccomp" in only:
        _seccomp(libc, os.getpid())
    state["seccomp"] = _prctl(libc, PR_GET_SECCOMP) == 2
    return state


def _parent_death(libc: ctypes.CDLL, grader_pid: int) -> None:
    _prctl(libc, PR_SET_PDEATHSIG, 9)
    if os.getppid() != grader_pid:                      # the grader died before the signal was armed
        os._exit(1)


def _user_namespace(libc: ctypes.CDLL, flags: int) -> None:
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(ctypes.c_int(flags)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"unshare: {os.strerror(e)}")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def _drop_capabilities(libc: ctypes.CDLL) -> None:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _prctl(libc, PR_CAPBSET_DROP, cap)
    _prctl(libc, PR_SET_SECUREBITS, SECBITS_ALL_LOCKED)
    _prctl(libc, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = struct.pack("Ii", 0x20080522, 0)                   # _LINUX_CAPABILITY_VERSION_3, this process
    data = ctypes.create_string_buffer(24)                       # two empty {effective, permitted, inheritable}
    if libc.capset(ctypes.c_char_p(header), data) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"capset: {os.strerror(e)}")


def _capabilities() -> int:
    """The union of this process's capability sets (0: none at all)."""
    total = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:")):
                total |= int(line.split()[1], 16)
    return total


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _landlock(libc: ctypes.CDLL, read: list[str], write: list[str], read_write_files: list[str]) -> int:
    nr = _arch()[1]
    abi = landlock_abi(libc)
    if abi < 1:
        raise OSError(0, "Landlock is not available")
    fs = (1 << 13) - 1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0) | \
        (FS_IOCTL_DEV if abi >= 5 else 0)
    attr = _RulesetAttr(fs, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _sys(libc, nr["landlock_create_ruleset"], ctypes.byref(attr), size, 0)
    read_rights = FS_READ_FILE | FS_READ_DIR
    write_rights = fs & ~(FS_EXECUTE | FS_MAKE_CHAR | FS_MAKE_BLOCK | FS_IOCTL_DEV)
    try:
        done: set[tuple[int, int, int]] = set()
        for paths, rights in ((read, read_rights), (write, write_rights),
                              (read_write_files, FS_READ_FILE | FS_WRITE_FILE | (fs & (FS_TRUNCATE | FS_IOCTL_DEV)))):
            for path in paths:
                try:                     # O_PATH follows the links: the rule binds the real file or folder
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                try:
                    st = os.fstat(fd)
                    if (st.st_dev, st.st_ino, rights) in done:
                        continue
                    done.add((st.st_dev, st.st_ino, rights))
                    allowed = rights if stat.S_ISDIR(st.st_mode) else rights & _FILE_RIGHTS
                    rule = _PathBeneath(allowed, fd)
                    _sys(libc, nr["landlock_add_rule"], ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0)
                finally:
                    os.close(fd)
        _sys(libc, nr["landlock_restrict_self"], ruleset, 0)
    finally:
        os.close(ruleset)
    return abi


def seccomp_program(own_pid: int) -> list[tuple[int, int, int, int]]:
    """The BPF program (code, jt, jf, k) of the child's seccomp filter for this machine's architecture."""
    audit_arch, nr = _arch()
    LD, JEQ, JGE, AND, RET = 0x20, 0x15, 0x35, 0x54, 0x06
    NR, ARCH, ARG0 = 0, 4, 16                       # offsets in struct seccomp_data (arg0's low 32 bits)
    code: list = [(LD, 0, 0, ARCH), (JEQ, 1, 0, audit_arch), (RET, 0, 0, RET_KILL_PROCESS), (LD, 0, 0, NR)]
    if audit_arch == 0xC000003E:
        code.append((JGE, "eperm", None, _X32_BIT))
    for name in _DENY:
        code.append((JEQ, "eperm", None, nr[name]))
    code.append((JEQ, "enosys", None, nr["clone3"]))             # glibc falls back to clone for threads
    code.append((JEQ, "clone", None, nr["clone"]))
    code.append((JEQ, "prctl", None, nr["prctl"]))
    for name in _SELF_ONLY:
        code.append((JEQ, "self", None, nr[name]))
    for name in _SELF_OR_ZERO:
        code.append((JEQ, "self0", None, nr[name]))
    blocks = {          # forward jumps only: the blocks that test an argument first, the verdicts last
        # a thread (CLONE_THREAD, no new namespace), never a process
        "clone": [(LD, 0, 0, ARG0), (AND, 0, 0, CLONE_THREAD | _CLONE_NS), (JEQ, "allow", "eperm", CLONE_THREAD)],
        "prctl": [(LD, 0, 0, ARG0), (JEQ, "eperm", "allow", PR_SET_PDEATHSIG)],
        "self": [(LD, 0, 0, ARG0), (JEQ, "allow", "eperm", own_pid)],
        "self0": [(LD, 0, 0, ARG0), (JEQ, "allow", None, 0), (JEQ, "allow", "eperm", own_pid)],
        "allow": [(RET, 0, 0, RET_ALLOW)],
        "eperm": [(RET, 0, 0, RET_ERRNO | EPERM)],
        "enosys": [(RET, 0, 0, RET_ERRNO | ENOSYS)],
    }
    code.append((RET, 0, 0, RET_ALLOW))
    where: dict[str, int] = {}
    for label, block in blocks.items():
        where[label] = len(code)
        code.extend(block)
    def offset(t: str | int | None, i: int) -> int:       # a label → the forward jump from instruction i
        if t is None or isinstance(t, int):
            return t or 0
        off = where[t] - i - 1
        if not 0 <= off < 256:
            raise AssertionError("seccomp program: jump too far")
        return off

    return [(op, offset(jt, i), offset(jf, i), k & 0xFFFFFFFF) for i, (op, jt, jf, k) in enumerate(code)]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _seccomp(libc: ctypes.CDLL, own_pid: int) -> None:
    program = seccomp_program(own_pid)
    filters = (_SockFilter * len(program))(*[_SockFilter(*ins) for ins in program])
    prog = _SockFprog(len(program), filters)
    _sys(libc, _arch()[1]["seccomp"], SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(prog))
