"""The OS boundary around every process that runs agent code (PythonTools' interpreter and
AppWorld's engine servers), built once here for both.

Agent code is written by a policy under optimisation pressure, and what it prints is logged,
saved in trajectories and sent to a third-party judge. So a process that runs it gets:

  - ``"bwrap"``: a bubblewrap sandbox. Fresh user, PID, network, IPC, UTS and cgroup
    namespaces (no network at all: the parent talks to it over pipes); no capability, even
    when the parent is root, and no nested user namespace; a read-only root holding only the
    system's program and library folders and the paths the caller names (interpreter,
    virtual environments, task data), with ``hidden`` paths inside them emptied; the
    process's own work folder as the one writable place (an in-memory folder of a fixed
    size, or a host folder); a private /proc (its own processes only) and a read-only
    minimal /dev; no home folder; an environment built from an allowlist; killed with its
    parent (``--die-with-parent``), and everything in it with it (its PID namespace).
  - ``"guard"``: no OS boundary, for machines without bubblewrap (macOS, containers without
    user namespaces). The process still gets the allowlisted environment and confines
    itself (``sandbox_guard.py``, in both modes: the inner layers): an audit hook, and on
    Linux a seccomp filter and a Landlock rule set where the kernel has them. A single
    warning names what is not isolated.
  - ``"auto"`` (default): ``"bwrap"`` when it can run here, else ``"guard"``.

Whatever the mode, the parent's environment is never passed on: API keys in the trainer's
environment (the judge's) do not reach agent code.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Literal

SandboxMode = Literal["bwrap", "guard", "auto"]
SANDBOX_MODES: tuple[str, ...] = ("bwrap", "guard", "auto")

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`, Fedora: `dnf install bubblewrap`) "
    "on a Linux kernel that allows unprivileged user namespaces"
)

ENV_ALLOWLIST: tuple[str, ...] = ("LANG", "LC_ALL", "LC_CTYPE")
"""Variables copied from the parent's environment; every other one is dropped."""

WORKER_SCRIPT = Path(__file__).with_name("sandbox_worker.py")
"""PythonTools' interpreter."""

GUARD_MODULE = Path(__file__).with_name("sandbox_guard.py")
"""The inner layers (audit hook, seccomp, Landlock, limits) every process running agent code
installs on itself, loaded by path (``sandbox_guard.load``)."""

PRIVATE_WORKDIR_MB = 512
"""Default size of an in-memory work folder (``bwrap_command(private_workdir=True)``): its
pages are memory that no address-space limit counts."""

SYSTEM_DIRS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES: tuple[str, ...] = ("/etc/ld.so.cache",)


class SandboxUnavailable(RuntimeError):
    """``sandbox="bwrap"`` was asked for and bubblewrap cannot run here."""


class SandboxWarning(UserWarning):
    """Agent code runs without the OS boundary (``sandbox="guard"``, chosen or fallen back to)."""


def check_mode(mode: str) -> None:
    if mode not in SANDBOX_MODES:
        raise ValueError(f"sandbox must be one of {SANDBOX_MODES}, got {mode!r}")


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot sandbox a process on this machine, or None when it can.

    Tried for real once per process (a few milliseconds): bwrap on PATH is not enough when
    the kernel or a container forbids the namespaces it needs."""
    path = shutil.which("bwrap")
    if path is None:
        return "bubblewrap (`bwrap`) is not on PATH"
    # every option bwrap_command uses: an older bubblewrap lacks --size or --disable-userns
    probe = [path, *_BOUNDARY, *_system_binds(), "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
             "--size", str(1 << 20), "--tmpfs", "/tmp", "--remount-ro", "/", "--", "true"]
    try:
        result = subprocess.run(probe, capture_output=True, timeout=30, env=allowlisted_env("/"))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`bwrap` could not be run ({exc})"
    if result.returncode != 0:
        return f"`bwrap` cannot create a sandbox here: {result.stderr.decode(errors='replace').strip()}"
    return None


_warned: set[str] = set()


def resolve_mode(mode: str, what: str) -> str:
    """``"bwrap"`` or ``"guard"`` for ``mode``; raised or warned (once per ``what``) here, at
    the environment's construction, not at its first step."""
    check_mode(mode)
    if mode != "guard":
        problem = bwrap_problem()
        if problem is None:
            return "bwrap"
        if mode == "bwrap":
            raise SandboxUnavailable(
                f"{what}: sandbox='bwrap' was asked for, but {problem}. To fix it, {INSTALL_HINT}; or pass "
                "sandbox='guard' to run agent code behind the audit hook alone (no OS boundary)."
            )
        reason = problem
    else:
        reason = "sandbox='guard' was chosen"
    if what not in _warned:
        _warned.add(what)
        warnings.warn(
            f"{what} runs agent code WITHOUT an OS sandbox ({reason}). Still in force: a scrubbed environment "
            "(no API keys), an audit hook, and on Linux where the kernel has them a seccomp filter (no process, "
            "no signal to another process, no ptrace, no socket) and Landlock (reads only of the interpreter's "
            "files, writes only in the work folder). Not isolated: the work folder's total size (only each "
            "file's is capped), and where Landlock is missing the host's process list and reads of any file this "
            "user can read outside the home folder (project files, /etc); native code gets around the audit hook. "
            "For the OS "
            f"boundary, {INSTALL_HINT}.",
            SandboxWarning,
            stacklevel=3,
        )
    return "guard"


