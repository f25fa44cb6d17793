"""The random-reward baseline: R_i drawn at random, no judge, no environment signal.

DRACO compares its rubric reward against a random reward to show that the gains come from
what the reward says, not from any reward at all moving the policy (GRPO with a random
reward still changes it: group normalisation turns noise into full-size advantages).

R_i is uniform in [low, high] (default [-1, 1], the rubric reward's range). The draw is
seeded by ``seed``, the task id and the rollouts' own text, so the same group re-scored
(a replay, a resumed run) gets the same rewards and different rollouts different ones,
whatever the process or the order of scoring. No verdicts: DRACO credit falls back to
uniform, as for the outcome reward.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

from draco_gym.reward.base import REWARDS, RubricReward, check_group
from draco_gym.types import GroupScore, Task, Trajectory, TrajectoryScore


@REWARDS.register("random")
class RandomReward(RubricReward):
    """``seed``: the run's stream of draws; ``low``, ``high``: the range of R_i."""

    name = "random"

    def __init__(self, *, seed: int = 0, low: float = -1.0, high: float = 1.0) -> None:
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"random reward: need finite low < high, got low={low!r}, high={high!r}")
        self.seed = int(seed)
        self.low, self.high = float(low), float(high)

    async def ascore_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        return self.score_group(task, trajectories)

    def score_group(self, task: Task, trajectories: Sequence[Trajectory]) -> GroupScore:
        trajectories = check_group(task, trajectories)
        scores = [TrajectoryScore(reward=self._draw(task, i, t)) for i, t in enumerate(trajectories)]
        return GroupScore(scores=scores)

    def _draw(self, task: Task, i: int, trajectory: Trajectory) -> float:
        digest = hashlib.sha256(f"{self.seed}\0{task.id}\0{i}".encode())
        for step in trajectory.steps:
            digest.update(b"\0" + step.text.encode("utf-8", "replace"))
        return random.Random(digest.hexdigest()).uniform(self.low, self.high)
