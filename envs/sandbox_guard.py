"""The inner layers around agent code, installed by the process that runs it on itself
(PythonTools' interpreter, AppWorld's engine server), under bubblewrap or alone.

Standard library only, and loaded by file path (``load()`` below shows how): AppWorld's
engine runs in an interpreter that cannot import draco-gym. Three layers, each closing what
the one above it cannot:

  - ``AuditGuard``: an audit hook (PEP 578). Sees Python-level operations with their
    arguments: refuses starting programs, signals, sockets, ctypes, writes outside the work
    folder, reads of private places (``PrivateReads``), and paths relative to a directory
    descriptor. Native code and calls that raise no audit event (``os.mkfifo``,
    ``_posixsubprocess.fork_exec``, ``signal.pidfd_send_signal``, sqlite's ``ATTACH``) get
    past it: a guard, not a boundary.
  - ``Seccomp``: a kernel filter on system calls, whoever makes them (x86_64 Linux): no new
    process (threads only), no program started, signals only to this process, no ptrace or
    other processes' memory, no new session or process group, no socket, no mount or
    namespace change, no key ring, no FIFO or device node, no memfd, no io_uring; without
    Landlock also no path relative to a directory descriptor.
  - ``Landlock``: a kernel file system rule set (Linux >= 5.13, no privilege needed): reads
    only of the listed folders and files, writes only in the work folder, nothing executed;
    from ABI 4 no TCP, from ABI 6 signals and abstract Unix sockets only within the sandbox.
    It also denies /proc entries of every process outside it (the kernel's ptrace check).

Every layer is permanent once installed (``AuditGuard.guard`` switches only the hook's
checks); ``confine`` installs the kernel layers and says which it could.
"""

from __future__ import annotations

import errno
import os
import platform
import resource
import struct
import sys
from collections.abc import Callable, Iterable


def load(path: str | None = None):
    """This module loaded from its file, for processes that cannot import draco-gym:
    ``guard = load("/path/to/sandbox_guard.py")``."""
    import importlib.util

    path = path or __file__
    spec = importlib.util.spec_from_file_location("draco_sandbox_guard", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the audit hook ------------------------------------------------------------------------

BLOCKED_EVENTS: dict[str, str] = {
    "os.system": "running shell commands",
    "os.exec": "starting programs",
    "os.posix_spawn": "starting programs",
    "os.spawn": "starting programs",
    "os.fork": "forking",
    "os.forkpty": "forking",
    "pty.spawn": "starting programs",
    "subprocess.Popen": "starting programs",
    "os.startfile": "starting programs",
    "webbrowser.open": "starting programs",
    "os.kill": "sending signals",
    "os.killpg": "sending signals",
    "socket.__new__": "network access",
    "socket.connect": "network access",
    "socket.bind": "network access",
    "socket.sendto": "network access",
    "socket.sendmsg": "network access",
    "socket.getaddrinfo": "network access",
    "ctypes.dlopen": "loading native code",
    "ctypes.dlsym": "loading native code",
    "ctypes.cdata": "raw memory access",
    "os.chdir": "changing directory",
    "os.putenv": "changing the environment",
    "os.unsetenv": "changing the environment",
    "sys.addaudithook": "changing the sandbox",
    "sqlite3.enable_load_extension": "loading native code",
    "sqlite3.load_extension": "loading native code",
}
"""Audit events refused outright while the guard is active, with what the agent is told."""

PATH_EVENTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "os.remove": ((0,), (1,)),
    "os.rmdir": ((0,), (1,)),
    "os.mkdir": ((0,), (2,)),
    "os.rename": ((0, 1), (2, 3)),
    "os.link": ((0, 1), (2, 3)),
    "os.symlink": ((1,), (2,)),
    "os.chmod": ((0,), (2,)),
    "os.chown": ((0,), (3,)),
    "os.utime": ((0,), (3,)),
    "os.truncate": ((0,), ()),
    "shutil.rmtree": ((0,), (1,)),
    "shutil.move": ((0, 1), ()),
    "shutil.copyfile": ((1,), ()),
    "shutil.copytree": ((1,), ()),
    "shutil.make_archive": ((0,), ()),
    "sqlite3.connect": ((0,), ()),
}
"""Events that change the file system: (indexes of the paths changed, indexes of dir_fd
arguments). A path must lie in the work folder; a dir_fd must be absent (the hook cannot
see which folder a descriptor names)."""

