"""The in-process judge: a local Hugging Face causal LM, registered as "transformers".

For a judge without a server. Decoding under a schema, fitting the prompt and the thinking
switch are ``local_judge.py``'s, which the self-judge (``algos/policy/self_judge.py``) shares;
torch and transformers load when a judge is built, never at import.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from draco_gym.reward.grammar import DoesNotFit
from draco_gym.reward.judge_protocol import JUDGES, JudgeReply, JudgeUnavailable
from draco_gym.reward.local_judge import SchemaConstraint, chat_ids, fit_messages, generate_answer, turn_end_ids


@JUDGES.register("transformers")
class TransformersJudge:
    """A local Hugging Face causal LM as the judge (for the self-judge, or a judge without a
    server). torch and transformers load when one is built, never at import.

    ``constrained=True`` (default) decodes every answer under the stage's JSON schema
    (llguidance, see ``local_judge.py``): even a 135M model answers in the right shape on
    the first attempt. ``constrained=False`` generates freely and relies on the client's
    validation and repair.

    A prompt over ``max_prompt_tokens`` is fitted by shortening its rollouts in the middle;
    the stage rules, task and rubric are never cut. ``thinking`` (None: the template's
    default) reaches the chat template as ``enable_thinking``; with thinking on, the
    reasoning (at most ``thinking_tokens``) is generated unconstrained before the answer.

    Generation runs in a worker thread (``asyncio.to_thread``) behind a lock: one model
    generates one answer at a time, while the event loop keeps serving other judges.

    When the model's weights change during a run (the policy as self-judge), set
    ``revision`` (e.g. to the training step): it is part of the cache key, so a cached verdict
    of an older policy is never reused.

    The default local judge, SmolLM2-135M-Instruct constrained::

        from draco_gym.algos.policy.models import resolve_model
        judge = TransformersJudge(str(resolve_model("smollm2-135m-instruct")))
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        name: str | None = None,
        revision: str | int | None = None,
        device: str = "cpu",
        dtype: str | None = None,
        max_prompt_tokens: int = 8192,
        local_files_only: bool = True,
        constrained: bool = True,
        thinking: bool | None = None,
        thinking_tokens: int = 1024,
    ) -> None:
        import torch  # noqa: F401 - fail here, with a clear error, if the extra is missing
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if max_prompt_tokens < 16:
            raise ValueError(f"max_prompt_tokens must be >= 16, got {max_prompt_tokens}")
        if thinking_tokens < 1:
            raise ValueError(f"thinking_tokens must be >= 1, got {thinking_tokens}")
        if isinstance(model, str):
            path = model
            kwargs = {"local_files_only": local_files_only}
            if dtype is not None:
                kwargs["dtype"] = dtype
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path, local_files_only=local_files_only)
            name = name or path
        if tokenizer is None:
            raise ValueError("pass the tokenizer along with a model object")
        self.lm = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.max_prompt_tokens = max_prompt_tokens
        self.model = name or str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
        self.revision = revision
        self.constrained = constrained
        self.thinking = thinking
        self.thinking_tokens = thinking_tokens
        self.eos_ids = turn_end_ids(tokenizer, getattr(model, "generation_config", None))
        self._constraint = None
        self._lock = threading.Lock()

    @property
    def identity(self) -> dict[str, Any]:
        return {"kind": "transformers", "model": self.model, "revision": self.revision,
                "constrained": self.constrained, "thinking": self.thinking}

    def _prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        def count(ms):
            return len(chat_ids(self.tokenizer, ms, self.thinking))

        return chat_ids(self.tokenizer, fit_messages(messages, count, self.max_prompt_tokens), self.thinking)

    def constraint(self):
        """The schema constraint for this model's tokenizer, built on first use."""
        if self._constraint is None:
            vocab = self.lm.get_output_embeddings().weight.shape[0]
            self._constraint = SchemaConstraint(self.tokenizer, vocab, self.eos_ids)
        return self._constraint

    def _generate(self, messages: list[dict[str, str]], schema: dict | None, schema_name: str, temperature: float,
                  max_tokens: int, sample: int) -> JudgeReply:
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else self.eos_ids[0]
        try:
            ids = self._prompt_ids(messages)
            with self._lock:
                text, n_in, n_out = generate_answer(
                    self.lm, tok, ids, eos_ids=self.eos_ids, pad_id=pad, temperature=temperature,
                    max_tokens=max_tokens, seed=sample, schema=schema,
                    constraint=self.constraint() if self.constrained else None, thinking=self.thinking,
                    thinking_tokens=self.thinking_tokens, stage=schema_name)
        except DoesNotFit as exc:
            raise JudgeUnavailable(str(exc)) from None
        return JudgeReply(text, n_in, n_out)

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        schema: dict | None = None,
        schema_name: str = "",
        temperature: float = 0.1,
        max_tokens: int = 1024,
        sample: int = 0,
    ) -> JudgeReply:
        return await asyncio.to_thread(self._generate, messages, schema, schema_name, temperature, max_tokens, sample)
