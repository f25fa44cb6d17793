"""The trainer learns: GRPO on real Ray/RLlib raises a policy's success on the Corridor.

The policy is a tiny Llama warm-started to write well-formed ``open_door(n)`` blocks with
every door at chance (``build_corridor_policy``). One room per episode is pivotal: only the
door opened there decides success. After a fixed number of GRPO iterations (env runner,
learner, LoRA weight sync, the ``corridor`` rubric with DRACO credit) the success rate of
sampled episodes, measured on the env runner like any rollout, must be far above chance.

The margin is about five standard errors of the difference of two rates measured on 128
episodes each, so sampling noise cannot pass it; a sign-flipped advantage, tokens whose
advantages land on the wrong step, or env runners that never receive the new weights all
fail it (checked by breaking each once).
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from draco_gym.bench.learning_setting import build_corridor_policy, corridor_config, success_rate  # noqa: E402

ITERATIONS = 12
EPISODES_PER_TASK = 32  # x 4 tasks = 128 evaluation episodes
CHANCE = 0.25  # one treasure door out of four


@pytest.fixture(scope="module")
def corridor_policy(tmp_path_factory):
    return build_corridor_policy(tmp_path_factory.mktemp("corridor_policy"))


@pytest.mark.parametrize("pipeline", ["off", pytest.param("one_step", marks=pytest.mark.slow)])
def test_grpo_raises_success_from_chance(ray_session, corridor_policy, pipeline):
    """With ``rollout.pipeline: one_step`` too: every iteration after the first learns from
    rollouts one update old, through the ratio of the policy that drew them."""
    algo = corridor_config(corridor_policy, credit="draco", p=0.0, seed=0).training(pipeline=pipeline).build_algo()
    try:
        before = success_rate(algo, episodes_per_task=EPISODES_PER_TASK)
        for _ in range(ITERATIONS):
            algo.train()
        after = success_rate(algo, episodes_per_task=EPISODES_PER_TASK)
    finally:
        algo.stop()
    assert before["episodes"] == after["episodes"] == 4 * EPISODES_PER_TASK
    assert abs(before["success"] - CHANCE) < 0.1, f"the warm-started policy should choose at chance: {before}"
    assert before["well_formed"] > 0.9, f"the warm start should write valid door calls: {before}"
    assert after["success"] >= before["success"] + 0.3, f"no learning: before {before}, after {after}"


def test_a_policy_built_for_another_corridor_is_refused(tmp_path):
    import json

    from draco_gym.bench.learning_setting import ENV_CONFIG

    (tmp_path / "draco_gym_corridor.json").write_text(json.dumps({"seed": 0, "env_config": ENV_CONFIG}))
    assert build_corridor_policy(tmp_path) == tmp_path  # the same corridor: reused, not rebuilt
    with pytest.raises(ValueError, match="built for the corridor"):
        build_corridor_policy(tmp_path, env_config={**ENV_CONFIG, "n_rooms": 8})


def test_the_locks_warm_start_sees_every_door_equally_often():
    """The full design: every combination of doors once, so each room's doors are equally
    frequent (27 of 81 each) and independent of the other rooms'."""
    import random
    from collections import Counter

    from draco_gym.bench.learning_setting import LOCKS_CONFIG, choice_tokens, demonstration_doors
    from draco_gym.envs.corridor import CorridorEnv

    env = CorridorEnv(**LOCKS_CONFIG)
    doors = demonstration_doors(env, "corridor-2", None, random.Random(0))
    assert len(doors) == 81 and len({tuple(d) for d in doors}) == 81
    assert Counter(d[2] for d in doors) == {230: 27, 231: 27, 232: 27}
    assert len(choice_tokens(env)) == 48 and choice_tokens(env)[0] == "open_door(110)"


def test_provers_simulated_judge_names_the_room_the_failures_missed():
    from draco_gym.bench.learning import CorridorSegmentJudge
    from draco_gym.envs.corridor import CorridorEnv

    env = CorridorEnv(layout="locks", n_doors=3)

    def play(doors):
        env.reset(options={"task_id": "corridor-3"})
        for d in doors:
            env.step(f"```python\nopen_door({d})\n```")
        return env.trajectory()

    win = play([312, 321, 332, 342])
    failures = [play([312, 320, 332, 340]), play([310, 320, 332, 342]), play([312, 320, 330, 340])]
    # room 2 missed three times, room 4 twice (but it is the final step), rooms 1 and 3 once
    segment, reason = CorridorSegmentJudge(0.0, seed=0)(win, 4, failures)
    assert (segment.start, segment.end, reason) == (2, 2, "ok")
    noisy = {CorridorSegmentJudge(1.0, seed=s)(win, 4, failures)[0].start for s in range(20)}
    assert noisy <= {1, 3} and noisy  # p = 1: always another non-final step
