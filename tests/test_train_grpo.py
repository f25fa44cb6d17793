"""GRPO on real Ray/RLlib: a tiny random Llama (LoRA) on the PythonTools environment.

The random policy never writes a code block, so every rubric reward would tie and every
advantage would be 0; the test reward (``grpo_fixtures.ParityReward``) scores the sampled
text instead, so that the groups have spread and the updates move the weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
from ray.rllib.algorithms.algorithm import Algorithm  # noqa: E402

from grpo_fixtures import lora_state, make_config, runner_state  # noqa: E402

from draco_gym.algos.rllib.grpo import GRPO  # noqa: E402

def test_two_iterations_checkpoint_and_exact_resume(ray_session, tiny_model, tmp_path):
    algo = make_config(tiny_model, tmp_path / "run").build_algo()
    try:
        first = algo.train()
        learner = first["learners"]["default_policy"]
        assert first["env_runners"]["num_episodes"] == 6
        assert first["env_runners"]["episode_return_std"] > 0, "the test reward must give the group a spread"
        assert learner["policy_tokens"] > 0
        # One minibatch, before any update: the learner's policy is the sampler's and the
        # adapter starts at zero, so the ratio is 1 and the KL to the base is 0.
        assert learner["ratio"] == pytest.approx(1.0, abs=1e-4)
        assert learner["kl"] == pytest.approx(0.0, abs=1e-6)
        assert learner["clip_fraction"] == 0.0
        ckpt = algo.save_to_path(str(tmp_path / "ckpt"))
        second = algo.train()
        sampled_with = {i: (w["seq_no"], w["digest"]) for i, w in algo.sampled_weights.items()}
        after_two = lora_state(algo)
        assert any(np.abs(v).max() > 0 for k, v in after_two.items() if "lora_B" in k), "LoRA B never moved"
        synced = runner_state(algo)
        assert set(synced) == set(after_two)
        assert all(np.allclose(synced[k], after_two[k]) for k in after_two), "env runner not synced"
    finally:
        algo.stop()

    # LoRA-only checkpoint: no file anywhere near the size of the base model's weights.
    files = [p for p in Path(ckpt).rglob("*") if p.is_file()]
    assert max(p.stat().st_size for p in files) < 5 * 2**20
    state = lora_state_from_checkpoint(ckpt)
    assert state and all("lora_" in k for k in state)

    restored = Algorithm.from_checkpoint(ckpt)  # RLlib's own entry point finds GRPO
    try:
        assert isinstance(restored, GRPO) and restored.iteration == 1
        again = restored.train()
        resumed = lora_state(restored)
        assert {i: (w["seq_no"], w["digest"]) for i, w in restored.sampled_weights.items()} == sampled_with, \
            "the resumed iteration sampled with another policy"
    finally:
        restored.stop()
    assert again["env_runners"]["episode_return_mean"] == pytest.approx(second["env_runners"]["episode_return_mean"])
    assert again["env_runners"]["num_episodes_lifetime"] == 12  # RLlib's lifetime counters carry over
    assert all(np.allclose(resumed[k], after_two[k], atol=1e-7) for k in after_two), "resume is not exact"
    # Both runs appended to the same rollouts file: iteration 0, 1, then the resumed 1,
    # which must have replayed the very same episodes.
    import json

    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rollouts] == [0] * 6 + [1] * 6 + [1] * 6
    # without rollout.pipeline every group is drawn by the newest weights
    assert [r["policy_version"] for r in rollouts] == [r["iteration"] for r in rollouts]
    assert [r["env_runners"]["policy_staleness_max"] for r in (first, second, again)] == [0, 0, 0]
    assert "waited_for_sample" not in first["timers"]
    assert [r["trajectory"]["token_ids"] for r in rollouts[6:12]] == [r["trajectory"]["token_ids"] for r in rollouts[12:]]


def test_without_env_runners_the_trainer_samples_on_the_learners_base_weights(ray_session, tiny_model, tmp_path):
    """``num_env_runners: 0``: the trainer's process samples too, its env runner's module and its
    learner's holding one copy of the frozen base weights; weight sync, checkpoints and an exact
    resume work as with a remote runner."""
    from draco_gym.algos.rllib.env_runner import weights_digest

    algo = make_config(tiny_model, tmp_path / "run").env_runners(num_env_runners=0).build_algo()
    try:
        group = algo.env_runner_group
        assert group.num_remote_workers() == 0 and group.local_env_runner is not None
        learner = algo.learner_group._learner.module["default_policy"]
        sampler_base, learner_base = base_tensors(group.local_env_runner.module.lm), base_tensors(learner.lm)
        assert sampler_base.keys() == learner_base.keys() and len(sampler_base) > 10
        assert all(sampler_base[k].data_ptr() == learner_base[k].data_ptr() for k in sampler_base), \
            "the process holds two copies of the base weights"
        first = algo.train()
        assert first["env_runners"]["num_episodes"] == 6 and list(algo.sampled_weights) == [0]
        ckpt = algo.save_to_path(str(tmp_path / "ckpt"))
        second = algo.train()
        after_two = lora_state(algo)
        assert any(np.abs(v).max() > 0 for k, v in after_two.items() if "lora_B" in k), "LoRA B never moved"
        synced = runner_state(algo)
        assert all(np.allclose(synced[k], after_two[k]) for k in after_two), "the trainer's sampler not synced"
    finally:
        algo.stop()
    # the learner's state holds the adapter; the runner's part of the checkpoint, its version only
    import pickle

    assert pickle.loads((Path(ckpt) / "env_runner" / "state.pkl").read_bytes()) == {"weights_seq_no": 1}

    restored = Algorithm.from_checkpoint(ckpt)
    try:
        again = restored.train()
        resumed = {k: v.clone() for k, v in lora_state(restored).items()}  # get_state's tensors are the live ones
        restored.restore_from_path(ckpt)  # an older policy, into the live trainer: its sampler takes it too
        assert weights_digest(runner_state(restored)) == weights_digest(lora_state_from_checkpoint(ckpt))
    finally:
        restored.stop()
    assert again["env_runners"]["episode_return_mean"] == pytest.approx(second["env_runners"]["episode_return_mean"])
    assert all(np.allclose(resumed[k], after_two[k], atol=1e-7) for k in after_two), "resume is not exact"


def base_tensors(lm) -> dict:
    """A PEFT model's frozen base parameters, by their name in the plain model."""
    return {name.replace(".base_layer", ""): p for name, p in lm.named_parameters() if "lora_" not in name}


