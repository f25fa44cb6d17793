"""The environment's own evaluation as the reward: the verifier-based baseline.

R_i is read from ``Trajectory.metrics[metric]`` (a bool, or a number such as the
fraction of AppWorld tests passed). It carries no step evidence, so the group has no
criteria or verdicts and DRACO credit falls back to uniform, exactly GRPO with an outcome
reward. A trajectory without a usable value gets R_i = 0 and a recorded fallback of the
outcome's own kind (``FallbackKind.OUTCOME``): no judge failed.
"""

from __future__ import annotations

from collections.abc import Sequence

from draco_gym.metrics import finite_number
from draco_gym.reward.base import REWARDS, RubricReward, check_group, outcome_fallback
from draco_gym.types import GroupScore, Task, Trajectory, TrajectoryScore


@REWARDS.register("outcome")
class OutcomeReward(RubricReward):
    """``metric``: the key in ``Trajectory.metrics``; ``ratio``: optional (numerator,
    denominator) keys instead, e.g. ``("tests_passed", "tests_total")``."""

    name = "outcome"

    def __init__(self, *, metric: str = "success", ratio: Sequence[str] | None = None) -> None:
        if ratio is not None and len(ratio) != 2:
            raise ValueError(f"ratio must name two metrics (numerator, denominator), got {ratio!r}")
        self.metric = metric
        self.ratio = tuple(ratio) if ratio is not None else None

    async def ascore_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        return self.score_group(task, trajectories)

    def score_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        trajectories = check_group(task, trajectories)
        scores, fallbacks = [], []
        for i, t in enumerate(trajectories):
            value, problem = self._value(t.metrics)
            if problem:
                fallbacks.append(outcome_fallback(i + 1, problem))
            scores.append(TrajectoryScore(reward=value))
        return GroupScore(scores=scores, fallbacks=fallbacks)

    def _value(self, metrics: dict) -> tuple[float, str | None]:
        if self.ratio is not None:
            top, bottom = (finite_number(metrics.get(k)) for k in self.ratio)
            if top is None or bottom is None or bottom <= 0:
                return 0.0, f"metrics {self.ratio} missing or not a valid ratio"
            return top / bottom, None
        value = finite_number(metrics.get(self.metric))
        if value is None:
            return 0.0, f"metric {self.metric!r} missing or not a number"
        return value, None
