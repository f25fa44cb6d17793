"""The OS boundary around every process that runs agent code (PythonTools' interpreter and
AppWorld's engine servers), built once here for both.

Agent code is written by a policy under optimisation pressure, and what it prints is logged,
saved in trajectories and sent to a third-party judge. So a process that runs it gets:

  - ``"bwrap"``: a bubblewrap sandbox. Fresh user, PID, network, IPC, UTS and cgroup
    namespaces (no network at all: the parent talks to it over pipes or a Unix socket in
    its work folder); a read-only root holding only the system's program and library
    folders and the paths the caller names (interpreter, virtual environments, tools' code,
    task data); the process's own work folder as the one writable place; a private /proc
    (its own processes only) and a minimal /dev; no home folder; an environment built from
    an allowlist; killed with its parent (``--die-with-parent``).
  - ``"guard"``: no OS boundary, for machines without bubblewrap (macOS, containers without
    user namespaces). The process still gets the allowlisted environment, and its audit
    hook (always on, in both modes: the inner layer) refuses writes outside the work
    folder, processes, sockets and reads of the home folder and of other processes' /proc
    entries. Reads anywhere else remain possible; a single warning says so.
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
"""PythonTools' interpreter, and the home of the read rule both environments' hooks apply."""

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
    probe = [path, "--unshare-all", "--die-with-parent", *_system_binds(), "--proc", "/proc", "--dev", "/dev",
             "--remount-ro", "/", "--", "true"]
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
            "(no API keys) and an audit hook refusing writes outside the work folder, processes, sockets and "
            "reads of the home folder and of other processes' /proc entries. Not isolated: reads of any other "
            "file this user can read (project files, /etc, other users' readable files), and native code that "
            f"bypasses Python's audit hooks. For the OS boundary, {INSTALL_HINT}.",
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
    symlinks: Mapping[str, str] | None = None,
) -> list[str]:
    """``argv`` wrapped in bubblewrap: see the module docstring for what it gets.

    Paths are bound at their real location, so the caller passes real paths in ``argv``
    and configuration; ``workdir`` (the one writable folder) is also the working folder.
    It is the host folder of that name, or with ``private_workdir`` an empty in-memory
    folder that exists only inside the sandbox (nothing is left on the host, even when the
    sandbox is killed). ``symlinks`` (link -> target) are made inside it."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"bubblewrap (`bwrap`) is not on PATH; {INSTALL_HINT}")
    # --cap-drop ALL: started by root, bubblewrap would keep every capability inside, and a
    # process could remount a read-only bind writable and write to the host's folder
    command = [bwrap, "--unshare-all", "--die-with-parent", "--clearenv", "--cap-drop", "ALL", *_system_binds(),
               "--proc", "/proc", "--dev", "/dev"]
    for path in sorted({os.path.realpath(p) for p in read_only if os.path.exists(p)}, key=len):
        command += ["--ro-bind", path, path]
    if private_workdir:
        command += ["--tmpfs", workdir]
    else:
        workdir = os.path.realpath(workdir)
        command += ["--bind", workdir, workdir]
    for link, target in (symlinks or {}).items():
        command += ["--symlink", target, link]
    command += ["--remount-ro", "/", "--chdir", workdir]
    for name, value in env.items():
        command += ["--setenv", name, value]
    return [*command, "--", *argv]


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


class JsonLines:
    """The transport of every sandboxed process: one JSON object per line over a pair of
    pipes. Pipes need no network, so the sandbox has none; a read waits at most until a
    deadline, and EOF means the process is gone. The caller owns (and closes) both ends."""

    def __init__(self, writer: BinaryIO, read_fd: int, max_line_bytes: int = 64 * 2**20) -> None:
        self._writer = writer
        self._read_fd = read_fd
        self._pending = b""
        self.max_line_bytes = max_line_bytes

    def send(self, message: dict) -> None:
        """Raises BrokenPipeError (an OSError) when the process is gone."""
        self._writer.write(json.dumps(message).encode() + b"\n")
        self._writer.flush()

    def receive(self, deadline: float) -> dict:
        """The next message; TimeoutError past ``deadline`` (time.monotonic), EOFError when
        the other end closed, ValueError on a line that is not JSON or longer than
        ``max_line_bytes`` (read no further than that: a flood costs no more memory)."""
        while b"\n" not in self._pending:
            if len(self._pending) > self.max_line_bytes:
                raise ValueError(f"a line longer than {self.max_line_bytes} bytes")
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
        line, _, self._pending = self._pending.partition(b"\n")
        if len(line) > self.max_line_bytes:
            raise ValueError(f"a line longer than {self.max_line_bytes} bytes")
        return json.loads(line)

    def has_pending(self) -> bool:
        """Whether anything arrived that was not asked for (or the other end closed)."""
        return bool(self._pending) or bool(select.select([self._read_fd], [], [], 0)[0])