READ_EVENTS = frozenset({"open", "os.listdir", "os.scandir"})
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _depth(path: str, roots: list[str]) -> int:
    """Length of the deepest of ``roots`` holding ``path``; -1 when none does."""
    return max((len(root) for root in roots if path == root or path.startswith(root.rstrip("/") + "/")), default=-1)


class PrivateReads:
    """Which reads the audit hook refuses: anything under a ``private`` folder (the parent's
    home, the task data, the tools' code) unless a deeper ``readable`` one holds it (code and
    data bound for this process), and another process's /proc entries (its environment,
    memory, command line). The deepest matching folder decides, so a private folder inside
    a readable one stays private. Paths are resolved first, so a symlink does not get
    around it."""

    def __init__(self, private: Iterable[str], readable: Iterable[str]) -> None:
        self.private = [os.path.realpath(p) for p in private]
        self.readable = [os.path.realpath(p) for p in readable]
        self.own_pid = str(os.getpid())

    def refused(self, path) -> bool:
        if path is None or isinstance(path, int):
            return False  # the work folder, or a descriptor checked when it was opened
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return True
        if real.startswith("/proc/"):
            entry = real.split("/")[2]
            if entry.isdigit() and entry != self.own_pid:
                return True
        private = _depth(real, self.private)
        return private >= 0 and private > _depth(real, self.readable)


class AuditGuard:
    """The audit hook. ``workdir``: the one folder writes may go to (None: no write at all
    while active, as AppWorld's engine wants around a cell). ``reads``: the read rule.
    ``allow``: events of ``BLOCKED_EVENTS`` the host process needs. ``strict_os_open``
    refuses ``os.open`` of a relative path, the only way the hook has to refuse a
    ``dir_fd`` open (the event does not carry it); ``confine`` leaves it off when a kernel
    layer refuses those opens instead. ``active``: checking from the start, or only inside
    ``guard(fn)``."""

    def __init__(self, workdir: str | None, reads: PrivateReads | None = None, *, allow: Iterable[str] = (),
                 strict_os_open: bool = True, active: bool = True) -> None:
        self.root = os.path.realpath(workdir) if workdir is not None else None
        self.reads = reads
        self.blocked = {event: why for event, why in BLOCKED_EVENTS.items() if event not in set(allow)}
        self.strict_os_open = strict_os_open
        self.active = active

    def install(self) -> AuditGuard:
        sys.addaudithook(self._hook)
        return self

    def guard(self, fn: Callable) -> Callable:
        """``fn`` with the checks on while it runs (for a guard created ``active=False``)."""

        def guarded(*args, **kwargs):
            self.active = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.active = False

        return guarded

    def inside(self, path) -> bool:
        if self.root is None:
            return False
        if isinstance(path, int):
            return True  # an already-open descriptor was checked when it was opened
        try:
            text = os.fsdecode(path)
        except (TypeError, ValueError):
            return False
        if text.startswith("file:"):  # sqlite URI
            text = text[5:].partition("?")[0]
        real = os.path.realpath(text)
        return real == self.root or real.startswith(self.root + os.sep)

    @staticmethod
    def _refuse(what: str) -> None:
        raise PermissionError(f"sandbox: {what} is not allowed")

    def _hook(self, event: str, args: tuple) -> None:
        if not self.active:
            return
        if event in self.blocked:
            self._refuse(f"{self.blocked[event]} ({event})")
        if event in READ_EVENTS and self.reads is not None and args and self.reads.refused(args[0]):
            self._refuse(f"reading {args[0]!r}")
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            if mode is None and self.strict_os_open and isinstance(path, (str, bytes)) \
                    and not os.path.isabs(os.fsdecode(path)):
                self._refuse(f"os.open of a relative path ({path!r}; give the full path)")
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & WRITE_FLAGS)
            if writing and path is not None and not self.inside(path):
                self._refuse(f"writing outside the working directory ({path!r})")
        elif event in PATH_EVENTS:
            paths, dir_fds = PATH_EVENTS[event]
            for i in dir_fds:
                if i < len(args) and args[i] is not None and args[i] != -1:
                    self._refuse(f"a path relative to a directory descriptor ({event})")
            for i in paths:
                if i < len(args) and isinstance(args[i], (str, bytes, os.PathLike)):
                    if event == "sqlite3.connect" and os.fsdecode(args[i]) in ("", ":memory:"):
                        continue
                    if not self.inside(args[i]):
                        self._refuse(f"changing files outside the working directory ({args[i]!r})")


