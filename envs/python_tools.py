"""PythonTools: any set of plain Python functions as a code-step tool-use environment.

The agent's code block runs in a separate interpreter (``sandbox_worker.py``) that keeps its
variables across steps, under a wall-clock timeout, memory/CPU/file-size/work-folder limits,
no network, no processes and no writes outside a per-episode work folder. The tools run
outside it, in a tools' process (``tool_host.py``): in the interpreter each tool is a stub
with its signature and docstring, and ``submit(answer)`` too, so the tools' code and the
tasks' answers are out of agent code's reach; the environment serves every call, records
it (``info["tool_calls"]``) and keeps the submitted answer. ``sandbox`` chooses the OS
boundary around the interpreter (``os_sandbox.py``): ``"bwrap"`` (bubblewrap), ``"guard"``
(the inner layers of ``sandbox_guard.py`` and a scrubbed environment only) or ``"auto"``
(bwrap when it can run). It is the template for plugging any other text tool-use
environment into draco-gym, and the fast environment of the unit tests.

    env = gym.make("draco_gym/PythonTools-v0")                 # the built-in shop tasks
    env = PythonToolsEnv(tools=[my_api.search, my_api.buy],    # your own tools and tasks
                         tasks=[{"id": "t1", "instruction": "...", "answer": 42}])

Tools must be importable top-level functions (the tools' process imports them by name) or
``"module:function"`` strings. A task is solved when the submitted answer equals its
``answer`` (numbers compared with a tolerance, text case- and space-insensitively).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from draco_gym.envs import os_sandbox
from draco_gym.envs.base import CodeStepEnv, Execution, WorldLost
from draco_gym.envs.os_sandbox import ProtocolError
from draco_gym.envs.state_keys import call_key, last_call
from draco_gym.registry import import_object
from draco_gym.types import Task

WORKER = os_sandbox.WORKER_SCRIPT
TOOL_HOST = WORKER.with_name("tool_host.py")

PROJECT_PACKAGES = ("draco_gym", "draco_gym.envs", "draco_gym.reward", "draco_gym.algos", "draco_gym.bench")
"""draco-gym's own code (the shop and its answers, the reward), never readable by agent code."""

MAX_CALL_CHARS = 1_000_000
"""Longest argument text one tool call may send; a stub refuses more with a TypeError."""

TASK_LIMIT = 64
"""Threads the interpreter may run at once under bubblewrap (RLIMIT_NPROC, counted in its own
user namespace; the kernel does not apply it to root). It starts no process in any mode."""


class SandboxError(RuntimeError):
    """The interpreter or the tools' process could not start, died, or stopped answering."""


@dataclass
class Block:
    """What one code block did, as the parent saw it: the interpreter's output and error,
    every tool call (``types.TOOL_CALLS``), and the answer it submitted, if any."""

    output: str = ""
    error: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    submitted: bool = False
    answer: Any = None