@pytest.mark.slow
def test_restore_puts_the_checkpoint_policy_on_every_env_runner(ray_session, tiny_model, tmp_path):
    """Restoring into a live trainer: an older checkpoint, while an earlier weight push to the
    runner is still in flight. RLlib's own push after a restore is dropped in that case (one
    request per runner at a time), and a runner would keep its newer weights anyway."""
    import time

    from draco_gym.algos.rllib.env_runner import weights_digest

    algo = make_config(tiny_model, tmp_path / "run").build_algo()
    try:
        algo.train()
        checkpointed = weights_digest(lora_state(algo))
        ckpt = algo.save_to_path(str(tmp_path / "ckpt"))
        algo.train()
        assert weights_digest(lora_state(algo)) != checkpointed
        algo.env_runner_group.foreach_env_runner_async(lambda runner: time.sleep(3), tag="set_state")
        algo.restore_from_path(ckpt)
        [(digest, seq_no)] = algo.env_runner_group.foreach_env_runner(
            lambda runner: (weights_digest(runner.module.get_state()), runner._weights_seq_no), local_env_runner=False)
        assert digest == checkpointed and seq_no == 1
        algo.train()  # the next update's weights reach the runner again
        assert algo.sampled_weights[1]["digest"] == checkpointed
        [digest] = algo.env_runner_group.foreach_env_runner(lambda runner: weights_digest(runner.module.get_state()),
                                                            local_env_runner=False)
        assert digest == weights_digest(lora_state(algo))
    finally:
        algo.stop()


