"""`draco-gym sft`: a LoRA warm start on the environment's reference solutions, through the CLI."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("peft")

from draco_gym.algos.policy.sft import (NO_TRANSFER, READY, SOLVED, TIED, TOO_WEAK, by_task, check_rates,  # noqa: E402
                                        warm_start_verdict)
from draco_gym.cli import main  # noqa: E402


def reference_accuracy(model_dir, task_ids) -> float:
    """Share of the tasks whose greedy episode (the real rollout loop) is the reference solution."""
    from transformers import AutoTokenizer

    from draco_gym.algos.policy.chat import ChatFormat
    from draco_gym.algos.policy.generation import TorchSampler
    from draco_gym.bench.learning_setting import ENV_CONFIG
    from draco_gym.algos.policy.lm import load_causal_lm
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
    assert "checking the warm-started policy at temperature 1.0: 4 of GRPO's train tasks x 4 episodes, " \
           "no held-out tasks" in printed
    assert "train tasks: closed, well-formed code blocks 1.00 (" in printed
    check = report["check"]
    assert check["held_out"] is None
    assert check["train"]["success_rate"]["n"] == 16 and check["train"]["success_rate"]["mean"] >= 0.75
    mixed = check["train"]["mixed_tasks"]["k"]
    verdict = SOLVED if check["train"]["success_rate"]["k"] == 16 else READY if mixed else TIED
    assert check["verdict"] == verdict and f"warm start check: {verdict}" in printed


def _episode(task: str, success: bool, well_formed: bool = True):
    from draco_gym.types import Step, Task, Trajectory

    step = Step(index=1, text="x", code="submit(1)" if well_formed else None, observation="")
    return Trajectory(task=Task(id=task, instruction="i"), steps=[step], metrics={"success": success})


def _rates(outcomes: dict[str, list[bool]], well_formed: bool = True) -> dict:
    return check_rates(by_task([_episode(task, ok, well_formed) for task, oks in outcomes.items() for ok in oks]))


def test_a_task_counts_as_learnable_when_its_episodes_hold_both_outcomes():
    rates = _rates({"a": [True, True, False, True], "b": [True] * 4, "c": [False] * 4, "d": [False, True, False, False]})
    assert rates["tasks"] == ["a", "b", "c", "d"]
    assert (rates["mixed_tasks"]["k"], rates["mixed_tasks"]["n"]) == (2, 4)
    assert (rates["success_rate"]["k"], rates["success_rate"]["n"]) == (8, 16)


def test_the_verdict_wants_train_groups_with_both_outcomes_and_a_held_out_success():
    """The issue's warm start: it replays the demonstrated answers, so each train task is
    always solved or never (0.5 success, yet every GRPO group ties), while a held-out
    episode succeeds now and then. The old check looked at held-out tasks only: "ready"."""
    held_out = _rates({"h1": [True, False], "h2": [False, False]})
    memorised = _rates({"a": [True] * 4, "b": [False] * 4, "c": [True] * 4, "d": [False] * 4})
    assert warm_start_verdict(memorised, held_out) == TIED
    learnable = _rates({"a": [True, False, True, True], "b": [False] * 4, "c": [True] * 4, "d": [False] * 4})
    assert warm_start_verdict(learnable, held_out) == READY
    assert warm_start_verdict(learnable, None) == READY  # nothing held out: the train side decides
    assert warm_start_verdict(learnable, _rates({"h1": [False, False], "h2": [False, False]})) == NO_TRANSFER
    assert warm_start_verdict(_rates({"a": [True] * 4, "b": [True] * 4}), held_out) == SOLVED
    assert warm_start_verdict(_rates({"a": [False] * 4, "b": [False] * 4}), held_out) == TOO_WEAK
    assert warm_start_verdict(_rates({"a": [True, False], "b": [False] * 2}, well_formed=False), held_out) == TOO_WEAK


def test_sft_says_a_policy_that_writes_no_code_is_too_weak(tmp_path, capsys):
    """A random tiny model, barely trained: its turns carry no closed code block."""
    from draco_gym.bench.learning_setting import ENV_CONFIG
    from draco_gym.algos.policy.models import build_tiny_llama

    policy = build_tiny_llama(tmp_path / "noise")
    config = tmp_path / "corridor.yaml"
    config.write_text(json.dumps({
        "name": "corridor", "output_dir": str(tmp_path / "run"),
        "env": {"id": "draco_gym/Corridor-v0", "config": ENV_CONFIG, "task_ids": ["corridor-1", "corridor-2"]},
        "policy": {"model": str(policy), "lora": {"r": 4, "alpha": 8}},
        "rollout": {"max_new_tokens": 17, "max_response_tokens": 100},  # the longest reference turn
        "warm_start": {"check_tasks": 2},
        "eval": {"task_ids": ["corridor-3", "corridor-4"]},
    }))
    assert main(["sft", str(config), "--epochs", "1", "--lr", "1e-6"]) == 0
    printed = capsys.readouterr().out
    assert "2 of GRPO's train tasks x 4 episodes, 2 held-out tasks x 2 episodes" in printed
    assert "warm start check: too weak: more epochs or a larger model" in printed
    assert "env success 0.00 (0/8)" in printed and "env success 0.00 (0/4)" in printed
    # The episodes behind the verdict are kept beside it, in the report's format.
    out = tmp_path / "run" / "warm_start"
    check = json.loads((out / "warm_start.json").read_text())["check"]
    assert sorted(check["train"]["tasks"]) == ["corridor-1", "corridor-2"]
    assert check["held_out"]["tasks"] == ["corridor-3", "corridor-4"]
    lines = [json.loads(line) for line in (out / "check" / "rollouts.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 4 + 2 * 2 and [r["task_id"] for r in lines].count("corridor-3") == 2
    assert f"the episodes: {out / 'check' / 'rollouts.jsonl'}" in printed
    assert main(["report", str(out / "check")]) == 0


def test_sft_refuses_an_env_without_references(tmp_path, capsys):
    config = tmp_path / "tools.yaml"
    config.write_text(json.dumps({"env": {"id": "draco_gym/Corridor-v0"}, "policy": {"model": str(tmp_path)}}))
    assert main(["sft", str(config), "--epochs", "0"]) == 2
    assert "--epochs" in capsys.readouterr().err


def test_sft_and_check_refuse_a_turn_budget_shorter_than_a_reference_turn(tmp_path, capsys):
    """A reference turn longer than rollout.max_new_tokens would be cut when the policy
    samples it: sft refuses to teach it and train --check of a warm-starting config fails,
    naming the key, the task and the size in the policy's own tokens."""
    from transformers import AutoTokenizer

    from draco_gym.algos.policy.chat import ChatFormat
    from draco_gym.algos.policy.models import build_tiny_llama
    from draco_gym.bench.learning_setting import ENV_CONFIG
    from draco_gym.envs.corridor import CorridorEnv

    policy = build_tiny_llama(tmp_path / "noise")
    chat = ChatFormat.from_tokenizer(AutoTokenizer.from_pretrained(policy))
    env = CorridorEnv(**ENV_CONFIG)
    sizes = {(task, k): len(chat.encode(m)) + 1 for task in env.task_ids
             for k, m in enumerate(env.reference_messages(task), start=1)}
    longest = max(sizes.values())
    (task, k), = [(t, k) for (t, k), n in sizes.items() if n == longest][:1]
    config = tmp_path / "corridor.yaml"

    def write(max_new_tokens):
        config.write_text(json.dumps({
            "name": "corridor", "output_dir": str(tmp_path / "run"),
            "env": {"id": "draco_gym/Corridor-v0", "config": ENV_CONFIG},
            "policy": {"model": str(policy), "lora": {"r": 4, "alpha": 8}},
            "rollout": {"max_new_tokens": max_new_tokens, "max_response_tokens": 100},
            "warm_start": {"epochs": 1, "check_tasks": 0}}))

    write(longest - 1)
    expected = (f"rollout.max_new_tokens is {longest - 1}, but message {k} of {task!r}'s reference solution is "
                f"{longest} tokens in the policy's tokenizer")
    assert main(["sft", str(config)]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "run" / "warm_start").exists()
    assert main(["train", str(config), "--check"]) == 2
    assert f"error: {expected}" in capsys.readouterr().err
    write(longest)
    assert main(["train", str(config), "--check"]) == 0
    assert f"is {longest} tokens, within rollout.max_new_tokens {longest}" in capsys.readouterr().out