def allowlisted_env(home: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a process that runs agent code: a fixed PATH, the work
    folder as HOME and TMPDIR, the locale, and ``extra``; nothing else of the parent's."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home}
    env.update({name: os.environ[name] for name in ENV_ALLOWLIST if name in os.environ})
    env.setdefault("LANG", "C.UTF-8")
    env.update(extra or {})
    return env


def private_folders() -> list[str]:
    """Where the parent's secrets live, refused to agent code by the audit hook whatever the
    sandbox: ``$HOME`` and the account's home folder (they can differ)."""
    import pwd

    folders = {os.path.realpath(os.path.expanduser("~"))}
    try:
        folders.add(os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir))
    except KeyError:
        pass
    return sorted(folders)


def interpreter_paths(python: str | os.PathLike = sys.executable) -> list[str]:
    """What an interpreter needs to start: its virtual environment (pyvenv.cfg, site-packages)
    and the installation its executable links to."""
    exe = Path(python)
    venv = exe.parent.parent
    paths = [str(venv)] if (venv / "pyvenv.cfg").is_file() else []
    real = exe.resolve()
    paths.append(str(real.parent.parent))  # <prefix>/bin/python3.x -> <prefix>
    return paths


def code_paths(entries: Iterable[str]) -> list[str]:
    """The import path entries worth binding: existing, and never the home folder, a folder
    holding it, or the root (``sys.path`` may hold the folder a script was started from)."""
    home = os.path.realpath(os.path.expanduser("~"))
    kept = []
    for entry in entries:
        if not entry or not os.path.exists(entry):
            continue
        real = os.path.realpath(entry)
        if real == "/" or home == real or home.startswith(real.rstrip("/") + "/"):
            continue
        kept.append(real)
    return kept


_BOUNDARY = ("--unshare-all", "--unshare-user", "--die-with-parent", "--cap-drop", "ALL", "--disable-userns", "--clearenv")


def _system_binds() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]  # merged /usr: /bin -> usr/bin
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in SYSTEM_FILES:
        args += ["--ro-bind-try", path, path]
    return args