class _Template:
    """A running template (``tool_host.py``) and its control socket: one per tool set in a
    process, however many environments serve those tools. Each copy is a fork of the
    pristine template, so environments share nothing but its imported pages."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.control = None  # its Unix socket
        self.users = 0  # the ToolHosts that hold it
        self.lock = threading.Lock()  # one fork request at a time

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, config: dict, deadline: float) -> None:
        import socket

        self.stop()
        ours, theirs = socket.socketpair()
        try:
            self.proc = os_sandbox.spawn([sys.executable, str(TOOL_HOST.resolve()),
                                          json.dumps({**config, "control_fd": theirs.fileno()})],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         pass_fds=(theirs.fileno(),), start_new_session=True)
        finally:
            theirs.close()
        self.control = ours
        if self.line(deadline) != "ready":
            raise SandboxError(f"the tools' process failed to start:\n{_tail(self.proc)}")

    def line(self, deadline: float) -> str:
        line = b""
        while not line.endswith(b"\n"):
            self.control.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.control.recv(64)
            except (TimeoutError, OSError):
                return ""
            if not chunk:
                return ""
            line += chunk
        return line.decode().strip()

    def stop(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None


# This process's templates, by what they serve (and the process: a fork starts its own).
_TEMPLATES: dict[tuple, _Template] = {}
_TEMPLATES_LOCK = threading.Lock()


class ToolHost:
    """The tools' processes (``tool_host.py``): a template that imports the user's tools
    once, outside the sandbox, with this process's import path, folder and environment,
    and per interpreter start a fresh fork of it (a copy) that answers that interpreter's
    calls directly and reports each one here. Environments of one process that serve the
    same tools share the template (an env runner holds one environment per episode of an
    iteration: one template each was ~25 MiB apiece); no copy outlives its interpreter."""

    def __init__(self, tools: Sequence[str], printed_limit: int, max_line: int) -> None:
        self.tools = list(tools)
        self.printed_limit = printed_limit
        self.max_line = max_line
        self._template: _Template | None = None  # held from the first launch to shutdown
        self._key: tuple | None = None  # its place in _TEMPLATES
        self._pid: int | None = None  # the current copy
        self.reports: os_sandbox.JsonLines | None = None  # the copy's reports
        self._report_fd: int | None = None

    def _config(self) -> dict:
        return {"tools": self.tools, "sys_path": list(sys.path), "parent_pid": os.getpid(),
                "printed_limit": self.printed_limit, "max_line": self.max_line}

    def _hold_template(self) -> _Template:
        if self._template is None:
            config = self._config()
            key = (os.getpid(), json.dumps(config, sort_keys=True))
            with _TEMPLATES_LOCK:
                template = _TEMPLATES.setdefault(key, _Template())
                template.users += 1
            self._template, self._key = template, key
        return self._template

    def launch(self, deadline: float) -> tuple[int, int]:
        """A fresh copy of the template (started first if needed); returns the two pipe
        ends the interpreter talks to it on (to the copy, from the copy), which the
        caller passes to the interpreter and then closes."""
        import socket

        self.close()
        template = self._hold_template()
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        reports_r, reports_w = os.pipe()
        try:
            with template.lock:
                if not template.running():
                    template.start(self._config(), deadline)
                socket.send_fds(template.control, [b"fork"], [requests_r, replies_w, reports_w])
                pid = template.line(deadline)
        except BaseException:
            for fd in (requests_w, replies_r, reports_r):
                os.close(fd)
            raise
        finally:
            for fd in (requests_r, replies_w, reports_w):
                os.close(fd)
        if not pid.isdigit():
            for fd in (requests_w, replies_r, reports_r):
                os.close(fd)
            raise SandboxError(f"the tools' process did not fork a copy:\n{_tail(template.proc)}")
        self._pid, self._report_fd = int(pid), reports_r
        self.reports = os_sandbox.JsonLines(None, reports_r)
        return requests_w, replies_r

    def wait_ready(self, deadline: float) -> None:
        try:
            self.reports.receive(deadline)
        except (EOFError, ProtocolError, TimeoutError):
            raise SandboxError("the tools' process copy did not start") from None

    def close(self) -> None:
        """Kill the current copy and whatever it started."""
        if self._pid is not None:
            try:
                os.killpg(self._pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # not yet its own group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(self._pid, signal.SIGKILL)
            self._pid = None
        if self._report_fd is not None:
            os.close(self._report_fd)
        self._report_fd, self.reports = None, None

    def shutdown(self) -> None:
        """Also let go of the template, which ends with the last environment holding it."""
        self.close()
        template, self._template = self._template, None
        if template is None:
            return
        with _TEMPLATES_LOCK:
            template.users -= 1
            if template.users > 0:
                return
            _TEMPLATES.pop(self._key, None)
        with template.lock:
            template.stop()


def _tail(proc: subprocess.Popen | None) -> str:
    """The end of a dead process's stderr (empty while it runs)."""
    if proc is None or proc.stderr is None:
        return ""
    try:
        if proc.poll() is None:
            os_sandbox.kill_group(proc)
        return proc.stderr.read().decode(errors="replace")[-2000:].strip()
    except (OSError, ValueError):
        return ""


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    os_sandbox.kill_group(proc)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


