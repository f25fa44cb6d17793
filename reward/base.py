"""The one protocol every reward follows, and the last two DRACO stages they share.

    group = reward.score_group(task, trajectories)          # plain Python
    group = await reward.ascore_group(task, trajectories)   # inside an event loop

``group.scores[i]`` holds trajectory i's surviving verdicts (score, cited 1-based steps,
evidence, justification), p, f and R_i; ``group.usage`` the judge cost per stage;
``group.fallbacks`` every stage that failed and what was done instead; ``fallback_kind``
says whose failure each was (the judge's, or the environment's missing outcome) and
``count_fallbacks`` counts them by kind.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any

from draco_gym.registry import Registry
from draco_gym.types import Criterion, GroupScore, StageUsage, Task, Trajectory, TrajectoryScore, Verdict

REWARDS: Registry[Any] = Registry("reward")


def build_reward(name: str, **options: Any) -> RubricReward:
    """The reward registered as ``name`` ("dynamic", "static", "rule", "outcome") built
    with ``options``, as a YAML config names it. A ``judge`` option may be a Judge, a
    JudgeClient, or a dict ``{"name": "openai", "model": ..., "base_url": ...}``."""
    return REWARDS.get(name)(**options)


def run_sync(coroutine):
    """Run a coroutine to completion from synchronous code, also when the caller is
    itself inside a running event loop (a notebook, an async trainer): then the work runs
    on a fresh loop in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class RubricReward:
    """Base of every reward: subclasses implement ``ascore_group``."""

    name = "reward"

    async def ascore_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        raise NotImplementedError

    def score_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        return run_sync(self._then_close(self.ascore_group(task, trajectories)))

    async def ascore_groups(self, groups: Sequence[tuple[Task, Sequence[Trajectory]]]) -> list[GroupScore]:
        """Several groups at once (a training step's tasks): their calls share the judge's
        concurrency and rate limits, so the step costs about one group's wall time."""
        return list(await asyncio.gather(*(self.ascore_group(task, trajs) for task, trajs in groups)))

    def score_groups(self, groups: Sequence[tuple[Task, Sequence[Trajectory]]]) -> list[GroupScore]:
        return run_sync(self._then_close(self.ascore_groups(groups)))

    async def aclose(self) -> None:
        """Release the judge's connections on the running event loop (async callers that
        own their loop may call it before closing the loop; the sync API always does)."""
        client = getattr(self, "client", None)
        if client is not None:
            await client.aclose()

    async def _then_close(self, coroutine):
        # The sync API runs each call on a fresh event loop; connections opened on it must
        # close before it does, or they fail later at garbage collection.
        try:
            return await coroutine
        finally:
            await self.aclose()


class FallbackKind(StrEnum):
    """Whose failure a fallback covers. A run with no judge has no judge fallback: an
    environment result without the outcome metric is the environment's, counted apart."""

    JUDGE = "judge"
    """a judge stage got no usable answer, and its result was replaced (the static rubric,
    verdicts without citations, a zeroed group)"""
    OUTCOME = "outcome"
    """the environment's result had no usable outcome metric, and that reward was set to 0"""


OUTCOME_STAGE = "outcome"
"""The stage name of the outcome reward's fallbacks, ``outcome[i]: ...`` (no judge stage has it)."""
_OUTCOME_FALLBACK = re.compile(rf"(?:[\w-]+: )*{OUTCOME_STAGE}\[\d+\]: ")
"""An outcome fallback, also under the part labels a weighted reward puts in front (``outcome: ``)."""


def outcome_fallback(index: int, problem: str) -> str:
    """The fallback of trajectory ``index`` (1-based) whose outcome metric is missing or unusable."""
    return f"{OUTCOME_STAGE}[{index}]: {problem}; reward set to 0"


def fallback_kind(fallback: str) -> FallbackKind:
    """Whose failure a ``GroupScore.fallbacks`` entry covers: the outcome reward's own
    (``outcome_fallback``, also inside a weighted reward) or, for every other, the judge's."""
    return FallbackKind.OUTCOME if _OUTCOME_FALLBACK.match(fallback) else FallbackKind.JUDGE


def count_fallbacks(groups: Iterable[GroupScore]) -> dict[FallbackKind, int]:
    """The fallbacks of ``groups`` by kind, every kind present (0 where none)."""
    counts = dict.fromkeys(FallbackKind, 0)
    for group in groups:
        for fallback in group.fallbacks:
            counts[fallback_kind(fallback)] += 1
    return counts


def check_group(task: Task, trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    trajectories = list(trajectories)
    if not trajectories:
        raise ValueError("a group needs at least one trajectory")
    for i, t in enumerate(trajectories):
        if not isinstance(t, Trajectory):
            raise TypeError(f"trajectories[{i}] is a {type(t).__name__}, expected Trajectory")
        if t.task.id != task.id:
            raise ValueError(f"trajectories[{i}] is for task {t.task.id!r}, but the group is for {task.id!r}")
    return trajectories


def discriminative_dropout(criteria: list[Criterion], verdicts: list[list[Verdict]]) -> tuple[list[int], list[int]]:
    """DRACO stage 6: keep a criterion only if some member of the group failed it.

    A criterion every trajectory passed (or found not applicable) cannot tell the group's
    members apart: it only inflates everyone's reward. Returns (kept, dropped) indices.
    """
    kept, dropped = [], []
    for j in range(len(criteria)):
        (kept if any(row[j].score == -1 for row in verdicts) else dropped).append(j)
    return kept, dropped


def finalize_group(
    criteria: list[Criterion],
    verdicts: list[list[Verdict]],
    *,
    usage: dict[str, StageUsage] | None = None,
    fallbacks: list[str] | None = None,
    dropout: bool = True,
) -> GroupScore:
    """Stages 6 and 7: dropout, then R_i = (p_i - f_i) / (p_i + f_i) over the surviving
    verdicts. ``verdicts[i][j]`` is trajectory i's final verdict on ``criteria[j]``."""
    for i, row in enumerate(verdicts):
        if len(row) != len(criteria):
            raise ValueError(f"trajectory {i} has {len(row)} verdicts for {len(criteria)} criteria")
    if dropout:
        kept, dropped = discriminative_dropout(criteria, verdicts)
    else:
        kept, dropped = list(range(len(criteria))), []
    return GroupScore(
        criteria=[criteria[j] for j in kept],
        scores=[TrajectoryScore.from_verdicts([row[j] for j in kept]).model_copy(
            update={"dropped_passes": sum(row[j].score == 1 for j in dropped)}) for row in verdicts],
        dropped=[criteria[j].title for j in dropped],
        usage=dict(usage or {}),
        fallbacks=list(fallbacks or []),
    )


def zero_group(n: int, reason: str, *, usage: dict[str, StageUsage] | None = None, fallbacks: list[str] | None = None) -> GroupScore:
    """The explicit fallback when a group cannot be scored: every R_i = 0, so the group's
    advantages are 0 and it teaches nothing, rather than something wrong."""
    return GroupScore(
        scores=[TrajectoryScore() for _ in range(n)],
        usage=dict(usage or {}),
        fallbacks=[*(fallbacks or []), reason],
    )
