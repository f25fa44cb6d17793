"""Supervised warm start: teach a policy the action format from demonstrations before RL.

A base policy that never writes a well-formed code block gives GRPO groups with equal
rewards and nothing to learn from. A few epochs of next-token training on demonstration
episodes (reference solutions) fix the format; GRPO then improves the choices.

Demonstrations are tokenised exactly as the rollout loop tokenises a live episode
(``draco_gym.algos.policy.chat.ChatFormat``): the prompt and every observation are context, and
only the assistant turns (their end-of-turn token included) carry the loss. So the warm
start trains the very token sequences the sampler will later produce.

    examples = [demonstration(env, chat, task_id, messages) for ...]
    train_supervised(model, examples, epochs=3, lr=3e-4)
    warm_start(model_dir, examples, out_dir)        # LoRA, merged: a new base model dir
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Demonstration:
    """One episode's tokens and which of them the policy wrote (1) or read (0)."""

    token_ids: list[int]
    loss_mask: list[int]

    @property
    def n_policy_tokens(self) -> int:
        return sum(self.loss_mask)


def demonstration(env, chat, task_id: str, messages: Sequence[str], *, max_prompt_tokens: int | None = None,
                  seed: int | None = None) -> Demonstration:
    """Play ``messages`` as the assistant's turns of ``task_id`` in ``env`` and record the
    tokens as the rollout loop would. Raises if the episode ends before the last message
    (a demonstration that does not fit the environment is a mistake in the data)."""
    prompt, _ = env.reset(seed=seed, options={"task_id": task_id})
    ids = chat.prompt_ids(prompt, max_prompt_tokens)
    mask = [0] * len(ids)
    for k, message in enumerate(messages):
        turn = chat.encode(message) + [chat.eos_ids[0]]
        ids += turn
        mask += [1] * len(turn)
        observation, _, terminated, truncated, _ = env.step(message)
        if terminated or truncated:
            if k != len(messages) - 1:
                raise ValueError(f"demonstration for {task_id!r}: the episode ended after message {k + 1} "
                                 f"of {len(messages)}")
            break
        gap = chat.observation_ids(observation, True)
        ids += gap
        mask += [0] * len(gap)
    return Demonstration(ids, mask)


