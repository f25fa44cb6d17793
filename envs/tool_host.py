"""The tools' process of PythonTools, and the wire format of a tool call (standard library
only; run as a script by the environment, loaded by path by the sandboxed interpreter).

The tools and the task data never enter the sandbox: agent code calls stubs there, each
call travels as a JSON line to the environment, which records it and passes it here; the
tool runs in this process, outside the sandbox, with the environment's import path,
folder and environment variables (it is the user's code, trusted like the environment),
and its return value or exception travels back the same way.

Values cross as plain data: None, bools, numbers, text, bytes, and lists, tuples, sets and
dicts of them. What agent code sends (arguments, answers) is written as a Python literal
(``literal``) and read with ``ast.literal_eval``, which runs no code, by processes that do
not trust it; what the tools return is marshalled (``pack``), faster, and read only inside
the sandbox, which trusts its sender. An exception crosses as its type's name, module and
nearest built-in base class plus its arguments (``describe_exception``), and is raised in
agent code as a class of the same name derived from that base (``rebuild_exception``), so
``except LookupError`` catches a tool's ``LookupError`` subclass.

The process imports the tools once per environment and then serves as a template: for
every interpreter start the environment asks it (over a Unix socket, handing it two pipe
ends) to fork a fresh copy, which serves that interpreter's calls and dies with it. So the
tools' module state starts fresh with each interpreter, as a replay after a restart needs,
without paying for their imports each time. A copy reads one request per line,
``{"call": name, "args": "((positional,), {keyword: ...})"}``, and writes one reply per
line: ``{"value": packed, "printed": text}``, ``{"raised": {...}, "printed": text}``, or
``{"malformed": why}`` for a request that no stub writes (the environment ends the step).
"""

from __future__ import annotations

import ast
import base64
import builtins
import contextlib
import importlib
import io
import json
import marshal
import math
import os
import sys

MAX_DEPTH = 100
"""Deepest nesting of a value that crosses (ast.literal_eval's parser stops near 200)."""


def plain(value, depth: int = 0):
    """``value`` built of the exact built-in types (subclasses such as IntEnum or numpy's
    float64 become their base type); TypeError naming the type when it is not plain data."""
    if depth > MAX_DEPTH:
        raise TypeError(f"a value nested more than {MAX_DEPTH} levels deep")
    kind = type(value)
    if value is None or kind in (str, int, float, bool, bytes):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v, depth + 1) for v in value)
    if isinstance(value, (set, frozenset)):
        return {plain(v, depth + 1) for v in value}
    raise TypeError(f"a {type(value).__name__} is not plain data (None, bool, int, float, str, bytes, "
                    "and lists, tuples, sets and dicts of them)")


def literal(value) -> str:
    """``value`` as a Python literal (``ast.literal_eval`` reads it back): how what agent
    code sends crosses, read by processes that must not trust it. TypeError for what is
    not plain data, and for nan and the infinities, which have no literal."""
    text = repr(plain(value))
    if "nan" in text or "inf" in text:  # cheap test first; strings may hold the letters
        _finite(plain(value))
    return text


def _finite(value) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise TypeError(f"{value} has no literal here")
    if isinstance(value, dict):
        for k, v in value.items():
            _finite(k)
            _finite(v)
    elif isinstance(value, (list, tuple, set)):
        for v in value:
            _finite(v)


def pack(value) -> str:
    """``value`` (plain data) marshalled, as text: how what the tools return crosses into
    the sandbox, which trusts its sender; ``unpack`` reverses it."""
    return base64.b64encode(marshal.dumps(plain(value))).decode()


def unpack(text: str):
    return marshal.loads(base64.b64decode(text))


def describe_exception(exc: BaseException) -> dict:
    """What crosses for an exception: type name and module, nearest built-in base, args."""
    base = next(c for c in type(exc).__mro__ if c.__module__ == "builtins")
    try:
        args = pack(tuple(exc.args))
    except TypeError:
        args = pack((str(exc),))
    return {"type": type(exc).__name__, "module": type(exc).__module__, "builtin": base.__name__, "args": args}


