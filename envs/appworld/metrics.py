"""AppWorld's two benchmark metrics over evaluated episodes.

TGC (task goal completion): the share of tasks whose every test passed.
SGC (scenario goal completion): the share of scenarios all of whose tasks passed; a scenario
is the task id before the last underscore (``<scenario>_<n>``), as in AppWorld.

``results`` is a sequence of episode results, each a mapping with ``task_id`` and
``success`` (what the environment puts in ``Trajectory.metrics``), optionally
``difficulty``. Several episodes of one task (G rollouts) count as separate attempts for
TGC; for SGC a scenario passes only if every attempt of each of its tasks passed, so
neither metric can be raised by repeating a task.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping


def scenario_of(task_id: str) -> str:
    task_id = task_id.split(":")[0]
    if "_" not in task_id:
        raise ValueError(f"task id {task_id!r} has no scenario part (expected <scenario>_<n>)")
    return task_id.rsplit("_", 1)[0]


def _rows(results: Iterable[Mapping[str, Any]]) -> list[tuple[str, bool, Any]]:
    rows = []
    for i, r in enumerate(results):
        if "task_id" not in r or "success" not in r:
            raise ValueError(f"result {i} needs 'task_id' and 'success' keys, got {sorted(r)}")
        rows.append((str(r["task_id"]), bool(r["success"]), r.get("difficulty")))
    return rows


def tgc(results: Iterable[Mapping[str, Any]]) -> float:
    rows = _rows(results)
    if not rows:
        raise ValueError("tgc() of no results is undefined")
    return sum(ok for _, ok, _ in rows) / len(rows)


def sgc(results: Iterable[Mapping[str, Any]]) -> float:
    rows = _rows(results)
    if not rows:
        raise ValueError("sgc() of no results is undefined")
    passed: dict[str, bool] = defaultdict(lambda: True)
    for task_id, ok, _ in rows:
        passed[scenario_of(task_id)] &= ok
    return sum(passed.values()) / len(passed)


def by_difficulty(results: Iterable[Mapping[str, Any]]) -> dict[Any, dict[str, float]]:
    """{difficulty: {"tgc", "sgc", "n"}} over results that carry a difficulty."""
    groups: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for r in results:
        if r.get("difficulty") is not None:
            groups[r["difficulty"]].append(r)
    return {d: {"tgc": tgc(rs), "sgc": sgc(rs), "n": len(rs)} for d, rs in sorted(groups.items())}
