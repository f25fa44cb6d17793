"""Where the tasks come from: the offline suite (built and cached) or a real AppWorld data folder.

Both are the same kind of folder, an AppWorld ``data/`` directory with ``tasks/`` and
``datasets/``, and go through the same code path: a ``TaskSource`` lists splits and task ids
(by reading ``datasets/<split>.txt``, no server needed) and names the folder the servers
load. Real data: run ``appworld download data`` on a machine with internet and point
``data_root`` (or ``$DRACO_GYM_APPWORLD_DATA``) at the folder holding ``data/``.

The offline suite is built by ``suite_builder.py`` inside the runtime. Its cache key is a
hash of the builder's source, the seed and the engine version, so editing the builder or
changing the seed builds a fresh suite and an unchanged one is reused (built once, in
about 30 s; concurrent builders wait on a lock instead of racing).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from draco_gym.envs.appworld.runtime import AppWorldRuntime, Progress, SetupError, file_lock

DATA_ENV = "DRACO_GYM_APPWORLD_DATA"
BUILDER_SCRIPT = Path(__file__).with_name("suite_builder.py")
REAL_SPLITS = {"train": 90, "dev": 57, "test_normal": 168, "test_challenge": 417}
"""Split sizes of the released AppWorld benchmark (for reference and checks)."""
READ_PREFIXES = ("show_", "search_", "get_", "list_", "find_", "download_")
"""Name prefixes of AppWorld APIs that only read the world."""


class TaskSource:
    """An AppWorld data folder: its splits, task ids and per-task files."""

    def __init__(self, data_dir: str | os.PathLike) -> None:
        path = Path(data_dir).expanduser().resolve()
        if (path / "data" / "tasks").is_dir():
            path = path / "data"
        if not (path / "tasks").is_dir() or not (path / "datasets").is_dir():
            raise FileNotFoundError(
                f"{data_dir} is not an AppWorld data folder: expected tasks/ and datasets/ in it or in its data/ "
                "subfolder (what `appworld download data` writes)"
            )
        self.data_dir = path

    def __repr__(self) -> str:
        return f"TaskSource({str(self.data_dir)!r}, splits={self.splits})"

    @cached_property
    def splits(self) -> list[str]:
        return sorted(p.stem for p in (self.data_dir / "datasets").glob("*.txt"))

    def task_ids(self, split: str) -> list[str]:
        path = self.data_dir / "datasets" / f"{split}.txt"
        if not path.is_file():
            raise ValueError(f"unknown split {split!r}; this data folder has {self.splits}")
        # strip AppWorld's optional ':tag' suffix, as load_task_ids does
        return [line.split(":")[0].strip() for line in path.read_text().splitlines() if line.strip()]

    def has_task(self, task_id: str) -> bool:
        return bool(task_id) and "/" not in task_id and not task_id.startswith(".") and (
            self.data_dir / "tasks" / task_id / "specs.json"
        ).is_file()

    def metadata(self, task_id: str) -> dict:
        """Ground-truth metadata (difficulty, ...) when the folder has it, else {}."""
        path = self.data_dir / "tasks" / task_id / "ground_truth" / "metadata.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def ground_truth_file(self, task_id: str, name: str):
        path = self.data_dir / "tasks" / task_id / "ground_truth" / name
        return json.loads(path.read_text())

    def required_apis(self, task_id: str) -> list[str]:
        """The APIs the task's solution calls (``apis.app.api``, in first-use order): from the
        offline suite's reference solution, or real AppWorld's compiled solution (AppWorld's
        own ``GroundTruth.required_apis`` reads the same file the same way); [] without either."""
        truth = self.data_dir / "tasks" / task_id / "ground_truth"
        if (truth / "reference_solution.json").is_file():
            code = "\n".join(json.loads((truth / "reference_solution.json").read_text()))
        elif (truth / "compiled_solution.py").is_file():
            code = (truth / "compiled_solution.py").read_text()
        else:
            return []
        return list(dict.fromkeys(f"apis.{m}" for m in re.findall(r"\bapis\.(\w+\.\w+)", code)))

    def operators(self, task_id: str) -> dict[str, list[str]]:
        """The task's operator library for the rule rubric (``Task.metadata["operators"]``):
        its required APIs that read the world (``show_``, ``search_``, ``get_``, ``list_``,
        ``find_``, ``download_``: evidence) and those that act on it (login, create, update,
        delete, send, ``complete_task``: execution). The split by name prefix is ours; the
        documentation app is left to the rubric's own documentation item."""
        evidence, execution = [], []
        for api in self.required_apis(task_id):
            app, name = api.split(".")[1:]
            if app == "api_docs":
                continue
            (evidence if name.startswith(READ_PREFIXES) else execution).append(api)
        return {"evidence": evidence, "execution": execution}

    def ground_truth(self, task_id: str) -> GroundTruth:
        """The task's reference and wrong solutions (what the offline suite's builder writes;
        a real AppWorld data folder has no wrong solution, so ``wrong_blocks`` is then empty)."""
        if not self.has_task(task_id):
            raise ValueError(f"unknown AppWorld task id {task_id!r} in {self.data_dir}")
        folder = self.data_dir / "tasks" / task_id / "ground_truth"
        if not (folder / "reference_solution.json").is_file():
            raise FileNotFoundError(f"{task_id}: no ground_truth/reference_solution.json in {self.data_dir}")
        reference = self.ground_truth_file(task_id, "reference_solution.json")
        wrong = self.ground_truth_file(task_id, "wrong_solution.json") if (folder / "wrong_solution.json").is_file() else {}
        if not isinstance(reference, list) or not all(isinstance(b, str) for b in reference):
            raise ValueError(f"{task_id}: reference_solution.json must be a list of code blocks")
        return GroundTruth(task_id, list(reference), list(wrong.get("blocks", [])), wrong.get("fails"))


