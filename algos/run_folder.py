"""A run's output folder: what an earlier run left there, and how a resumed run continues it.

A resumed run is the state at its checkpoint's iteration k, and every log continues at k + 1.
``continue_logs(output_dir, k)`` makes the folder say so before the run starts: whatever was
written after iteration k (by the run that went on past its checkpoint, or was killed) moves
to ``OUTPUT_DIR/set-aside/resume-<time>-after-iteration-<k>/`` under its own relative path,
and each log is cut there:

- ``metrics.jsonl``: rows whose ``training_iteration`` is above k;
- ``rollouts.jsonl``: records whose ``iteration`` (the trainer's count before the step, from
  0) is k or more;
- in each Tune trial folder under ``tune/``: ``result.json`` and ``progress.csv`` rows above k,
  and the TensorBoard event records of the steps above k (Tune logs a result at step
  ``training_iteration``); the checkpoints of iterations above k, and any partial ones.

Nothing is deleted. The trackers' runs (W&B, MLflow) are not rewritten: each attempt is a
run of its own there, and the resumed one logs from step k + 1.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

from draco_gym.algos.checkpoints import CheckpointError, checkpoint_dirs, require_complete
from draco_gym.records import SET_ASIDE, RecordError, cut_after, cut_point, move_tail, stamp

# What a run writes into its output folder (``warm_start/`` is the warm start's, reused by
# a later run with the same settings, and not among them).
RUN_FILES = ("metrics.jsonl", "rollouts.jsonl", "checkpoint", "tune", "plots", "summary.json", "memory.json", "eval",
             "report.html", "mlflow.db", "mlflow-artifacts", SET_ASIDE)
# The files whose presence means the folder holds a run.
_RUN_MARKS = ("metrics.jsonl", "rollouts.jsonl", "checkpoint", "tune")
# Tune's TensorBoard logger records a result at step ``training_iteration`` (Ray 2.60 does
# not log that key itself; a version that does logs it under this tag, and RLlib's
# timers/training_iteration, seconds, under another one that ends the same way).
_TUNE_ITERATION_TAG = "ray/tune/training_iteration"
_ROLLOUT_ITERATION = re.compile(rb'\{"iteration": (-?\d+)[,}]')


def previous_run(output_dir: str | Path) -> list[str]:
    """The files of an earlier run in ``output_dir`` (empty: none)."""
    out = Path(output_dir)
    return [name for name in _RUN_MARKS if (out / name).exists()]


def clear_previous_run(output_dir: str | Path) -> list[str]:
    """Delete an earlier run's files from ``output_dir`` (``--overwrite``); returns their names."""
    out = Path(output_dir)
    removed = []
    for name in RUN_FILES:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


@dataclass
class Continued:
    """What ``continue_logs`` moved: (file, lines kept, lines moved) per log it cut, the
    folders it moved, and notes on Tune files it could not read (left as they were)."""

    iteration: int
    aside: Path
    logs: list[tuple[Path, int, int]] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        moved = [f"{path.name} {n}" for path, _, n in self.logs if n]
        if not moved and not self.folders:
            return f"every log ends at iteration {self.iteration}; nothing set aside"
        parts = moved + ([f"{len(self.folders)} checkpoint folder(s)"] if self.folders else [])
        return f"set aside what came after iteration {self.iteration} ({', '.join(parts)}) in {self.aside}"


def continue_logs(output_dir: str | Path, iteration: int) -> Continued:
    """Cut every log of ``output_dir`` at ``iteration`` (module docstring), the rest kept
    under ``set-aside/``. Raises ``RecordError`` when ``metrics.jsonl`` or ``rollouts.jsonl``
    has a damaged line before the cut (nothing is moved then)."""
    out = Path(output_dir)
    k = int(iteration)
    done = Continued(k, out / SET_ASIDE / f"resume-{stamp()}-after-iteration-{k}")
    # Read both of our logs before moving anything: a damaged one stops the resume here.
    plans = [(out / "metrics.jsonl", lambda raw: _metrics_iteration(raw) > k),
             (out / "rollouts.jsonl", lambda raw: _rollout_iteration(raw) >= k)]
    for path, beyond in plans:
        if path.is_file():
            cut_point(path, beyond)
    for path, beyond in plans:
        _cut(done, out, path, beyond)
    for trial in sorted(p for p in (out / "tune").glob("*") if p.is_dir()):
        _continue_trial(done, out, trial, k)
    moved_final = _aside_if_after(done, out, out / "checkpoint", k)
    if moved_final:
        done.folders.append(moved_final)
    return done


