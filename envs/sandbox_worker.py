"""The PythonTools interpreter process (standard library only; run as a script, never imported
by the parent).

It keeps one namespace alive across code blocks, like a notebook, so variables persist from
step to step. The parent starts it inside the OS sandbox (``os_sandbox.py``: bubblewrap,
no network, read-only code, only its work folder writable, an allowlisted environment) when
it can; whatever the sandbox, before any agent code runs it confines itself too:

  - resource limits: address space (memory), CPU seconds, size of any file written;
  - an audit hook (PEP 578) that refuses process creation, signals, sockets, ctypes, any
    file write or deletion outside the episode's temporary directory, and reads of private
    places (the parent's home folder, other processes' /proc entries) outside the code
    folders it was given;
  - stdout/stderr of agent code go to a capped buffer, not to the protocol pipe.

Requests and replies are JSON lines on a private pipe (the original stdout fd, duplicated
before fd 1 is pointed at /dev/null). Wall-clock timeouts are the parent's job: it kills
this process and starts a new one.

The hook alone is a guard, not a boundary (native code can get around it); the boundary is
the OS sandbox around this process. AppWorld's engine server loads ``PrivateReads`` from
this file too, so both environments refuse the same reads.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import io
import json
import os
import resource
import sys
import traceback


class CappedBuffer(io.TextIOBase):
    """Keeps the first ``limit`` characters written and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        room = self.limit - self.size
        if room > 0:
            self.parts.append(text[:room])
        self.size += len(text)
        return len(text)

    def value(self) -> str:
        out = "".join(self.parts)
        if self.size > self.limit:
            out += f"\n[output cut: {self.size - self.limit} more characters]"
        return out


class Submission:
    """The built-in ``submit(answer)`` tool: records the agent's final answer."""

    def __init__(self) -> None:
        self.answer = None
        self.done = False

    def __call__(self, answer=None):
        self.answer, self.done = answer, True
        return "Answer submitted."


_BLOCKED_EVENTS = {
    "os.system": "running shell commands",
    "os.exec": "starting programs",
    "os.posix_spawn": "starting programs",
    "os.spawn": "starting programs",
    "os.fork": "forking",
    "os.forkpty": "forking",
    "subprocess.Popen": "starting programs",
    "os.kill": "sending signals",
    "os.killpg": "sending signals",
    "socket.__new__": "network access",
    "socket.connect": "network access",
    "socket.bind": "network access",
    "socket.getaddrinfo": "network access",
    "ctypes.dlopen": "loading native code",
    "ctypes.dlsym": "loading native code",
    "ctypes.cdata": "raw memory access",
    "os.chdir": "changing directory",
    "sys.addaudithook": "changing the sandbox",
}
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                "os.symlink", "os.link", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile"}


def _depth(path: str, roots: list[str]) -> int:
    """Length of the deepest of ``roots`` holding ``path``; -1 when none does."""
    return max((len(root) for root in roots if path == root or path.startswith(root.rstrip("/") + "/")), default=-1)


class PrivateReads:
    """Which reads the audit hook refuses: anything under a ``private`` folder (the parent's
    home; for the engine also the task files) unless a deeper ``readable`` one holds it
    (code and data bound for this process), and another process's /proc entries (its
    environment, memory, command line). The deepest matching folder decides, so a private
    folder inside a readable one stays private. Paths are resolved first, so a symlink in
    the work folder does not get around it."""

    def __init__(self, private: list[str], readable: list[str]) -> None:
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


_READ_EVENTS = {"open", "os.listdir", "os.scandir"}


def install_guard(workdir: str, reads: PrivateReads | None = None) -> None:
    root = os.path.realpath(workdir)

    def inside(path) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor was checked when it was opened
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == root or real.startswith(root + os.sep)

    def hook(event: str, args: tuple) -> None:
        if event in _BLOCKED_EVENTS:
            raise PermissionError(f"sandbox: {_BLOCKED_EVENTS[event]} is not allowed ({event})")
        if event in _READ_EVENTS and reads is not None and args and reads.refused(args[0]):
            raise PermissionError(f"sandbox: reading {args[0]!r} is not allowed")
        if event == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                flags is not None and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
            )
            if writing and path is not None and not inside(path):
                raise PermissionError(f"sandbox: writing outside the working directory is not allowed ({path})")
        elif event in _PATH_EVENTS:
            for path in args[:2]:
                if isinstance(path, (str, bytes, os.PathLike)) and not inside(path):
                    raise PermissionError(f"sandbox: changing files outside the working directory is not allowed ({path})")

    sys.addaudithook(hook)


def set_limits(memory_mb: int, cpu_s: int, file_mb: int) -> None:
    mem = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    fsize = file_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))


def load_tools(specs: list[str]) -> dict:
    tools = {}
    for spec in specs:
        module_name, _, qualname = spec.partition(":")
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        tools[qualname.rsplit(".", 1)[-1]] = obj
    return tools


def run_code(code: str, namespace: dict, output_limit: int) -> tuple[str, str | None]:
    buffer = CappedBuffer(output_limit)
    error = None
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        try:
            compiled = compile(code, "<step>", "exec")
            exec(compiled, namespace)  # noqa: S102 - running agent code is this process's job
        except MemoryError:
            error = "MemoryError"
            buffer.write("MemoryError: the step exceeded the sandbox memory limit\n")
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt included
            error = type(exc).__name__
            tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
            # Drop this file's frames: the agent only needs its own code's traceback.
            lines = [tb[0]] + [t for t in tb[1:] if __file__ not in t]
            buffer.write("".join(lines))
    return buffer.value(), error


def main() -> None:
    config = json.loads(sys.argv[1])
    sys.path[:0] = config["sys_path"]
    os.chdir(config["workdir"])
    submission = Submission()
    namespace = {"__name__": "__agent__", "__builtins__": builtins, "submit": submission}
    namespace.update(load_tools(config["tools"]))  # a failure here reaches the parent on stderr

    # From here on agent code owns fds 1 and 2; the protocol keeps a private copy of stdout.
    proto_out = os.fdopen(os.dup(1), "w", buffering=1)
    proto_in = sys.stdin
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    set_limits(config["memory_mb"], config["cpu_s"], config["file_mb"])
    install_guard(config["workdir"], PrivateReads(config["private"], config["readable"]))
    proto_out.write(json.dumps({"ready": True}) + "\n")

    for line in proto_in:
        request = json.loads(line)
        output, error = run_code(request["code"], namespace, config["output_limit"])
        reply = {"output": output, "error": error, "submitted": submission.done}
        try:
            json.dumps(submission.answer)
            reply["answer"] = submission.answer
        except (TypeError, ValueError):
            reply["answer"] = repr(submission.answer)
        proto_out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
