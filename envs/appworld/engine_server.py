"""The AppWorld engine's processes. Run INSIDE the isolated runtime, never imported by draco-gym.

Started by ``server.py`` as ``<runtime python> engine_server.py --role ROLE --channel-fd N ...``,
inside the OS sandbox when there is one (``os_sandbox.py``: bubblewrap with no network). Each
process answers JSON lines on one inherited Unix socket, one request at a time, each
``{"method", "path", "body"}`` answered by ``{"status", "body"}``.

The roles exist so that what decides an episode's outcome never shares a process with the
agent's code (in one process, agent code could patch the evaluator, read the ground truth
from memory, or write the replies itself):

- ``world``: the task's apps and their databases. It runs no agent code: the agent's API
  requests reach it relayed by the parent (``POST /api``), only to the routes of the task's
  apps. It holds no ground truth: the parent writes only the task's specs and start
  databases into its folder at each reset, and the task loads without ground truth.
      POST /reset {"task_id", "files"}      -> {"task": {...}}
      POST /api {"method", "url", "kwargs"}  -> {"status_code", "text", "api"}
      POST /task_completed {}                -> {"completed"}
      POST /save {}                          -> {"files": {name: text}}  (the saved end state)
- ``shell``: a fork server whose children run agent code, one child per episode, so no
  process that ran agent code serves a second episode. A child holds AppWorld's IPython
  shell with ``apis`` and no database: its requests go out on its own socket and the parent
  relays them to the world. The fork server itself runs no agent code and is not
  debuggable by its children (``PR_SET_DUMPABLE`` 0); with its own PID namespace
  (bubblewrap) it kills every process but itself when a child's episode ends.
      control (fork server): {"op": "fork"} + the child's socket -> {"pid"};
                             {"op": "kill", "pid"} -> {"killed"}; {"op": "health"} -> {"ok"}
      child: POST /reset {"task_id", "specs", "timeout_s"} -> {"ok"};
             POST /execute {"code"} -> {"output"}, after any number of relayed API calls:
             the child sends {"api": {"method", "url", "kwargs"}}, the parent answers
             {"status_code", "text"}
- ``evaluator``: grades a saved end state against the task's ground truth with AppWorld's
  own ``evaluate_task``. It runs no agent code and never meets the agent: its input is the
  world's saved databases, handed on by the parent.
      POST /evaluate {"task_id", "files"} -> {"success", "passed", "total", "failures", "passes"}
Every role: GET /health, POST /shutdown.

Why not the package's own ``appworld serve environment``/``serve apis``: they bind 0.0.0.0
with no host option, and FastAPI runs handlers off the main thread, where AppWorld's
SIGALRM timeout cannot fire. Why sockets rather than a port: the sandbox then needs no
network at all, and no other local process can reach a server.

Defences in the shell's children on top of AppWorld's own safety guard and timeout: the
audit hook below, an address-space limit so a memory bomb raises MemoryError instead of
taking the machine, and a cap on the output returned. Every role exits as soon as the
parent is gone (its end of the socket closes, or, outside the sandbox, the process is
re-parented).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import sys
import threading
import time
import traceback


class AuditGuard:
    """A second wall behind AppWorld's safety guard, which patches module functions and so
    misses other routes to the same system calls (``__import__('posix').system(...)`` runs
    on 0.1.3.post1): while agent code runs, an audit hook refuses the operations that could
    touch the host, whatever module they come from, and the reads PythonTools' worker
    refuses too (``PrivateReads``: the parent's home folder outside the runtime and data,
    other processes' /proc entries). It is switched on only around the agent's cell, so
    the engine's own state saving is unaffected. Cost: the hook is called on every audit
    event of the process, about 10% of a step (bench/appworld_env.py). Inside bubblewrap
    it is the inner layer; without it, the only one."""

    BLOCKED = {
        "os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
        "pty.spawn", "os.kill", "os.killpg", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
        "os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree", "shutil.copyfile", "shutil.move",
        "os.chmod", "os.chown", "os.truncate", "os.symlink", "os.link", "os.utime", "os.chdir", "os.putenv",
        "os.unsetenv", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "os.startfile", "webbrowser.open",
    }
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    READ_EVENTS = {"open", "os.listdir", "os.scandir"}

    def __init__(self, reads=None) -> None:
        self.active = False
        self.reads = reads
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if not self.active:
            return
        if event in self.BLOCKED:
            self._refuse(event)
        if event in self.READ_EVENTS and self.reads is not None and args and self.reads.refused(args[0]):
            self._refuse(f"reading {args[0]!r}")
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & self.WRITE_FLAGS)
            if writes:
                self._refuse(f"writing to {path!r}")

    @staticmethod
    def _refuse(what: str) -> None:
        raise PermissionError(f"not allowed in this environment: {what}")

    def guard(self, run_cell):
        def guarded(*args, **kwargs):
            self.active = True
            try:
                return run_cell(*args, **kwargs)
            finally:
                self.active = False

        return guarded


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    keep = limit // 2
    return text[:keep] + f"\n[... {len(text) - 2 * keep} characters cut by the server ...]\n" + text[-keep:]


def _check_task_id(task_id: str) -> str:
    if not task_id or "/" in task_id or task_id.startswith(".") or "\x00" in task_id:
        raise KeyError(f"invalid AppWorld task id {task_id!r}")
    return task_id


TASK_FILE = re.compile(r"(specs\.json|dbs/[A-Za-z0-9_]+\.jsonl?)")
STATE_FILE = re.compile(r"[A-Za-z0-9_]+\.jsonl?")


def _write_files(folder: str, files: dict, pattern: re.Pattern) -> None:
    """Write ``files`` (relative name -> text) into a fresh ``folder``; only names of the
    shape AppWorld's task and state folders have are accepted."""
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise ValueError("files must map names to texts")
    bad = sorted(name for name in files if not pattern.fullmatch(name))
    if bad:
        raise ValueError(f"unexpected file names {bad[:5]}")
    shutil.rmtree(folder, ignore_errors=True)
    for name, text in files.items():
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)