class SandboxedInterpreter:
    """One interpreter process with a private work folder, inside the OS sandbox when
    ``mode`` is ``"bwrap"`` (an already resolved mode: ``"bwrap"`` or ``"guard"``), and its
    tools' process outside it. ``run`` relays the block's tool calls between the two,
    recording each, and keeps the answers ``submit`` sent.

    What the interpreter may read: the system's library folders, the interpreter and the
    import path it starts with, its own three scripts, and ``read_only`` (data for agent
    code); never ``hidden``: draco-gym's packages and the tools' and tasks' modules, where
    they lie inside those folders (a non-editable install puts them in site-packages)."""

    def __init__(
        self,
        tools: Sequence[dict[str, Any]],
        *,
        mode: str = "guard",
        read_only: Sequence[str] = (),
        hidden_modules: Sequence[str] = (),
        memory_mb: int = 1024,
        cpu_s: int = 120,
        file_mb: int = 16,
        workdir_mb: int = 128,
        output_limit: int = 100_000,
        start_timeout_s: float = 30.0,
    ) -> None:
        if mode not in ("bwrap", "guard"):
            raise ValueError(f"SandboxedInterpreter mode must be 'bwrap' or 'guard' (resolve 'auto' first), got {mode!r}")
        self.tools = list(tools)
        self.mode = mode
        self.limits = {"memory_mb": memory_mb, "cpu_s": cpu_s, "file_mb": file_mb, "output_limit": output_limit,
                       "max_call_chars": MAX_CALL_CHARS, "tasks": TASK_LIMIT if mode == "bwrap" else None}
        self.workdir_mb = workdir_mb
        self.start_timeout_s = start_timeout_s
        scripts = [str(p.resolve()) for p in (WORKER, os_sandbox.GUARD_MODULE, TOOL_HOST)]
        self.readable = sorted({*os_sandbox.interpreter_paths(sys.executable),
                                *os_sandbox.code_paths(os_sandbox.isolated_sys_path(sys.executable)),
                                *scripts, *(os.path.realpath(p) for p in read_only)})
        self.hidden = module_locations([*PROJECT_PACKAGES, *hidden_modules])
        # a done line holds up to output_limit characters, a call MAX_CALL_CHARS, each at
        # most 12 bytes once JSON-escaped; anything longer is a flood
        self.max_line = 12 * max(output_limit, MAX_CALL_CHARS) + 4096
        self.workdir: str | None = None
        self.layers: dict[str, str] = {}
        self.tool_calls: list[dict[str, Any]] = []  # the current (or last) block's, as they happen
        self._proc: subprocess.Popen | None = None
        self._channel: os_sandbox.JsonLines | None = None
        self._blocks_sent = 0  # per process: a done line names its block, so a stale or early one is caught
        self._tool_host = ToolHost([tool["spec"] for tool in self.tools], output_limit, self.max_line)

    def start(self) -> None:
        self.close()
        if self.mode == "bwrap":  # an in-memory folder of the sandbox, of a fixed size
            self.workdir = os.path.join(os.path.realpath(tempfile.gettempdir()),
                                        f"draco_pythontools_{secrets.token_hex(6)}")
        else:
            self.workdir = os.path.realpath(tempfile.mkdtemp(prefix="draco_pythontools_"))
        config = {**self.limits, "tools": [{k: v for k, v in t.items() if k != "spec"} for t in self.tools],
                  "workdir": self.workdir, "readable": self.readable, "hidden": self.hidden,
                  "system": [*os_sandbox.SYSTEM_DIRS, *os_sandbox.SYSTEM_FILES],
                  "private": [*os_sandbox.private_folders(), *self.hidden]}
        argv = [sys.executable, "-I", "-B", str(WORKER.resolve()), json.dumps(config)]
        env = os_sandbox.allowlisted_env(self.workdir)  # never the parent's: it holds API keys
        if self.mode == "bwrap":
            argv = os_sandbox.bwrap_command(argv, workdir=self.workdir, read_only=self.readable, env=env,
                                            private_workdir=True, workdir_mb=self.workdir_mb, hidden=self.hidden)
        popen = os_sandbox.spawn if self.mode == "bwrap" else subprocess.Popen
        deadline = time.monotonic() + self.start_timeout_s
        try:
            tool_fds = self._tool_host.launch(deadline)
        except SandboxError:
            self.close()
            raise
        config["tool_fds"] = list(tool_fds)
        argv[-1] = json.dumps(config)  # the worker's argument, last (after bwrap's "--")
        try:
            self._proc = popen(
                argv,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=tool_fds,
                cwd="/" if self.mode == "bwrap" else self.workdir,
                start_new_session=True,  # its own process group, so close() kills anything it left
            )
        finally:
            for fd in tool_fds:
                os.close(fd)
        self._channel = os_sandbox.JsonLines(self._proc.stdin, self._proc.stdout.fileno(), max_line=self.max_line)
        self._blocks_sent = 0
        try:
            ready = self._channel.receive(deadline)
            self.layers = dict(ready.get("layers", {}))
            self._tool_host.wait_ready(deadline)
        except (EOFError, TimeoutError, ProtocolError) as exc:
            stderr = _tail(self._proc)
            self.close()
            reason = "it did not start in time" if isinstance(exc, TimeoutError) else "it exited"
            raise SandboxError(f"the PythonTools interpreter failed to start ({reason})\n{stderr}".rstrip()) from None
        except SandboxError:
            self.close()
            raise

    def run(self, code: str, timeout_s: float) -> Block:
        """Run one block; the tools' process serves its calls and reports them here.
        Raises TimeoutError (both processes killed), SandboxError (one died) or
        ProtocolError (something on a channel the protocol does not allow: the processes
        are killed, the block's submission is not kept)."""
        if self._proc is None:
            raise SandboxError("the interpreter is not running")
        if self._proc.poll() is not None:
            raise SandboxError(self._death())
        block = Block()
        self.tool_calls = block.tool_calls
        self._blocks_sent += 1
        try:
            self._channel.send({"code": code, "block": self._blocks_sent})
        except OSError as exc:
            raise SandboxError(f"the interpreter stopped accepting code ({exc})") from None
        deadline = time.monotonic() + timeout_s
        worker_fd, report_fd = self._proc.stdout.fileno(), self._tool_host.reports.fileno()
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                ready, _, _ = select.select([worker_fd, report_fd], [], [], remaining)
                if report_fd in ready:
                    self._take_reports(block, deadline)
                if worker_fd in ready:
                    try:
                        message = self._channel.receive(deadline)
                    except EOFError:
                        self._take_reports(block, time.monotonic(), quiet_end=True)  # a violation explains it
                        raise SandboxError(self._death()) from None
                    if set(message) != {"done", "block", "output", "error"} or message["done"] is not True \
                            or message["block"] != self._blocks_sent or not isinstance(message["output"], str) \
                            or not isinstance(message["error"], (str, type(None))):
                        raise ProtocolError(f"an unexpected message {json.dumps(message)[:120]}")
                    self._take_reports(block, time.monotonic())  # written before the block's last reply
                    block.output, block.error = message["output"], message["error"]
                    return block
        except (TimeoutError, ProtocolError, SandboxError):
            self.close()
            raise
        except OSError as exc:
            self.close()
            raise SandboxError(f"the interpreter stopped reading ({exc})") from None

    def _take_reports(self, block: Block, deadline: float, quiet_end: bool = False) -> None:
        """The reports the tools' copy has written, into ``block``: waiting until
        ``deadline`` for the first, then only those already in the pipe. The copy's end
        is a SandboxError unless ``quiet_end`` (the interpreter ended first)."""
        while True:
            try:
                report = self._tool_host.reports.receive(deadline)
            except TimeoutError:
                return
            except EOFError:
                if quiet_end:
                    return
                raise SandboxError("the tools' process died") from None
            if "violation" in report:
                raise ProtocolError(str(report["violation"]))
            if "submit" in report:
                block.answer, block.submitted = ast.literal_eval(report["submit"]), True
                block.tool_calls.append({"name": "submit", "ok": True})
            else:
                block.tool_calls.append({"name": report["call"], "ok": report["ok"],
                                         **{k: report[k] for k in ("error", "arguments") if k in report}})
            deadline = time.monotonic()

    def _death(self) -> str:
        """One message for a dead interpreter, whether its exit was seen before or after
        sending; a process that closed the channel but lives on is killed first."""
        if self._proc.poll() is None:
            try:
                self._proc.wait(1.0)
            except subprocess.TimeoutExpired:
                os_sandbox.kill_group(self._proc)
                return "the interpreter closed its channel"
        code = self._proc.wait()
        reason = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return f"the interpreter died ({reason})"

    def close(self) -> None:
        """Kill both processes (and, under bubblewrap, everything in the sandbox) and
        remove the work folder."""
        _stop(self._proc)
        self._proc, self._channel = None, None
        self._tool_host.close()
        if self.workdir is not None:
            if self.mode == "guard":
                shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def shutdown(self) -> None:
        """``close``, and end the tools' template process too (the environment is done)."""
        self.close()
        self._tool_host.shutdown()


