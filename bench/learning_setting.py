"""Does the trainer learn? The Corridor settings of the learning test and of
``bench/learning.py`` (the trainer's CartPole): a test and bench fixture, not library code.

A tiny random Llama is built on the spot with a tokenizer trained on Corridor text, then
warm-started (``draco_gym.algos.policy.sft``) on demonstrations that open random doors: the
policy writes well-formed ``open_door(n)`` blocks but chooses at chance. GRPO with the
``corridor`` rubric must then raise the success rate.

    policy = build_corridor_policy(tmp_dir)
    algo = corridor_config(policy, credit="draco", p=0.0, seed=0).build_algo()
    before = success_rate(algo, episodes_per_task=32)
    for _ in range(iterations): algo.train()
    after = success_rate(algo, episodes_per_task=32)

``ENV_CONFIG`` is the learning test's corridor (the ``treasure`` layout: one pivotal room,
the same four door tokens in every room). ``LOCKS_CONFIG`` is the benchmark's: every room
of every task is its own decision with its own door tokens (4 corridors x 4 rooms x 3 doors
= 48 action tokens), so no two decisions share the output row that scores their choice.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

ENV_ID = "draco_gym/Corridor-v0"
ENV_CONFIG = {"n_rooms": 4, "n_doors": 4, "treasure_door": 3, "trap_doors": [2]}
LOCKS_CONFIG = {"layout": "locks", "n_rooms": 4, "n_doors": 3, "n_tasks": 4}
LOCKS_WARM_START = {"seed": 1, "epochs": 20, "lr": 3e-3}
"""The locks policy's warm start. Measured (share of the next action's probability on the
room's own three doors, one history per room): seed 1 gives 0.99 in every room of every
corridor; seed 0 at lr 3e-3 for 30 epochs stalls at 0.49 in corridors 1 and 3 (their doors
confused), and seed 0 at the treasure layout's 10 epochs at 1e-2 at 0.20 on average."""
TINY_HIDDEN = 32  # build_tiny_llama's hidden size


def _action(door: int) -> str:
    return f"```python\nopen_door({door})\n```"


def corridor_actions(env) -> list[str]:
    """Every valid action of the corridor: one ``open_door(n)`` block per door number."""
    doors = {d: None for task in env.task_ids for room in range(1, env.n_rooms + 1) for d in env.doors(task, room)}
    return [_action(d) for d in doors]


def choice_tokens(env) -> list[str]:
    """The strings that become single tokens, one per choice. ``treasure``: each whole action
    block. ``locks``: each call ``open_door(n)``, which the room's description lists too, so
    the policy reads its room's choices as the very tokens it picks from."""
    if env.layout == "treasure":
        return corridor_actions(env)
    return [a.removeprefix("```python\n").removesuffix("\n```") for a in corridor_actions(env)]


