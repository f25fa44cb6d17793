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
    """A ``Judge`` backed by an env runner's sampling copy of the policy.

    Answers decode under the stage's JSON schema (``constrained``, see
    ``draco_gym.reward.local_judge``). A prompt over ``max_prompt_tokens`` loses the middle
    of its rollouts, never the stage rules, task or rubric. ``thinking`` is the paper's
    switch, passed to the chat template as ``enable_thinking``; with it on, the reasoning
    (at most ``thinking_tokens``) precedes the constrained answer. Options are declared in
    ``config.PolicyJudgeOptions``.
    """

    def __init__(self, runner, *, max_prompt_tokens: int = 6144, constrained: bool = True, thinking: bool = True,
                 thinking_tokens: int = 1024, name: str = "policy") -> None:
        from draco_gym.algos.config import PolicyJudgeOptions

        PolicyJudgeOptions(name=name, max_prompt_tokens=max_prompt_tokens, constrained=constrained,
                           thinking=thinking, thinking_tokens=thinking_tokens)  # the same bounds as a config
        self.runner = runner
        self.max_prompt_tokens = max_prompt_tokens
        self.constrained = constrained
        self.thinking = thinking
        self.thinking_tokens = thinking_tokens
        self.model = f"policy:{runner.config.run.policy.model}"
        self._constraint = None
        self._lock = threading.Lock()  # one model, one generation at a time

    def prompt_ids(self, messages) -> list[int]:
        """The judge prompt's token ids, fitted to ``max_prompt_tokens``."""
        from draco_gym.reward.local_judge import chat_ids, fit_messages

        tok = self.runner.tokenizer

        def count(ms):
            return len(chat_ids(tok, ms, self.thinking))

        return chat_ids(tok, fit_messages(messages, count, self.max_prompt_tokens), self.thinking)

    def _schema_constraint(self):
        from draco_gym.reward.local_judge import SchemaConstraint

        if self._constraint is None:
            lm = self.runner.module.lm
            vocab = lm.get_output_embeddings().weight.shape[0]
            self._constraint = SchemaConstraint(self.runner.tokenizer, vocab, self.runner.chat.eos_ids)
        return self._constraint

    async def complete(self, messages, *, schema=None, schema_name="", temperature=0.1, max_tokens=1024, sample=0):
        from draco_gym.reward.judges import JudgeReply, JudgeUnavailable
        from draco_gym.reward.local_judge import DoesNotFit, generate_answer

        def run() -> JudgeReply:
            try:
                ids = self.prompt_ids(messages)
                constraint = self._schema_constraint() if self.constrained else None
                with self._lock:
                    text, n_in, n_out = generate_answer(
                        self.runner.module.lm, self.runner.tokenizer, ids, eos_ids=self.runner.chat.eos_ids,
                        pad_id=self.runner.sampler.pad_id, temperature=temperature, max_tokens=max_tokens,
                        seed=hash((len(ids), sample)) & 0x7FFFFFFF, schema=schema, constraint=constraint,
                        thinking=self.thinking, thinking_tokens=self.thinking_tokens, stage=schema_name)
            except DoesNotFit as exc:
                raise JudgeUnavailable(str(exc)) from None
            return JudgeReply(text, n_in, n_out)

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
