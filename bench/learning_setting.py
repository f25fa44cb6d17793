"""Does the trainer learn? The Corridor setting shared by the learning test and
``bench/learning.py`` (the trainer's CartPole).

A tiny random Llama is built on the spot with a tokenizer trained on Corridor text, then
warm-started (``draco_gym.algos.sft``) on demonstrations that open random doors: the
policy writes well-formed ``open_door(n)`` blocks but chooses at chance. GRPO with the
``corridor`` rubric must then raise the success rate, which only the pivotal step decides.

    policy = build_corridor_policy(tmp_dir)
    algo = corridor_config(policy, credit="draco", p=0.0, seed=0).build_algo()
    before = success_rate(algo, episodes_per_task=32)
    for _ in range(iterations): algo.train()
    after = success_rate(algo, episodes_per_task=32)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

ENV_ID = "draco_gym/Corridor-v0"
ENV_CONFIG = {"n_rooms": 4, "n_doors": 4, "treasure_door": 3, "trap_doors": [2]}


def _action(door: int) -> str:
    return f"```python\nopen_door({door})\n```"


def corridor_corpus(env_config: dict | None = None) -> list[str]:
    """Texts a Corridor episode is made of, to train the tiny tokenizer on."""
    from draco_gym.envs.corridor import CorridorEnv

    env = CorridorEnv(**(env_config or ENV_CONFIG))
    texts = []
    for task in env.task_ids:
        obs, _ = env.reset(options={"task_id": task})
        texts.append(obs)
        for room in range(env.n_rooms):
            door = room % env.n_doors
            texts.append(_action(door))
            obs, *_ = env.step(_action(door))
            texts.append(obs)
    # The actions repeat most, so the tokenizer merges them into a few tokens each.
    return texts * 10 + [_action(d) for d in range(env.n_doors)] * 100


def build_corridor_policy(path: str | Path, *, seed: int = 0, demos_per_task: int = 32, epochs: int = 10,
                          lr: float = 1e-2, env_config: dict | None = None) -> Path:
    """A tiny Llama that writes well-formed ``open_door(n)`` blocks with n at chance.

    The demonstrations open doors uniformly at random in every room, so supervised
    training fixes the format and leaves every choice near 1/n_doors. Full fine-tuning
    (the model has ~100K parameters); takes a few seconds. Idempotent for one path and
    corridor (a policy built there for another corridor is refused)."""
    import torch
    from transformers import AutoTokenizer

    from draco_gym.algos.chat import ChatFormat
    from draco_gym.algos.models import build_tiny_llama
    from draco_gym.algos.module import load_causal_lm
    from draco_gym.algos.sft import demonstration, train_supervised
    from draco_gym.envs.corridor import CorridorEnv

    path = Path(path)
    env_config = dict(env_config or ENV_CONFIG)
    if (path / "draco_gym_corridor.json").is_file():
        built = json.loads((path / "draco_gym_corridor.json").read_text()).get("env_config", ENV_CONFIG)
        if built != env_config:
            raise ValueError(f"{path} holds a policy built for the corridor {built}, not {env_config}")
        return path
    # Each whole action is one token: the policy's every choice is a single token, which
    # keeps the format intact while RL moves the choice.
    actions = [_action(d) for d in range(int(env_config.get("n_doors", 4)))]
    build_tiny_llama(path, seed=seed, corpus=corridor_corpus(env_config), added_tokens=actions)
    tokenizer = AutoTokenizer.from_pretrained(path)
    chat = ChatFormat.from_tokenizer(tokenizer)
    env = CorridorEnv(**env_config)
    rng = random.Random(seed)
    examples = [
        demonstration(env, chat, task, [_action(rng.randrange(env.n_doors)) for _ in range(env.n_rooms)])
        for task in env.task_ids for _ in range(demos_per_task)
    ]
    torch.manual_seed(seed)
    model = load_causal_lm(str(path))
    # Distinct, large output embeddings for the actions. Trained to be equally likely, the
    # action rows would otherwise end up nearly equal, and then no change of the hidden
    # state (all a LoRA adapter can change) separates them: RL could not move the choice.
    with torch.no_grad():
        rows = model.get_input_embeddings().weight
        ids = tokenizer.convert_tokens_to_ids(actions)
        directions = torch.linalg.qr(torch.randn(rows.shape[1], len(ids)))[0].T
        rows[ids] = 1.0 * directions
    losses = train_supervised(model, examples, epochs=epochs, lr=lr, batch_size=16, seed=seed)
    model.save_pretrained(path)
    (path / "draco_gym_corridor.json").write_text(json.dumps({"seed": seed, "env_config": env_config,
                                                                   "sft_losses": losses}))
    return path


def corridor_config(model: str | Path, *, credit: str = "draco", p: float = 0.0, seed: int = 0,
                    group_size: int = 8, tasks_per_iteration: int = 4, lr: float = 2e-3, kl_coeff: float = 0.05,
                    minibatch_size: int | None = 8, num_epochs: int = 1, lora_r: int = 8,
                    reward: str = "corridor", env_config: dict | None = None, reward_options: dict | None = None):
    """The GRPO config of the learning test: the Corridor, the ``corridor`` rubric with
    wrong-citation probability ``p`` (and any other ``reward_options``, e.g. ``traps``),
    and the given credit rule."""
    from draco_gym.algos.grpo import GRPOConfig

    return (
        GRPOConfig()
        .environment(ENV_ID, env_config=dict(env_config or ENV_CONFIG))
        .policy(model=str(model), lora={"r": lora_r, "alpha": 2 * lora_r})
        .training(group_size=group_size, tasks_per_iteration=tasks_per_iteration, temperature=1.0,
                  max_new_tokens=8, max_prompt_tokens=512, max_response_tokens=400,
                  reward=reward, reward_options={"p": p, "seed": seed, **(reward_options or {})} if reward == "corridor" else {},
                  credit=credit,
                  lr=lr, kl_coeff=kl_coeff, minibatch_size=minibatch_size, num_epochs=num_epochs,
                  micro_batch_tokens=8192)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .debugging(seed=seed, log_level="ERROR")
    )


def success_rate(algo, *, episodes_per_task: int = 32, seed: int = 10_000) -> dict:
    """Sampled evaluation (temperature 1) on every Corridor task, no update: the share of
    episodes that found the treasure, with its binomial standard error."""
    task_ids = list(algo._task_ids)
    groups = algo.rollout(task_ids, group_size=episodes_per_task, score=False, seed=seed)
    wins = [bool(t.metrics.get("success")) for g in groups for t in g["trajectories"]]
    rate = float(np.mean(wins))
    return {"success": rate, "stderr": float(np.sqrt(rate * (1 - rate) / len(wins))), "episodes": len(wins),
            "well_formed": float(np.mean([t.metrics.get("parse_errors", 0) == 0
                                          for g in groups for t in g["trajectories"]]))}