def demonstration_doors(env, task_id: str, n: int | None, rng: random.Random) -> list[list[int]]:
    """The doors the warm start's demonstrations open: ``treasure``, ``n`` (32) uniform draws
    per room; ``locks``, the full design (every combination of doors once, n_doors ** n_rooms
    demonstrations), so each room's doors are exactly equally frequent and independent."""
    rooms = range(1, env.n_rooms + 1)
    if env.layout == "treasure":
        return [[rng.choice(env.doors(task_id, room)) for room in rooms] for _ in range(n or 32)]
    d = env.n_doors
    return [[env.doors(task_id, room)[(i // d ** (room - 1)) % d] for room in rooms] for i in range(d ** env.n_rooms)]


def corridor_corpus(env_config: dict | None = None) -> list[str]:
    """Texts a Corridor episode is made of, to train the tiny tokenizer on."""
    from draco_gym.envs.corridor import CorridorEnv

    env = CorridorEnv(**(env_config or ENV_CONFIG))
    texts = []
    for task in env.task_ids:
        obs, _ = env.reset(options={"task_id": task})
        texts.append(obs)
        for room in range(1, env.n_rooms + 1):
            doors = env.doors(task, room)
            door = doors[(room - 1) % len(doors)]
            texts.append(_action(door))
            obs, *_ = env.step(_action(door))
            texts.append(obs)
    # The actions repeat most, so the tokenizer merges them into a few tokens each.
    return texts * 10 + corridor_actions(env) * 100


def build_corridor_policy(path: str | Path, *, seed: int = 0, demos_per_task: int | None = None, epochs: int = 10,
                          lr: float = 1e-2, env_config: dict | None = None) -> Path:
    """A tiny Llama that writes well-formed ``open_door(n)`` blocks with n at chance.

    The demonstrations open doors uniformly at random in every room, so supervised
    training fixes the format and leaves every choice near 1/n_doors. Full fine-tuning
    (the model has ~100K parameters; wider when the corridor has more action tokens than
    ``TINY_HIDDEN`` dimensions); takes a few seconds. Idempotent for one path and corridor
    (a policy built there for another corridor is refused)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from draco_gym.algos.policy.chat import ChatFormat
    from draco_gym.algos.policy.models import build_tiny_llama
    from draco_gym.algos.policy.lm import load_causal_lm
    from draco_gym.algos.policy.sft import demonstration, train_supervised
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
    env = CorridorEnv(**env_config)
    actions = choice_tokens(env)
    build_tiny_llama(path, seed=seed, corpus=corridor_corpus(env_config), added_tokens=actions)
    if len(actions) > TINY_HIDDEN:  # room for one orthogonal output row per action (below)
        config = LlamaConfig.from_pretrained(path)
        width = 32 * -(-len(actions) // 32)
        config.hidden_size, config.intermediate_size = width, 2 * width
        torch.manual_seed(seed)
        LlamaForCausalLM(config).save_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    chat = ChatFormat.from_tokenizer(tokenizer)
    rng = random.Random(seed)
    examples = [demonstration(env, chat, task, [_action(d) for d in doors])
                for task in env.task_ids for doors in demonstration_doors(env, task, demos_per_task, rng)]
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
                    reward: str = "corridor", env_config: dict | None = None, reward_options: dict | None = None,
                    credit_options: dict | None = None, max_new_tokens: int = 8):
    """The GRPO config of the learning test: the Corridor, the ``corridor`` rubric with
    wrong-citation probability ``p`` (and any other ``reward_options``, e.g. ``traps``) or
    another ``reward``, and the given credit rule with its ``credit_options``."""
    from draco_gym.algos.rllib.grpo import GRPOConfig

    return (
        GRPOConfig()
        .environment(ENV_ID, env_config=dict(env_config or ENV_CONFIG))
        .policy(model=str(model), lora={"r": lora_r, "alpha": 2 * lora_r})
        .training(group_size=group_size, tasks_per_iteration=tasks_per_iteration, temperature=1.0,
                  max_new_tokens=max_new_tokens, max_prompt_tokens=512, max_response_tokens=400,
                  reward=reward, reward_options={"p": p, "seed": seed, **(reward_options or {})} if reward == "corridor" else {},
                  credit=credit, credit_options=dict(credit_options or {}),
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
    wins = [bool(t.metrics.get("success")) for g in groups for t in g.trajectories]
    rate = float(np.mean(wins))
    return {"success": rate, "stderr": float(np.sqrt(rate * (1 - rate) / len(wins))), "episodes": len(wins),
            "well_formed": float(np.mean([t.metrics.get("parse_errors", 0) == 0
                                          for g in groups for t in g.trajectories]))}


def main(argv: list[str] | None = None) -> int:
    """``python -m draco_gym.bench.learning_setting DIR [--layout locks|treasure]``: build the
    warm-started Corridor policy in DIR (what ``configs/corridor_locks.yaml`` trains)."""
    import argparse

    parser = argparse.ArgumentParser(description="build the warm-started tiny Corridor policy")
    parser.add_argument("path", help="folder to build it in (reused if already built there for the same corridor)")
    parser.add_argument("--layout", default="locks", choices=("locks", "treasure"))
    args = parser.parse_args(argv)
    locks = args.layout == "locks"
    path = build_corridor_policy(args.path, env_config=LOCKS_CONFIG if locks else ENV_CONFIG,
                                 **(LOCKS_WARM_START if locks else {}))
    print(f"the {args.layout} Corridor policy is in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
