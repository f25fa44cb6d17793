"""Environment server processes and the pool that lends them to environments.

An ``EnvServer`` is one ``engine_server.py`` process running in the isolated runtime, inside
the OS sandbox (``os_sandbox.py``; ``sandbox="bwrap"``) or behind its audit hook alone
(``"guard"``), and the pair of pipes it answers on (no network: the sandbox has none). Its
environment is an allowlist, never the parent's, so API keys do not reach agent code. Servers are costly
to start (seconds: the engine import) and cheap to reuse (a reset loads the next task), so
a ``ServerPool`` keeps them alive across episodes and hands an idle one to each environment
that needs one; N environments in one process run on N servers in parallel. In a Ray
actor the module-level pool of that actor's process does the same.

No orphans: every server is stopped when its pool shuts down, at interpreter exit (atexit),
and when this process dies without running atexit (SIGKILL): bubblewrap's
``--die-with-parent`` kills the sandbox, and outside it the server's own watchdog exits.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path

from draco_gym.envs import os_sandbox
from draco_gym.envs.appworld.runtime import AppWorldRuntime

ENGINE_SCRIPT = Path(__file__).with_name("engine_server.py")


class ServerError(RuntimeError):
    """A server could not start or stopped answering."""


class ServerDied(ServerError):
    """The server process is gone or its connection broke mid-request."""


class RemoteError(RuntimeError):
    """The server answered with an error (bad request, unknown task id, engine exception)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class EnvServer:
    """One engine process and the pipes to it. ``sandbox`` is a resolved mode, ``"bwrap"``
    or ``"guard"`` (the environment resolves ``"auto"`` when it is built)."""

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
        if sandbox not in ("bwrap", "guard"):
            raise ValueError(f"EnvServer sandbox must be 'bwrap' or 'guard' (resolve 'auto' first), got {sandbox!r}")
        self.runtime = runtime
        self.data_dir = Path(data_dir).resolve()
        self.name = name
        self.startup_timeout_s = startup_timeout_s
        self.memory_limit_mb = memory_limit_mb
        self.sandbox = sandbox
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self._channel: os_sandbox.JsonLines | None = None
        self._pipes: tuple = ()
        self._log = None
        self._workdir: Path | None = None

    def __repr__(self) -> str:
        state = f"pid={self.process.pid}" if self.alive else "stopped"
        return f"EnvServer({self.name}, {self.sandbox}, {state})"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def readable(self) -> list[str]:
        """What the engine reads: the runtime's venv and the engine's cache, the interpreter
        the venv links to, the task data, and this package's engine script and read rule.
        The whole data folder, not one split's: a pool serves environments of any split, and
        a reset may name any task of the folder (agent code reads none of it: see --private)."""
        return sorted({str(self.runtime.venv_dir.resolve()), str(self.runtime.cache_dir.resolve()),
                       *os_sandbox.interpreter_paths(self.runtime.python), str(self.data_dir),
                       str(ENGINE_SCRIPT.resolve()), str(os_sandbox.WORKER_SCRIPT.resolve())})

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> EnvServer:
        """Start the process and wait until it is ready. Idempotent while alive."""
        if self.alive:
            return self
        if not self.runtime.is_ready():
            raise ServerError(
                f"the AppWorld runtime at {self.runtime.home} is not set up; run `draco-gym setup appworld`"
            )
        self.stop()
        # A private APPWORLD_ROOT per server: 'data' links to the shared (read-only) task
        # folder; the engine writes its per-task outputs under this root, never in the data.
        # In bubblewrap it is an in-memory folder of the sandbox: nothing of it on the host.
        workdir = Path(tempfile.gettempdir()).resolve() / f"draco-appworld-{self.name}-{secrets.token_hex(6)}"
        if self.sandbox == "guard":
            workdir.mkdir(mode=0o700)
            os.symlink(self.data_dir, workdir / "data")
        self._workdir = workdir
        readable = self.readable()
        command = [
            str(self.runtime.python), str(ENGINE_SCRIPT.resolve()),
            "--experiment", "draco_gym",
            "--memory-limit-mb", str(self.memory_limit_mb),
            "--scratch", str(workdir),
            # agent code reads no task's files (ground truth included): the engine loads a
            # task at /reset and grades it at /evaluate, outside agent code
            *(arg for path in [*os_sandbox.private_folders(), str(self.data_dir / "tasks")]
              for arg in ("--private", path)),
            *(arg for path in readable for arg in ("--readable", path)),
        ]
        env = os_sandbox.allowlisted_env(str(workdir), self.runtime.engine_env(workdir))
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        command += ["--requests-fd", str(requests_r), "--replies-fd", str(replies_w)]
        if self.sandbox == "bwrap":
            command = os_sandbox.bwrap_command(command, workdir=str(workdir), read_only=readable, env=env,
                                               private_workdir=True, symlinks={str(workdir / "data"): str(self.data_dir)})
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
                pass_fds=(requests_r, replies_w),
                start_new_session=True,  # our Ctrl-C goes to us; we stop the server ourselves
            )
        finally:
            os.close(requests_r)
            os.close(replies_w)
        writer = os.fdopen(requests_w, "wb")
        self._pipes = (writer, replies_r)
        self._channel = os_sandbox.JsonLines(writer, replies_r)
        self.starts += 1
        _live_servers.add(self)
        try:
            self._channel.receive(time.monotonic() + self.startup_timeout_s)
        except TimeoutError:
            self.stop()
            raise ServerError(f"{self.name} did not start within {self.startup_timeout_s:.0f} s") from None
        except (EOFError, ValueError):
            code = self.process.wait(5)
            tail = self._log_tail()
            self.stop()
            raise ServerError(f"{self.name} exited with code {code} while starting:\n{tail}") from None
        return self

    def health(self, timeout_s: float = 5.0) -> dict:
        return self.request("GET", "/health", timeout_s=timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the process (politely, then SIGKILL) and remove its scratch folder."""
        process, self.process = self.process, None
        for end in self._pipes:  # closing the request pipe alone makes an idle server exit
            try:
                end.close() if hasattr(end, "close") else os.close(end)
            except OSError:
                pass
        self._pipes, self._channel = (), None
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

    def restart(self) -> EnvServer:
        self.stop()
        return self.start()

    # -- protocol ---------------------------------------------------------------------------

    def request(self, method: str, path: str, body: dict | None = None, *, timeout_s: float = 60.0) -> dict:
        """One request. Raises ServerDied when the process is gone or does not answer within
        ``timeout_s`` (the caller then replaces it), RemoteError when it answered with an error."""
        if not self.alive or self._channel is None:
            raise ServerDied(f"{self.name} is not running")
        try:
            self._channel.send({"method": method, "path": path, "body": body or {}})
            reply = self._channel.receive(time.monotonic() + timeout_s)
        except TimeoutError:
            self.stop()  # a late answer would be read as the next request's
            raise ServerDied(f"{self.name} {method} {path} failed (timed out)") from None
        except (OSError, EOFError, ValueError) as exc:
            reason = "the process exited" if isinstance(exc, EOFError) else f"{type(exc).__name__}: {exc}"
            self.stop()
            raise ServerDied(f"{self.name} {method} {path} failed ({reason})") from None
        answer = reply.get("body") or {}
        if reply.get("status") != 200:
            raise RemoteError(reply.get("status", 500), answer.get("error", f"status {reply.get('status')}"))
        return answer

    def _log_tail(self, lines: int = 20) -> str:
        try:
            self._log.seek(0)
            return "\n".join(self._log.read().decode(errors="replace").splitlines()[-lines:])
        except (OSError, AttributeError, ValueError):
            return "(no server log)"


class ServerPool:
    """Lends idle servers to environments; starts new ones up to ``max_servers``.

    Servers stay alive when returned, so the next episode (or the next environment) skips
    the start-up cost. ``acquire`` blocks when all ``max_servers`` are lent out.
    """

    _shared: dict[tuple[str, str], ServerPool] = {}
    _shared_lock = threading.Lock()

    def __init__(self, runtime: AppWorldRuntime, data_dir: Path, *, max_servers: int | None = None,
                 memory_limit_mb: int = 4096, sandbox: os_sandbox.SandboxMode = "auto") -> None:
        self.sandbox = os_sandbox.resolve_mode(sandbox, "AppWorld")
        self.runtime = runtime
        self.data_dir = Path(data_dir)
        self.max_servers = max_servers
        self.memory_limit_mb = memory_limit_mb
        self._idle: list[EnvServer] = []
        self._all: list[EnvServer] = []
        self._cond = threading.Condition()
        self._closed = False
        _live_pools.add(self)

    @classmethod
    def shared(cls, runtime: AppWorldRuntime, data_dir: Path, sandbox: str = "auto") -> ServerPool:
        """The process-wide pool for one (runtime, data folder, resolved sandbox mode)."""
        mode = os_sandbox.resolve_mode(sandbox, "AppWorld")
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
                    server.stop()  # died or hung while idle: drop it (and its scratch folder)
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
            return server.start()
        except BaseException:
            with self._cond:
                self._all.remove(server)
                self._cond.notify()
            raise

    @staticmethod
    def _healthy(server: EnvServer) -> bool:
        try:
            return server.alive and server.health(timeout_s=5.0).get("ok", False)
        except (ServerError, RemoteError):
            return False

    def release(self, server: EnvServer) -> None:
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


_live_pools: weakref.WeakSet[ServerPool] = weakref.WeakSet()
_live_servers: weakref.WeakSet[EnvServer] = weakref.WeakSet()


@atexit.register
def _stop_all_servers() -> None:
    for pool in list(_live_pools):
        pool.shutdown()
    for server in list(_live_servers):
        server.stop()