def _task_info(task, task_id: str) -> dict:
    supervisor = task.supervisor
    return {
        "task_id": task_id,
        "instruction": task.instruction,
        "supervisor": {k: supervisor[k] for k in ("first_name", "last_name", "email", "phone_number")},
        "datetime": str(task.datetime),
        "allowed_apps": list(task.allowed_apps),
    }


def _tasks_dir() -> str:
    return os.path.join(os.environ["APPWORLD_ROOT"], "data", "tasks")


# -- world ------------------------------------------------------------------------------------


class _NoShell:
    """AppWorld builds an IPython shell for every world (a fifth of a reset); the world
    process runs no code, so it gets this instead."""

    def __init__(self, config=None) -> None:
        self.user_ns: dict = {}
        self.ast_node_interactivity = "none"

    def run_cell(self, *args, **kwargs) -> None:
        return None


class World:
    """The one live world of this process: the apps of one task and their databases.

    Agent requests arrive relayed by the parent and go to AppWorld's own in-process client
    exactly as the agent's ``apis`` would have sent them in a single-process AppWorld, so
    the apps answer the same. Only URLs under one of the task's apps are passed on: the API
    server's own routes (``/dbs``, ``/seed``, ``/date_time``, saving databases to a path) and
    the payment ``admin`` app are not for agents."""

    METHODS = ("get", "post", "put", "patch", "delete")
    KWARGS = {"params", "data", "json", "headers"}
    SEGMENT = re.compile(r"[^/?#%\\\x00-\x1f]+")

    def __init__(self, experiment_name: str, max_response_chars: int) -> None:
        from appworld import AppWorld  # imported here: this process only exists to run it
        from appworld.apps import import_apis_module

        import appworld.environment

        _memoize_api_docs()
        appworld.environment.InteractiveShellEmbed = _NoShell
        self._AppWorld = AppWorld
        self._apis_module = import_apis_module
        self.experiment_name = experiment_name
        self.max_response_chars = max_response_chars
        self.world = None
        self.task_id: str | None = None
        self.apps: frozenset[str] = frozenset()
        self._api_names: dict[str, dict[str, str]] = {}

    def routes(self) -> dict:
        return {("POST", "/reset"): lambda b: self.reset(str(b["task_id"]), b["files"]),
                ("POST", "/api"): lambda b: self.api(b.get("method"), b.get("url"), b.get("kwargs")),
                ("POST", "/task_completed"): lambda b: {"completed": bool(self._require_world().task_completed())},
                ("POST", "/save"): lambda b: self.save()}

    def reset(self, task_id: str, files: dict) -> dict:
        self.close()
        _check_task_id(task_id)
        shutil.rmtree(_tasks_dir(), ignore_errors=True)
        _write_files(os.path.join(_tasks_dir(), task_id), files, TASK_FILE)
        self.world = self._AppWorld(task_id=task_id, experiment_name=self.experiment_name, load_ground_truth=False,
                                    timeout_seconds=None)
        self.task_id = task_id
        self.apps = frozenset(self.world.task.allowed_apps) - {"admin"}
        return {"task": _task_info(self.world.task, task_id)}

    def api(self, method, url, kwargs) -> dict:
        """One relayed request; ``api`` names the app's API that answered it (None: no such API)."""
        world = self._require_world()
        if method not in self.METHODS or not isinstance(url, str) or not isinstance(kwargs, dict):
            raise ValueError("an API request needs a method, a url and kwargs")
        if not set(kwargs) <= self.KWARGS:
            raise ValueError(f"unexpected request arguments {sorted(set(kwargs) - self.KWARGS)}")
        headers = kwargs.get("headers") or {}
        if not isinstance(headers, dict) or not set(h.lower() for h in headers) <= {"authorization"}:
            raise ValueError("only an Authorization header may be sent")
        segments = url.split("/")
        if (len(url) > 4096 or segments[0] not in self.apps
                or not all(self.SEGMENT.fullmatch(s) and s not in (".", "..") for s in segments[1:])):
            text = json.dumps({"message": f"The {url} is not a valid URL of this task's apps."})
            return {"status_code": 404, "text": text, "api": None}
        response = getattr(world.requester.client, method)(url, **kwargs)
        text = response.text
        if len(text) > self.max_response_chars:
            text = json.dumps({"message": f"The response was too large ({len(text)} characters)."})
            return {"status_code": 500, "text": text, "api": self._api_name(segments[0], method, url)}
        return {"status_code": response.status_code, "text": text, "api": self._api_name(segments[0], method, url)}

    def _api_name(self, app: str, method: str, url: str) -> str | None:
        """The API the app's router sends this request to (AppWorld's API names are the
        route functions' names), found the way the router finds it."""
        from fastapi.routing import APIRoute
        from starlette.routing import Match

        path = "/" + url.split("/", 1)[1] if "/" in url else "/"
        scope = {"type": "http", "path": path, "method": method.upper()}
        for route in self._apis_module(app).app.routes:
            if isinstance(route, APIRoute) and route.matches(scope)[0] == Match.FULL:
                return f"{app}.{route.name}"
        return None

    def save(self) -> dict:
        """The world's databases as AppWorld saves them (``changes`` format), read back."""
        world = self._require_world()
        folder = world.output_db_home_path_on_disk
        world._save_state(folder)
        files = {}
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name)) as handle:
                files[name] = handle.read()
        return {"files": files}

    def health(self) -> dict:
        return {"ok": True, "pid": os.getpid(), "task_id": self.task_id}

    def close(self) -> None:
        if self.world is not None:
            try:
                self.world.close()
            finally:
                self.world, self.task_id, self.apps = None, None, frozenset()

    def _require_world(self):
        if self.world is None:
            raise RuntimeError("no task loaded on this server; call /reset first")
        return self.world


