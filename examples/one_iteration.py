"""One GRPO iteration with step credit, in one file and one process, without Ray.

    episodes -> group score -> credit -> token batch -> loss -> optimizer step

The same pieces the RLlib trainer runs (``draco_gym/algos/rllib/grpo.py``, where the
episodes are sampled on env runners and the step on learners), called in order on a tiny
random Llama built here, so it runs in seconds on a CPU:

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
from draco_gym.algos.credit import apply_credit, get_credit_rule
from draco_gym.algos.policy.batch import token_batch
from draco_gym.algos.policy.chat import ChatFormat
from draco_gym.algos.policy.generation import TorchSampler
from draco_gym.algos.policy.lm import add_lora, load_causal_lm, token_logprobs
from draco_gym.algos.policy.loss import grpo_loss
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
    reward, credit_rule, loss_cfg = build_reward(args.reward), get_credit_rule(args.credit), LossConfig()
    adapter = [w for w in lm.parameters() if w.requires_grad]
    optimizer = torch.optim.AdamW(adapter, lr=args.lr)

    # 1. Episodes: G per task, every live episode's turn in one batched sampling call.
    G = args.group_size
    envs = [gym.make(args.env, max_turns=2) for _ in range(args.tasks * G)]
    task_ids = list(envs[0].unwrapped.task_ids)[: args.tasks]
    episodes = [Episode.start(env, chat, limits, task_id=task_ids[k // G], seed=args.seed + k)
                for k, env in enumerate(envs)]
    with torch.no_grad():
        trajectories = run_episodes(episodes, sampler, chat, limits, seed=args.seed)
    groups = [RolloutGroup(task_id=task, trajectories=trajectories[i * G : (i + 1) * G])
              for i, task in enumerate(task_ids)]

    # 2. Group score: one reward call per group (a rubric judges the G rollouts together).
    groups = [group.with_score(reward.score_group(group.task, group.trajectories)) for group in groups]

    # 3. Credit, as the trainers apply it: A_i = the group-normalised reward; the rule turns it
    #    into a_j per step (DRACO: towards the steps the verdicts cite); a_j goes on step j's
    #    tokens, 0 on gap tokens.
    credited = apply_credit(groups, credit_rule)

    # 4. Token batch: one right-padded row per trajectory; the loss is taken on step tokens.
    batch = {k: torch.as_tensor(v) for k, v in token_batch(credited.trajectories, credited.token_advantages,
                                                           pad_id=tokenizer.pad_token_id).items()}
    mask = batch["policy_mask"][:, 1:].bool()  # token t is predicted at t - 1
    rows = (batch["input_ids"], batch["attention_mask"], batch["policy_mask"])

    # 5. Loss: clipped ratio to the sampler's log-probs, k3 KL to the base model (adapter off).
    logp = token_logprobs(lm, *rows, temperature=temperature)
    with torch.no_grad(), lm.disable_adapter():
        ref_logp = token_logprobs(lm, *rows, temperature=temperature)
    loss, stats = grpo_loss(logp, batch["old_logp"][:, 1:][mask], ref_logp, batch["advantages"][:, 1:][mask],
                            n_tokens=int(mask.sum()), cfg=loss_cfg)

    # 6. Optimizer step.
    before = {name: w.detach().clone() for name, w in lm.named_parameters() if w.requires_grad}
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(adapter, 1.0)
    optimizer.step()
    moved = max(float((w.detach() - before[name]).abs().max()) for name, w in lm.named_parameters() if name in before)

    for env in envs:
        env.close()
    out = {"episodes": len(trajectories), "rewards": [group.score.rewards for group in groups], "policy_tokens": int(mask.sum()),
           "loss": float(loss.detach()), **{k: float(v) for k, v in stats.items()}, "adapter_moved": moved,
           "inert_share": credited.inert_credit_share, "paper_inert_share": credited.paper_inert_share}
    print("\n".join(f"{k}: {v}" for k, v in out.items()))
    return out


if __name__ == "__main__":
    main()