_rebuilt: dict[tuple[str, str, type], type] = {}


def rebuild_exception(info: dict) -> BaseException:
    """The exception to raise in agent code for ``describe_exception``'s ``info``."""
    base = getattr(builtins, str(info.get("builtin")), None)
    if not (isinstance(base, type) and issubclass(base, BaseException)):
        base = Exception
    name, module = str(info.get("type")), str(info.get("module"))
    if module == "builtins" and name == base.__name__:
        cls = base
    else:
        key = (module, name, base)
        if key not in _rebuilt:
            _rebuilt[key] = type(name, (base,), {"__module__": module})
        cls = _rebuilt[key]
    try:
        args = unpack(info["args"])
        return cls(*args)
    except Exception:  # noqa: BLE001 - a base class whose signature the args do not fit
        return cls(*map(str, args)) if isinstance(args, tuple) else cls()


def parse_call(text: str) -> tuple[tuple, dict]:
    """``"((args,), {kwargs})"`` back to args and kwargs; ValueError when it is not that."""
    try:
        args, kwargs = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(f"arguments that are not a literal pair ({type(exc).__name__})") from None
    if not isinstance(args, tuple) or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError("arguments that are not (tuple, dict of str)")
    return args, kwargs


def load_tools(specs: list[str]) -> dict:
    tools = {}
    for spec in specs:
        module_name, _, qualname = spec.partition(":")
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        tools[qualname.rsplit(".", 1)[-1]] = obj
    return tools


def call(tools: dict, request: dict, printed_limit: int) -> dict:
    """One request's reply (never raises)."""
    name = request.get("call")
    if name not in tools or not isinstance(request.get("args"), str):
        return {"malformed": f"a call of {str(name)[:80]!r}, which is not a tool"}
    try:
        args, kwargs = parse_call(request["args"])
    except ValueError as exc:
        return {"malformed": str(exc)}
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        try:
            result = tools[name](*args, **kwargs)
            try:
                reply = {"value": pack(result)}
            except TypeError as exc:
                reply = {"raised": describe_exception(TypeError(f"{name}() returned {exc}"))}
        except BaseException as exc:  # noqa: BLE001 - the tool's failure is the agent's to see
            reply = {"raised": describe_exception(exc)}
    reply["printed"] = buffer.getvalue()[:printed_limit]
    return reply


def _die_with_parent() -> None:
    """SIGKILL when the parent process ends (Linux), even while a tool hangs."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (ImportError, OSError, AttributeError):
        pass


def serve(tools: dict, requests: int, replies: int, printed_limit: int) -> None:
    """One copy's life: answer calls on the two pipe ends until the environment closes them."""
    reader = os.fdopen(requests, "r")
    writer = os.fdopen(replies, "w", buffering=1)
    writer.write(json.dumps({"ready": True}) + "\n")
    for line in reader:
        try:
            request = json.loads(line)
        except ValueError:
            request = {}
        writer.write(json.dumps(call(tools, request if isinstance(request, dict) else {}, printed_limit)) + "\n")


def main() -> None:
    import signal
    import socket

    config = json.loads(sys.argv[1])
    sys.path[:] = config["sys_path"]  # the environment's, not this script's folder first
    _die_with_parent()
    if os.getppid() != config["parent_pid"]:
        return  # the environment ended before the death signal was armed
    control = socket.socket(fileno=config["control_fd"])
    os.dup2(2, 1)  # what tools write to fd 1 outside a call goes to the log
    tools = load_tools(config["tools"])  # a failure reaches the environment on stderr
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # copies are reaped by the kernel
    control.sendall(b"ready\n")
    while True:
        _, fds, _, _ = socket.recv_fds(control, 16, 2)
        if len(fds) != 2:
            return  # the environment closed its end
        pid = os.fork()
        if pid == 0:
            control.close()
            os.setsid()  # its own group: the environment kills it with whatever it started
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _die_with_parent()
            serve(tools, fds[0], fds[1], config["printed_limit"])
            os._exit(0)
        for fd in fds:
            os.close(fd)
        control.sendall(f"{pid}\n".encode())


if __name__ == "__main__":
    main()