def train_supervised(model, examples: Sequence[Demonstration], *, epochs: int = 3, lr: float = 3e-4,
                     batch_size: int = 4, weight_decay: float = 0.0, grad_clip: float = 1.0, seed: int = 0,
                     log: Callable[[dict], None] | None = None) -> list[float]:
    """Next-token cross-entropy on the policy tokens of ``examples``, AdamW, shuffled
    minibatches. Trains the parameters that require grad (the LoRA adapter, or all).
    Each minibatch's loss is the mean over its policy tokens, as one padded batch would
    give, but its gradient is accumulated one demonstration at a time: memory is that of
    one episode (a 1000-token AppWorld episode of SmolLM2-135M in a batch of 4 took 16 GB).
    ``log`` gets a row after every optimizer step (``epoch``, ``epochs``, ``step``,
    ``steps``, ``loss``: that minibatch's) and one at each epoch's end (``epoch``,
    ``epochs``, ``epoch_loss``). Returns the mean loss of each epoch."""
    import torch

    if not examples:
        raise ValueError("no demonstrations to train on")
    if any(e.n_policy_tokens == 0 for e in examples):
        raise ValueError("a demonstration has no assistant tokens")
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    device = next(model.parameters()).device
    rng = random.Random(seed)
    order = list(range(len(examples)))
    losses = []
    steps_per_epoch = -(-len(order) // batch_size)
    step = 0
    model.train()
    for epoch in range(epochs):
        rng.shuffle(order)
        total, count = 0.0, 0
        for start in range(0, len(order), batch_size):
            batch = [examples[i] for i in order[start : start + batch_size]]
            # a token predicts the next one: the targets are the policy tokens from position 1 on
            n_targets = sum(sum(e.loss_mask[1:]) for e in batch)
            optim.zero_grad()
            batch_loss = 0.0
            for e in batch:
                ids = torch.tensor([e.token_ids], device=device)
                labels = torch.where(torch.tensor([e.loss_mask], device=device) > 0, ids, -100)
                out = model(input_ids=ids, labels=labels, use_cache=False)
                share = sum(e.loss_mask[1:]) / n_targets
                (out.loss * share).backward()
                batch_loss += float(out.loss.detach()) * share
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            optim.step()
            total += batch_loss * len(batch)
            count += len(batch)
            step += 1
            if log:
                log({"epoch": epoch + 1, "epochs": epochs, "step": step, "steps": steps_per_epoch * epochs,
                     "loss": batch_loss})
        losses.append(total / count)
        if log:
            log({"epoch": epoch + 1, "epochs": epochs, "epoch_loss": losses[-1]})
    model.eval()
    if not all(math.isfinite(x) for x in losses):
        raise FloatingPointError(f"supervised loss diverged: {losses}")
    return losses


def warm_start(model_dir: str | Path, examples: Sequence[Demonstration], out_dir: str | Path, *,
               lora: dict | None = None, epochs: int = 3, lr: float = 3e-4, batch_size: int = 4,
               dtype: str = "float32", seed: int = 0, activation_checkpointing: bool = False,
               log: Callable[[dict], None] | None = None) -> dict:
    """LoRA warm start of the model in ``model_dir`` on ``examples``, merged into the base
    weights and saved with the tokenizer to ``out_dir``: a plain model directory that the
    trainer loads like any other (GRPO then adds its own, fresh adapter on top, and its KL
    reference is the warm-started model). ``activation_checkpointing`` as the policy's
    ``gradient_checkpointing``: the same steps in less memory. Returns the losses and sizes."""
    import torch
    from transformers import AutoTokenizer

    from draco_gym.algos.policy.lm import add_lora, enable_activation_checkpointing, load_causal_lm

    torch.manual_seed(seed)
    model = add_lora(load_causal_lm(str(model_dir), dtype), lora or {}, seed)
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    losses = train_supervised(model, examples, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, log=log)
    merged = model.merge_and_unload()
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    merged.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(tmp)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return {"losses": losses, "examples": len(examples),
            "policy_tokens": sum(e.n_policy_tokens for e in examples), "model": str(out)}


# -- is the warm start good enough to start GRPO from? ---------------------------------------


READY = "ready for GRPO"
TOO_WEAK = "too weak: more epochs or a larger model"
SOLVED = ("already solves every train-task episode: GRPO groups would tie on the outcome "
          "(fewer epochs, or harder tasks)")
TIED = ("each train task's episodes all succeed or all fail: GRPO groups would tie on the outcome "
        "(fewer epochs, or other train tasks)")
NO_TRANSFER = ("solves no held-out episode: what the warm start taught does not carry to new tasks "
               "(fewer epochs, or more varied reference solutions)")


def sample_episodes(model_dir: str | Path, make_env: Callable[[], Any], plays: Sequence[str], limits, *,
                    temperature: float = 1.0, dtype: str = "float32", seed: int = 0, parallel: int = 4) -> list:
    """One sampled episode (a ``Trajectory``) per entry of ``plays`` (task ids, a task repeated
    for several episodes) with the model in ``model_dir``, played by the rollout loop GRPO
    uses (same chat layout, sampler and token budgets ``limits``), no Ray. ``parallel``
    episodes run at a time, each in an environment of its own from ``make_env``."""
    from transformers import AutoTokenizer

    from draco_gym.algos.policy.chat import ChatFormat, eos_token_ids
    from draco_gym.algos.policy.generation import TorchSampler
    from draco_gym.algos.policy.lm import load_causal_lm
    from draco_gym.algos.policy.rollout import Episode, run_episodes

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    chat = ChatFormat.from_tokenizer(tokenizer)
    lm = load_causal_lm(str(model_dir), dtype)
    eos = eos_token_ids(tokenizer, getattr(lm, "generation_config", None))
    sampler = TorchSampler(lm, eos_ids=eos, pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                           else eos[0], temperature=temperature)
    envs = [make_env() for _ in range(min(parallel, len(plays)))]
    trajectories = []
    try:
        for start in range(0, len(plays), len(envs)):
            batch = plays[start : start + len(envs)]
            episodes = [Episode.start(env, chat, limits, task_id=task, seed=seed + start + k)
                        for k, (env, task) in enumerate(zip(envs, batch))]
            trajectories += run_episodes(episodes, sampler, chat, limits, seed=seed + start)
    finally:
        for env in envs:
            env.close()
    return trajectories


def by_task(trajectories: Sequence) -> list:
    """The episodes as ``RolloutGroup``s, one per task, in the order the tasks first appear."""
    from draco_gym.types import RolloutGroup

    tasks: dict[str, list] = {}
    for t in trajectories:
        tasks.setdefault(t.task.id, []).append(t)
    return [RolloutGroup(task_id=task, trajectories=ts) for task, ts in tasks.items()]


def check_rates(groups: Sequence) -> dict:
    """``draco_gym.algos.evaluation.episode_summary``'s rates of one side of the check plus
    ``mixed_tasks``: the tasks whose episodes hold both a success and a failure, the tasks on
    which a GRPO group would have an outcome spread to learn from."""
    from draco_gym.algos.evaluation import episode_summary
    from draco_gym.metrics import share

    mixed = sum(len({bool(t.metrics.get("success")) for t in g.trajectories}) == 2 for g in groups)
    return {**episode_summary(groups), "mixed_tasks": share(mixed, len(groups)), "tasks": [g.task_id for g in groups]}


def warm_start_verdict(train: dict, held_out: dict | None) -> str:
    """Whether GRPO can learn from the warm-started policy, from ``check_rates`` of its train
    tasks and of held-out ones (``None`` when nothing is held out). GRPO learns from groups
    whose outcomes differ, so on the train tasks it wants at least half the turns well-formed,
    some episode succeeding (else ``TOO_WEAK``) but not every one (``SOLVED``), and some task
    whose episodes hold both a success and a failure (``TIED``: a warm start that replays the
    demonstrated answers solves some tasks always and the rest never). A held-out success
    (else ``NO_TRANSFER``) says the skill, not the answers, was learned."""
    wins, episodes = train["success_rate"]["k"], train["success_rate"]["n"]
    if train["well_formed_turns"]["mean"] < 0.5 or not wins:
        return TOO_WEAK
    if wins == episodes:
        return SOLVED
    if not train["mixed_tasks"]["k"]:
        return TIED
    if held_out is not None and not held_out["success_rate"]["k"]:
        return NO_TRANSFER
    return READY