# -- the agent's shell --------------------------------------------------------------------------


class Relay:
    """The shell child's end of the API relay: a request line out on its socket, the
    parent's answer (from the world) back on it."""

    def __init__(self, requests, replies) -> None:
        self.requests, self.replies = requests, replies

    def call(self, method: str, url: str, kwargs: dict) -> tuple[int, str]:
        line = json.dumps({"api": {"method": method, "url": url, "kwargs": kwargs}})
        self.replies.write(line.encode() + b"\n")
        self.replies.flush()
        answer = self.requests.readline()
        if not answer:
            raise ConnectionError("the environment closed the API channel")
        answer = json.loads(answer)
        return int(answer["status_code"]), str(answer["text"])


class RelayResponse:
    """What AppWorld's requester reads of a response."""

    def __init__(self, status_code: int, text: str) -> None:
        self.status_code, self.text, self.headers = status_code, text, {}

    def json(self):
        return json.loads(self.text)


class RelayClient:
    """Stands in for AppWorld's in-process TestClient inside the shell: the requester makes
    the same calls with the same arguments, and the world answers them."""

    def __init__(self, relay: Relay) -> None:
        self._relay = relay

    def _send(self, method: str, url: str, **kwargs) -> RelayResponse:
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return RelayResponse(*self._relay.call(method, url, kwargs))

    def get(self, url, params=None, headers=None):
        return self._send("get", url, params=params, headers=headers)

    def post(self, url, data=None, json=None, headers=None):
        return self._send("post", url, data=data, json=json, headers=headers)

    def put(self, url, json=None, headers=None):
        return self._send("put", url, json=json, headers=headers)

    def patch(self, url, json=None, headers=None):
        return self._send("patch", url, json=json, headers=headers)

    def delete(self, url, params=None, headers=None):
        return self._send("delete", url, params=params, headers=headers)

    def __exit__(self, *exc) -> None:
        return None


