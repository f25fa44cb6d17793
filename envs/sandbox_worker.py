"""The PythonTools interpreter process (standard library only; run as a script, never imported
by the parent).

It keeps one namespace alive across code blocks, like a notebook, so variables persist from
step to step. The tools are not here: each name in the namespace is a stub with the tool's
signature and docstring that sends the call to the tools' process outside the sandbox
(``tool_host.py``, which holds the wire format) and returns the tool's result or raises
its exception; ``submit`` is a stub too. The tools' process reports every call and answer
to the environment on a pipe this process never holds. So neither the tools' code nor the
tasks' answers are importable or readable from here, and nothing written here decides the
outcome: the environment counts the submissions reported to it and compares them with
answers this process never saw.

The parent starts it inside the OS sandbox (``os_sandbox.py``) when it can; whatever the
sandbox, before any agent code runs it confines itself (``sandbox_guard.py``): resource
limits, Landlock and seccomp where the kernel has them, and the audit hook. Agent code's
stdout and stderr go to a capped buffer, not to the channel.

Messages are JSON lines. With the environment, on stdin and a private pipe (the original
stdout fd, duplicated before fd 1 is pointed at /dev/null):

    parent -> here   {"code": src, "block": n}           run block n (numbered per process)
    here -> parent   {"done": true, "block": n, "output": text, "error": name or null}

With the tools' process, on two inherited pipe ends (``tool_fds``):

    here -> tools    {"call": name, "json" or "args": text}   a stub was called; then waits for
    tools -> here    {"value": packed, "printed": text} or {"raised": {...}, "printed": text}

Wall-clock timeouts are the parent's job: it kills this process and starts a new one.
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import io
import json
import os
import sys
import threading
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"draco_{name}", os.path.join(HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


guard = _load("sandbox_guard")
wire = None  # tool_host.py, the wire format, loaded by main()
PrivateReads = guard.PrivateReads  # AppWorld's engine server loads the read rule from this file


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


class Channel:
    """The stubs' line to the tools' process: one call at a time, whatever thread makes it."""

    def __init__(self, reader, writer, max_call_chars: int) -> None:
        self.reader, self.writer = reader, writer
        self.max_call_chars = max_call_chars
        self.lock = threading.Lock()

    def call(self, name: str, form: str, args: str):
        if len(args) > self.max_call_chars:
            raise TypeError(f"{name}() was given {len(args):,} characters of arguments; at most "
                            f"{self.max_call_chars:,} cross to the tool")
        with self.lock:
            self.writer.write(json.dumps({"call": name, form: args}) + "\n")
            line = self.reader.readline()
        if not line:
            os._exit(0)  # the tools' process is gone: the environment is ending this one
        reply = json.loads(line)
        if reply.get("printed"):
            sys.stdout.write(reply["printed"])
        if "raised" in reply:
            raise wire.rebuild_exception(reply["raised"])
        return wire.unpack(reply["value"])


class _Shown:
    """A default value or annotation shown as the tool's source wrote it."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _signature(spec: dict) -> inspect.Signature:
    parameters = [
        inspect.Parameter(name, inspect._ParameterKind(kind),
                          default=inspect.Parameter.empty if default is None else _Shown(default),
                          annotation=inspect.Parameter.empty if annotation is None else _Shown(annotation))
        for name, kind, default, annotation in spec["parameters"]
    ]
    returns = spec.get("returns")
    return inspect.Signature(parameters, return_annotation=inspect.Signature.empty if returns is None else _Shown(returns))


def tool_stub(channel: Channel, spec: dict):
    """A function that looks like the tool (name, signature, docstring) and calls it."""
    name = spec["name"]

    def stub(*args, **kwargs):
        return channel.call(name, *wire.encode_call(args, kwargs))

    stub.__name__ = stub.__qualname__ = name
    stub.__module__ = "tools"
    stub.__doc__ = spec["doc"]
    stub.__signature__ = _signature(spec)
    return stub


def submit_stub(channel: Channel):
    def submit(answer=None):
        """Submit your final answer to the task."""
        try:
            text = wire.literal(answer)
        except TypeError:
            text = wire.literal(str(answer))
        return channel.call("submit", "args", text)

    submit.__module__ = "tools"
    return submit


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
            # Drop this process's own frames: the agent only needs its code's traceback.
            lines = [tb[0]] + [t for t in tb[1:] if not any(f'File "{own}"' in t for own in OWN_FILES)]
            buffer.write("".join(lines))
    return buffer.value(), error


OWN_FILES: tuple[str, ...] = ()


def main() -> None:
    global wire, OWN_FILES
    wire = _load("tool_host")
    OWN_FILES = (os.path.abspath(__file__), guard.__file__, wire.__file__)
    config = json.loads(sys.argv[1])
    os.chdir(config["workdir"])
    # From here on agent code owns fds 1 and 2; the protocol keeps a private copy of stdout.
    proto_out = os.fdopen(os.dup(1), "w", buffering=1)
    proto_in = sys.stdin
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    to_tools, from_tools = config["tool_fds"]
    channel = Channel(os.fdopen(from_tools, "r"), os.fdopen(to_tools, "w", buffering=1), config["max_call_chars"])
    namespace = {"__name__": "__agent__", "__builtins__": builtins, "submit": submit_stub(channel)}
    namespace.update({spec["name"]: tool_stub(channel, spec) for spec in config["tools"]})

    guard.set_limits(config["memory_mb"], config["cpu_s"], config["file_mb"], config["tasks"])
    # Landlock's reads: what bubblewrap binds (the system's libraries too, for extension modules)
    layers = guard.confine(workdir=config["workdir"], readable=[*config["system"], *config["readable"]],
                           hidden=config["hidden"])
    kernel_checks_paths = layers["landlock"].startswith("on") or layers["seccomp"] == "on"
    guard.AuditGuard(config["workdir"], guard.PrivateReads(config["private"], config["readable"]),
                     allow=("os.putenv", "os.unsetenv"), strict_os_open=not kernel_checks_paths).install()
    proto_out.write(json.dumps({"ready": True, "layers": layers}) + "\n")

    for line in proto_in:
        request = json.loads(line)
        output, error = run_code(request["code"], namespace, config["output_limit"])
        proto_out.write(json.dumps({"done": True, "block": request["block"], "output": output, "error": error}) + "\n")


if __name__ == "__main__":
    main()
