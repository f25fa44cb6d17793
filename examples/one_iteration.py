"""One GRPO iteration with step credit, in one file and one process, without Ray.

    sample -> score -> credit -> token batch -> update (loss, backward, clip, step)

The iteration's steps (``draco_gym/algos/policy/iteration.py``), the very calls the RLlib
trainer makes (``draco_gym/algos/rllib/grpo.py``, where the episodes are sampled and scored
on env runners and the gradient taken on learners), on a tiny random Llama built here, so it
runs in seconds on a CPU:

    python examples/one_iteration.py                    # the random-reward baseline
    python examples/one_iteration.py --reward rule --credit draco --model DIR

The policy is noise, so a rubric would give every rollout of a group the same reward and
every advantage would be 0; the default reward is DRACO's random-reward baseline, which
group normalisation turns into full-size advantages, so the step below really moves the
adapter. With ``--model`` (a chat model directory) and a rubric the same lines train.
"""

from __future__ import annotations

import argparse
import tempfile

import gymnasium as gym
import torch
from transformers import AutoTokenizer

import draco_gym  # noqa: F401 - registers the environments
from draco_gym.algos.config import EpisodeLimits, LossConfig
from draco_gym.algos.credit import get_credit_rule
from draco_gym.algos.policy import iteration
from draco_gym.algos.policy.chat import ChatFormat
from draco_gym.algos.policy.generation import TorchSampler
from draco_gym.algos.policy.lm import add_lora, load_causal_lm
from draco_gym.algos.policy.models import build_tiny_llama
from draco_gym.algos.policy.rollout import Episode, run_episodes
from draco_gym.reward import build_reward
from draco_gym.types import RolloutGroup


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="draco_gym/Corridor-v0")
    p.add_argument("--model", help="a local chat model directory (default: a tiny random Llama)")
    p.add_argument("--reward", default="random", help="a name in draco_gym.reward.REWARDS")
    p.add_argument("--credit", default="draco", help="a name in draco_gym.algos.credit.CREDIT_RULES")
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4, help="G rollouts per task")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)

    model_dir = args.model or str(build_tiny_llama(tempfile.mkdtemp(prefix="one_iteration_")))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat = ChatFormat.from_tokenizer(tokenizer)  # the chat template, cut into token chunks
    lm = add_lora(load_causal_lm(model_dir), {"r": 8, "alpha": 16}, seed=args.seed)  # only the adapter trains
    temperature = 1.0  # the learner scores tokens under the distribution that drew them
    sampler = TorchSampler(lm, eos_ids=chat.eos_ids, pad_id=tokenizer.pad_token_id, temperature=temperature)
    limits = EpisodeLimits(max_new_tokens=24, max_prompt_tokens=512, max_response_tokens=128)
    reward, credit_rule = build_reward(args.reward), get_credit_rule(args.credit)
    optimizer = torch.optim.AdamW([w for w in lm.parameters() if w.requires_grad], lr=args.lr)

    # 1. Sample (this loop's own; RLlib samples on env runners, TRL in its rollout_func): G
    #    episodes per task, every live episode's turn in one batched sampling call.
    G = args.group_size
    envs = [gym.make(args.env, max_turns=2) for _ in range(args.tasks * G)]
    task_ids = list(envs[0].unwrapped.task_ids)[: args.tasks]
    episodes = [Episode.start(env, chat, limits, task_id=task_ids[k // G], seed=args.seed + k)
                for k, env in enumerate(envs)]
    with torch.no_grad():
        trajectories = run_episodes(episodes, sampler, chat, limits, seed=args.seed)
    groups = [RolloutGroup(task_id=task, trajectories=trajectories[i * G : (i + 1) * G])
              for i, task in enumerate(task_ids)]

    # 2-5. The iteration's steps, the trainers' own calls (draco_gym/algos/policy/iteration.py).
    groups = iteration.score(groups, reward)  # one reward call per group (a rubric judges the G together)
    credited = iteration.credit(groups, credit_rule)  # A_i, then a_j per step (DRACO: the cited steps), per token
    batch = iteration.to_batch(credited, pad_id=tokenizer.pad_token_id)  # one padded row per trajectory
    before = {name: w.detach().clone() for name, w in lm.named_parameters() if w.requires_grad}
    step = iteration.update(iteration.LoRAPolicy(lm, temperature), batch, optimizer, LossConfig())
    moved = max(float((w.detach() - before[name]).abs().max()) for name, w in lm.named_parameters() if name in before)

    for env in envs:
        env.close()
    out = {"episodes": len(trajectories), "rewards": [group.score.rewards for group in groups],
           "policy_tokens": step.policy_tokens, "loss": float(step.loss), **step.stats, "adapter_moved": moved,
           "inert_share": credited.inert_credit_share, "paper_inert_share": credited.paper_inert_share}
    print("\n".join(f"{k}: {v}" for k, v in out.items()))
    return out


if __name__ == "__main__":
    main()