def _memoize_api_docs() -> None:
    """Every task of a world reads the same API docs from their files (a second or so of a
    reset); read them once per process instead. A world's copy is only ever read."""
    from appworld.collections.api_docs import ApiDocCollection

    load, loaded = ApiDocCollection.load.__func__, {}

    def memoized(cls, load_apps=None, include_response_schemas: bool = True):
        key = (None if load_apps is None else tuple(load_apps), include_response_schemas)
        if key not in loaded:
            loaded[key] = load(cls, load_apps, include_response_schemas)
        return loaded[key]

    ApiDocCollection.load = classmethod(memoized)


def _warm_engine() -> None:
    """What each new shell would otherwise redo at its reset and first step, done once in
    the fork server: the API docs, freezegun's survey of the loaded modules (a clock is
    frozen per world), and the requester's API tables."""
    import freezegun
    from appworld.apps import get_all_apps
    from appworld.collections.api_docs import ApiDocCollection
    from appworld.requester import _get_api_name_to_doc

    ApiDocCollection.load(load_apps=tuple(get_all_apps(skip_admin=True)), include_response_schemas=True)
    for app in get_all_apps():
        _get_api_name_to_doc(app, include_private_apis=True)
    freezer = freezegun.freeze_time("2023-05-18T12:00:00")
    freezer.start()
    freezer.stop()


def _agent_world_class():
    """AppWorld in remote-APIs mode with the world process behind the relay: no database
    here, so nothing to set up, save or log on a server (the world does it)."""
    import appworld.requester as requester_module
    from appworld import AppWorld

    for name in ("set_remote_dbs", "set_remote_random_seed", "set_remote_show_api_response_schemas",
                 "unset_remote_date_and_time"):
        setattr(requester_module, name, lambda *args, **kwargs: None)
    requester_module.set_remote_date_and_time = lambda *args, **kwargs: "world"

    class AgentWorld(AppWorld):
        def _save_state(self, directory: str) -> None:
            return None

        def save_logs(self) -> None:
            return None

    return AgentWorld


