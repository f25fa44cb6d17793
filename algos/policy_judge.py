"""The self-judge: the policy being trained judges its own rollouts (DRACO's self-judge).

In a config, ``reward_options: {judge: policy}`` (or ``{judge: {name: policy, ...}}``)
means "the current policy, adapter included, as served by this env runner". The reward
layer stays free of torch: it only sees an object with the ``Judge`` protocol.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class PolicyJudge:
    """A ``Judge`` backed by an env runner's sampling copy of the policy."""

    def __init__(self, runner, *, max_prompt_tokens: int = 6144) -> None:
        self.runner = runner
        self.max_prompt_tokens = max_prompt_tokens
        self.model = f"policy:{runner.config.policy_model}"
        self._lock = threading.Lock()  # one model, one generation at a time

    async def complete(self, messages, *, schema=None, schema_name="", temperature=0.1, max_tokens=1024, sample=0):
        from draco_gym.reward.judges import JudgeReply

        def run() -> JudgeReply:
            from draco_gym.algos.generation import TorchSampler

            tok = self.runner.tokenizer
            ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)[-self.max_prompt_tokens :]
            sampler = TorchSampler(self.runner.module.lm, eos_ids=self.runner.chat.eos_ids,
                                   pad_id=self.runner.sampler.pad_id, temperature=temperature)
            with self._lock:
                out = sampler.sample([ids], [max_tokens], seed=hash((len(ids), sample)) & 0x7FFFFFFF)[0]
            return JudgeReply(tok.decode(out.token_ids, skip_special_tokens=True), len(ids), len(out.token_ids))

        return await asyncio.to_thread(run)


def build_trainer_reward(name, options: dict[str, Any], runner):
    """``build_reward`` with the ``policy`` judge resolved to this runner's policy.

    ``name`` is a registered reward name, or (Python API) a factory called with the
    options, e.g. your own ``RubricReward`` subclass."""
    from draco_gym.reward import build_reward

    judge = options.get("judge")
    judge_name = judge.get("name") if isinstance(judge, dict) else judge
    if judge_name == "policy":
        extra = {k: v for k, v in judge.items() if k != "name"} if isinstance(judge, dict) else {}
        options = {**options, "judge": PolicyJudge(runner, **extra)}
    return build_reward(name, **options) if isinstance(name, str) else name(**options)
