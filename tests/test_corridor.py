"""Corridor-v0 and the corridor rubric: one pivotal step, verdicts citing it, noise p."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import draco_gym  # noqa: F401 - registers the ids
from draco_gym.reward import build_reward
from draco_gym.reward.corridor import TRAPS, TREASURE, VALID


def act(door) -> str:
    return f"```python\nopen_door({door})\n```"


def play(env, task_id: str, messages):
    env.reset(seed=0, options={"task_id": task_id})
    for m in messages:
        *_, terminated, truncated, _ = env.step(m)
        if terminated or truncated:
            break
    return env.unwrapped.trajectory()


def test_registered_and_passes_the_env_checker():
    env = gym.make("draco_gym/Corridor-v0")
    check_env(env.unwrapped)
    assert env.unwrapped.task_ids == ["corridor-1", "corridor-2", "corridor-3", "corridor-4"]


def test_only_the_pivotal_step_decides_success():
    env = gym.make("draco_gym/Corridor-v0")
    # treasure room 3; hallways differ wildly, the door in room 3 alone decides
    wins = [play(env, "corridor-3", [act(a), act(b), act(3), act(c)]) for a, b, c in [(0, 1, 2), (2, 2, 2), (3, 0, 1)]]
    losses = [play(env, "corridor-3", [act(0), act(1), act(d), act(0)]) for d in (0, 1, 2)]
    assert all(t.metrics["success"] for t in wins) and not any(t.metrics["success"] for t in losses)
    assert all(t.termination == "submitted" and len(t.steps) == 4 for t in wins + losses)
    assert wins[1].metrics["traps"] == 3 and wins[1].metrics["pivot_step"] == 3


def test_invalid_messages_stay_in_the_room_and_shift_the_pivotal_step():
    env = gym.make("draco_gym/Corridor-v0")
    traj = play(env, "corridor-1", ["no code", "```python\nopen_door(9)\n```", "```python\nprint(1)\n```", act(3),
                                    act(0), act(1), act(0)])
    assert traj.metrics["pivot_step"] == 4 and traj.metrics["success"]
    assert traj.metrics["parse_errors"] == 1 and traj.metrics["exec_errors"] == 2
    assert "there is no door 9" in traj.steps[1].observation


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="n_rooms"):
        gym.make("draco_gym/Corridor-v0", n_rooms=1)
    with pytest.raises(ValueError, match="treasure_door"):
        gym.make("draco_gym/Corridor-v0", treasure_door=7)
    with pytest.raises(ValueError, match="trap_doors"):
        gym.make("draco_gym/Corridor-v0", trap_doors=[0, 1, 2, 3])
    env = gym.make("draco_gym/Corridor-v0")
    with pytest.raises(ValueError, match="unknown task_id"):
        env.reset(options={"task_id": "corridor-9"})
    with pytest.raises(ValueError, match="p "):
        build_reward("corridor", p=1.5)


def group(env, task_id="corridor-2"):
    plays = [[0, 3, 0, 0], [0, 1, 0, 0], [2, 3, 2, 1], [2, 1, 2, 2]]
    return [play(env, task_id, [act(d) for d in doors]) for doors in plays]


def test_verdicts_cite_the_steps_that_caused_them():
    env = gym.make("draco_gym/Corridor-v0")
    trajs = group(env)
    score = build_reward("corridor", p=0.0).score_group(trajs[0].task, trajs)
    assert [c.title for c in score.criteria] == [TREASURE, TRAPS]  # nobody sent an invalid call: dropped
    assert score.dropped == [VALID]
    v = {s: {x.criterion: x for x in t.verdicts} for s, t in zip("abcd", score.scores)}
    assert v["a"][TREASURE].score == 1 and v["a"][TREASURE].cited_steps == [2]
    assert v["b"][TREASURE].score == -1 and v["b"][TREASURE].cited_steps == [2]
    assert v["c"][TRAPS].score == -1 and v["c"][TRAPS].cited_steps == [1, 3]
    assert v["a"][TRAPS].score == 1 and v["a"][TRAPS].cited_steps == [1, 3, 4]
    assert score.rewards == [1.0, 0.0, 0.0, -1.0]


def test_citation_noise_is_seeded_and_moves_only_citations():
    import random

    env = gym.make("draco_gym/Corridor-v0")
    rng = random.Random(0)
    trajs = [play(env, "corridor-2", [act(rng.randrange(4)) for _ in range(4)]) for _ in range(60)]
    clean = build_reward("corridor", p=0.0).score_group(trajs[0].task, trajs)
    noisy = build_reward("corridor", p=0.4, seed=3).score_group(trajs[0].task, trajs)
    again = build_reward("corridor", p=0.4, seed=3).score_group(trajs[0].task, trajs)
    assert noisy.rewards == clean.rewards  # the same verdicts; only where they point changes
    assert [s.model_dump() for s in noisy.scores] == [s.model_dump() for s in again.scores]
    cited = [v.cited_steps for s in noisy.scores for v in s.verdicts if v.criterion == TREASURE]
    wrong = sum(c != [2] for c in cited) / len(cited)
    assert 0.2 < wrong < 0.6, wrong  # about p = 0.4 of them point at another step
    assert all(1 <= c[0] <= 4 for c in cited)


def test_room_trap_criteria_cite_each_hallway_step():
    from draco_gym.reward.corridor import room_trap

    env = gym.make("draco_gym/Corridor-v0")
    trajs = group(env)  # treasure room 2; hallways 1, 3, 4
    score = build_reward("corridor", p=0.0, traps="room").score_group(trajs[0].task, trajs)
    assert [c.title for c in score.criteria] == [TREASURE, room_trap(1), room_trap(3), room_trap(4)]
    assert score.dropped == [VALID]
    v = {s: {x.criterion: x for x in t.verdicts} for s, t in zip("abcd", score.scores)}
    assert v["c"][room_trap(1)].score == -1 and v["c"][room_trap(1)].cited_steps == [1]
    assert v["c"][room_trap(3)].score == -1 and v["c"][room_trap(3)].cited_steps == [3]
    assert v["c"][room_trap(4)].score == 1 and v["c"][room_trap(4)].cited_steps == [4]
    assert v["b"][TREASURE].score == -1 and v["b"][TREASURE].cited_steps == [2]
    # the treasure door is one verdict of four: b (wrong door, no trap) outscores c (treasure, two traps)
    assert score.rewards == [1.0, 0.5, 0.0, -1.0]
    with pytest.raises(ValueError, match="traps must be one of"):
        build_reward("corridor", traps="step")