class Shell:
    """One episode's agent shell (a forked child of the fork server): AppWorld's IPython
    shell and ``apis``, whose requests the parent relays to the world."""

    def __init__(self, experiment_name: str, max_output_chars: int, reads, relay: Relay) -> None:
        self._AgentWorld = _agent_world_class()
        self.experiment_name = experiment_name
        self.max_output_chars = max_output_chars
        self.relay = relay
        self.audit_guard = AuditGuard(reads)
        self.world = None
        self.task_id: str | None = None

    def routes(self) -> dict:
        return {("POST", "/reset"): lambda b: self.reset(str(b["task_id"]), b["specs"], int(b.get("timeout_s", 60))),
                ("POST", "/execute"): lambda b: self.execute(str(b["code"]))}

    def reset(self, task_id: str, specs: str, timeout_s: int) -> dict:
        if self.world is not None:
            raise RuntimeError("a shell serves one episode; the environment forks a fresh one per reset")
        _check_task_id(task_id)
        # the fork server's earlier shells left their tasks' folders: this one sees only its own
        for name in os.listdir(_tasks_dir()):
            if name != task_id:
                shutil.rmtree(os.path.join(_tasks_dir(), name), ignore_errors=True)
        _write_files(os.path.join(_tasks_dir(), task_id), {"specs.json": specs}, TASK_FILE)
        self.world = self._AgentWorld(task_id=task_id, experiment_name=self.experiment_name,
                                      remote_apis_url="relay://world", load_ground_truth=False,
                                      timeout_seconds=max(1, timeout_s))
        self.world.requester.client = RelayClient(self.relay)
        self.world.shell.run_cell = self.audit_guard.guard(self.world.shell.run_cell)
        self.task_id = task_id
        return {"ok": True}

    def execute(self, code: str) -> dict:
        if self.world is None:
            raise RuntimeError("no task loaded on this shell; call /reset first")
        return {"output": _clip(self.world.execute(code), self.max_output_chars)}

    def health(self) -> dict:
        return {"ok": True, "pid": os.getpid(), "task_id": self.task_id}

    def close(self) -> None:
        return None


class ShellForkServer:
    """Forks one shell per episode from a process that imported the engine but never ran
    agent code, so a fresh shell costs a fork rather than an interpreter start."""

    def __init__(self, args, control: socket.socket) -> None:
        import ctypes

        import appworld.environment  # noqa: F401 - what every shell needs, imported once here
        from appworld.apps import get_all_apps, import_apis_module

        for app in get_all_apps():
            import_apis_module(app)
        _agent_world_class()
        _memoize_api_docs()
        _warm_engine()
        self.args = args
        self.control = control
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: shells may not ptrace or read our memory
        self.children: set[int] = set()
        self._buffer = b""
        self._fds: list[int] = []

    def serve(self) -> None:
        self._send({"status": 200, "body": {"ready": True, "pid": os.getpid()}})
        while True:
            data, fds, _, _ = socket.recv_fds(self.control, 1 << 16, 4)
            self._fds += fds
            if not data:
                return
            self._buffer += data
            while b"\n" in self._buffer:
                line, _, self._buffer = self._buffer.partition(b"\n")
                self._answer(line)
            self._reap()

    def _answer(self, line: bytes) -> None:
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "fork":
                if not self._fds:
                    raise ValueError("fork needs the child's socket")
                self._send({"status": 200, "body": {"pid": self._fork(self._fds.pop(0))}})
            elif op == "kill":
                self._send({"status": 200, "body": {"killed": self._kill(int(request["pid"]))}})
            elif op == "health":
                self._send({"status": 200, "body": {"ok": True, "pid": os.getpid(), "children": len(self.children)}})
            else:
                self._send({"status": 404, "body": {"error": f"no such operation: {op!r}"}})
        except Exception as exc:  # noqa: BLE001 - the fork server answers, it does not die
            self._send({"status": 500, "body": {"error": f"{type(exc).__name__}: {exc}"}})

    def _fork(self, channel_fd: int) -> int:
        pid = os.fork()
        if pid == 0:
            self._child(channel_fd)
        os.close(channel_fd)
        self.children.add(pid)
        return pid

    def _child(self, channel_fd: int) -> None:
        """The shell process: never returns."""
        try:
            parent = os.getppid()
            self.control.close()
            for fd in self._fds:
                os.close(fd)
            os.setpgid(0, 0)
            self.libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the fork server
            if os.getppid() != parent:
                os._exit(0)
            channel = socket.socket(fileno=channel_fd)
            requests, replies = channel.makefile("rb"), channel.makefile("wb")
            args = self.args
            reads = _private_reads(args.private, args.readable)  # after the fork: it knows its own pid
            shell = Shell(args.experiment, args.max_output_chars, reads, Relay(requests, replies))
            replies.write(json.dumps({"status": 200, "body": {"ready": True, "pid": os.getpid()}}).encode() + b"\n")
            replies.flush()
            serve(shell, requests, replies)
        except BaseException:  # noqa: BLE001 - a child reports and exits, never returns into the fork server
            traceback.print_exc()
        finally:
            os._exit(0)

    def _kill(self, pid: int) -> int:
        """End a shell's episode: the shell and whatever it started. In our own PID namespace
        that is every process but the namespace's init and us; outside one, its process group."""
        killed = 0
        if self.args.own_pid_namespace and os.getppid() == 1:
            targets = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
            for target in targets:
                try:
                    os.kill(target, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
        elif pid in self.children:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                    killed += 1
                except (ProcessLookupError, PermissionError):
                    pass
        if pid in self.children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            self.children.discard(pid)
        self._reap()
        return killed

    def _reap(self) -> None:
        while self.children:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)

    def _send(self, message: dict) -> None:
        self.control.sendall(json.dumps(message).encode() + b"\n")


