"""Before/after evaluation figures with intervals, and the run's plain statements."""

from __future__ import annotations

import gymnasium as gym
import pytest

import draco_gym  # noqa: F401
from draco_gym.algos.evaluation import (comparison_notes, difference, episode_summary, no_update_note, wilson)
from draco_gym.reward import build_reward
from draco_gym.types import RolloutGroup


def corridor_groups(door_plays, task="corridor-1", score=True):
    env = gym.make("draco_gym/Corridor-v0")
    trajs = []
    for messages in door_plays:
        env.reset(seed=0, options={"task_id": task})
        for m in messages:
            *_, done, cut, _ = env.step(m)
            if done or cut:
                break
        trajs.append(env.unwrapped.trajectory())
    group = RolloutGroup(task_id=task, trajectories=trajs,
                         score=build_reward("corridor").score_group(trajs[0].task, trajs) if score else None)
    return [group]


def act(d):
    return f"```python\nopen_door({d})\n```"


def test_summary_counts_episodes_turns_and_blocks():
    plays = [[act(3), act(0), act(1), act(0)],                       # success, 4 clean turns
             ["hello", act(2), act(2), act(0), act(1)],              # a turn without code, then a miss
             ["```python\nopen_door(7)\n```", act(3), act(2), act(0), act(0)]]  # a raising block
    s = episode_summary(corridor_groups(plays))
    assert s["episodes"] == 3
    assert s["success_rate"]["k"] == 2 and s["success_rate"]["n"] == 3
    assert (s["well_formed_turns"]["k"], s["well_formed_turns"]["n"]) == (13, 14)
    # executed blocks that raised: the door that does not exist and two hallway traps
    assert (s["raised_blocks"]["k"], s["raised_blocks"]["n"]) == (3, 13)
    assert 0 <= s["rubric_pass_rate"]["mean"] <= 1 and s["rubric_pass_rate"]["n"] > 0
    lo, hi = s["success_rate"]["ci95"]
    assert lo < 2 / 3 < hi


def test_wilson_interval_and_difference():
    assert wilson(0, 0) == [0.0, 1.0]
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.404, abs=1e-3) and hi == pytest.approx(0.596, abs=1e-3)
    d = difference({"mean": 0.25, "n": 128}, {"mean": 0.9, "n": 128})
    assert d["delta"] == pytest.approx(0.65) and d["ci95"][0] > 0.5


def test_notes_say_when_an_evaluation_cannot_tell():
    few = {"success_rate": {"mean": 0.25, "k": 1, "n": 4}}
    more = {"success_rate": {"mean": 0.5, "k": 2, "n": 4}}
    notes = comparison_notes(few, more)
    assert len(notes) == 1 and "does not exclude zero" in notes[0] and "(4 and 4)" in notes[0]
    big_b = {"success_rate": {"mean": 0.25, "k": 32, "n": 128}}
    big_a = {"success_rate": {"mean": 0.9, "k": 115, "n": 128}}
    assert comparison_notes(big_b, big_a) == []


def test_no_update_note_counts_flat_iterations():
    rows = [{"credit/groups_with_spread": 0}, {"credit/groups_with_spread": 2}, {"credit/groups_with_spread": 0}]
    assert no_update_note(rows) == "no update in 2 of 3 iterations: every group had equal rewards"
    assert no_update_note([{"credit/groups_with_spread": 1}]) is None
    assert no_update_note([{}]) is None  # older metrics without the count: no claim


def test_rubric_pass_rate_counts_the_criteria_dropout_removed():
    """Two episodes, three criteria: "Solves" passed by both (dropout removes it: it tells
    them apart in nothing), "Is brief" failed by one, "Cites data" N/A for both. The rubric
    pass rate is over the whole rubric: 3 PASS of 4 PASS + FAIL, not 1 of 2 (the kept one)."""
    from draco_gym.reward import finalize_group
    from draco_gym.types import Criterion, Task, Trajectory, Verdict

    criteria = [Criterion(title=t) for t in ("Solves", "Is brief", "Cites data")]
    rows = [[Verdict(criterion="Solves", score=1), Verdict(criterion="Is brief", score=1), Verdict(criterion="Cites data", score=0)],
            [Verdict(criterion="Solves", score=1), Verdict(criterion="Is brief", score=-1), Verdict(criterion="Cites data", score=0)]]
    score = finalize_group(criteria, rows)
    assert [c.title for c in score.criteria] == ["Is brief"] and set(score.dropped) == {"Solves", "Cites data"}
    assert [s.dropped_passes for s in score.scores] == [1, 1] and score.rewards == [1.0, -1.0]
    task = Task(id="t", instruction="do it")
    groups = [RolloutGroup(task_id="t", trajectories=[Trajectory(task=task), Trajectory(task=task)], score=score)]
    rate = episode_summary(groups)["rubric_pass_rate"]
    assert (rate["k"], rate["n"]) == (3, 4)