def test_a_checkpointed_warm_start_recomputes_each_layer_and_takes_the_same_steps(tmp_path, monkeypatch):
    """``policy.gradient_checkpointing`` reaches the warm start: every decoder layer runs again in
    the backward (its attention is called twice per demonstration), and the losses and merged
    weights are the plain run's."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from draco_gym.algos.cli.sft import demonstrations
    from draco_gym.algos.policy import lm as lm_module
    from draco_gym.algos.policy.chat import ChatFormat
    from draco_gym.algos.policy.sft import warm_start
    from draco_gym.bench.learning_setting import ENV_CONFIG, build_corridor_policy
    from draco_gym.envs.corridor import CorridorEnv

    policy = build_corridor_policy(tmp_path / "policy", epochs=1)
    chat = ChatFormat.from_tokenizer(AutoTokenizer.from_pretrained(policy))
    examples, missing = demonstrations(CorridorEnv(**ENV_CONFIG), chat, ["corridor-1", "corridor-2"])
    assert len(examples) == 2 and not missing

    attention_calls = []
    enable = lm_module.enable_activation_checkpointing

    def enable_and_count(model):
        enable(model)
        attention = next(m for name, m in model.named_modules() if name.endswith("layers.0.self_attn"))
        attention.register_forward_hook(lambda *_: attention_calls.append(1))

    monkeypatch.setattr(lm_module, "enable_activation_checkpointing", enable_and_count)
    options = {"lora": {"r": 8, "alpha": 16}, "epochs": 2, "lr": 1e-2, "batch_size": 2}
    plain = warm_start(policy, examples, tmp_path / "plain", **options)
    assert attention_calls == []
    checkpointed = warm_start(policy, examples, tmp_path / "checkpointed", activation_checkpointing=True, **options)
    assert len(attention_calls) == 2 * 2 * 2  # the forward and its recompute, 2 demonstrations, 2 epochs
    assert checkpointed["losses"] == pytest.approx(plain["losses"], rel=1e-5)
    a, b = load_file(tmp_path / "plain" / "model.safetensors"), load_file(tmp_path / "checkpointed" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
