"""Environment server processes and the pool that lends them to environments.

An ``EnvServer`` is one ``engine_server.py`` process running in the isolated runtime, bound to
127.0.0.1 on a port the OS picked, plus a keep-alive HTTP client for it. Servers are costly
to start (seconds: the engine import) and cheap to reuse (a reset loads the next task), so
a ``ServerPool`` keeps them alive across episodes and hands an idle one to each environment
that needs one; N environments in one process run on N servers in parallel. In a Ray
actor the module-level pool of that actor's process does the same.

No orphans: every server is stopped when its pool shuts down, at interpreter exit (atexit),
and by the server's own watchdog when this process dies without running atexit (SIGKILL).
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path

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
    """One engine process on 127.0.0.1 and its HTTP connection."""

    def __init__(
        self,
        runtime: AppWorldRuntime,
        data_dir: Path,
        *,
        name: str = "server",
        startup_timeout_s: float = 120.0,
        memory_limit_mb: int = 4096,
    ) -> None:
        self.runtime = runtime
        self.data_dir = Path(data_dir)
        self.name = name
        self.startup_timeout_s = startup_timeout_s
        self.memory_limit_mb = memory_limit_mb
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.starts = 0
        self._conn: http.client.HTTPConnection | None = None
        self._workdir: Path | None = None

    def __repr__(self) -> str:
        state = f"pid={self.process.pid} port={self.port}" if self.alive else "stopped"
        return f"EnvServer({self.name}, {state})"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self._workdir / "server.log" if self._workdir else None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> EnvServer:
        """Start the process and wait until it answers /health. Idempotent while alive."""
        if self.alive:
            return self
        if not self.runtime.is_ready():
            raise ServerError(
                f"the AppWorld runtime at {self.runtime.home} is not set up; run `draco-gym setup appworld`"
            )
        self.stop()
        # A private APPWORLD_ROOT per server: 'data' links to the shared (read-only) task
        # folder; the engine writes its per-task outputs under this root, never in the data.
        self._workdir = Path(tempfile.mkdtemp(prefix=f"draco-appworld-{self.name}-"))
        os.symlink(self.data_dir, self._workdir / "data")
        port_file = self._workdir / "port"
        log = open(self._workdir / "server.log", "ab")
        command = [
            str(self.runtime.python), str(ENGINE_SCRIPT),
            "--port-file", str(port_file),
            "--parent-pid", str(os.getpid()),
            "--experiment", "draco_gym",
            "--memory-limit-mb", str(self.memory_limit_mb),
            "--scratch", str(self._workdir),
        ]
        try:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(self._workdir),
                env=self.runtime.subprocess_env(self._workdir),
                start_new_session=True,  # our Ctrl-C goes to us; we stop the server ourselves
            )
        finally:
            log.close()
        self.starts += 1
        _live_servers.add(self)
        deadline = time.monotonic() + self.startup_timeout_s
        while not port_file.exists():
            if self.process.poll() is not None:
                raise ServerError(f"{self.name} exited with code {self.process.returncode} while starting:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"{self.name} did not start within {self.startup_timeout_s:.0f} s:\n{self._log_tail()}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        health = self.health()
        if health.get("pid") != self.process.pid:
            self.stop()
            raise ServerError(f"port {self.port} is answered by another process (pid {health.get('pid')})")
        return self

    def health(self, timeout_s: float = 5.0) -> dict:
        return self.request("GET", "/health", timeout_s=timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the process (politely, then SIGKILL) and remove its scratch folder."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout_s)
            except (ProcessLookupError, PermissionError):
                pass
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout_s)
        if self._workdir is not None:
            import shutil

            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self.port = None

    def restart(self) -> EnvServer:
        self.stop()
        return self.start()

    # -- protocol ---------------------------------------------------------------------------

    def request(self, method: str, path: str, body: dict | None = None, *, timeout_s: float = 60.0) -> dict:
        """One JSON request. Raises ServerDied when the process or connection is gone,
        RemoteError when the server answered with an error."""
        if not self.alive or self.port is None:
            raise ServerDied(f"{self.name} is not running")
        payload = json.dumps(body or {}).encode()
        conn = self._conn
        try:
            if conn is None:
                conn = self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
                conn.connect()
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if conn.sock is not None:  # None only if the server closed it; request() reconnects
                conn.sock.settimeout(timeout_s)
            conn.request(method, path, body=payload if method == "POST" else None,
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self._conn = None
            if conn is not None:
                conn.close()
            reason = "timed out" if isinstance(exc, (socket.timeout, TimeoutError)) else f"{type(exc).__name__}: {exc}"
            raise ServerDied(f"{self.name} {method} {path} failed ({reason})") from exc
        try:
            answer = json.loads(data)
        except ValueError as exc:
            raise ServerDied(f"{self.name} sent a non-JSON answer to {path}") from exc
        if response.status != 200:
            raise RemoteError(response.status, answer.get("error", f"HTTP {response.status}"))
        return answer

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except (OSError, AttributeError):
            return "(no server log)"


class ServerPool:
    """Lends idle servers to environments; starts new ones up to ``max_servers``.

    Servers stay alive when returned, so the next episode (or the next environment) skips
    the start-up cost. ``acquire`` blocks when all ``max_servers`` are lent out.
    """

    _shared: dict[tuple[str, str], ServerPool] = {}
    _shared_lock = threading.Lock()

    def __init__(self, runtime: AppWorldRuntime, data_dir: Path, *, max_servers: int | None = None,
                 memory_limit_mb: int = 4096) -> None:
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
    def shared(cls, runtime: AppWorldRuntime, data_dir: Path) -> ServerPool:
        """The process-wide pool for one (runtime, data folder)."""
        key = (str(runtime.python), str(Path(data_dir).resolve()))
        with cls._shared_lock:
            pool = cls._shared.get(key)
            if pool is None or pool._closed:
                pool = cls._shared[key] = cls(runtime, Path(data_dir).resolve())
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
                                       memory_limit_mb=self.memory_limit_mb)
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