# -- resource limits -----------------------------------------------------------------------


def set_limits(memory_mb: int, cpu_s: int, file_mb: int, tasks: int | None = None) -> None:
    """Address space, CPU seconds, size of any one file written, and (``tasks``) threads
    plus processes. The kernel counts ``tasks`` per user and user namespace, so it bounds
    a process alone only inside its own user namespace (bubblewrap), and not for root."""
    mem = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    fsize = file_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    if tasks is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))


# -- the kernel layers: raw system calls through ctypes -------------------------------------


def _libc():
    """libc through ctypes, or None (no ctypes, no Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
    except ImportError:
        return None
    return ctypes.CDLL(None, use_errno=True)


PR_SET_NO_NEW_PRIVS = 38


def _no_new_privs(libc) -> None:
    import ctypes

    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


class Seccomp:
    """A classic-BPF seccomp filter, assembled here (no libseccomp), for x86_64.

    Default: allow. Refused with EPERM: the calls in ``DENIED``; ``clone`` without
    CLONE_THREAD (a process, where a thread is fine); signals (``kill``, ``tgkill``,
    ``rt_*sigqueueinfo``) whose target is not this process; with ``dir_fd_paths=False``
    the ``*at`` calls given a directory descriptor instead of the current folder. ``clone3``
    answers ENOSYS, so the C library falls back to ``clone``, whose flags the filter can
    read. Any other architecture's calls (32-bit ``int 0x80``, x32) are refused."""

    ARCH = 0xC000003E  # AUDIT_ARCH_X86_64
    X32_BIT = 0x40000000
    CLONE_THREAD = 0x00010000
    AT_FDCWD = 0xFFFFFF9C  # -100 as the low 32 bits the kernel reads
    NR = {
        "clone": 56, "clone3": 435, "kill": 62, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
        "openat": 257, "mkdirat": 258, "fchownat": 260, "futimesat": 261, "unlinkat": 263, "renameat": 264,
        "linkat": 265, "symlinkat": 266, "fchmodat": 268, "utimensat": 280, "renameat2": 316, "fchmodat2": 452,
        "openat2": 437,
    }
    DENIED = {
        "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "process_madvise": 440, "kcmp": 312, "pidfd_open": 434,
        "pidfd_send_signal": 424, "pidfd_getfd": 438, "tkill": 200, "setsid": 112, "setpgid": 109,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "socket": 41, "mknod": 133, "mknodat": 259, "keyctl": 250, "add_key": 248,
        "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "memfd_create": 319, "memfd_secret": 447,
        "name_to_handle_at": 303, "open_by_handle_at": 304, "shmget": 29, "shmat": 30, "shmctl": 31,
        "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "semget": 64, "semop": 65, "semctl": 66,
        "semtimedop": 220, "mq_open": 240, "mq_unlink": 241, "syslog": 103,
    }
    # the *at calls and which of their arguments are directory descriptors
    DIR_FD_ARGS = {"openat": (0,), "mkdirat": (0,), "fchownat": (0,), "futimesat": (0,), "unlinkat": (0,),
                   "renameat": (0, 2), "linkat": (0, 2), "symlinkat": (1,), "fchmodat": (0,), "utimensat": (0,),
                   "renameat2": (0, 2), "fchmodat2": (0,)}

    def __init__(self, own_pid: int, *, dir_fd_paths: bool) -> None:
        self.own_pid = own_pid
        self.dir_fd_paths = dir_fd_paths

    def program(self) -> bytes:
        """The filter as ``struct sock_filter`` records."""
        ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JGE, JSET, RET|K
        allow, eperm, enosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
        code: list[tuple] = []  # (op, k, true label or None, false label or None) or ("label", name)

        def arg(i: int, high: bool = False) -> int:
            return 16 + 8 * i + (4 if high else 0)  # struct seccomp_data: nr, arch, ip, args[6]

        code += [(ld, 4, None, None), (jeq, self.ARCH, None, "deny"), (ld, 0, None, None),
                 (jge, self.X32_BIT, "deny", None), (jeq, self.NR["clone3"], "nosys", None),
                 (jeq, self.NR["openat2"], "nosys", None), (jeq, self.NR["clone"], "clone", None)]
        for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
            code.append((jeq, self.NR[name], "own_pid", None))
        for nr in sorted(self.DENIED.values()):
            code.append((jeq, nr, "deny", None))
        if not self.dir_fd_paths:
            for name, args in self.DIR_FD_ARGS.items():
                code.append((jeq, self.NR[name], f"cwd_{'_'.join(map(str, args))}", None))
        code += [(ret, allow, None, None),
                 ("label", "clone"), (ld, arg(0), None, None), (jset, self.CLONE_THREAD, "allow", "deny"),
                 ("label", "own_pid"), (ld, arg(0), None, None), (jeq, self.own_pid, None, "deny"),
                 (ld, arg(0, high=True), None, None), (jeq, 0, "allow", "deny")]
        if not self.dir_fd_paths:
            for args in sorted(set(self.DIR_FD_ARGS.values())):
                code.append(("label", f"cwd_{'_'.join(map(str, args))}"))
                for n, i in enumerate(args):
                    last = n == len(args) - 1
                    code += [(ld, arg(i), None, None), (jeq, self.AT_FDCWD, "allow" if last else None, "deny")]
        code += [("label", "allow"), (ret, allow, None, None), ("label", "deny"), (ret, eperm, None, None),
                 ("label", "nosys"), (ret, enosys, None, None)]
        return self._assemble(code)

    @staticmethod
    def _assemble(code: list[tuple]) -> bytes:
        labels, position = {}, 0
        for item in code:
            if item[0] == "label":
                labels[item[1]] = position
            else:
                position += 1
        out, position = [], 0
        for item in code:
            if item[0] == "label":
                continue
            op, k, true, false = item
            offsets = []
            for target in (true, false):
                offset = 0 if target is None else labels[target] - position - 1
                if not 0 <= offset <= 255:
                    raise ValueError(f"seccomp jump to {target} out of range ({offset})")
                offsets.append(offset)
            out.append(struct.pack("=HBBI", op, offsets[0], offsets[1], k))
            position += 1
        return b"".join(out)

    def install(self, libc, program: bytes | None = None) -> None:
        import ctypes

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        program = program or self.program()
        buffer = ctypes.create_string_buffer(program, len(program))
        fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
        _no_new_privs(libc)
        # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog): every thread
        if libc.syscall(317, 1, 1, ctypes.byref(fprog)) != 0:
            raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")