# -- evaluator ----------------------------------------------------------------------------------


class Evaluator:
    """Grades a saved end state: the world's databases are written where AppWorld keeps an
    experiment's outputs and ``evaluate_task`` compares them with the task's start state
    under its ground truth. Nothing is cached between evaluations (AppWorld's database
    cache would otherwise answer a task's second evaluation from the first's state)."""

    def __init__(self, experiment_name: str) -> None:
        from appworld.apps.model_lib import CachedDBHandler
        from appworld.common.path_store import path_store
        from appworld.evaluator import evaluate_task

        self._evaluate_task = evaluate_task
        self._cache = CachedDBHandler
        self._path_store = path_store
        self.experiment_name = experiment_name

    def routes(self) -> dict:
        return {("POST", "/evaluate"): lambda b: self.evaluate(str(b["task_id"]), b["files"])}

    def evaluate(self, task_id: str, files: dict) -> dict:
        _check_task_id(task_id)
        if not os.path.isdir(os.path.join(_tasks_dir(), task_id)):
            raise KeyError(f"unknown AppWorld task id {task_id!r} (no folder under {_tasks_dir()})")
        folder = os.path.join(self._path_store.experiment_outputs, self.experiment_name, "tasks", task_id, "dbs")
        self._cache.reset()
        _write_files(folder, files, STATE_FILE)
        try:
            tracker = self._evaluate_task(task_id=task_id, experiment_name=self.experiment_name,
                                          suppress_errors=True, save_report=False)
        finally:
            self._cache.reset()
            shutil.rmtree(folder, ignore_errors=True)
        details = tracker.to_dict(stats_only=False)
        return {
            "success": bool(tracker.success),
            "passed": int(tracker.pass_count),
            "total": int(tracker.num_tests),
            "failures": [_requirement(f) for f in details.get("failures", [])],
            "passes": [_requirement(p) for p in details.get("passes", [])],
        }

    def health(self) -> dict:
        return {"ok": True, "pid": os.getpid(), "task_id": None}

    def close(self) -> None:
        return None


def _requirement(entry) -> str:
    if isinstance(entry, dict):
        text = entry.get("requirement", "")
        trace = entry.get("trace") or ""
        return f"{text} -- {trace.strip().splitlines()[-1]}" if trace.strip() else text
    return str(entry)


# -- the request loop -----------------------------------------------------------------------------


def handle(engine, method: str, path: str, body: dict) -> tuple[int, dict]:
    """One request -> (status, answer); never raises: the server must answer, not die."""
    try:
        if (method, path) == ("GET", "/health"):
            return 200, engine.health()
        if (method, path) == ("POST", "/shutdown"):
            engine.close()
            return 200, {"ok": True}
        route = engine.routes().get((method, path))
        if route is None:
            return 404, {"error": f"no such endpoint: {method} {path}"}
        return 200, route(body)
    except KeyError as exc:
        return 404, {"error": str(exc.args[0]) if exc.args else repr(exc)}
    except BaseException as exc:  # noqa: BLE001 - SystemExit from agent code included
        return 500, {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=5)}