def module_locations(modules: Sequence[str]) -> list[str]:
    """The folders of every package on the modules' paths (``a``, ``a.b`` for ``a.b.c``)
    and the modules' files with their compiled copies: what would reveal their code."""
    import importlib.util

    found: set[str] = set()
    for name in modules:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            try:
                module_spec = importlib.util.find_spec(".".join(parts[:i]))
            except (ImportError, ValueError):
                continue
            if module_spec is None:
                continue
            found.update(os.path.realpath(p) for p in module_spec.submodule_search_locations or ())
            origin = module_spec.origin
            if origin and os.path.exists(origin):
                found.add(os.path.realpath(origin))
                cached = module_spec.cached
                if cached and os.path.exists(cached):
                    found.add(os.path.realpath(cached))
    return sorted(found)


def tool_spec(tool: Callable | str) -> str:
    """``"module:qualname"`` for a tool, checking the worker will be able to import it."""
    if isinstance(tool, str):
        if ":" not in tool:
            raise ValueError(f"tool {tool!r} must be written 'module:function'")
        return tool
    module, qualname = getattr(tool, "__module__", None), getattr(tool, "__qualname__", "")
    if not callable(tool) or module is None or "<" in qualname or module == "__main__":
        raise ValueError(
            f"tool {tool!r} must be a top-level function of an importable module "
            "(not a lambda, a nested function or a function defined in __main__)"
        )
    return f"{module}:{qualname}"