class Landlock:
    """A Landlock rule set (via its three system calls): ``read`` folders and files may be
    read, ``write`` folders read and changed, ``devices`` (e.g. /dev/null) read and written;
    everything else the ABI can name is refused, executing included."""

    READ_FILE, READ_DIR, WRITE_FILE = 1 << 2, 1 << 3, 1 << 1
    CHANGE_TREE = (1 << 4) | (1 << 5) | (1 << 7) | (1 << 8) | (1 << 12)  # remove dir/file, make dir/reg/sym
    REFER, TRUNCATE = 1 << 13, 1 << 14
    FILE_RIGHTS = (1 << 0) | WRITE_FILE | READ_FILE | TRUNCATE | (1 << 15)  # what a rule on a file may hold
    HANDLED_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
    ALL_FS = (1 << 16) - 1  # ABI >= 5 adds IOCTL_DEV
    NET_TCP = (1 << 0) | (1 << 1)  # bind, connect (ABI >= 4)
    SCOPES = (1 << 0) | (1 << 1)  # abstract unix sockets, signals (ABI >= 6)

    def __init__(self, read: Iterable[str], write: Iterable[str], devices: Iterable[str] = ()) -> None:
        self.read = [p for p in read if os.path.exists(p)]
        self.write = [p for p in write if os.path.exists(p)]
        self.devices = [p for p in devices if os.path.exists(p)]

    @staticmethod
    def abi(libc) -> int:
        """The kernel's Landlock ABI version; 0 without Landlock."""
        version = libc.syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, ..._VERSION)
        return max(0, version)

    def install(self, libc) -> int:
        import ctypes

        abi = self.abi(libc)
        if abi < 1:
            raise OSError(ctypes.get_errno(), "Landlock is not enabled in this kernel")
        handled = self.HANDLED_BY_ABI.get(abi, self.ALL_FS)
        if abi >= 6:
            attr = struct.pack("=QQQ", handled, self.NET_TCP, self.SCOPES)
        elif abi >= 4:
            attr = struct.pack("=QQ", handled, self.NET_TCP)
        else:
            attr = struct.pack("=Q", handled)
        ruleset = libc.syscall(444, ctypes.c_char_p(attr), len(attr), 0)
        if ruleset < 0:
            raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
        try:
            read = self.READ_FILE | self.READ_DIR
            write = read | self.WRITE_FILE | self.CHANGE_TREE | self.REFER | self.TRUNCATE
            for paths, rights in ((self.read, read), (self.write, write), (self.devices, self.READ_FILE | self.WRITE_FILE)):
                for path in paths:
                    self._add(libc, ruleset, path, rights & handled)
            _no_new_privs(libc)
            if libc.syscall(446, ruleset, 0) != 0:  # landlock_restrict_self
                raise OSError(ctypes.get_errno(), "landlock_restrict_self")
        finally:
            os.close(ruleset)
        return abi

    def _add(self, libc, ruleset: int, path: str, rights: int) -> None:
        import ctypes

        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            if not os.path.isdir(path):
                rights &= self.FILE_RIGHTS
            rule = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr (packed)
            if libc.syscall(445, ruleset, 1, ctypes.c_char_p(rule), 0) != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
        finally:
            os.close(fd)


