"""The tools' process of PythonTools, and the wire format of a tool call (standard library
only; run as a script by the environment, loaded by path by the sandboxed interpreter).

The tools and the task data never enter the sandbox: agent code calls stubs there, each
call travels as a JSON line to the environment, which records it and passes it here; the
tool runs in this process, outside the sandbox, with the environment's import path,
folder and environment variables (it is the user's code, trusted like the environment),
and its return value or exception travels back the same way.

Values cross as plain data written as Python literals (``literal``, read back with
``ast.literal_eval``, which runs no code): None, bools, numbers, text, bytes, and lists,
tuples, sets and dicts of them. An exception crosses as its type's name, module and
nearest built-in base class plus its arguments (``describe_exception``), and is raised in
agent code as a class of the same name derived from that base (``rebuild_exception``), so
``except LookupError`` catches a tool's ``LookupError`` subclass.

The process imports the tools once per environment and then serves as a template: for
every interpreter start the environment asks it (over a Unix socket, handing it two pipe
ends) to fork a fresh copy, which serves that interpreter's calls and dies with it. So the
tools' module state starts fresh with each interpreter, as a replay after a restart needs,
without paying for their imports each time. A copy reads one request per line,
``{"call": name, "args": "((positional,), {keyword: ...})"}``, and writes one reply per
line: ``{"value": literal, "printed": text}``, ``{"raised": {...}, "printed": text}``, or
``{"malformed": why}`` for a request that no stub writes (the environment ends the step).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import io
import json
import math
import os
import sys

MAX_DEPTH = 100
"""Deepest nesting of a value that crosses (ast.literal_eval's parser stops near 200)."""


def literal(value, depth: int = 0) -> str:
    """``value`` as a Python literal; TypeError naming the type when it is not plain data.
    Subclasses of the built-in types (IntEnum, numpy's float64) cross as their base type."""
    if depth > MAX_DEPTH:
        raise TypeError(f"a value nested more than {MAX_DEPTH} levels deep")
    if value is None or value is True or value is False:
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        number = float(value)
        if math.isnan(number):
            raise TypeError("nan is not plain data here (no literal for it)")
        return ("1e999" if number > 0 else "-1e999") if math.isinf(number) else repr(number)
    if isinstance(value, str):
        return repr(str(value))
    if isinstance(value, (bytes, bytearray)):
        return repr(bytes(value))
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k, depth + 1)}: {literal(v, depth + 1)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [literal(v, depth + 1) for v in value]
        if isinstance(value, list):
            return "[" + ", ".join(items) + "]"
        if isinstance(value, tuple):
            return "(" + "".join(f"{item}, " for item in items) + ")"
        return "{" + ", ".join(items) + "}" if items else "set()"
    raise TypeError(f"a {type(value).__name__} is not plain data (None, bool, int, float, str, bytes, "
                    "and lists, tuples, sets and dicts of them)")


def describe_exception(exc: BaseException) -> dict:
    """What crosses for an exception: type name and module, nearest built-in base, args."""
    base = next(c for c in type(exc).__mro__ if c.__module__ == "builtins")
    try:
        args = literal(tuple(exc.args))
    except TypeError:
        args = literal((str(exc),))
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
        return cls(*ast.literal_eval(info.get("args", "()")))
    except Exception:  # noqa: BLE001 - a base class whose signature the args do not fit
        return cls(str(info.get("args")))


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
                reply = {"value": literal(result)}
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