def lora_state_from_checkpoint(ckpt) -> dict:
    import pickle

    paths = list(Path(ckpt).rglob("module_state.pkl")) or list(Path(ckpt).rglob("*.pkl"))
    for p in paths:
        if "rl_module" in str(p) and "default_policy" in str(p):
            with open(p, "rb") as fh:
                return pickle.load(fh)
    raise AssertionError(f"no module state in {ckpt}: {[str(p) for p in paths]}")


@pytest.mark.slow
def test_tune_runs_one_iteration(ray_session, tiny_model, tmp_path):
    from ray import tune
    from ray.rllib.utils.test_utils import check_train_results_new_api_stack

    from draco_gym.algos.rllib.grpo import register_with_tune

    register_with_tune()  # the one call that makes the name "GRPO" known to Tune
    # Also the vLLM path's learner side: old log-probs recomputed on the learner.
    config = make_config(tiny_model, tmp_path / "run").training(minibatch_size=None, recompute_old_logprobs=True)
    # RLlib-style stop criteria: every return is >= -1, so the trial stops after one iteration of two.
    results = tune.Tuner("GRPO", param_space=config, run_config=tune.RunConfig(
        stop={"env_runners/episode_return_mean": -1.0, "training_iteration": 2}, storage_path=str(tmp_path / "tune"),
        verbose=0)).fit()
    assert not results.errors
    result = results[0]
    assert result.metrics["training_iteration"] == 1
    check_train_results_new_api_stack(result.metrics)
    assert result.metrics["env_runners"]["num_episodes"] == 6
    learner = result.metrics["learners"]["default_policy"]
    assert learner["policy_tokens"] > 0
    assert learner["ratio"] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.slow
def test_a_dead_judge_stops_the_run_naming_its_url(ray_session, tiny_model, tmp_path, monkeypatch):
    """Every judge request refused (nothing listens at the URL): the run goes on while fewer
    than ``reward.dead_judge_groups`` (3) groups are in, then stops with the judge's URL in the error
    instead of training on all-zero rewards."""
    import socket

    with socket.socket() as s:  # a port where nothing listens: every connection is refused
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    judge = {"name": "openai", "model": "test-judge", "base_url": url, "api_key_env": "DEAD_JUDGE_KEY",
             "max_retries": 0, "request_timeout_s": 10}
    monkeypatch.setenv("DEAD_JUDGE_KEY", "sk-test")
    algo = make_config(tiny_model, tmp_path / "run").training(
        reward="dynamic", dead_judge_groups=3,
        reward_options={"judge": judge, "mode": "fused", "retries": 0, "max_repairs": 1, "retry_wait_s": 0.01},
    ).build_algo()
    try:
        # 2 groups per iteration: the first names the judge on the console, the second stops
        from draco_gym.algos.rllib.reporting import NOTE_KEY

        result = algo.train()
        assert result["judge"]["failed_requests"] > 0
        assert result[NOTE_KEY].startswith("warning: the judge failed every call of this iteration")
        assert url in result[NOTE_KEY] and "\n" not in result[NOTE_KEY]
        with pytest.raises(Exception, match="the judge failed every call of the last 3 groups") as stopped:
            algo.train()
        assert url in str(stopped.value)
    finally:
        algo.stop()


def test_reward_rising_while_the_outcome_falls_warns_once(caplog):
    from types import SimpleNamespace

    from draco_gym.algos.rllib.grpo import GRPO

    algo = SimpleNamespace(_reward_and_outcome=[], _divergence_warned=False, iteration=0)
    flags = []
    for t in range(10):
        metrics = {"env_runners/episode_return_mean": 0.1 * t, "env_runners/env/success": 0.9 - 0.1 * t}
        algo.iteration = t + 1
        with caplog.at_level("WARNING", logger="draco_gym.algos.rllib.grpo"):
            GRPO._watch_reward_against_outcome(algo, metrics)
        flags.append(metrics["judge/reward_outcome_divergence"])
    assert flags == [0.0] * 7 + [1.0] * 3  # the window is 8 iterations
    warnings = [r.message for r in caplog.records if "the reward rose" in r.getMessage()]
    assert len(warnings) == 1
