"""PythonTools: any set of plain Python functions as a code-step tool-use environment.

The agent's code block runs in a separate interpreter (``sandbox_worker.py``) that keeps its
variables across steps, has the tools and a ``submit(answer)`` function in scope, and runs
under a wall-clock timeout, memory/CPU/file-size limits, no network, no subprocesses and no
writes outside a per-episode temporary directory. ``sandbox`` chooses the OS boundary around
it (``os_sandbox.py``): ``"bwrap"`` (bubblewrap), ``"guard"`` (audit hook and scrubbed
environment only) or ``"auto"`` (bwrap when it can run). It is the template for plugging any
other text tool-use environment into draco-gym, and the fast environment of the unit tests.

    env = gym.make("draco_gym/PythonTools-v0")                 # the built-in shop tasks
    env = PythonToolsEnv(tools=[my_api.search, my_api.buy],    # your own tools and tasks
                         tasks=[{"id": "t1", "instruction": "...", "answer": 42}])

Tools must be importable top-level functions (the worker imports them by name) or
``"module:function"`` strings. A task is solved when the submitted answer equals its
``answer`` (numbers compared with a tolerance, text case- and space-insensitively).
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from draco_gym.envs import os_sandbox
from draco_gym.envs.base import CodeStepEnv, Execution, WorldLost
from draco_gym.envs.state_keys import call_key, last_call
from draco_gym.types import Task

WORKER = os_sandbox.WORKER_SCRIPT


class SandboxError(RuntimeError):
    """The interpreter process could not start, died, or stopped answering."""


class SandboxedInterpreter:
    """One interpreter process with a private temporary directory, inside the OS sandbox
    when ``mode`` is ``"bwrap"`` (an already resolved mode: ``"bwrap"`` or ``"guard"``)."""

    def __init__(
        self,
        tools: Sequence[str],
        *,
        mode: str = "guard",
        read_only: Sequence[str] = (),
        memory_mb: int = 1024,
        cpu_s: int = 120,
        file_mb: int = 16,
        output_limit: int = 100_000,
        start_timeout_s: float = 30.0,
    ) -> None:
        if mode not in ("bwrap", "guard"):
            raise ValueError(f"SandboxedInterpreter mode must be 'bwrap' or 'guard' (resolve 'auto' first), got {mode!r}")
        self.tools = list(tools)
        self.mode = mode
        self.limits = {"memory_mb": memory_mb, "cpu_s": cpu_s, "file_mb": file_mb, "output_limit": output_limit}
        self.start_timeout_s = start_timeout_s
        self.sys_path = os_sandbox.code_paths(sys.path)
        # What the interpreter may read: itself, the import path, the tools' packages, the
        # worker, and what the caller adds (data files its tools open).
        self.readable = sorted({*os_sandbox.interpreter_paths(sys.executable), *self.sys_path,
                                *tool_locations(self.tools), str(WORKER.resolve()),
                                *(os.path.realpath(p) for p in read_only)})
        self.workdir: str | None = None
        self._proc: subprocess.Popen | None = None
        self._channel: os_sandbox.JsonLines | None = None

    def start(self) -> None:
        self.close()
        self.workdir = os.path.realpath(tempfile.mkdtemp(prefix="draco_pythontools_"))
        config = {**self.limits, "tools": self.tools, "workdir": self.workdir, "sys_path": self.sys_path,
                  "private": os_sandbox.private_folders(), "readable": self.readable}
        argv = [sys.executable, "-I", "-B", str(WORKER.resolve()), json.dumps(config)]
        env = os_sandbox.allowlisted_env(self.workdir)  # never the parent's: it holds API keys
        if self.mode == "bwrap":
            argv = os_sandbox.bwrap_command(argv, workdir=self.workdir, read_only=self.readable, env=env)
        popen = os_sandbox.spawn if self.mode == "bwrap" else subprocess.Popen
        self._proc = popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.workdir,
            start_new_session=True,  # its own process group, so close() kills anything it left
        )
        self._channel = os_sandbox.JsonLines(self._proc.stdin, self._proc.stdout.fileno())
        try:
            self._read(time.monotonic() + self.start_timeout_s)
        except SandboxError as exc:
            stderr = self._stderr()
            self.close()
            raise SandboxError(f"the PythonTools interpreter failed to start: {exc}\n{stderr}".rstrip()) from None

    def run(self, code: str, timeout_s: float) -> dict[str, Any]:
        """Run one block; raises TimeoutError (process killed) or SandboxError (it died)."""
        if self._proc is None:
            raise SandboxError("the interpreter is not running")
        if self._proc.poll() is not None:
            raise SandboxError(self._death())
        try:
            self._channel.send({"code": code})
        except OSError as exc:
            raise SandboxError(f"the interpreter stopped accepting code ({exc})") from None
        try:
            return self._read(time.monotonic() + timeout_s)
        except TimeoutError:
            self.close()
            raise

    def _read(self, deadline: float) -> dict[str, Any]:
        try:
            return self._channel.receive(deadline)
        except EOFError:
            raise SandboxError(self._death()) from None

    def _death(self) -> str:
        """One message for a dead interpreter, whether its exit was seen before or after sending."""
        code = self._proc.wait()
        reason = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return f"the interpreter died ({reason})"

    def _stderr(self) -> str:
        if self._proc is None or self._proc.stderr is None:
            return ""
        try:
            if self._proc.poll() is None:
                return ""
            return self._proc.stderr.read().decode(errors="replace")[-2000:]
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
                if stream is not None:
                    stream.close()
            self._proc, self._channel = None, None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


def tool_locations(specs: Sequence[str]) -> list[str]:
    """The folders of every package on the tools' module paths (``a``, ``a.b`` for
    ``a.b.c:f``) and the tool modules' files: what importing them reads beyond sys.path
    (editable installs map packages to folders that are on no import path)."""
    import importlib.util

    found: set[str] = set()
    for spec in specs:
        parts = spec.partition(":")[0].split(".")
        for i in range(1, len(parts) + 1):
            try:
                module_spec = importlib.util.find_spec(".".join(parts[:i]))
            except (ImportError, ValueError):
                continue
            if module_spec is None:
                continue
            found.update(os.path.realpath(p) for p in module_spec.submodule_search_locations or ())
            if module_spec.origin and os.path.exists(module_spec.origin):
                found.add(os.path.realpath(module_spec.origin))
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


def _import_function(spec: str, what: str) -> Callable:
    """The function a ``"module:function"`` string names (a YAML config can only give names)."""
    import importlib

    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{what} {spec!r} must be written 'module:function'")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{what} {spec!r}: {exc}") from None


def describe_tool(tool: Callable | str) -> str:
    """One tool's signature and docstring, as the agent sees it."""
    if isinstance(tool, str):
        import importlib

        module_name, _, qualname = tool.partition(":")
        tool = importlib.import_module(module_name)
        for part in qualname.split("."):
            tool = getattr(tool, part)
    doc = inspect.getdoc(tool) or ""
    return f"{tool.__name__}{inspect.signature(tool)}\n" + "\n".join(f"    {line}" for line in doc.splitlines())


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