def _resolve(tool: Callable | str) -> Callable:
    return import_object(tool, "tool") if isinstance(tool, str) else tool


def describe_tool(tool: Callable | str) -> str:
    """One tool's signature and docstring, as the agent sees it."""
    tool = _resolve(tool)
    doc = inspect.getdoc(tool) or ""
    return f"{tool.__name__}{_signature(tool)}\n" + "\n".join(f"    {line}" for line in doc.splitlines())


def _signature(function: Callable) -> inspect.Signature:
    """The signature with its annotations evaluated, so a module under ``from __future__
    import annotations`` shows ``count: int``, not ``count: 'int'``; as written where one
    names something the module cannot resolve."""
    try:
        return inspect.signature(function, eval_str=True)
    except Exception:  # noqa: BLE001 - NameError and whatever an annotation's expression raises
        return inspect.signature(function)


def stub_description(tool: Callable | str) -> dict[str, Any]:
    """What the interpreter needs to build a tool's stub: its spec (for the tools' process),
    name, docstring and signature as text (parameters: name, kind, default, annotation)."""
    spec, function = tool_spec(tool), _resolve(tool)
    signature = _signature(function)
    shown = lambda value: None if value is inspect.Parameter.empty else inspect.formatannotation(value)  # noqa: E731
    parameters = [[p.name, int(p.kind), None if p.default is p.empty else repr(p.default), shown(p.annotation)]
                  for p in signature.parameters.values()]
    return {"spec": spec, "name": spec.rpartition(":")[2].rpartition(".")[2], "doc": inspect.getdoc(function),
            "parameters": parameters, "returns": shown(signature.return_annotation)}


def answers_match(submitted: Any, expected: Any) -> bool:
    """Numbers within 1e-6 (relative), everything else as case- and space-insensitive text."""
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        try:
            value = float(str(submitted).replace(",", "").strip())
        except (TypeError, ValueError):
            return False
        return abs(value - expected) <= 1e-6 * max(1.0, abs(expected))
    normal = lambda x: " ".join(str(x).split()).lower()  # noqa: E731
    return normal(submitted) == normal(expected)