def serve(engine, requests, replies) -> None:
    """Answer requests until /shutdown or until the parent closes its end (it is gone)."""
    for line in requests:
        try:
            request = json.loads(line)
            method, path, body = request["method"], request["path"], request.get("body") or {}
        except (ValueError, KeyError, TypeError) as exc:
            status, answer, path = 400, {"error": f"request is not a JSON object with method and path: {exc}"}, None
        else:
            status, answer = handle(engine, method, path, body)
        replies.write(json.dumps({"status": status, "body": answer}, default=str).encode() + b"\n")
        replies.flush()
        if path == "/shutdown" and status == 200:
            return


def _watch_parent(parent_pid: int, scratch: str | None) -> None:
    """Exit as soon as the process that started us is gone (we got re-parented), even while
    agent code keeps the main thread busy. Inside bubblewrap (own PID namespace) the
    sandbox's ``--die-with-parent`` does this instead."""
    while True:
        if os.getppid() != parent_pid:
            _remove_scratch(scratch)
            os._exit(0)
        time.sleep(0.5)


def _remove_scratch(scratch: str | None) -> None:
    """Delete our private APPWORLD_ROOT (only ever a folder the parent made for us)."""
    if scratch and os.path.basename(scratch.rstrip("/")).startswith("draco-appworld-"):
        shutil.rmtree(scratch, ignore_errors=True)


def _private_reads(private: list[str], readable: list[str]):
    """PythonTools' read rule, loaded from its file: this process cannot import draco-gym."""
    import importlib.util

    worker = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sandbox_worker.py")
    spec = importlib.util.spec_from_file_location("draco_sandbox_worker", worker)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PrivateReads(private, readable)


def _link_data(links: list[str]) -> None:
    """``APPWORLD_ROOT/data``: links to the parts of the task data this role may see
    (``NAME=TARGET``), and an empty ``tasks`` folder where a role is handed its task."""
    data = os.path.join(os.environ["APPWORLD_ROOT"], "data")
    os.makedirs(data, exist_ok=True)
    for link in links:
        name, _, target = link.partition("=")
        os.symlink(target, os.path.join(data, name))
    os.makedirs(os.path.join(data, "tasks"), exist_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=("world", "shell", "evaluator"), required=True)
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when re-parented away from it (0: off)")
    parser.add_argument("--experiment", default="draco_gym")
    parser.add_argument("--memory-limit-mb", type=int, default=4096)
    parser.add_argument("--max-output-chars", type=int, default=200_000)
    parser.add_argument("--max-response-chars", type=int, default=8_000_000)
    parser.add_argument("--scratch", default=None, help="private folder to delete on exit, even when orphaned")
    parser.add_argument("--data", action="append", default=[], help="NAME=TARGET: a link in APPWORLD_ROOT/data")
    parser.add_argument("--private", action="append", default=[], help="folder whose reads agent code is refused")
    parser.add_argument("--readable", action="append", default=[], help="exception to --private")
    parser.add_argument("--own-pid-namespace", action="store_true", help="the sandbox gave us a PID namespace")
    args = parser.parse_args()

    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, args.scratch), daemon=True).start()
    if args.memory_limit_mb > 0:
        limit = args.memory_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _link_data(args.data)
    channel = socket.socket(fileno=args.channel_fd)
    try:
        if args.role == "shell":
            ShellForkServer(args, channel).serve()  # pays the appworld import now
            return
        engine = World(args.experiment, args.max_response_chars) if args.role == "world" else Evaluator(args.experiment)
        requests, replies = channel.makefile("rb"), channel.makefile("wb")
        replies.write(json.dumps({"status": 200, "body": {"ready": True, "pid": os.getpid()}}).encode() + b"\n")
        replies.flush()
        try:
            serve(engine, requests, replies)
        finally:
            engine.close()
    finally:
        _remove_scratch(args.scratch)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