def _cut(done: Continued, out: Path, path: Path, beyond) -> None:
    kept, moved, _ = cut_after(path, beyond, done.aside / path.parent.relative_to(out))
    if path.is_file():
        done.logs.append((path, kept, moved))


def _continue_trial(done: Continued, out: Path, trial: Path, k: int) -> None:
    for name, beyond in (("result.json", lambda raw: _metrics_iteration(raw) > k),
                         ("progress.csv", _csv_beyond(trial / "progress.csv", k))):
        if beyond is None or not (trial / name).is_file():
            continue
        try:
            _cut(done, out, trial / name, beyond)
        except RecordError as exc:
            done.notes.append(f"{exc}; left as it is")
    for events in sorted(trial.glob("events.out.tfevents.*")):
        try:
            _cut_events(done, out, events, k)
        except ValueError as exc:
            done.notes.append(f"{events}: {exc}; left as it is")
    for path in checkpoint_dirs(trial):
        moved = _aside_if_after(done, out, path, k)
        if moved:
            done.folders.append(moved)


def _aside_if_after(done: Continued, out: Path, path: Path, k: int) -> Path | None:
    """A checkpoint folder of an iteration above ``k``, or a partial one, moved aside."""
    if not path.is_dir():
        return None
    try:
        if require_complete(path).iteration <= k:
            return None
    except CheckpointError:
        pass  # partial: never trusted, kept aside for inspection
    target = done.aside / path.relative_to(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    path.rename(target)
    return target


def _metrics_iteration(raw: bytes) -> int:
    value = json.loads(raw).get("training_iteration")
    if not isinstance(value, int):
        raise ValueError("no integer training_iteration")
    return value


def _rollout_iteration(raw: bytes) -> int:
    found = _ROLLOUT_ITERATION.match(raw)  # RolloutLog writes the iteration first: no full parse
    if found:
        return int(found.group(1))
    value = json.loads(raw).get("iteration")
    if not isinstance(value, int):
        raise ValueError("no integer iteration")
    return value


def _csv_beyond(path: Path, k: int):
    """A ``progress.csv`` row test, from its header's ``training_iteration`` column."""
    if not path.is_file():
        return None
    with open(path, newline="") as fh:
        header = next(csv.reader(fh), [])
    if "training_iteration" not in header:
        return None
    column = header.index("training_iteration")
    first = True

    def beyond(raw: bytes) -> bool:
        nonlocal first
        row = next(csv.reader(io.StringIO(raw.decode("utf-8"))))
        if first and row == header:
            first = False
            return False
        return int(float(row[column])) > k

    return beyond


# -- TensorBoard event files: TFRecord framing (length, crc, data, crc) of Event protos ---------


def _event_records(path: Path) -> tuple[list[tuple[int, int, float | None]], int]:
    """(offset, step, training_iteration if the record logs it) of each whole record, and
    the offset where the whole records end (a record cut short follows it)."""
    from tensorboardX.proto import event_pb2

    data = path.read_bytes()
    records, pos = [], 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        end = pos + 12 + length + 4
        if end > len(data):
            break
        event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
        logged = next((v.simple_value for v in event.summary.value if v.tag == _TUNE_ITERATION_TAG), None)
        records.append((pos, event.step, logged))
        pos = end
    return records, pos


def _cut_events(done: Continued, out: Path, path: Path, k: int) -> None:
    records, whole = _event_records(path)
    iteration_at = {step: int(logged) for _, step, logged in records if logged is not None}
    offset = next((pos for pos, step, _ in records if iteration_at.get(step, step) > k), whole)
    kept = sum(1 for pos, _, _ in records if pos < offset)
    if offset < path.stat().st_size:
        move_tail(path, offset, done.aside / path.parent.relative_to(out))
    done.logs.append((path, kept, len(records) - kept))
