"""``rollout.pipeline: one_step`` on real Ray/RLlib with the tiny policy: iteration k+1 is
sampled and scored with the weights the env runners hold while iteration k learns, so each
iteration after the first learns from rollouts exactly one update old, recorded per group;
the draws are the same tasks as without the pipeline; a restore neither repeats nor drops an
iteration; combinations that would break the ratio or the runners are refused up front."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")

from grpo_fixtures import lora_state, make_config  # noqa: E402

from draco_gym.algos.config import ConfigError, RunConfig  # noqa: E402
from draco_gym.algos.rllib.env_runner import weights_digest  # noqa: E402


def logged(run_dir) -> list[tuple[int, str, int]]:
    """(iteration, task, policy_version) of every group in rollouts.jsonl, in order."""
    records = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    return [(r["iteration"], r["task_id"], r["policy_version"]) for r in records if r["index"] == 0]


@pytest.mark.slow
def test_one_step_learns_from_rollouts_one_update_old_and_resumes_without_a_gap(ray_session, tiny_model, tmp_path):
    algo = make_config(tiny_model, tmp_path / "run").training(pipeline="one_step").build_algo()
    try:
        draws = [algo.sample_tasks(k) for k in range(4)]
        on_the_spot, sample = [], algo.sample
        algo.sample = lambda *args, **kwargs: on_the_spot.append(algo.iteration) or sample(*args, **kwargs)
        results, learner_digests = [], []
        for _ in range(3):
            results.append(algo.train())
            learner_digests.append(weights_digest(lora_state(algo)))
        # iteration 2 was drawn with the weights after iteration 0's update (version 1)
        assert {w["digest"] for w in algo.sampled_weights.values()} == {learner_digests[0]}
        # only the first iteration waits for a sample of its own; the others were drawn while
        # the one before them learned
        assert on_the_spot == [0]
        ckpt = algo.save_to_path(str(tmp_path / "ckpt"))  # while iteration 3 is being drawn ahead
    finally:
        algo.stop()

    assert logged(tmp_path / "run") == [(k, task, max(k - 1, 0)) for k in range(3) for task in draws[k]]
    staleness = [(r["env_runners"]["policy_staleness_mean"], r["env_runners"]["policy_staleness_max"])
                 for r in results]
    assert staleness == [(0.0, 0), (1.0, 1), (1.0, 1)]
    assert all(r["timers"]["waited_for_sample"] >= 0 for r in results)
    # on-policy at iteration 0 (ratio 1 before the update); one update stale at 1: the ratio spreads
    devs = [r["learners"]["default_policy"]["ratio_abs_dev"] for r in results]
    assert devs[0] < 1e-4 < devs[1], devs

    resumed = make_config(tiny_model, tmp_path / "run").training(pipeline="one_step",
                                                                  restore_from=ckpt).build_algo()
    try:
        assert resumed.iteration == 3
        again = resumed.train()  # iteration 3, sampled on the spot with the restored weights
    finally:
        resumed.stop()
    assert again["env_runners"]["policy_staleness_max"] == 0
    assert logged(tmp_path / "run")[-len(draws[3]):] == [(3, task, 3) for task in draws[3]]
    assert [k for k, *_ in logged(tmp_path / "run")] == sorted(k for k in range(4) for _ in draws[k])


def test_one_step_refuses_a_recomputed_ratio_and_a_credit_rule_that_needs_the_runners(tiny_model):
    run = {"env": {"id": "draco_gym/PythonTools-v0"}, "policy": {"model": str(tiny_model)},
           "rollout": {"pipeline": "one_step"}}
    with pytest.raises(ValueError, match="recompute_old_logprobs: true"):
        RunConfig.model_validate({**run, "optim": {"recompute_old_logprobs": True}})
    RunConfig.model_validate(run)
    with pytest.raises(ConfigError, match="one_step with credit 'prover'"):
        make_config(tiny_model, None).training(pipeline="one_step", credit="prover",
                                               credit_options={"base_advantage": "reward"}).validate()
