"""An evaluation samples at most a training iteration's episodes at a time
(``GRPO.rollout``, ``rollout_chunks``): its env runner's memory (KV cache, environments)
stays that of training, and the same seed still draws the same episodes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from draco_gym.algos.rllib.grpo import CHUNK_SEED_STRIDE, GRPO, rollout_chunks


def test_chunks_are_even_and_within_the_episode_budget():
    tasks = [f"t{i}" for i in range(20)]
    # 2 episodes per task, 12 per iteration: 6 tasks would fit, 4 chunks of 5 are as even
    assert rollout_chunks(tasks, 2, 12) == [tasks[0:5], tasks[5:10], tasks[10:15], tasks[15:20]]
    assert rollout_chunks(tasks, 1, 12) == [tasks[:10], tasks[10:]]
    assert rollout_chunks(tasks[:3], 2, 12) == [tasks[:3]]
    # a group larger than the budget: one task at a time
    assert rollout_chunks(["a", "b"], 20, 12) == [["a"], ["b"]]
    assert rollout_chunks([], 2, 12) == []


class RecordingAlgo:
    """What ``GRPO.rollout`` reads of the algorithm: the rollout knobs, ``sample`` and
    ``score`` (recorded, not run)."""

    def __init__(self, group_size: int, tasks_per_iteration: int) -> None:
        self.config = SimpleNamespace(run=SimpleNamespace(rollout=SimpleNamespace(
            group_size=group_size, tasks_per_iteration=tasks_per_iteration)))
        self.calls: list[tuple[list[str], int, int]] = []
        self.scored: list[list[str]] = []

    def sample(self, tasks, *, seed, temperature=None, group_size=None):
        self.calls.append((list(tasks), seed, group_size))
        return [SimpleNamespace(task_id=t, trajectories=[None] * group_size) for t in tasks], {}

    def score(self, groups):
        self.scored.append([g.task_id for g in groups])
        return groups, {}


@pytest.mark.parametrize("score", [True, False])
def test_rollout_samples_an_iterations_episodes_at_a_time(score, capsys):
    algo = RecordingAlgo(group_size=6, tasks_per_iteration=2)
    tasks = [f"t{i}" for i in range(20)]
    groups = GRPO.rollout(algo, tasks, group_size=2, seed=5, score=score)
    assert [g.task_id for g in groups] == tasks  # every task once, in order
    assert [len(c[0]) * c[2] for c in algo.calls] == [10, 10, 10, 10]  # never more than 12 episodes
    assert [c[1] for c in algo.calls] == [5 + CHUNK_SEED_STRIDE * k for k in range(4)]
    assert algo.scored == ([c[0] for c in algo.calls] if score else [])
    progress = [line.split("(")[0].strip() for line in capsys.readouterr().out.splitlines()]
    assert progress == [f"evaluation: {n} of 40 episodes" for n in (10, 20, 30, 40)]  # minutes on a CPU: it shows
    again = RecordingAlgo(group_size=6, tasks_per_iteration=2)
    GRPO.rollout(again, tasks, group_size=2, seed=5, score=score)
    assert again.calls == algo.calls  # the same seed, the same calls: before/after meet the same episodes
