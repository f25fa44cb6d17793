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
every interpreter start the environment asks it (over a Unix socket, handing it three pipe
ends) to fork a fresh copy, which serves that interpreter's calls and dies with it. So the
tools' module state starts fresh with each interpreter, as a replay after a restart needs,
without paying for their imports each time.

A copy talks to the interpreter directly, one request per line, ``{"call": name, "json":
"[[positional], {keyword: ...}]"}`` or, for what JSON cannot carry exactly, ``{"call":
name, "args": "((positional,), {keyword: ...})"}`` (``submit``'s args: the answer's
literal), one reply
per line, ``{"value": packed, "printed": text}`` or ``{"raised": {...}, "printed": text}``;
and reports each request to the environment, on a pipe the interpreter never holds:
``{"call": name, "ok": bool[, "error": type][, "arguments": {parameter: value}]}``,
``{"submit": literal}``, or
``{"violation": why}`` for a request no stub writes, after which the copy stops (the
environment ends the episode).
"""

from __future__ import annotations

import ast
import base64
import builtins
import contextlib
import importlib
import inspect
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


def encode_call(args: tuple, kwargs: dict) -> tuple[str, str]:
    """(format, text) for a call's arguments: ``"json"`` when JSON carries them exactly
    (most calls: text, numbers, lists and dicts with text keys; read fast), else
    ``"args"``, a Python literal of ``(args, kwargs)``."""
    try:
        text = json.dumps([list(args), kwargs])
        if json.loads(text) == [list(args), kwargs]:
            return "json", text
    except (TypeError, ValueError, RecursionError):
        pass
    return "args", literal((args, kwargs))


def parse_call(form: str, text: str) -> tuple[tuple, dict]:
    """``encode_call``'s text back to args and kwargs; ValueError when it is not that."""
    try:
        if form == "json":
            args, kwargs = json.loads(text)
            args = tuple(args) if isinstance(args, list) else args
        else:
            args, kwargs = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(f"arguments that are not a pair ({type(exc).__name__})") from None
    if not isinstance(args, tuple) or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError("arguments that are not (tuple, dict of str)")
    return args, kwargs


ARGUMENT_CHARS = 200
"""Longest text of one recorded argument value; longer ones are cut (the call still got all of it)."""


def bound_arguments(tool, positional: tuple, keywords: dict) -> dict | None:
    """The call's arguments by parameter name, defaults filled in, as the tool received them
    (``get_product("P101")`` and ``get_product(product_id="P101")`` record the same), for
    rules that check a call's target; None when they do not bind (the call raised
    TypeError). A value that is not a str, int, float, bool or None is recorded as its
    repr; text is cut at ``ARGUMENT_CHARS``."""
    try:
        bound = inspect.signature(tool).bind(*positional, **keywords)
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    return {key: _plain(value) for key, value in bound.arguments.items()}


def _plain(value):
    if value is None or isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return (value if isinstance(value, str) else repr(value))[:ARGUMENT_CHARS]


def load_tools(specs: list[str]) -> dict:
    tools = {}
    for spec in specs:
        module_name, _, qualname = spec.partition(":")
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        tools[qualname.rsplit(".", 1)[-1]] = obj
    return tools


class Served:
    """A copy's answers: each request of the interpreter gets a reply, and the environment
    a report line, written before the reply (so when the interpreter says its block is
    done, every report of the block is already in the environment's pipe)."""

    def __init__(self, tools: dict, printed_limit: int) -> None:
        self.tools = tools
        self.printed_limit = printed_limit

    def answer(self, line: str) -> tuple[dict, dict | None]:
        """(report, reply); reply None for a request no stub writes."""
        try:
            request = json.loads(line)
        except (ValueError, RecursionError):
            return {"violation": f"a line that is not JSON: {line[:80]!r}"}, None
        form = "json" if isinstance(request, dict) and "json" in request else "args"
        if not isinstance(request, dict) or set(request) != {"call", form} or not isinstance(request[form], str) \
                or (request["call"] != "submit" and request["call"] not in self.tools) \
                or (request["call"] == "submit" and form != "args"):
            return {"violation": f"a request no stub writes: {line[:120]!r}"}, None
        name, args = request["call"], request[form]
        if name == "submit":
            try:
                answer = ast.literal_eval(args)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return {"violation": "a submission that is not a literal"}, None
            del answer  # well-formed: the environment reads the same text
            return {"submit": args}, {"value": pack("Answer submitted."), "printed": ""}
        try:
            positional, keywords = parse_call(form, args)
        except ValueError as exc:
            return {"violation": str(exc)}, None
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            try:
                result = self.tools[name](*positional, **keywords)
                try:
                    reply = {"value": pack(result)}
                except TypeError as exc:
                    reply = {"raised": describe_exception(TypeError(f"{name}() returned {exc}"))}
            except BaseException as exc:  # noqa: BLE001 - the tool's failure is the agent's to see
                reply = {"raised": describe_exception(exc)}
        reply["printed"] = buffer.getvalue()[:self.printed_limit]
        report = {"call": name, "ok": "value" in reply}
        arguments = bound_arguments(self.tools[name], positional, keywords)
        if arguments is not None:
            report["arguments"] = arguments
        if "raised" in reply:
            report["error"] = reply["raised"]["type"]
        return report, reply


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


def serve(served: Served, requests: int, replies: int, reports: int, max_line: int) -> None:
    """One copy's life: answer the interpreter's calls until it closes its end; a request
    no stub writes is reported and ends the copy (the environment ends the episode)."""
    reader = os.fdopen(requests, "rb")
    writer = os.fdopen(replies, "w", buffering=1)
    report = os.fdopen(reports, "w", buffering=1)
    report.write(json.dumps({"ready": True}) + "\n")
    while True:
        line = reader.readline(max_line + 1)
        if not line:
            return
        if len(line) > max_line:
            report.write(json.dumps({"violation": f"a line longer than {max_line:,} bytes"}) + "\n")
            return
        note, reply = served.answer(line.decode(errors="replace"))
        report.write(json.dumps(note) + "\n")
        if reply is None:
            return
        writer.write(json.dumps(reply) + "\n")


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
    served = Served(tools, config["printed_limit"])
    while True:
        _, fds, _, _ = socket.recv_fds(control, 16, 3)
        if len(fds) != 3:
            return  # the environment closed its end
        pid = os.fork()
        if pid == 0:
            control.close()
            os.setsid()  # its own group: the environment kills it with whatever it started
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _die_with_parent()
            serve(served, *fds, config["max_line"])
            os._exit(0)
        for fd in fds:
            os.close(fd)
        control.sendall(f"{pid}\n".encode())


if __name__ == "__main__":
    main()
