"""More than one of each on one machine: two env runners, two remote learners.

Real Ray, real RLlib ``LearnerGroup`` (two learner actors in a gloo process group) and the
tiny random Llama on the Corridor environment. The random policy writes no code block, so
the parity reward of ``grpo_fixtures`` scores the sampled text instead: the groups have
spread and the updates move the weights.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from grpo_fixtures import ParityReward  # noqa: E402  (shipped to the actors by value there)

from draco_gym.algos.rllib.grpo import shard_rows  # noqa: E402
from draco_gym.algos.credit.apply import apply_credit  # noqa: E402
from draco_gym.algos.rllib.env_runner import weights_digest  # noqa: E402
from draco_gym.algos.rllib.grpo import GRPOConfig  # noqa: E402


@pytest.fixture(scope="module")
def ray_four_actors():
    # Logical CPUs: a driver, two runners and two learners at a quarter CPU each fit; the
    # actors themselves run one torch thread each.
    ray.init(num_cpus=2, object_store_memory=100 * 2**20, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_shard_rows_gives_every_learner_rows_or_a_no_loss_row():
    batch = {"input_ids": np.arange(15).reshape(3, 5), "attention_mask": np.ones((3, 5), np.int64),
             "policy_mask": np.ones((3, 5), np.float32), "advantages": np.ones((3, 5), np.float32),
             "old_logp": np.zeros((3, 5), np.float32)}
    two = shard_rows(batch, 2)
    assert [s["input_ids"].tolist() for s in two] == [batch["input_ids"][:2].tolist(), batch["input_ids"][2:].tolist()]
    four = shard_rows(batch, 4)
    assert [len(s["input_ids"]) for s in four] == [1, 1, 1, 1]
    assert four[3]["policy_mask"].sum() == 0 and four[3]["attention_mask"].sum() == 1, \
        "a learner without rows gets one padding token that adds nothing to the loss"


def make_config(model, out_dir=None, *, env_runners: int = 1, learners: int = 0, **training) -> GRPOConfig:
    return (
        GRPOConfig()
        .environment("draco_gym/Corridor-v0", env_config={"n_rooms": 4, "max_turns": 2})
        .policy(model=str(model), lora={"r": 4, "alpha": 8}, torch_threads=1)
        .training(**{"group_size": 2, "tasks_per_iteration": 3, "max_new_tokens": 10, "max_response_tokens": 120,
                     "reward": ParityReward, "credit": "draco", "lr": 5e-3, "kl_coeff": 0.05,
                     "micro_batch_tokens": 200, "output_dir": str(out_dir) if out_dir else None, **training})
        .env_runners(num_env_runners=env_runners, num_cpus_per_env_runner=0.25)
        .learners(num_learners=learners, num_cpus_per_learner=0.25)
        .resources(num_cpus_for_main_process=0.25)
        .debugging(seed=11, log_level="ERROR")
    )


def learner_states(algo) -> list[dict]:
    """A copy of the LoRA state of every learner (one for the local learner)."""
    states = algo.learner_group.foreach_learner(lambda learner: learner.module["default_policy"].get_state())
    states = [s.get() if hasattr(s, "get") else s for s in states]
    return [{k: np.array(v.numpy() if hasattr(v, "numpy") else v, copy=True) for k, v in s.items()} for s in states]


@pytest.mark.slow
def test_two_env_runners_sample_every_task_once_with_the_newest_weights(ray_four_actors, tiny_model, tmp_path):
    algo = make_config(tiny_model, tmp_path, env_runners=2, minibatch_size=None).build_algo()
    try:
        digests = [weights_digest(learner_states(algo)[0])]
        for _ in range(3):
            algo.train()
            # After the iteration's sync, every runner must sample the next iteration with
            # the learner's weights as they are now.
            digests.append(weights_digest(learner_states(algo)[0]))
            if len(digests) > 2:
                used = algo.sampled_weights
                assert sorted(used) == [1, 2], "both runners must sample (3 tasks over 2 runners)"
                assert {u["digest"] for u in used.values()} == {digests[-2]}, \
                    f"a runner sampled with stale weights: {used}, learner had {digests[-2]}"
                assert len({u["seq_no"] for u in used.values()}) == 1
        assert len(set(digests)) == len(digests), "the weights must move every iteration for this test to mean much"

        # Every drawn task's group was sampled exactly once in each iteration.
        lines = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
        for it in range(3):
            groups = Counter(r["task_id"] for r in lines if r["iteration"] == it and r["index"] == 0)
            assert groups == Counter(algo.sample_tasks(it)), f"iteration {it}"
            assert sum(1 for r in lines if r["iteration"] == it) == 3 * 2

        # Fewer tasks than runners: one runner sits out, the task is still sampled once.
        groups = algo.rollout(["corridor-2"], group_size=2, score=False)
        assert [g.task_id for g in groups] == ["corridor-2"] and len(groups[0].trajectories) == 2
    finally:
        algo.stop()


@pytest.mark.slow
def test_two_learners_update_equals_one_learner(ray_four_actors, tiny_model):
    """9 trajectories in minibatches of 4, 4 and 1 (the last leaves one learner no row), 2
    epochs: the two-learner update lands on the one-learner weights."""
    training = {"minibatch_size": 4, "num_epochs": 2, "group_size": 3}
    two = make_config(tiny_model, learners=2, **training).build_algo()
    one = make_config(tiny_model, learners=0, **training).build_algo()
    try:
        before = learner_states(one)[0]
        assert all(weights_digest(s) == weights_digest(before) for s in learner_states(two)), \
            "both runs must start from the same adapter"
        groups, _ = two.sample(two.sample_tasks(0), seed=5)
        groups, _ = two.score(groups)
        batch = apply_credit(groups, two.credit_rule())
        assert len(batch.trajectories) == 9 and np.abs(np.concatenate(batch.token_advantages)).max() > 0

        two.update(batch)
        one.update(batch)
        after_one = learner_states(one)[0]
        after_two = learner_states(two)
        assert len(after_two) == 2
        moved = max(float(np.abs(np.asarray(after_one[k]) - np.asarray(before[k])).max()) for k in before)
        assert moved > 1e-3, "the update must move the adapter for the comparison to mean much"
        for state in after_two:
            worst = max(float(np.abs(np.asarray(state[k]) - np.asarray(after_one[k])).max()) for k in after_one)
            assert worst < 1e-5, f"two learners differ from one by {worst}"
        # The learners' logged loss statistics are the whole minibatch's, like one learner's.
        stats_two = two.metrics.peek(("learners", "default_policy", "ratio"))
        stats_one = one.metrics.peek(("learners", "default_policy", "ratio"))
        assert stats_two == pytest.approx(stats_one, abs=1e-5)
    finally:
        two.stop()
        one.stop()