@dataclass(frozen=True)
class GroundTruth:
    """One task's solutions: ``reference_blocks`` solve it, ``wrong_blocks`` look alike but
    fail the requirement that starts with ``wrong_fails``."""

    task_id: str
    reference_blocks: list[str]
    wrong_blocks: list[str]
    wrong_fails: str | None


def ground_truth(task_id: str, data_root: str | os.PathLike | None = None, *, seed: int = 0) -> GroundTruth:
    """Reference and wrong solutions of ``task_id`` in the offline suite of ``seed`` (built if
    needed) or in the data folder ``data_root``."""
    return resolve_source(data_root, AppWorldRuntime(), seed=seed).ground_truth(task_id)


def suite_fingerprint(runtime: AppWorldRuntime, seed: int) -> str:
    digest = hashlib.sha256(BUILDER_SCRIPT.read_bytes())
    digest.update(f"seed={seed};appworld={runtime.version}".encode())
    return digest.hexdigest()[:12]


def ensure_offline_suite(
    runtime: AppWorldRuntime | None = None, *, seed: int = 0, progress: Progress | None = None
) -> TaskSource:
    """The offline suite for ``seed``, built on first use (runtime included) and cached."""
    runtime = (runtime or AppWorldRuntime()).ensure(progress)
    say = progress or (lambda message: None)
    target = runtime.suites_dir / f"offline-seed{seed}-{suite_fingerprint(runtime, seed)}"
    if (target / "data" / "suite.json").is_file():
        return TaskSource(target)
    with file_lock(runtime.suites_dir / ".build.lock"):
        if (target / "data" / "suite.json").is_file():
            return TaskSource(target)
        staging = target.with_name(target.name + ".building")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        say(f"building the offline AppWorld suite (seed {seed}) in {target} ...")
        result = subprocess.run(
            [str(runtime.python), str(BUILDER_SCRIPT), "--out", str(staging), "--seed", str(seed)],
            env=runtime.subprocess_env(staging), cwd=str(staging), capture_output=True, text=True,
        )
        for line in result.stderr.splitlines():
            if line.startswith("["):
                say("    " + line)
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise SetupError(
                f"building the offline AppWorld suite failed (exit {result.returncode}):\n"
                + "\n".join(result.stderr.splitlines()[-25:])
            )
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    return TaskSource(target)


def resolve_source(data_root: str | os.PathLike | None, runtime: AppWorldRuntime, *, seed: int = 0,
                   progress: Progress | None = None) -> TaskSource:
    """``data_root`` (or ``$DRACO_GYM_APPWORLD_DATA``) if given, else the offline suite."""
    data_root = data_root or os.environ.get(DATA_ENV)
    if data_root:
        return TaskSource(data_root)
    return ensure_offline_suite(runtime, seed=seed, progress=progress)


def list_tasks(split: str = "train", data_root: str | os.PathLike | None = None, *, seed: int = 0,
               runtime: AppWorldRuntime | None = None) -> list[str]:
    """Task ids of ``split``: cheap (reads one text file), builds the offline suite if needed."""
    return resolve_source(data_root, runtime or AppWorldRuntime(), seed=seed).task_ids(split)