PROMPT = """You are an agent that solves tasks by writing Python code.

Each of your messages may contain one Python code block (```python ... ```). It runs in a
persistent Python session, and what it prints comes back to you. Variables persist between
your messages. Print what you need to see; explore before you answer.

These functions are available in the session:

{tools}

submit(answer)
    Submit your final answer to the task. Call it exactly once, when you are sure.

{ending}

Task: {instruction}"""
ENDINGS = {"no_code": "After submitting, reply with a short message without a code block to finish.",
           "task_completed": "The episode ends as soon as submit has been called."}
"""The prompt's last instruction, by ``end_rule``: what ends an episode."""


class PythonToolsEnv(CodeStepEnv):
    """Plain Python functions as tools; one step is one assistant message whose code block
    runs in a persistent, sandboxed interpreter (see the module docstring). Without
    ``tools``, the built-in shop (``draco_gym.envs.shop``: products, customers and orders
    behind paged lookups, and tasks with exact answers) is the world. Deterministic given
    the code, so episodes can be restored (``can_restore``).

    ## Action space
    ``UnicodeText``: the assistant message. Its one ```` ```python ```` block (or
    ``<code>...</code>``) runs; several blocks follow ``multi_block``.

    ## Observation space
    ``UnicodeText``: at reset the agent prompt (the tools' signatures and docstrings,
    ``submit(answer)``, the task); after a step what the block printed, its traceback, or a
    parse error, cut to ``output_limit`` by the interpreter and in the middle to
    ``max_observation_chars``. A block that runs past ``step_timeout_s`` or kills the
    interpreter is reported failed; the interpreter is restarted and the episode's earlier
    blocks re-run, so the agent's variables survive.

    ## Tool calls
    ``info["tool_calls"]`` (``draco_gym.types.TOOL_CALLS``) of a step that ran code lists
    its calls in order as the environment served them, ``{"name", "ok"}`` plus ``"error"``
    (the exception's type) when the tool raised and ``"arguments"`` (by parameter name,
    defaults filled in, as the tool received them) when they bound to its signature;
    ``submit`` included.

    ## Rewards
    Always 0: rewards come from the rubric layer. ``info["metrics"]`` at the end holds
    ``submitted``, ``answer`` and, when the task has an ``answer``, ``success`` (numbers
    within 1e-6 relative, text case- and space-insensitively).

    ## Episode end
    Terminated: ``no_code`` (a message without code, under ``end_rule="no_code"``),
    ``submitted`` (``submit`` called, under ``end_rule="task_completed"``), ``env_error``
    (the interpreter could not be restarted and replayed, or wrote on its channel what
    the protocol does not allow). Truncated: ``max_turns`` messages.
    ``info["trajectory"]`` holds the episode at its end.

    ## State key
    ``info["state_key"]`` (``draco_gym.types.STATE_KEY``) names the state the step was
    taken in: the last tool call, with its arguments as written (``get_order('O1001')``),
    of a block that ran without error (``"start"`` before any), read from the code. Steps
    of a group with equal keys are compared by TRCA's credit.

    ## Task metadata for the rule rubric
    A task may declare its operator library, ``metadata["operators"]`` (the tool calls it
    needs: ``{"evidence": [...], "execution": [...]}``); the shop's tasks do. The tools'
    documentation is in the prompt, so no ``api_docs`` is declared.

    ## Arguments
    ``tools``: top-level functions or ``"module:function"`` strings (default: the shop's).
    ``tasks``: ``Task`` objects or ``{"id", "instruction", "answer"}`` dicts, or a
    ``"module:function"`` returning them (e.g. ``"draco_gym.envs.shop:purchase_tasks"``,
    the shop's easier tier) (default: the shop's when ``tools`` is not given; required
    otherwise); a task's ``metadata["reference"]`` (code blocks) is its reference solution
    (``reference_messages``); ``options={"task_id": ...}``
    at reset picks one, else the reset seed draws one.
    ``step_timeout_s`` (10) bounds one block's wall-clock time; ``memory_mb`` (1024),
    ``cpu_s`` (120), ``file_mb`` (16) are the interpreter's resource limits, ``workdir_mb``
    (128) the size of its in-memory work folder under bubblewrap (under the guard the
    folder is on disk and only each file is capped), and ``output_limit`` (100,000
    characters) caps what one block prints.
    ``sandbox`` (``"auto"``, ``"bwrap"``, ``"guard"``; see ``draco_gym.envs.os_sandbox``) is
    the OS boundary around the interpreter, resolved here: ``"bwrap"`` raises
    ``SandboxUnavailable`` when bubblewrap cannot run, ``"guard"`` (chosen, or ``"auto"``
    falling back to it) warns once; ``env.sandbox`` says which was chosen.
    ``read_only_paths`` adds files or folders agent code itself may read (the tools run
    outside the sandbox and read what they need).
    ``end_rule``, ``max_turns``, ``max_observation_chars``, ``multi_block``, ``languages``,
    ``render_mode`` ("ansi") as in ``CodeStepEnv``.

    ## Version history
    - v0: the initial version; since this release each step's info carries ``state_key``
      and the shop's tasks declare ``operators`` (additions only: episodes, observations
      and metrics are unchanged). Tools run outside the sandbox behind stubs: their
      arguments and results are plain data, their tracebacks stay on the tools' side, each
      step's info carries ``tool_calls``, and a channel line that is not the protocol's
      ends the episode (``env_error``).
    """

    can_restore = True
    names_states = True

    def __init__(
        self,
        tools: Sequence[Callable | str] | None = None,
        tasks: Sequence[Task | dict] | None = None,
        *,
        step_timeout_s: float = 10.0,
        memory_mb: int = 1024,
        cpu_s: int = 120,
        file_mb: int = 16,
        workdir_mb: int = 128,
        output_limit: int = 100_000,
        sandbox: os_sandbox.SandboxMode = "auto",
        read_only_paths: Sequence[str | os.PathLike] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        os_sandbox.check_mode(sandbox)
        tasks_module: list[str] = []
        if isinstance(tasks, str):
            tasks_module = [tasks.partition(":")[0]]
            tasks = import_object(tasks, "tasks")()
        if tools is None:
            from draco_gym.envs import shop

            tools = shop.TOOLS
            tasks = shop.tasks() if tasks is None else tasks
        if not tasks:
            raise ValueError("PythonToolsEnv needs tasks: a list of Task objects or {'id', 'instruction', 'answer'} dicts")
        if step_timeout_s <= 0:
            raise ValueError(f"step_timeout_s must be > 0, got {step_timeout_s}")
        self.step_timeout_s = step_timeout_s
        stubs = [stub_description(t) for t in tools]
        self._tool_docs = "\n\n".join(describe_tool(t) for t in tools)
        self._tasks = {t.id: t for t in (self._as_task(x) for x in tasks)}
        self.sandbox = os_sandbox.resolve_mode(sandbox, "PythonTools")
        tool_modules = [stub["spec"].partition(":")[0] for stub in stubs]
        self._interpreter = SandboxedInterpreter(
            stubs, mode=self.sandbox, read_only=[str(p) for p in read_only_paths],
            hidden_modules=[*tool_modules, *tasks_module], memory_mb=memory_mb, cpu_s=cpu_s, file_mb=file_mb,
            workdir_mb=workdir_mb, output_limit=output_limit)
        self._answer: Any = None
        self._submitted = False
        self._lost_calls: list[dict[str, Any]] = []
        self._tool_names = {stub["name"] for stub in stubs}

    @property
    def task_ids(self) -> list[str]:
        return list(self._tasks)

    @property
    def sandbox_layers(self) -> dict[str, str]:
        """The kernel layers the interpreter confined itself with, as it reported before
        running agent code: ``{"landlock": "on (ABI 7)", "seccomp": "on"}``, or why each is
        off (empty before the first reset)."""
        return dict(self._interpreter.layers)

    @staticmethod
    def _as_task(item: Task | dict) -> Task:
        if isinstance(item, Task):
            return item
        if not isinstance(item, dict) or "id" not in item or "instruction" not in item:
            raise ValueError(f"a task must be a Task or a dict with 'id' and 'instruction', got {item!r}")
        metadata = dict(item.get("metadata", {}))
        if "answer" in item:
            metadata["answer"] = item["answer"]
        return Task(id=str(item["id"]), instruction=item["instruction"], metadata=metadata)

    def reference_messages(self, task_id: str) -> list[str]:
        """The assistant messages of ``task_id``'s reference solution (the code blocks in its
        ``metadata["reference"]``, fenced, then under ``end_rule="no_code"`` a closing
        message), or [] when the task has none. Demonstrations for ``draco-gym sft``."""
        if task_id not in self._tasks:
            raise ValueError(f"unknown task_id {task_id!r}; this environment has {len(self._tasks)} tasks, "
                             f"e.g. {self.task_ids[:3]}")
        blocks = self._tasks[task_id].metadata.get("reference") or []
        messages = [f"```python\n{block}\n```" for block in blocks]
        if messages and self.end_rule == "no_code":
            messages.append("Submitted.")
        return messages

    def _start(self, seed: int | None, options: dict[str, Any]) -> Task:
        unknown = set(options) - {"task_id"}
        if unknown:
            raise ValueError(f"unknown reset options {sorted(unknown)}; PythonTools accepts 'task_id'")
        if "task_id" in options:
            task_id = options["task_id"]
            if task_id not in self._tasks:
                raise ValueError(f"unknown task_id {task_id!r}; this environment has {len(self._tasks)} tasks, "
                                 f"e.g. {self.task_ids[:3]}")
        else:
            task_id = self.task_ids[int(self.np_random.integers(len(self._tasks)))]
        task = self._tasks[task_id]
        self._interpreter.start()
        self._answer, self._submitted = None, False
        prompt = PROMPT.format(tools=self._tool_docs, ending=ENDINGS[self.end_rule], instruction=task.instruction)
        return task.model_copy(update={"agent_prompt": prompt})

    def _state_key_after(self, code: str) -> str | None:
        """The last call of one of the tools in the block, with its arguments as written."""
        called = last_call(code, self._tool_names.__contains__)
        return None if called is None else call_key(*called)

    def _execute(self, code: str) -> Execution:
        try:
            return super()._execute(code)
        except ProtocolError as exc:
            return Execution(output=f"Environment error: the interpreter's channel carried {exc}, which no tool "
                                    "call writes. The episode ends.", error="ProtocolError", fatal=True,
                             tool_calls=list(self._interpreter.tool_calls))

    def _run(self, code: str) -> Execution:
        try:
            block = self._interpreter.run(code, self.step_timeout_s)
        except TimeoutError:
            self._lost_calls = list(self._interpreter.tool_calls)
            raise WorldLost(f"TimeoutError: the code ran longer than {self.step_timeout_s:g} s and was stopped.",
                            "TimeoutError") from None
        except SandboxError as exc:
            self._lost_calls = list(self._interpreter.tool_calls)
            raise WorldLost(f"Error: {exc}.", "SandboxError") from None
        if block.submitted:
            self._answer, self._submitted = block.answer, True
        return Execution(output=block.output, error=block.error, submitted=block.submitted,
                         tool_calls=block.tool_calls)

    def _restart(self) -> None:
        self._interpreter.start()
        self._answer, self._submitted = None, False  # the replay submits again what it submitted

    def _lost_block(self, lost: WorldLost, failure: str | None) -> Execution:
        """The lost block's tool calls did happen (the tools' process served them); its
        submission, if any, is not kept, and the replay brought back the earlier ones."""
        if failure is not None:
            return Execution(output=f"{lost}\nThe session could not be restored ({failure}).", error=lost.error,
                             fatal=True, tool_calls=self._lost_calls)
        restored = " Earlier steps were re-run, so their variables are back." if self._executed else ""
        return Execution(output=f"{lost} The Python session was restarted.{restored}", error=lost.error,
                         tool_calls=self._lost_calls)

    def _evaluate(self) -> dict[str, Any]:
        expected = self.task.metadata.get("answer")
        metrics: dict[str, Any] = {"submitted": self._submitted, "answer": self._answer}
        if expected is not None:
            metrics["success"] = self._submitted and answers_match(self._answer, expected)
        return metrics

    def close(self) -> None:
        self._interpreter.shutdown()
        super().close()

    def __del__(self) -> None:
        try:
            self._interpreter.shutdown()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