After submitting, reply with a short message without a code block to finish.

Task: {instruction}"""


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

    ## Rewards
    Always 0: rewards come from the rubric layer. ``info["metrics"]`` at the end holds
    ``submitted``, ``answer`` and, when the task has an ``answer``, ``success`` (numbers
    within 1e-6 relative, text case- and space-insensitively).

    ## Episode end
    Terminated: ``no_code`` (a message without code, under ``end_rule="no_code"``),
    ``submitted`` (``submit`` called, under ``end_rule="task_completed"``), ``env_error``
    (the interpreter could not be restarted and replayed). Truncated: ``max_turns``
    messages. ``info["trajectory"]`` holds the episode at its end.

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
    ``cpu_s`` (120), ``file_mb`` (16) are the interpreter's resource limits and
    ``output_limit`` (100,000 characters) caps what one block prints.
    ``sandbox`` (``"auto"``, ``"bwrap"``, ``"guard"``; see ``draco_gym.envs.os_sandbox``) is
    the OS boundary around the interpreter, resolved here: ``"bwrap"`` raises
    ``SandboxUnavailable`` when bubblewrap cannot run, ``"guard"`` (chosen, or ``"auto"``
    falling back to it) warns once; ``env.sandbox`` says which was chosen.
    ``read_only_paths`` adds files or folders the tools read (their data) to what the
    sandboxed interpreter can see.
    ``end_rule``, ``max_turns``, ``max_observation_chars``, ``multi_block``, ``languages``,
    ``render_mode`` ("ansi") as in ``CodeStepEnv``.

    ## Version history
    - v0: the initial version; since this release each step's info carries ``state_key``
      and the shop's tasks declare ``operators`` (additions only: episodes, observations
      and metrics are unchanged).
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
        output_limit: int = 100_000,
        sandbox: os_sandbox.SandboxMode = "auto",
        read_only_paths: Sequence[str | os.PathLike] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        os_sandbox.check_mode(sandbox)
        if isinstance(tasks, str):
            tasks = _import_function(tasks, "tasks")()
        if tools is None:
            from draco_gym.envs import shop

            tools = shop.TOOLS
            tasks = shop.tasks() if tasks is None else tasks
        if not tasks:
            raise ValueError("PythonToolsEnv needs tasks: a list of Task objects or {'id', 'instruction', 'answer'} dicts")
        if step_timeout_s <= 0:
            raise ValueError(f"step_timeout_s must be > 0, got {step_timeout_s}")
        self.step_timeout_s = step_timeout_s
        self._tool_specs = [tool_spec(t) for t in tools]
        self._tool_docs = "\n\n".join(describe_tool(t) for t in tools)
        self._tasks = {t.id: t for t in (self._as_task(x) for x in tasks)}
        self.sandbox = os_sandbox.resolve_mode(sandbox, "PythonTools")
        self._interpreter = SandboxedInterpreter(
            self._tool_specs, mode=self.sandbox, read_only=[str(p) for p in read_only_paths],
            memory_mb=memory_mb, cpu_s=cpu_s, file_mb=file_mb, output_limit=output_limit)
        self._answer: Any = None
        self._submitted = False
        self._tool_names = {spec.rpartition(":")[2].rpartition(".")[2] for spec in self._tool_specs}

    @property
    def task_ids(self) -> list[str]:
        return list(self._tasks)

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
        prompt = PROMPT.format(tools=self._tool_docs, instruction=task.instruction)
        return task.model_copy(update={"agent_prompt": prompt})

    def _state_key_after(self, code: str) -> str | None:
        """The last call of one of the tools in the block, with its arguments as written."""
        called = last_call(code, self._tool_names.__contains__)
        return None if called is None else call_key(*called)

    def _run(self, code: str) -> Execution:
        try:
            reply = self._interpreter.run(code, self.step_timeout_s)
        except TimeoutError:
            raise WorldLost(f"TimeoutError: the code ran longer than {self.step_timeout_s:g} s and was stopped.",
                            "TimeoutError") from None
        except SandboxError as exc:
            raise WorldLost(f"Error: {exc}.", "SandboxError") from None
        if reply["submitted"]:
            self._answer, self._submitted = reply.get("answer"), True
        return Execution(output=reply["output"], error=reply["error"], submitted=reply["submitted"])

    def _restart(self) -> None:
        self._interpreter.start()

    def _lost_block(self, lost: WorldLost, failure: str | None) -> Execution:
        if failure is not None:
            return Execution(output=f"{lost}\nThe session could not be restored ({failure}).", error=lost.error,
                             fatal=True)
        restored = " Earlier steps were re-run, so their variables are back." if self._executed else ""
        return Execution(output=f"{lost} The Python session was restarted.{restored}", error=lost.error)

    def _evaluate(self) -> dict[str, Any]:
        expected = self.task.metadata.get("answer")
        metrics: dict[str, Any] = {"submitted": self._submitted, "answer": self._answer}
        if expected is not None:
            metrics["success"] = self._submitted and answers_match(self._answer, expected)
        return metrics

    def close(self) -> None:
        self._interpreter.close()
        super().close()

    def __del__(self) -> None:
        try:
            self._interpreter.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
