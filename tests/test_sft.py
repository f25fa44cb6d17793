"""`draco-gym sft`: a LoRA warm start on the environment's reference solutions, through the CLI."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("peft")

from draco_gym.algos.policy.sft import READY, SOLVED, TOO_WEAK, warm_start_verdict  # noqa: E402
from draco_gym.cli import main  # noqa: E402


def reference_accuracy(model_dir, task_ids) -> float:
    """Share of the tasks whose greedy episode (the real rollout loop) is the reference solution."""
    from transformers import AutoTokenizer

    from draco_gym.algos.policy.chat import ChatFormat
    from draco_gym.algos.policy.generation import TorchSampler
    from draco_gym.bench.learning_setting import ENV_CONFIG
    from draco_gym.algos.rllib.module import load_causal_lm
    from draco_gym.algos.policy.rollout import Episode, EpisodeLimits, run_episodes
    from draco_gym.envs.corridor import CorridorEnv

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat = ChatFormat.from_tokenizer(tokenizer)
    sampler = TorchSampler(load_causal_lm(str(model_dir)), eos_ids=chat.eos_ids, pad_id=tokenizer.pad_token_id,
                           temperature=0.0)
    limits = EpisodeLimits(max_new_tokens=8, max_prompt_tokens=512, max_response_tokens=400)
    envs = [CorridorEnv(**ENV_CONFIG) for _ in task_ids]
    episodes = [Episode.start(env, chat, limits, task_id=task) for env, task in zip(envs, task_ids)]
    trajectories = run_episodes(episodes, sampler, chat, limits)
    same = [[s.text for s in t.steps] == envs[0].reference_messages(task) for t, task in zip(trajectories, task_ids)]
    return sum(same) / len(same)


@pytest.mark.slow
def test_sft_command_teaches_the_reference_solutions(tmp_path, capsys):
    from draco_gym.bench.learning_setting import ENV_CONFIG, build_corridor_policy

    policy = build_corridor_policy(tmp_path / "policy")
    config = tmp_path / "corridor.yaml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "name": "corridor", "output_dir": str(tmp_path / "run"),
        "env": {"id": "draco_gym/Corridor-v0", "config": ENV_CONFIG},
        "policy": {"model": str(policy), "lora": {"r": 8, "alpha": 16}},
    }))
    tasks = ["corridor-1", "corridor-2", "corridor-3", "corridor-4"]
    before = reference_accuracy(policy, tasks)
    assert main(["sft", str(config), "--epochs", "80", "--lr", "1e-2"]) == 0
    out = tmp_path / "run" / "warm_start"
    report = json.loads((out / "warm_start.json").read_text())
    assert report["examples"] == 4 and report["losses"][-1] < report["losses"][0]
    after = reference_accuracy(out, tasks)
    # Before: doors at chance, greedy picks one door everywhere; after: every task's reference.
    assert before <= 0.25 and after == 1.0, (before, after)
    # Progress per step with its loss, per epoch, then the check and its verdict.
    printed = capsys.readouterr().out
    assert "step 1/80 (epoch 1): loss " in printed and "step 80/80 (epoch 80): loss " in printed
    assert "epoch 80/80: mean loss " in printed
    assert "checking the warm-started policy on 4 train tasks (nothing is held out" in printed
    assert "closed, well-formed code blocks: 1.00 (" in printed
    check = report["check"]
    assert check["success_rate"]["n"] == 8 and check["success_rate"]["mean"] >= 0.75
    verdict = SOLVED if check["success_rate"]["k"] == 8 else READY
    assert check["verdict"] == verdict and f"warm start check: {verdict}" in printed


def test_the_verdict_wants_a_success_and_a_failure_to_learn_from():
    def summary(wins, episodes, well_formed):
        return {"success_rate": {"k": wins, "n": episodes, "mean": wins / episodes},
                "well_formed_turns": {"mean": well_formed}}
    assert warm_start_verdict(summary(3, 12, 0.7)) == READY
    assert warm_start_verdict(summary(12, 12, 1.0)) == SOLVED  # every group would tie on the outcome
    assert warm_start_verdict(summary(0, 12, 0.9)) == TOO_WEAK
    assert warm_start_verdict(summary(3, 12, 0.4)) == TOO_WEAK


def test_sft_says_a_policy_that_writes_no_code_is_too_weak(tmp_path, capsys):
    """A random tiny model, barely trained: its turns carry no closed code block."""
    from draco_gym.bench.learning_setting import ENV_CONFIG
    from draco_gym.algos.policy.models import build_tiny_llama

    policy = build_tiny_llama(tmp_path / "noise")
    config = tmp_path / "corridor.yaml"
    config.write_text(json.dumps({
        "name": "corridor", "output_dir": str(tmp_path / "run"),
        "env": {"id": "draco_gym/Corridor-v0", "config": ENV_CONFIG},
        "policy": {"model": str(policy), "lora": {"r": 4, "alpha": 8}},
        "rollout": {"max_new_tokens": 12, "max_response_tokens": 100},
        "warm_start": {"check_tasks": 2},
    }))
    assert main(["sft", str(config), "--epochs", "1", "--lr", "1e-6"]) == 0
    printed = capsys.readouterr().out
    assert "warm start check: too weak: more epochs or a larger model" in printed
    assert "env success: 0.00 (0/4)" in printed


def test_sft_refuses_an_env_without_references(tmp_path, capsys):
    config = tmp_path / "tools.yaml"
    config.write_text(json.dumps({"env": {"id": "draco_gym/Corridor-v0"}, "policy": {"model": str(tmp_path)}}))
    assert main(["sft", str(config), "--epochs", "0"]) == 2
    assert "--epochs" in capsys.readouterr().err
