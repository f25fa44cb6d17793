"""The engine's processes and the pool that lends them to environments.

An episode's outcome must not be computable where the agent's code runs (there it could
patch the evaluator, read the answer from memory or forge the replies), so an AppWorld
environment uses three kinds of runtime process (``engine_server.py`` has their protocol),
each inside the OS sandbox (``os_sandbox.py``; ``sandbox="bwrap"``, the only mode AppWorld
runs in: see ``shell_sandbox``):

- the **world** holds the task's apps and databases, runs no agent code and holds no
  ground truth (its folder gets only the task's specs and start databases);
- the **shell** fork server forks one **shell** per episode, which runs the agent's code
  and holds neither the databases nor the ground truth (it gets the task's specs). Its API
  requests come to this process, which relays them to the world and records each call
  (``Execution.tool_calls``): the record is made outside the agent's process, and nothing
  the shell sends decides the outcome (``submitted`` is asked of the world);
- the **evaluator** (one per pool) grades the world's saved end state against the ground
  truth; it sees nothing else the agent produced.

A shell that ran agent code is never handed to another episode: every reset forks a fresh
one and the old one is killed, with whatever it started. A shell that sends what the
protocol does not allow (a line that is not JSON, too long, unasked for, of the wrong
shape) ends its episode (``ProtocolError``: termination ``env_error``); the next reset
works. Processes are costly to start (seconds: the engine import) and cheap to reuse (a
reset loads the next task), so a ``ServerPool`` keeps them alive across episodes and hands
an idle ``EnvServer`` (a world, a fork server and the current shell) to each environment
that needs one; N environments in one process run on N servers in parallel. In a Ray
actor the module-level pool of that actor's process does the same.

No orphans: every process is stopped when its pool shuts down, at interpreter exit
(atexit), and when this process dies without running atexit (SIGKILL): bubblewrap's
``--die-with-parent`` kills the sandbox, and outside it each process's own watchdog exits
(a shell dies with its fork server).
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path

from draco_gym.envs import os_sandbox
from draco_gym.text import MAX_DEPTH, nesting_depth
from draco_gym.envs.appworld.runtime import AppWorldRuntime

ENGINE_SCRIPT = Path(__file__).with_name("engine_server.py")
ROLES = ("world", "shell", "evaluator")
MAX_SHELL_LINE = 16 * 2**20
"""Longest line a shell may send (an API request's arguments, a step's output)."""
MAX_CALLS_PER_STEP = 1000
"""Relayed API calls per block: AppWorld's own limit per execution (its
``max_api_calls_per_interaction``), enforced here too since the shell's count is the agent's."""


class ServerError(RuntimeError):
    """A server could not start or stopped answering."""


class ServerDied(ServerError):
    """The server process is gone or its connection broke mid-request."""


class ProtocolError(ServerError):
    """The agent's shell sent what the protocol does not allow; its episode cannot go on."""


