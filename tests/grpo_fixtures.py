"""What the trainer tests share (not a test module): the parity test reward and the tiny
GRPO config of ``test_train_grpo``, and ways to read a trained adapter back.

The random tiny policy never writes a code block, so every rubric reward would tie and
every advantage would be 0; ``ParityReward`` scores the sampled text instead, so that the
groups have spread and the updates move the weights. The env runner actors unpickle it,
so this module is shipped to them by value.
"""

from __future__ import annotations

import sys

import ray.cloudpickle

from draco_gym.algos.rllib.grpo import GRPOConfig
from draco_gym.reward import RubricReward
from draco_gym.types import Criterion, GroupScore, TrajectoryScore, Verdict

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ParityReward(RubricReward):
    """One verdict per step: the step passes when the sum of its sampled token ids is even."""

    async def ascore_group(self, task, trajectories):
        scores = []
        for traj in trajectories:
            sums = {}
            for token, step in zip(traj.token_ids, traj.token_step):
                sums[step] = sums.get(step, 0) + token
            verdicts = [Verdict(criterion="even", score=1 if sums.get(s.index, 0) % 2 == 0 else -1,
                                cited_steps=[s.index]) for s in traj.steps]
            scores.append(TrajectoryScore.from_verdicts(verdicts))
        return GroupScore(criteria=[Criterion(title="even")], scores=scores)


def make_config(model, out_dir) -> GRPOConfig:
    return (
        GRPOConfig()
        .environment("draco_gym/PythonTools-v0", env_config={"max_turns": 2})
        .policy(model=str(model), lora={"r": 4, "alpha": 8})
        .training(group_size=3, tasks_per_iteration=2, max_new_tokens=12, max_response_tokens=200,
                  reward=ParityReward, credit="draco", lr=5e-3, kl_coeff=0.05, minibatch_size=None,
                  micro_batch_tokens=400, output_dir=str(out_dir))
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=7, log_level="ERROR")
    )


def lora_state(algo) -> dict:
    state = algo.learner_group.get_state(components="learner/rl_module", inference_only=True)
    return state["learner"]["rl_module"]["default_policy"]


def runner_state(algo) -> dict:
    """The first env runner's adapter: a remote one's, else the trainer's own."""
    group = algo.env_runner_group
    if not group.num_remote_workers():
        return group.local_env_runner.module.get_state()
    return group.foreach_env_runner(lambda r: r.module.get_state(), local_env_runner=False)[0]
