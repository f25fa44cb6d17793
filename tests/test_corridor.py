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


# -- the locks layout: every room its own decision ---------------------------------------------


def locks_env(**kwargs):
    return gym.make("draco_gym/Corridor-v0", layout="locks", n_doors=3, **kwargs)


def test_locks_every_room_decides_and_each_room_has_its_own_doors():
    env = locks_env()
    check_env(env.unwrapped)
    u = env.unwrapped
    assert u.task_ids == ["corridor-1", "corridor-2", "corridor-3", "corridor-4"]
    assert u.doors("corridor-3", 2) == [320, 321, 322]
    right = {t: [u.right_door(t, k) for k in range(1, 5)] for t in u.task_ids}
    # lock_seed 0: the right door differs per room and per task
    assert right == {"corridor-1": [112, 121, 130, 140], "corridor-2": [212, 220, 230, 241],
                     "corridor-3": [312, 321, 332, 342], "corridor-4": [411, 420, 432, 440]}
    obs, _ = env.reset(options={"task_id": "corridor-3"})
    assert obs.endswith("Corridor 3, room 1 of 4: its doors are open_door(310), open_door(311) and open_door(312).")
    win = play(env, "corridor-3", [act(d) for d in right["corridor-3"]])
    assert win.metrics["success"] and win.metrics["locked"] == 0 and win.termination == "submitted"
    assert win.task.metadata["answer"] == "312, 321, 332, 342"
    assert [s.info["state_key"] for s in win.steps] == ["start", "room 2", "room 3", "room 4"]
    # one wrong room of four fails the corridor; a locked door raises and still moves on
    one_off = play(env, "corridor-3", [act(312), act(320), act(332), act(342)])
    assert not one_off.metrics["success"] and one_off.metrics["locked"] == 1
    assert "LockedError: door 320 is locked" in one_off.steps[1].observation
    assert one_off.steps[1].info["exec_error"] == "LockedError" and one_off.steps[2].info["state_key"] == "room 3"
    assert one_off.metrics["visits"][1] == [2, 2, 320, "locked"]


def test_locks_a_door_of_another_room_is_an_error_and_the_agent_stays():
    env = locks_env()
    traj = play(env, "corridor-2", [act(221), act(212), act(112), act(220), act(230), act(241)])
    assert "there is no door 221 in this room; its doors are 210, 211, 212" in traj.steps[0].observation
    assert "there is no door 112 in this room" in traj.steps[2].observation  # corridor 1's door
    assert [s.info["state_key"] for s in traj.steps] == ["start", "start", "room 2", "room 2", "room 3", "room 4"]
    assert traj.metrics["visits"] == [[2, 1, 212, "open"], [4, 2, 220, "open"], [5, 3, 230, "open"], [6, 4, 241, "open"]]
    assert traj.metrics["success"] and traj.metrics["exec_errors"] == 2


def test_locks_arguments_are_checked():
    with pytest.raises(ValueError, match="layout must be one of"):
        gym.make("draco_gym/Corridor-v0", layout="maze")
    with pytest.raises(ValueError, match="n_tasks"):
        locks_env(n_tasks=10)
    with pytest.raises(ValueError, match="right_door belongs to the locks layout"):
        gym.make("draco_gym/Corridor-v0").unwrapped.right_door("corridor-1", 1)
    # the treasure layout's door checks do not apply: 3 doors and the default treasure_door 3
    assert locks_env().unwrapped.n_doors == 3


def test_locks_rubric_cites_each_rooms_step():
    from draco_gym.reward.corridor import room_lock

    env = locks_env()
    right = [312, 321, 332, 342]
    plays = [right, [312, 320, 332, 342], [310, 320, 330, 340], right]
    trajs = [play(env, "corridor-3", [act(d) for d in doors]) for doors in plays]
    score = build_reward("corridor", p=0.0).score_group(trajs[0].task, trajs)
    # room 1 and 3 fail for c only, room 2 for b and c, room 4 for c; nobody sent an invalid call
    assert [c.title for c in score.criteria] == [room_lock(k) for k in (1, 2, 3, 4)] and score.dropped == [VALID]
    v = {s: {x.criterion: x for x in t.verdicts} for s, t in zip("abcd", score.scores)}
    assert v["b"][room_lock(2)].score == -1 and v["b"][room_lock(2)].cited_steps == [2]
    assert v["b"][room_lock(3)].score == 1 and v["b"][room_lock(3)].cited_steps == [3]
    # R = (p - f) / (p + f): a 4/4, b 3 of 4 -> 0.5, c 0 of 4 -> -1
    assert score.rewards == [1.0, 0.5, -1.0, 1.0]
