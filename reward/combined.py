"""Rubrics combined by weight: R_i = sum_k w_k R_i^k, e.g. rule + outcome.

    reward = build_reward("weighted", parts=[
        {"name": "rule", "weight": 0.5},
        {"name": "outcome", "weight": 0.5, "options": {"metric": "success"}},
    ])

Every part scores the same group (concurrently, so judged parts share the wall time); the
combined group keeps every part's surviving criteria and verdicts (so DRACO credit reads
the citations of all of them), its dropped criteria, judge usage per ``part/stage`` and
fallbacks prefixed with the part's name. Only the reward is weighted: p_i and f_i count
the verdicts of all parts.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from draco_gym.reward.base import REWARDS, RubricReward, build_reward, check_group
from draco_gym.types import GroupScore, Task, Trajectory, TrajectoryScore


@REWARDS.register("weighted")
class WeightedReward(RubricReward):
    """``parts``: ``(reward, weight)`` pairs, or dicts ``{"name", "weight", "options"}`` as a
    YAML config writes them (``reward: {name: weighted, options: {parts: [...]}}``)."""

    name = "weighted"

    def __init__(self, parts: Sequence[Any]) -> None:
        built: list[tuple[RubricReward, float]] = []
        for k, part in enumerate(parts or []):
            if isinstance(part, dict):
                unknown = set(part) - {"name", "weight", "options"}
                if unknown or "name" not in part:
                    raise ValueError(f"parts[{k}] must be {{name, weight, options}}, got keys {sorted(part)}")
                reward, weight = build_reward(part["name"], **(part.get("options") or {})), part.get("weight", 1.0)
            else:
                reward, weight = part
                if not isinstance(reward, RubricReward):
                    raise TypeError(f"parts[{k}][0] must be a RubricReward, got {type(reward).__name__}")
            if not math.isfinite(float(weight)):
                raise ValueError(f"parts[{k}]: weight must be finite, got {weight}")
            built.append((reward, float(weight)))
        if not built:
            raise ValueError("a weighted reward needs at least one part")
        names = [reward.name for reward, _ in built]
        self.parts: list[tuple[str, RubricReward, float]] = [
            (name if names.count(name) == 1 else f"{name}{k + 1}", reward, weight)
            for k, (name, (reward, weight)) in enumerate(zip(names, built))]

    async def ascore_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        trajectories = check_group(task, trajectories)
        groups = await asyncio.gather(*(reward.ascore_group(task, trajectories) for _, reward, _ in self.parts))
        scores = []
        for i in range(len(trajectories)):
            verdicts = [v for g in groups for v in g.scores[i].verdicts]
            scores.append(TrajectoryScore(
                verdicts=verdicts, p=sum(g.scores[i].p for g in groups), f=sum(g.scores[i].f for g in groups),
                dropped_passes=sum(g.scores[i].dropped_passes for g in groups),
                reward=sum(w * g.scores[i].reward for (_, _, w), g in zip(self.parts, groups))))
        return GroupScore(
            criteria=[c for g in groups for c in g.criteria],
            scores=scores,
            dropped=[d for g in groups for d in g.dropped],
            usage={f"{label}/{stage}": u for (label, _, _), g in zip(self.parts, groups) for stage, u in g.usage.items()},
            fallbacks=[f"{label}: {f}" for (label, _, _), g in zip(self.parts, groups) for f in g.fallbacks],
            judge_answers=sum(g.judge_answers for g in groups),
            judge_failures=[f for g in groups for f in g.judge_failures],
        )

    async def aclose(self) -> None:
        for _, reward, _ in self.parts:
            await reward.aclose()