class RemoteError(RuntimeError):
    """The server answered with an error (bad request, unknown task id, engine exception)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _SocketWriter:
    """What JsonLines writes to, straight onto a socket: closing the socket then closes it
    (a ``makefile`` would keep it open, and the other end would never see EOF)."""

    def __init__(self, sock: socket.socket) -> None:
        self._socket = sock

    def write(self, data: bytes) -> None:
        self._socket.sendall(data)

    def flush(self) -> None:
        return None


def _channel(sock: socket.socket, max_line: int = 64 * 2**20) -> os_sandbox.JsonLines:
    return os_sandbox.JsonLines(_SocketWriter(sock), sock.fileno(), max_line=max_line)


def _answer(reply: dict, what: str) -> dict:
    if not isinstance(reply, dict):
        raise ValueError(f"{what}: a reply that is not a JSON object")
    body = reply.get("body") or {}
    if reply.get("status") != 200:
        raise RemoteError(reply.get("status", 500), body.get("error", f"status {reply.get('status')}")
                          if isinstance(body, dict) else f"status {reply.get('status')}")
    if not isinstance(body, dict):
        raise ValueError(f"{what}: a reply body that is not a JSON object")
    return body


GUARD_REFUSED = (
    "AppWorld runs agent code only inside bubblewrap (sandbox='bwrap'). Its shell is AppWorld's own IPython "
    "session, which the seccomp and Landlock layers of PythonTools' guard mode do not confine: under "
    "sandbox='guard' agent code could start processes on the host, read the trainer's environment (API keys) "
    "through /proc and rewrite the suite's ground truth for later episodes. So guard mode is refused for AppWorld"
)


def shell_sandbox(mode: str) -> str:
    """The sandbox of AppWorld's engine processes for the mode asked: always ``"bwrap"``.

    ``"guard"`` raises ``ValueError``, and ``"auto"`` or ``"bwrap"`` where bubblewrap cannot
    run raises ``SandboxUnavailable``, each naming bwrap and how to install it: called where
    an environment or a pool is built (in the driver, before any actor starts)."""
    os_sandbox.check_mode(mode)
    if mode == "guard":
        raise ValueError(f"{GUARD_REFUSED}; use sandbox='bwrap' (or 'auto'). To run it, {os_sandbox.INSTALL_HINT}.")
    problem = os_sandbox.bwrap_problem()
    if problem is not None:
        raise os_sandbox.SandboxUnavailable(
            f"AppWorld: sandbox={mode!r} needs bubblewrap, but {problem}. {GUARD_REFUSED}. To fix it, "
            f"{os_sandbox.INSTALL_HINT}.")
    return "bwrap"


class EngineProcess:
    """One runtime process of one role (see ``engine_server.py``) and the socket to it.
    ``sandbox`` is a resolved mode, ``"bwrap"`` or ``"guard"`` (the environment resolves
    ``"auto"`` when it is built); the shell, which runs agent code, only in ``"bwrap"``."""

    def __init__(
        self,
        runtime: AppWorldRuntime,
        data_dir: Path,
        role: str,
        *,
        name: str = "server",
        startup_timeout_s: float = 120.0,
        memory_limit_mb: int = 4096,
        sandbox: str = "guard",
    ) -> None:
        if sandbox not in ("bwrap", "guard"):
            raise ValueError(f"EngineProcess sandbox must be 'bwrap' or 'guard' (resolve 'auto' first), got {sandbox!r}")
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if role == "shell" and sandbox != "bwrap":
            raise ValueError(f"{GUARD_REFUSED}; the shell needs sandbox='bwrap'")
        self.runtime = runtime
        self.data_dir = Path(data_dir).resolve()
        self.role = role
        self.name = name
        self.startup_timeout_s = startup_timeout_s
        self.memory_limit_mb = memory_limit_mb
        self.sandbox = sandbox
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.socket: socket.socket | None = None
        self._channel: os_sandbox.JsonLines | None = None
        self._log = None
        self._workdir: Path | None = None
        self._ready = False

    def __repr__(self) -> str:
        state = f"pid={self.process.pid}" if self.alive else "stopped"
        return f"EngineProcess({self.name}, {self.role}, {self.sandbox}, {state})"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def data_links(self) -> dict[str, Path]:
        """What of the data folder the role sees: the shell the API docs, the world also the
        base databases (each task arrives with its reset), the evaluator everything."""
        names = {"shell": ("api_docs",), "world": ("api_docs", "base_dbs"),
                 "evaluator": ("api_docs", "base_dbs", "tasks")}[self.role]
        return {name: self.data_dir / name for name in names}

    def readable(self) -> list[str]:
        """What the process reads: the runtime's venv and the engine's cache, the interpreter
        the venv links to, its part of the task data, and this package's engine script and
        read rule."""
        return sorted({str(self.runtime.venv_dir.resolve()), str(self.runtime.cache_dir.resolve()),
                       *os_sandbox.interpreter_paths(self.runtime.python),
                       *(str(path.resolve()) for path in self.data_links().values() if path.exists()),
                       str(ENGINE_SCRIPT.resolve()), str(os_sandbox.WORKER_SCRIPT.resolve())})

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> EngineProcess:
        """Start the process and wait until it is ready. Idempotent while alive."""
        self.launch()
        return self.wait_ready()

    def launch(self) -> EngineProcess:
        """Start the process without waiting for it (``wait_ready`` does), so that several
        start side by side. Idempotent while alive."""
        if self.alive:
            return self
        if not self.runtime.is_ready():
            raise ServerError(
                f"the AppWorld runtime at {self.runtime.home} is not set up; run `draco-gym setup appworld`"
            )
        self.stop()
        # A private APPWORLD_ROOT per process; its data/ links to what the role may see of the
        # shared (read-only) task folder. In bubblewrap it is an in-memory folder of the
        # sandbox: nothing of it on the host.
        workdir = Path(tempfile.gettempdir()).resolve() / f"draco-appworld-{self.name}-{self.role}-{secrets.token_hex(6)}"
        if self.sandbox == "guard":
            workdir.mkdir(mode=0o700)
        self._workdir = workdir
        readable = self.readable()
        ours, theirs = socket.socketpair()
        command = [
            str(self.runtime.python), str(ENGINE_SCRIPT.resolve()), "--role", self.role,
            "--channel-fd", str(theirs.fileno()), "--experiment", "draco_gym",
            "--memory-limit-mb", str(self.memory_limit_mb), "--scratch", str(workdir),
            *(arg for name, path in self.data_links().items() for arg in ("--data", f"{name}={path}")),
        ]
        if self.role == "shell":
            # agent code reads no task's files (the shell is not even given them) and nothing
            # of the parent's home folder
            command += [*(arg for path in [*os_sandbox.private_folders(), str(self.data_dir)] for arg in ("--private", path)),
                        *(arg for path in readable for arg in ("--readable", path))]
        env = os_sandbox.allowlisted_env(str(workdir), self.runtime.engine_env(workdir))
        if self.sandbox == "bwrap":
            if self.role == "shell":
                command.append("--own-pid-namespace")
            command = os_sandbox.bwrap_command(command, workdir=str(workdir), read_only=readable, env=env,
                                               private_workdir=True)
        else:
            command += ["--parent-pid", str(os.getpid())]
        self._log = tempfile.TemporaryFile(prefix="draco-appworld-log-")  # gone with its last descriptor
        try:
            popen = os_sandbox.spawn if self.sandbox == "bwrap" else subprocess.Popen
            self.process = popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=str(workdir) if self.sandbox == "guard" else "/",
                env=env,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # our Ctrl-C goes to us; we stop the server ourselves
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.socket = ours
        self._channel = _channel(ours)
        self.starts += 1
        self._ready = False
        _live_processes.add(self)
        return self

    def wait_ready(self) -> EngineProcess:
        if self._ready and self.alive:
            return self
        if self._channel is None:
            raise ServerDied(f"{self.name} {self.role} is not running")
        try:
            _answer(self._channel.receive(time.monotonic() + self.startup_timeout_s), f"{self.name} {self.role}")
        except TimeoutError:
            self.stop()
            raise ServerError(f"{self.name} {self.role} did not start within {self.startup_timeout_s:.0f} s") from None
        except (EOFError, ValueError, OSError, RemoteError):
            code = self.process.wait(5) if self.process is not None else None
            tail = self._log_tail()
            self.stop()
            raise ServerError(f"{self.name} {self.role} exited with code {code} while starting:\n{tail}") from None
        self._ready = True
        return self

    def health(self, timeout_s: float = 5.0) -> dict:
        return self.request("GET", "/health", timeout_s=timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the process (politely, then SIGKILL) and remove its scratch folder."""
        process, self.process = self.process, None
        if self.socket is not None:  # closing our end alone makes an idle server exit
            try:
                self.socket.close()
            except OSError:
                pass
        self.socket, self._channel, self._ready = None, None, False
        if process is not None and process.poll() is None:
            try:
                process.wait(0.5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(timeout_s)
                except (ProcessLookupError, PermissionError):
                    pass
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    # -- protocol ---------------------------------------------------------------------------

    def send(self, message: dict) -> None:
        if not self.alive or self._channel is None:
            raise ServerDied(f"{self.name} {self.role} is not running")
        try:
            self._channel.send(message)
        except OSError as exc:
            self.stop()
            raise ServerDied(f"{self.name} {self.role} failed ({type(exc).__name__}: {exc})") from None

    def receive(self, what: str, timeout_s: float) -> dict:
        """The answer to the request sent last. Raises ServerDied when the process is gone or
        does not answer within ``timeout_s`` (the caller then replaces it), RemoteError when it
        answered with an error."""
        if self._channel is None:
            raise ServerDied(f"{self.name} {self.role} is not running")
        try:
            reply = self._channel.receive(time.monotonic() + timeout_s)
            return _answer(reply, f"{self.name} {self.role} {what}")
        except TimeoutError:
            self.stop()  # a late answer would be read as the next request's
            raise ServerDied(f"{self.name} {self.role} {what} failed (timed out)") from None
        except (OSError, EOFError, ValueError) as exc:
            reason = "the process exited" if isinstance(exc, EOFError) else f"{type(exc).__name__}: {exc}"
            self.stop()
            raise ServerDied(f"{self.name} {self.role} {what} failed ({reason})") from None

    def request(self, method: str, path: str, body: dict | None = None, *, timeout_s: float = 60.0) -> dict:
        self.send({"method": method, "path": path, "body": body or {}})
        return self.receive(f"{method} {path}", timeout_s)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            self._log.seek(0)
            return "\n".join(self._log.read().decode(errors="replace").splitlines()[-lines:])
        except (OSError, AttributeError, ValueError):
            return "(no server log)"


class Shell:
    """One episode's shell: a child of the fork server, which runs the agent's code, and the
    socket to it. Everything it sends is checked here; it decides nothing."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.socket = sock
        self.channel = _channel(sock, MAX_SHELL_LINE)
        self.ran_code = False

    def send(self, message: dict) -> None:
        try:
            self.channel.send(message)
        except OSError as exc:
            raise ServerDied(f"the agent's shell is gone ({type(exc).__name__})") from None

    def receive(self, deadline: float) -> dict:
        try:
            message = self.channel.receive(deadline)
        except TimeoutError:
            raise ServerDied("the agent's shell did not answer in time (timed out)") from None
        except (EOFError, OSError):
            raise ServerDied("the agent's shell exited") from None
        except ValueError as exc:
            raise ProtocolError(f"the agent's shell sent a malformed line ({exc})") from None
        if not isinstance(message, dict):
            raise ProtocolError("the agent's shell sent a line that is not a JSON object")
        return message

    def check_quiet(self) -> None:
        """Before a request: nothing may have arrived unasked (a forged reply, a late one)."""
        if not self.channel.has_pending():
            return
        try:
            self.channel.receive(time.monotonic() + 0.05)
        except (EOFError, OSError):
            raise ServerDied("the agent's shell exited") from None
        except (TimeoutError, ValueError):
            pass
        raise ProtocolError("the agent's shell sent a line nobody asked for")

    def close(self) -> None:
        try:
            self.socket.close()
        except OSError:
            pass


class EnvServer:
    """What a pool lends an environment: a world, a shell fork server, and the current
    episode's shell (see the module docstring)."""

    def __init__(
        self,
        runtime: AppWorldRuntime,
        data_dir: Path,
        *,
        name: str = "server",
        startup_timeout_s: float = 120.0,
        memory_limit_mb: int = 4096,
        sandbox: str = "guard",
    ) -> None:
        options = dict(name=name, startup_timeout_s=startup_timeout_s, memory_limit_mb=memory_limit_mb, sandbox=sandbox)
        self.runtime = runtime
        self.data_dir = Path(data_dir).resolve()
        self.name = name
        self.sandbox = sandbox
        self.world = EngineProcess(runtime, data_dir, "world", **options)
        self.forks = EngineProcess(runtime, data_dir, "shell", **options)
        self.shell: Shell | None = None
        self.task_id: str | None = None

    def __repr__(self) -> str:
        return f"EnvServer({self.name}, {self.sandbox}, {'alive' if self.alive else 'stopped'})"

    @property
    def alive(self) -> bool:
        return self.world.alive and self.forks.alive

    @property
    def process(self) -> subprocess.Popen | None:
        """The world's process: killing it loses the episode's state (the environment replays)."""
        return self.world.process

    @property
    def starts(self) -> int:
        return self.world.starts

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> EnvServer:
        """Start whichever process is not running (side by side) and wait for them."""
        stale = [p for p in (self.world, self.forks) if not p.alive]
        for process in stale:
            process.launch()
        for process in stale:
            process.wait_ready()
        return self

    def stop(self) -> None:
        self.discard_shell()
        self.world.stop()
        self.forks.stop()
        self.task_id = None

    def restart(self) -> EnvServer:
        self.stop()
        return self.start()

    def health(self, timeout_s: float = 5.0) -> dict:
        answer = self.world.health(timeout_s)
        self.forks.send({"op": "health"})
        return {**answer, "ok": answer.get("ok") and self.forks.receive("health", timeout_s).get("ok")}

    def discard_shell(self) -> None:
        """Kill the current shell and whatever it started; the next reset forks a fresh one."""
        shell, self.shell = self.shell, None
        if shell is None:
            return
        shell.close()
        if self.forks.alive:
            try:
                self.forks.send({"op": "kill", "pid": shell.pid})
                self.forks.receive("kill", 10.0)
            except (ServerError, RemoteError):
                self.forks.stop()  # a fork server that cannot kill its child is replaced, child and all

    # -- an episode -------------------------------------------------------------------------

    def reset(self, task_id: str, timeout_s: int) -> dict:
        """Load ``task_id`` in the world from its start files and give it a fresh shell;
        returns the task's description. The world and the new shell load side by side."""
        self.discard_shell()
        self.start()
        folder = self.data_dir / "tasks" / task_id
        if "/" in task_id or task_id.startswith(".") or not (folder / "specs.json").is_file():
            raise RemoteError(404, f"unknown AppWorld task id {task_id!r} (no folder under {self.data_dir / 'tasks'})")
        specs = (folder / "specs.json").read_text()
        files = {"specs.json": specs, **{f"dbs/{p.name}": p.read_text() for p in sorted((folder / "dbs").iterdir())}}
        self.task_id = None
        self.world.send({"method": "POST", "path": "/reset", "body": {"task_id": task_id, "files": files}})
        try:
            shell = self._fork()
            shell.send({"method": "POST", "path": "/reset",
                        "body": {"task_id": task_id, "specs": specs, "timeout_s": timeout_s}})
        except BaseException:
            self.world.receive("POST /reset", 120.0)  # keeps the world's channel in step
            raise
        task = self.world.receive("POST /reset", 120.0)["task"]
        try:  # no agent code has run in this shell yet: a bad answer is the engine's fault
            _answer(shell.receive(time.monotonic() + 120.0), "the agent's shell reset")
        except (ValueError, ProtocolError) as exc:
            self.discard_shell()
            raise ServerDied(f"the agent's shell could not load the task ({exc})") from None
        self.task_id = task_id
        return task

    def _fork(self) -> Shell:
        ours, theirs = socket.socketpair()
        try:
            request = json.dumps({"op": "fork"}).encode() + b"\n"
            try:
                socket.send_fds(self.forks.socket, [request], [theirs.fileno()])
            except OSError as exc:
                self.forks.stop()
                raise ServerDied(f"{self.name} shell fork server failed ({exc})") from None
            pid = int(self.forks.receive("fork", 30.0)["pid"])
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.shell = Shell(pid, ours)
        try:
            _answer(self.shell.receive(time.monotonic() + 60.0), "the agent's shell start")
        except ValueError as exc:
            raise ServerDied(f"the agent's shell did not start ({exc})") from None
        return self.shell

    def execute(self, code: str, timeout_s: float) -> dict:
        """Run one block in the shell, relaying its API calls to the world; returns its output,
        whether the task is now submitted (asked of the world) and the calls it made (each
        ``{"name": "app.api", "ok": bool, "status": int}``, as the world answered them)."""
        shell = self._require_shell()
        calls: list[dict] = []
        try:
            shell.check_quiet()
            shell.ran_code = True
            deadline = time.monotonic() + timeout_s
            shell.send({"method": "POST", "path": "/execute", "body": {"code": code}})
            while True:
                message = shell.receive(deadline)
                if "api" not in message:
                    break
                shell.send(self._relay(message["api"], calls))
            try:
                body = _answer(message, "the agent's shell")
            except ValueError as exc:
                raise ProtocolError(str(exc)) from None
            output = body.get("output")
            if not isinstance(output, str) or set(message) != {"status", "body"}:
                raise ProtocolError("the agent's shell answered an execution without its output")
            shell.check_quiet()  # a second answer already behind the first: one of them was forged
        except (ProtocolError, ServerDied):
            self.discard_shell()  # stuck, dead or lying: it runs nothing more
            raise
        submitted = any(c["name"] == "supervisor.complete_task" for c in calls) and bool(
            self.world.request("POST", "/task_completed", timeout_s=30.0)["completed"])
        return {"output": output, "submitted": submitted, "tool_calls": calls}

    def _relay(self, api, calls: list[dict]) -> dict:
        """One API call of the shell, passed to the world and recorded as the world answered it."""
        if not isinstance(api, dict) or not isinstance(api.get("url"), str) or not isinstance(api.get("kwargs"), dict):
            raise ProtocolError("the agent's shell sent an API call without a url and arguments")
        if len(calls) >= MAX_CALLS_PER_STEP:
            text = json.dumps({"message": f"Number of requests exceeded the limit of {MAX_CALLS_PER_STEP}."})
            return {"status_code": 429, "text": text}
        if nesting_depth(api["kwargs"]) > MAX_DEPTH:  # refused before json.dumps recurses into it
            calls.append({"name": api["url"][:200], "ok": False, "status": 422})
            text = json.dumps({"message": f"The arguments nest deeper than {MAX_DEPTH} levels."})
            return {"status_code": 422, "text": text}
        try:
            answer = self.world.request("POST", "/api", {"method": api.get("method"), "url": api["url"],
                                                         "kwargs": api["kwargs"]}, timeout_s=60.0)
            status, text, name = int(answer["status_code"]), str(answer["text"]), answer.get("api")
        except RemoteError as exc:  # a request the world refused to pass on
            status, text, name = 400, json.dumps({"message": str(exc)}), None
        calls.append({"name": name or api["url"][:200], "ok": 200 <= status < 300, "status": status})
        return {"status_code": status, "text": text}

    def save_state(self) -> dict[str, str]:
        """The world's databases now (AppWorld's saved state), for the evaluator."""
        return self.world.request("POST", "/save", timeout_s=120.0)["files"]

    def _require_shell(self) -> Shell:
        if self.shell is None:
            raise ServerDied(f"{self.name} has no shell (reset first)")
        return self.shell


class Evaluator:
    """The pool's evaluator process, one evaluation at a time. Started on first use (or in
    the background with the pool's first server) and replaced after any failure, since an
    evaluation that raised may leave AppWorld's clock frozen or its caches full."""

    def __init__(self, runtime: AppWorldRuntime, data_dir: Path, sandbox: str, memory_limit_mb: int = 4096) -> None:
        self.process = EngineProcess(runtime, data_dir, "evaluator", name="appworld-evaluator", sandbox=sandbox,
                                     memory_limit_mb=memory_limit_mb)
        self._lock = threading.Lock()

    def launch(self) -> None:
        with self._lock:
            if not self.process.alive:
                self.process.launch()

    def evaluate(self, task_id: str, files: dict[str, str], timeout_s: float = 120.0) -> dict:
        with self._lock:
            self.process.launch()
            self.process.wait_ready()
            try:
                return self.process.request("POST", "/evaluate", {"task_id": task_id, "files": files}, timeout_s=timeout_s)
            except RemoteError:
                self.process.stop()
                raise

    def stop(self) -> None:
        with self._lock:
            self.process.stop()


class ServerPool:
    """Lends idle servers to environments; starts new ones up to ``max_servers``; grades
    episodes with its one evaluator.

    Servers stay alive when returned, so the next episode (or the next environment) skips
    the start-up cost; the returned server's shell is killed (it ran agent code).
    ``acquire`` blocks when all ``max_servers`` are lent out.
    """

    _shared: dict[tuple[str, str], ServerPool] = {}
    _shared_lock = threading.Lock()

    def __init__(self, runtime: AppWorldRuntime, data_dir: Path, *, max_servers: int | None = None,
                 memory_limit_mb: int = 4096, sandbox: os_sandbox.SandboxMode = "auto") -> None:
        self.sandbox = shell_sandbox(sandbox)
        self.runtime = runtime
        self.data_dir = Path(data_dir)
        self.max_servers = max_servers
        self.memory_limit_mb = memory_limit_mb
        self.evaluator = Evaluator(runtime, self.data_dir, self.sandbox, memory_limit_mb)
        self._idle: list[EnvServer] = []
        self._all: list[EnvServer] = []
        self._cond = threading.Condition()
        self._closed = False
        _live_pools.add(self)

    @classmethod
    def shared(cls, runtime: AppWorldRuntime, data_dir: Path, sandbox: str = "auto") -> ServerPool:
        """The process-wide pool for one (runtime, data folder, resolved sandbox mode)."""
        mode = shell_sandbox(sandbox)
        key = (str(runtime.python), str(Path(data_dir).resolve()), mode)
        with cls._shared_lock:
            pool = cls._shared.get(key)
            if pool is None or pool._closed:
                pool = cls._shared[key] = cls(runtime, Path(data_dir).resolve(), sandbox=mode)
            return pool

    @property
    def size(self) -> int:
        return len(self._all)

    def acquire(self, timeout_s: float | None = 600.0) -> EnvServer:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise ServerError("the server pool has been shut down")
                while self._idle:
                    server = self._idle.pop()
                    if self._healthy(server):
                        return server
                    server.stop()  # died or hung while idle: drop it (and its scratch folders)
                    self._all.remove(server)
                if self.max_servers is None or len(self._all) < self.max_servers:
                    server = EnvServer(self.runtime, self.data_dir, name=f"appworld-{len(self._all) + 1}",
                                       memory_limit_mb=self.memory_limit_mb, sandbox=self.sandbox)
                    self._all.append(server)
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise ServerError(f"no AppWorld server free after {timeout_s} s (max_servers={self.max_servers})")
                self._cond.wait(remaining)
        try:
            self.evaluator.launch()  # starts beside the first server; waited for at the first evaluation
            return server.start()
        except BaseException:
            with self._cond:
                self._all.remove(server)
                self._cond.notify()
            raise

    @staticmethod
    def _healthy(server: EnvServer) -> bool:
        try:
            return server.alive and bool(server.health(timeout_s=5.0).get("ok", False))
        except (ServerError, RemoteError):
            return False

    def evaluate(self, task_id: str, files: dict[str, str]) -> dict:
        """AppWorld's verdict on an end state (``EnvServer.save_state``) of ``task_id``."""
        if self._closed:
            raise ServerError("the server pool has been shut down")
        return self.evaluator.evaluate(task_id, files)

    def release(self, server: EnvServer) -> None:
        server.discard_shell()
        with self._cond:
            if server not in self._all:
                return
            if self._closed or not server.alive:
                server.stop()
                self._all.remove(server)
            elif server not in self._idle:
                self._idle.append(server)
            self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            servers, self._all, self._idle = list(self._all), [], []
            self._cond.notify_all()
        for server in servers:
            server.stop()
        self.evaluator.stop()


_live_pools: weakref.WeakSet[ServerPool] = weakref.WeakSet()
_live_processes: weakref.WeakSet[EngineProcess] = weakref.WeakSet()


@atexit.register
def _stop_all_servers() -> None:
    for pool in list(_live_pools):
        pool.shutdown()
    for process in list(_live_processes):
        process.stop()
