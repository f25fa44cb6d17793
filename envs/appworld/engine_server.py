"""The AppWorld environment server. Runs INSIDE the isolated runtime, never imported by draco-gym.

Started by ``server.py`` as ``<runtime python> engine_server.py --requests-fd R --replies-fd W ...``,
inside the OS sandbox when there is one (``os_sandbox.py``: bubblewrap with no network).
It holds one AppWorld world at a time and answers JSON lines on two inherited pipes, one
request at a time, each ``{"method", "path", "body"}`` answered by ``{"status", "body"}``:

    GET  /health                       -> {"ok": true, "pid": ..., "task_id": ...}
    POST /reset    {"task_id", "timeout_s"} -> {"task": {...}}   (closes the previous world)
    POST /execute  {"code"}            -> {"output", "submitted"}
    POST /evaluate {}                  -> {"success", "passed", "total", "failures", ...}
    POST /shutdown {}                  -> {"ok": true}, then the process exits

Why not the package's own ``appworld serve environment``: it binds 0.0.0.0 with no host
option, and FastAPI runs handlers off the main thread, where AppWorld's SIGALRM timeout
cannot fire. Here every execution runs on the main thread. Why pipes rather than a port:
the sandbox then needs no network at all, and no other local process can reach the server.

Defences on top of AppWorld's own safety guard and timeout: the audit hook below, an
address-space limit so a memory bomb raises MemoryError instead of taking the machine, a
cap on the output returned, and exit as soon as the parent is gone (its end of the request
pipe closes, or, outside the sandbox, the process is re-parented).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


class Engine:
    """The one live world of this process and the operations the protocol exposes."""

    def __init__(self, experiment_name: str, max_output_chars: int, reads=None) -> None:
        from appworld import AppWorld  # imported here: this process only exists to run it

        self._AppWorld = AppWorld
        self.experiment_name = experiment_name
        self.max_output_chars = max_output_chars
        self.audit_guard = AuditGuard(reads)
        self.world = None
        self.task_id: str | None = None
        self.completion_called = False

    def reset(self, task_id: str, timeout_s: int) -> dict:
        self.close()
        tasks_dir = os.path.join(os.environ["APPWORLD_ROOT"], "data", "tasks")
        if not os.path.isdir(os.path.join(tasks_dir, task_id)) or "/" in task_id or task_id.startswith("."):
            raise KeyError(f"unknown AppWorld task id {task_id!r} (no folder under {tasks_dir})")
        self.world = self._AppWorld(
            task_id=task_id, experiment_name=self.experiment_name, timeout_seconds=max(1, int(timeout_s))
        )
        self.world.shell.run_cell = self.audit_guard.guard(self.world.shell.run_cell)
        self._track(self.world.requester)
        self.task_id = task_id
        task = self.world.task
        supervisor = task.supervisor
        return {
            "task": {
                "task_id": task_id,
                "instruction": task.instruction,
                "supervisor": {k: supervisor[k] for k in ("first_name", "last_name", "email", "phone_number")},
                "datetime": str(task.datetime),
                "allowed_apps": list(task.allowed_apps),
            }
        }

    def execute(self, code: str) -> dict:
        world = self._require_world()
        self.completion_called = False
        output = world.execute(code)
        # Asking the supervisor app costs an API call (~10 ms, a third of a typical step), so
        # it is asked only after a block that really called complete_task (seen by _track).
        submitted = self.completion_called and bool(world.task_completed())
        return {"output": _clip(output, self.max_output_chars), "submitted": submitted}

    def _track(self, requester) -> None:
        """Note every call of supervisor.complete_task, however the agent's code reached it."""
        request = requester._request

        def tracked(_app_name, _api_name, *args, **kwargs):
            if _app_name == "supervisor" and _api_name == "complete_task":
                self.completion_called = True
            return request(_app_name, _api_name, *args, **kwargs)

        requester._request = tracked

    def evaluate(self) -> dict:
        world = self._require_world()
        tracker = world.evaluate(suppress_errors=True)
        details = tracker.to_dict(stats_only=False)
        return {
            "success": bool(tracker.success),
            "passed": int(tracker.pass_count),
            "total": int(tracker.num_tests),
            "failures": [_requirement(f) for f in details.get("failures", [])],
            "passes": [_requirement(p) for p in details.get("passes", [])],
        }

    def close(self) -> None:
        if self.world is not None:
            try:
                self.world.close()
            finally:
                self.world, self.task_id = None, None

    def _require_world(self):
        if self.world is None:
            raise RuntimeError("no task loaded on this server; call /reset first")
        return self.world


def _requirement(entry) -> str:
    if isinstance(entry, dict):
        text = entry.get("requirement", "")
        trace = entry.get("trace") or ""
        return f"{text} -- {trace.strip().splitlines()[-1]}" if trace.strip() else text
    return str(entry)


def handle(engine: Engine, method: str, path: str, body: dict) -> tuple[int, dict]:
    """One request -> (status, answer); never raises: the server must answer, not die."""
    try:
        if (method, path) == ("GET", "/health"):
            return 200, {"ok": True, "pid": os.getpid(), "task_id": engine.task_id}
        if method != "POST" or path not in ("/reset", "/execute", "/evaluate", "/shutdown"):
            return 404, {"error": f"no such endpoint: {method} {path}"}
        if path == "/reset":
            return 200, engine.reset(str(body["task_id"]), int(body.get("timeout_s", 60)))
        if path == "/execute":
            return 200, engine.execute(str(body["code"]))
        if path == "/evaluate":
            return 200, engine.evaluate()
        engine.close()
        return 200, {"ok": True}
    except KeyError as exc:
        return 404, {"error": str(exc.args[0]) if exc.args else repr(exc)}
    except BaseException as exc:  # noqa: BLE001 - SystemExit from agent code included
        return 500, {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=5)}


def serve(engine: Engine, requests, replies) -> None:
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
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


def _private_reads(private: list[str], readable: list[str]):
    """PythonTools' read rule, loaded from its file: this process cannot import draco-gym."""
    import importlib.util

    worker = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sandbox_worker.py")
    spec = importlib.util.spec_from_file_location("draco_sandbox_worker", worker)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PrivateReads(private, readable)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests-fd", type=int, required=True)
    parser.add_argument("--replies-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when re-parented away from it (0: off)")
    parser.add_argument("--experiment", default="draco_gym")
    parser.add_argument("--memory-limit-mb", type=int, default=4096)
    parser.add_argument("--max-output-chars", type=int, default=200_000)
    parser.add_argument("--scratch", default=None, help="private folder to delete on exit, even when orphaned")
    parser.add_argument("--private", action="append", default=[], help="folder whose reads agent code is refused")
    parser.add_argument("--readable", action="append", default=[], help="exception to --private")
    args = parser.parse_args()

    requests = os.fdopen(args.requests_fd, "rb")
    replies = os.fdopen(args.replies_fd, "wb")
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, args.scratch), daemon=True).start()
    if args.memory_limit_mb > 0:
        limit = args.memory_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    reads = _private_reads(args.private, args.readable)
    engine = Engine(args.experiment, args.max_output_chars, reads)  # pays the appworld import now
    replies.write(json.dumps({"status": 200, "body": {"ready": True, "pid": os.getpid()}}).encode() + b"\n")
    replies.flush()
    try:
        serve(engine, requests, replies)
    finally:
        engine.close()
        _remove_scratch(args.scratch)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