def readable_minus(roots: Iterable[str], hidden: Iterable[str]) -> list[str]:
    """``roots`` with every ``hidden`` path cut out, as a list of folders and files that
    together hold everything else (Landlock can only grant, never subtract)."""
    hidden = {os.path.realpath(h) for h in hidden}
    out: list[str] = []

    def add(path: str) -> None:
        if path in hidden:
            return
        inner = [h for h in hidden if h.startswith(path.rstrip("/") + "/")]
        if not inner or not os.path.isdir(path):
            out.append(path)
            return
        try:
            names = os.listdir(path)
        except OSError:
            return
        for name in sorted(names):
            add(os.path.join(path, name))

    for root in sorted({os.path.realpath(r) for r in roots}):
        add(root)
    return out


DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def confine(*, workdir: str | None, readable: Iterable[str], hidden: Iterable[str] = ()) -> dict[str, str]:
    """Install the kernel layers this machine has on this process (and, for seccomp, its
    threads; call it before starting any for Landlock): Landlock with reads of
    ``readable`` minus ``hidden`` and writes in ``workdir``, then the seccomp filter (no
    process is started from here on: threads only). Returns each layer's
    state: ``"on"`` (``"on (ABI n)"``) or why it is off. The audit hook is separate
    (``AuditGuard``): its ``strict_os_open`` is needed only where both layers are off."""
    layers: dict[str, str] = {}
    libc = _libc()
    if libc is None:
        return {"landlock": "off: not Linux or no ctypes", "seccomp": "off: not Linux or no ctypes"}
    try:
        read = readable_minus(readable, hidden)
        abi = Landlock(read, [workdir] if workdir else [], DEVICES).install(libc)
        layers["landlock"] = f"on (ABI {abi})"
    except OSError as exc:
        layers["landlock"] = f"off: {exc}"
    if platform.machine() != "x86_64":
        layers["seccomp"] = f"off: the filter is written for x86_64, this is {platform.machine()}"
        return layers
    try:
        Seccomp(os.getpid(), dir_fd_paths=layers["landlock"].startswith("on")).install(libc)
        layers["seccomp"] = "on"
    except OSError as exc:
        layers["seccomp"] = f"off: {exc}"
    return layers
