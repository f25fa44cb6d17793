"""Token bookkeeping for trajectories from any loop (``algos/policy/tokens.py``).

``attach_tokens`` must lay a trajectory out exactly as the trainer does while sampling, so the
reference here is the trainer's own rollout loop (``rollout.run_episodes``) on a real
environment, driven by a scripted sampler that emits the tokenizer's encoding of fixed turns.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from draco_gym.algos.policy.chat import ChatFormat
from draco_gym.algos.config import EpisodeLimits
from draco_gym.algos.credit import get_credit_rule, group_advantages, token_advantages
from draco_gym.algos.policy.generation import Sample
from draco_gym.algos.policy.rollout import Episode, run_episodes
from draco_gym.algos.policy.tokens import attach_tokens, pad_token_advantages
from draco_gym.reward import build_reward
from draco_gym.types import GAP

TURNS = [
    ["Let me look around first.", "```python\nopen_door(0)\n```", "```python\nopen_door(3)\n```"],
    ["```python\nopen_door(2)\n```", "```python\nopen_door(1)\n```"],
]


class ScriptedSampler:
    """Episode k's turn j is TURNS[k][j], tokenised by the policy's tokenizer, plus EOS."""

    def __init__(self, chat: ChatFormat, scripts: list[list[str]]) -> None:
        self.chat, self.scripts, self.turn = chat, scripts, {}

    def sample(self, prompts, max_new_tokens, seed):
        out = []
        for prompt in prompts:
            k = next(i for i, s in enumerate(self.starts) if prompt[: len(s)] == s)
            j = self.turn.get(k, 0)
            self.turn[k] = j + 1
            ids = self.chat.encode(self.scripts[k][j]) + [self.chat.eos_ids[0]]
            out.append(Sample(token_ids=ids, logprobs=[-1.0] * len(ids), ended_with_eos=True))
        return out


@pytest.fixture(scope="module")
def chat(tiny_model):
    from transformers import AutoTokenizer

    return ChatFormat.from_tokenizer(AutoTokenizer.from_pretrained(tiny_model))


def trainer_trajectories(chat):
    """Two Corridor episodes (different tasks, so different prompts) through the trainer's loop."""
    limits = EpisodeLimits(max_new_tokens=64, max_prompt_tokens=4096, max_response_tokens=4096)
    envs = [gym.make("draco_gym/Corridor-v0", n_rooms=2) for _ in TURNS]
    episodes = [Episode.start(env, chat, limits, task_id=f"corridor-{k + 1}", seed=k) for k, env in enumerate(envs)]
    sampler = ScriptedSampler(chat, TURNS)
    sampler.starts = [list(ep.tokens) for ep in episodes]
    return run_episodes(episodes, sampler, chat, limits)


def test_attach_tokens_reproduces_the_trainers_token_record(chat):
    trajs = trainer_trajectories(chat)
    assert [len(t.steps) for t in trajs] == [3, 2]
    for traj in trajs:
        bare = traj.model_copy(update={"token_ids": [], "token_step": [], "token_logprobs": [],
                                       "steps": [s.model_copy(update={"n_tokens": 0}) for s in traj.steps]})
        attached = attach_tokens(bare, chat.tokenizer)
        assert attached.token_ids == traj.token_ids
        assert attached.token_step == traj.token_step
        assert attached.step_tokens == traj.step_tokens
        assert all(n > 0 for n in attached.step_tokens)
        assert attached.token_logprobs == []
        # the input is left as it was
        assert bare.token_ids == [] and bare.step_tokens == [0] * len(bare.steps)


def test_credit_runs_on_a_plain_loop_with_attached_tokens(chat):
    """The credit page's snippet: trajectories from gym.make + step, no trainer."""
    env = gym.make("draco_gym/Corridor-v0", n_rooms=2)
    group = []
    for doors in [(0, 3), (0, 1), (2, 0)]:
        env.reset(options={"task_id": "corridor-2"})
        for door in doors:
            env.step(f"```python\nopen_door({door})\n```")
        group.append(attach_tokens(env.unwrapped.trajectory(), chat.tokenizer))
    scores = build_reward("corridor").score_group(group[0].task, group)
    A = group_advantages(scores.rewards)
    assert max(A) > 0 > min(A)
    per_step = get_credit_rule("draco")(group, scores, A)
    per_token = [token_advantages(a, t.token_step) for a, t in zip(per_step, group)]
    batch = pad_token_advantages(group, per_token, pad_id=0)
    width = max(len(t.token_ids) for t in group)
    assert batch["advantages"].shape == batch["policy_mask"].shape == (3, width)
    assert "old_logp" not in batch
    for i, traj in enumerate(group):
        # DRACO keeps each trajectory's total push: sum over step tokens = A_i x step tokens
        n = sum(traj.step_tokens)
        assert batch["advantages"][i].sum() == pytest.approx(A[i] * n, rel=1e-5)


def test_pad_token_advantages_pads_and_masks(chat):
    trajs = trainer_trajectories(chat)
    adv = [[float(s) for s in t.token_step] for t in trajs]  # any per-token values
    batch = pad_token_advantages(trajs, adv, pad_id=7)
    short, long_ = sorted(range(2), key=lambda i: len(trajs[i].token_ids))
    n = len(trajs[short].token_ids)
    assert batch["input_ids"].shape == (2, len(trajs[long_].token_ids))
    assert (batch["input_ids"][short, n:] == 7).all() and (batch["attention_mask"][short, n:] == 0).all()
    assert (batch["advantages"][short, n:] == 0).all()
    np.testing.assert_array_equal(batch["advantages"][short, :n], adv[short])
    step = np.asarray(trajs[short].token_step) != GAP
    np.testing.assert_array_equal(batch["policy_mask"][short, 1:n], step[1:])
    assert batch["policy_mask"][:, 0].sum() == 0
    np.testing.assert_allclose(batch["old_logp"][short, :n], trajs[short].token_logprobs)
    with pytest.raises(ValueError, match="token advantages"):
        pad_token_advantages(trajs, [adv[0], adv[0]])
