"""`draco-gym sft`: a LoRA warm start on the environment's reference solutions, through the CLI."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("peft")

from draco_gym.cli import main  # noqa: E402


def reference_accuracy(model_dir, task_ids) -> float:
    """Share of the reference's policy tokens the model predicts greedily, on every task."""
    import torch
    from transformers import AutoTokenizer

    from draco_gym.algos.chat import ChatFormat
    from draco_gym.algos.learning import ENV_CONFIG
    from draco_gym.algos.module import load_causal_lm
    from draco_gym.algos.sft import demonstration
    from draco_gym.envs.corridor import CorridorEnv

    env = CorridorEnv(**ENV_CONFIG)
    chat = ChatFormat.from_tokenizer(AutoTokenizer.from_pretrained(model_dir))
    model = load_causal_lm(str(model_dir))
    hits = total = 0
    for task in task_ids:
        demo = demonstration(env, chat, task, env.reference_messages(task))
        ids = torch.tensor([demo.token_ids])
        with torch.no_grad():
            guess = model(input_ids=ids).logits[0, :-1].argmax(-1)
        for t in range(1, len(demo.token_ids)):
            if demo.loss_mask[t]:
                hits += int(guess[t - 1]) == demo.token_ids[t]
                total += 1
    return hits / total


def test_sft_command_teaches_the_reference_solutions(tmp_path):
    from draco_gym.algos.learning import ENV_CONFIG, build_corridor_policy

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
    # Before: the door is at chance; after: the reference's every token, doors included.
    assert before < 0.9 and after == 1.0, (before, after)


def test_sft_refuses_an_env_without_references(tmp_path, capsys):
    config = tmp_path / "tools.yaml"
    config.write_text(json.dumps({"env": {"id": "draco_gym/Corridor-v0"}, "policy": {"model": str(tmp_path)}}))
    assert main(["sft", str(config), "--epochs", "0"]) == 2
    assert "--epochs" in capsys.readouterr().err
