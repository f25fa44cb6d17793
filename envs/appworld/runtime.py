"""The isolated AppWorld runtime: its own virtual environment, created on first use.

``appworld`` pins pydantic<2 and SQLAlchemy 1.4, which cannot share an interpreter with the
rest of draco-gym. So the engine lives in a virtual environment of its own and the main
process talks to it only through subprocesses: the environment servers (``server.py``) and
the offline suite builder (``suite.py``). Nothing in this module imports ``appworld``.

Location: ``$DRACO_GYM_APPWORLD_HOME`` if set, else ``<user cache dir>/draco-gym/appworld``.
The home holds one virtual environment per pinned engine version, the engine's own cache
(``APPWORLD_CACHE``, so ``appworld install`` writes nothing to ``~/.appworld``) and the
built offline suites. Creating it is idempotent, locked against concurrent creation (two
Ray actors, two pytest workers) and marked complete only once every step succeeded, so an
interrupted setup is redone on the next call rather than half-used.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path
from typing import Callable, Iterator

APPWORLD_VERSION = "0.1.3.post1"
HOME_ENV = "DRACO_GYM_APPWORLD_HOME"

Progress = Callable[[str], None]


class SetupError(RuntimeError):
    """Creating the runtime failed; the message says which step and how to retry."""


def default_home() -> Path:
    configured = os.environ.get(HOME_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_cache_dir("draco-gym")) / "appworld"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock across processes (flock), released when the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class AppWorldRuntime:
    """One isolated installation of the engine at ``home``."""

    def __init__(self, home: str | os.PathLike | None = None, version: str = APPWORLD_VERSION) -> None:
        self.home = Path(home).expanduser().resolve() if home is not None else default_home()
        self.version = version

    def __repr__(self) -> str:
        return f"AppWorldRuntime(home={str(self.home)!r}, version={self.version!r}, ready={self.is_ready()})"

    # -- layout ---------------------------------------------------------------------------

    @property
    def venv_dir(self) -> Path:
        return self.home / f"venv-{self.version}"

    @property
    def python(self) -> Path:
        return self.venv_dir / "bin" / "python"

    @property
    def cache_dir(self) -> Path:
        return self.home / "engine-cache"

    @property
    def suites_dir(self) -> Path:
        return self.home / "suites"

    @property
    def _marker(self) -> Path:
        return self.venv_dir / ".draco-gym-ready"

    def is_ready(self) -> bool:
        return self._marker.is_file() and self.python.exists()

    def engine_env(self, appworld_root: str | os.PathLike) -> dict[str, str]:
        """The engine's own variables, for a server that runs agent code: its whole
        environment is these on top of ``os_sandbox.allowlisted_env``, never the caller's."""
        return {"APPWORLD_CACHE": str(self.cache_dir), "APPWORLD_ROOT": str(appworld_root),
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}

    def subprocess_env(self, appworld_root: str | os.PathLike | None = None) -> dict[str, str]:
        """Environment for the runtime's setup and offline suite builder, which run no agent
        code (pip needs the caller's proxy and index settings).

        Starts from the caller's environment minus variables that would leak the main
        interpreter into the runtime's (PYTHONPATH, an active venv)."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["APPWORLD_CACHE"] = str(self.cache_dir)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        if appworld_root is not None:
            env["APPWORLD_ROOT"] = str(appworld_root)
        return env

    # -- creation -------------------------------------------------------------------------

    def ensure(self, progress: Progress | None = None, *, force: bool = False) -> AppWorldRuntime:
        """Create the runtime unless it is already complete. Returns self."""
        say = progress or (lambda message: None)
        if self.is_ready() and not force:
            return self
        with file_lock(self.home / ".setup.lock"):
            if self.is_ready() and not force:  # another process finished while we waited
                return self
            started = time.monotonic()
            if self.venv_dir.exists():
                say(f"removing incomplete runtime at {self.venv_dir}")
                shutil.rmtree(self.venv_dir)
            say(f"[1/3] creating virtual environment {self.venv_dir}")
            try:
                venv.EnvBuilder(with_pip=True, symlinks=True, clear=True).create(self.venv_dir)
            except Exception as exc:  # noqa: BLE001 - reported with the step that failed
                raise SetupError(
                    f"could not create a virtual environment at {self.venv_dir}: {exc}. "
                    "Check that the directory is writable and that Python's venv module (and "
                    f"ensurepip) is available, or set {HOME_ENV} to another location; then rerun "
                    "`draco-gym setup appworld`."
                ) from exc
            say(f"[2/3] pip install appworld=={self.version} (about a minute)")
            self._pip_install(say)
            say("[3/3] appworld install (unpacks the bundled apps; offline)")
            self._run_step(
                [str(self.python), "-m", "appworld.cli", "install"],
                "`appworld install`",
                say,
            )
            self._marker.write_text(f"appworld=={self.version}\n")
            say(f"AppWorld runtime ready in {time.monotonic() - started:.0f} s: {self.python}")
        return self

    def _pip_install(self, say: Progress) -> None:
        command = [
            str(self.python), "-m", "pip", "install", "--progress-bar", "off",
            "--disable-pip-version-check", f"appworld=={self.version}",
        ]
        try:
            self._run_step(command, f"`pip install appworld=={self.version}`", say)
        except SetupError as exc:
            text = str(exc).lower()
            offline = any(
                s in text
                for s in ("no matching distribution", "could not find a version", "connection", "network", "resolve")
            )
            if offline:
                raise SetupError(
                    f"pip could not download appworld=={self.version}: the package index is not "
                    "reachable from this machine (or does not carry that version). Connect to the "
                    "internet or point pip at a mirror (PIP_INDEX_URL / PIP_FIND_LINKS holding the "
                    f"appworld wheel and its dependencies), then rerun `draco-gym setup appworld`.\n"
                    f"{exc}"
                ) from None
            raise

    def _run_step(self, command: list[str], what: str, say: Progress) -> None:
        """Run one setup command, streaming its meaningful lines to ``say``."""
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.subprocess_env(),
            cwd=str(self.home),
        )
        tail: list[str] = []
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip()
            if not line or "is ignored: it is neither a file nor a directory" in line:
                continue  # pip chatter about unusable find-links entries
            tail = (tail + [line])[-30:]
            if line.startswith(("Collecting", "Successfully", "ERROR", "Unpacked")):
                say("    " + line)
        if process.wait() != 0:
            raise SetupError(
                f"{what} failed (exit code {process.returncode}). Last output:\n  "
                + "\n  ".join(tail)
                + "\nFix the cause above and rerun `draco-gym setup appworld` (it starts over cleanly)."
            )


def print_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
