"""Checkpoints a resume can trust: complete, or refused by name.

A checkpoint is written into a hidden sibling of its folder (``.checkpoint_000003.partial-…``),
its files synced, then sealed: ``draco_checkpoint.json``, written last, lists every file with
its size and the iteration the state is at; only then is the sibling renamed onto the
checkpoint's name (one ``rename``, atomic on a local filesystem). A kill at any moment leaves
either the complete checkpoint or a hidden partial one that nothing trusts; and a folder that
lost files afterwards (a copy cut short, a delete interrupted) no longer matches its list.

``resume_point`` is what ``draco-gym train --resume`` and ``restore_from`` use: the newest
complete checkpoint under a folder (a run's ``OUTPUT_DIR``, its ``tune/`` or a trial folder),
or the one named, which must be complete: ``CheckpointError`` names what is missing.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from draco_gym.records import SET_ASIDE

MARKER = "draco_checkpoint.json"
# Folder names that are checkpoints: Tune's, the run's final copy, a partial one.
_TUNE_NAME = re.compile(r"checkpoint_\d+")
_PARTIAL = re.compile(r"\..+\.(partial|old)-[0-9a-f]+")
# Files RLlib writes at a checkpoint's top, to tell a checkpoint from a folder of them.
_RLLIB_FILES = ("class_and_ctor_args.pkl", "metadata.json", "rllib_checkpoint.json", "algorithm_state.pkl")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message says what is missing."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    iteration: int


@dataclass
class Choice:
    """The checkpoint picked under a folder, and the ones passed over with the reason."""

    checkpoint: Checkpoint
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def describe(self) -> str:
        text = f"{self.checkpoint.path} (iteration {self.checkpoint.iteration})"
        if self.skipped:
            text += "; passed over: " + "; ".join(f"{p}: {why}" for p, why in self.skipped)
        return text


# -- writing -----------------------------------------------------------------------------------


def staging_dir(final: Path) -> Path:
    """The hidden sibling a checkpoint is written into before it takes ``final``'s name."""
    return final.parent / f".{final.name}.partial-{uuid.uuid4().hex[:12]}"


def seal(path: Path, iteration: int) -> None:
    """Sync every file of the written checkpoint at ``path``, then write its marker last."""
    files = {}
    for item in sorted(path.rglob("*")):
        if item.is_file() and item.name != MARKER:
            files[item.relative_to(path).as_posix()] = item.stat().st_size
            _fsync_file(item)
    tmp = path / f".{MARKER}.tmp"
    tmp.write_text(json.dumps({"format": 1, "iteration": int(iteration), "files": files}, indent=1))
    _fsync_file(tmp)
    os.replace(tmp, path / MARKER)
    for folder in sorted({p.parent for p in path.rglob("*")} | {path}, key=lambda p: len(p.parts), reverse=True):
        _fsync_dir(folder)


def install(staging: Path, final: Path) -> None:
    """``staging`` renamed to ``final``. An empty ``final`` is replaced in the same rename; a
    full one is renamed aside first and deleted only once the new one is in place."""
    try:
        os.rename(staging, final)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:12]}"
        os.rename(final, old)
        os.rename(staging, final)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(final.parent)


def copy_checkpoint(source: str | Path, final: str | Path) -> Checkpoint:
    """A complete copy of the complete checkpoint ``source`` at ``final``, put in place by a
    rename (the old ``final``, if any, is deleted after)."""
    checkpoint = require_complete(source)
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(final)
    try:
        shutil.copytree(checkpoint.path, staging)
        copied = require_complete(staging)
        for item in staging.rglob("*"):
            if item.is_file():
                _fsync_file(item)
        install(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Checkpoint(final, copied.iteration)


# -- reading -----------------------------------------------------------------------------------


def problems(path: str | Path) -> list[str]:
    """What keeps ``path`` from being a complete checkpoint (empty: nothing)."""
    path = Path(path)
    if not path.is_dir():
        return [f"{path} is not a directory"]
    marker = path / MARKER
    if not marker.is_file():
        present = [name for name in _RLLIB_FILES if (path / name).is_file()]
        return [f"no {MARKER} (written last, once every file is in place: the save did not finish, or the "
                f"checkpoint was not written by draco-gym's GRPO); it holds "
                + (", ".join(present) if present else "none of RLlib's checkpoint files")]
    try:
        listed = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        return [f"{MARKER} is unreadable ({type(exc).__name__})"]
    found = []
    for name, size in listed.items():
        item = path / name
        if not item.is_file():
            found.append(f"{name} is missing")
        elif item.stat().st_size != size:
            found.append(f"{name} has {item.stat().st_size} of its {size} bytes")
    return found


def require_complete(path: str | Path) -> Checkpoint:
    """The checkpoint at ``path``, or ``CheckpointError`` naming what it lacks."""
    path = Path(path)
    found = problems(path)
    if found:
        shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        raise CheckpointError(f"checkpoint {path} is incomplete: {shown}")
    return Checkpoint(path, int(json.loads((path / MARKER).read_text())["iteration"]))


def is_checkpoint_dir(path: Path) -> bool:
    """A checkpoint (complete or not), as opposed to a folder that holds checkpoints."""
    return (path / MARKER).is_file() or path.name == "checkpoint" or bool(_TUNE_NAME.fullmatch(path.name)) \
        or bool(_PARTIAL.fullmatch(path.name)) or any((path / name).is_file() for name in _RLLIB_FILES)


def checkpoint_dirs(root: Path, depth: int = 3) -> list[Path]:
    """The checkpoints under a run folder (``checkpoint/``, ``tune/*/checkpoint_*``), a Tune
    experiment folder (``*/checkpoint_*``) or a trial folder (``checkpoint_*``), partial ones
    included; never a checkpoint's own subfolders (RLlib's components look like checkpoints
    too) nor what a resume set aside."""
    found: list[Path] = []

    def visit(folder: Path, depth: int) -> None:
        for child in sorted(folder.iterdir()):
            if not child.is_dir() or child.is_symlink() or child.name == SET_ASIDE:
                continue
            if is_checkpoint_dir(child):
                found.append(child)
            elif depth > 1:
                visit(child, depth - 1)

    if root.is_dir():
        visit(root, depth)
    return found


def newest_complete(root: str | Path) -> Choice:
    """The complete checkpoint at the highest iteration under ``root`` (the latest sealed one
    among equals), with every other checkpoint passed over and why."""
    root = Path(root)
    complete, skipped = [], []
    for path in checkpoint_dirs(root):
        try:
            complete.append(require_complete(path))
        except CheckpointError as exc:
            skipped.append((path, str(exc).split(": ", 1)[1]))
    if not complete:
        where = f"{root} holds no checkpoint" if not skipped else f"no complete checkpoint under {root}"
        detail = "; ".join(f"{p}: {why}" for p, why in skipped)
        raise CheckpointError(where + (f" ({detail})" if detail else ""))
    complete.sort(key=lambda c: (c.iteration, (c.path / MARKER).stat().st_mtime))
    chosen = complete[-1]
    return Choice(chosen, [(p, why) for p, why in skipped])


def resume_point(path: str | Path) -> Choice:
    """``path`` itself when it is a checkpoint (complete, else ``CheckpointError``), else the
    newest complete checkpoint under it."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint or run folder")
    if is_checkpoint_dir(path):
        return Choice(require_complete(path))
    return newest_complete(path)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (network ones) refuse a directory fsync; the rename still stands
    finally:
        os.close(fd)