def bwrap_command(
    argv: list[str],
    *,
    workdir: str,
    read_only: Iterable[str],
    env: Mapping[str, str],
    private_workdir: bool = False,
    workdir_mb: int = PRIVATE_WORKDIR_MB,
    hidden: Iterable[str] = (),
    symlinks: Mapping[str, str] | None = None,
) -> list[str]:
    """``argv`` wrapped in bubblewrap: see the module docstring for what it gets.

    Paths are bound at their real location, so the caller passes real paths in ``argv``
    and configuration; ``workdir`` (the one writable folder) is also the working folder.
    It is the host folder of that name, or with ``private_workdir`` an empty in-memory
    folder of ``workdir_mb`` MiB that exists only inside the sandbox (nothing is left on
    the host, even when the sandbox is killed; a write past the size fails with ENOSPC).
    ``hidden`` folders and files inside the bound paths are emptied (a folder becomes an
    empty read-only one; a file becomes /dev/null on a nodev mount, which cannot be
    opened), and ``read_only`` paths inside a hidden folder are bound again on top.
    ``symlinks`` (link -> target) are made inside it."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap (`bwrap`) is not on PATH; {INSTALL_HINT}")
    command = [bwrap, *_BOUNDARY, *_system_binds(), "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    # the inner layers' module is in every sandbox: each process running agent code loads it
    bound = sorted({os.path.realpath(p) for p in [*read_only, str(GUARD_MODULE)] if os.path.exists(p)}, key=len)
    hide = sorted({os.path.realpath(p) for p in hidden if os.path.exists(p)}, key=len)
    within = lambda path, roots: any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)  # noqa: E731
    hide = [h for h in hide if within(h, bound)]
    again = [p for p in bound if within(p, hide)]
    for path in bound:
        if path not in again:
            command += ["--ro-bind", path, path]
    for path in hide:
        if os.path.isdir(path):
            command += ["--perms", "0555", "--tmpfs", path]
        else:
            command += ["--ro-bind", "/dev/null", path]
    for path in again:
        command += ["--ro-bind", path, path]
    for path in hide:
        if os.path.isdir(path):
            command += ["--remount-ro", path]
    if private_workdir:
        command += ["--size", str(workdir_mb * 1024 * 1024), "--tmpfs", workdir]
    else:
        workdir = os.path.realpath(workdir)
        command += ["--bind", workdir, workdir]
    for link, target in (symlinks or {}).items():
        command += ["--symlink", target, link]
    command += ["--remount-ro", "/", "--chdir", workdir]
    for name, value in env.items():
        command += ["--setenv", name, value]
    return [*command, "--", *argv]


@functools.lru_cache(maxsize=8)
def isolated_sys_path(python: str = sys.executable) -> tuple[str, ...]:
    """The import path ``python -I`` starts with (its standard library, its virtual
    environment and the folders that environment's .pth files add): what a sandboxed
    interpreter imports from, asked of the interpreter itself once."""
    probe = [python, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"]
    result = subprocess.run(probe, capture_output=True, text=True, timeout=60, env=allowlisted_env("/"))
    if result.returncode != 0:
        raise RuntimeError(f"{python} -I could not report its import path: {result.stderr.strip()[-500:]}")
    return tuple(json.loads(result.stdout))


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL ``process``'s whole process group (it was started with
    ``start_new_session=True``) and reap it. Under bubblewrap this ends its PID namespace,
    so every process in the sandbox dies, whatever session it made for itself."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            process.kill()
    process.wait()


class _Spawner:
    """Starts sandboxed processes from one long-lived thread of this process.

    ``--die-with-parent`` follows the thread that forked bubblewrap (Linux's parent-death
    signal is per thread): started from a short-lived thread (a thread pool's, a Ray
    worker's), the sandbox would die when that thread ends. This thread ends with the
    process, which is when the sandbox should die."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        with self._lock:
            if self._executor is None or self._pid != os.getpid():  # none yet, or we were forked
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="draco-sandbox-spawner")
                self._pid = os.getpid()
            executor = self._executor
        return executor.submit(subprocess.Popen, argv, **kwargs).result()


spawn = _Spawner().popen


class ProtocolError(ValueError):
    """A line on a sandboxed process's channel that is not the protocol's: not JSON, not an
    object, longer than the channel allows, or not a message expected now. The process
    runs agent code, which can write on the channel, so this is hostile or broken input."""


class JsonLines:
    """The transport of every sandboxed process: one JSON object per line over a pair of
    pipes. Pipes need no network, so the sandbox has none; a read waits at most until a
    deadline, and EOF means the process is gone. ``max_line`` (bytes) bounds what a line
    may hold, so a flood without a newline costs no more memory than that. The caller owns
    (and closes) both ends."""

    def __init__(self, writer: BinaryIO | None, read_fd: int, max_line: int | None = None) -> None:
        self._writer = writer
        self._read_fd = read_fd
        self._max_line = max_line
        self._pending = bytearray()
        self._scanned = 0  # how much of _pending is known to hold no newline

    def fileno(self) -> int:
        """The read end, for ``select``."""
        return self._read_fd

    def send(self, message: dict) -> None:
        """Raises BrokenPipeError (an OSError) when the process is gone."""
        self._writer.write(json.dumps(message).encode() + b"\n")
        self._writer.flush()

    def receive(self, deadline: float) -> dict:
        """The next message; TimeoutError past ``deadline`` (time.monotonic), EOFError when
        the other end closed, ProtocolError on a line that is not a JSON object or is
        longer than ``max_line``."""
        while (end := self._pending.find(b"\n", self._scanned)) < 0:
            self._scanned = len(self._pending)
            if self._max_line is not None and len(self._pending) > self._max_line:
                raise ProtocolError(f"a line longer than {self._max_line:,} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self._read_fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._read_fd, 1 << 16)
            if not chunk:
                raise EOFError
            self._pending += chunk
        line = bytes(self._pending[:end])
        del self._pending[:end + 1]
        self._scanned = 0
        if self._max_line is not None and len(line) > self._max_line:
            raise ProtocolError(f"a line longer than {self._max_line:,} bytes")
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            raise ProtocolError(f"a line that is not JSON: {line[:80]!r}") from None
        if not isinstance(message, dict):
            raise ProtocolError(f"a JSON line that is not an object: {line[:80]!r}")
        return message

    def has_pending(self) -> bool:
        """Whether anything arrived that was not asked for (or the other end closed)."""
        return bool(self._pending) or bool(select.select([self._read_fd], [], [], 0)[0])
