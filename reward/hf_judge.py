"""A local Hugging Face causal LM as the judge (for the self-judge, or a judge without a
server). Imports torch and transformers, so it is imported only when built
(``build_judge("transformers", ...)`` or this module directly).

No constrained decoding: the schema is not enforced while generating, so every answer
relies on the client's validation and repair, and a model too weak to follow the format
ends in explicit fallbacks rather than in a reward.

Generation runs in a worker thread (``asyncio.to_thread``) behind a lock: one model
generates one answer at a time, while the event loop keeps serving other judges.

When the model's weights change during a run (the policy as self-judge), set
``revision`` (e.g. to the training step): it is part of the cache key, so a cached verdict
of an older policy is never reused.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from draco_gym.reward.judge import JudgeReply


class TransformersJudge:
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
    ) -> None:
        import torch  # noqa: F401 - fail here, with a clear error, if the extra is missing
        from transformers import AutoModelForCausalLM, AutoTokenizer

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
        if max_prompt_tokens < 16:
            raise ValueError(f"max_prompt_tokens must be >= 16, got {max_prompt_tokens}")
        self.lm = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.max_prompt_tokens = max_prompt_tokens
        self.model = name or str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
        self.revision = revision
        self._lock = threading.Lock()

    @property
    def identity(self) -> dict[str, Any]:
        return {"kind": "transformers", "model": self.model, "revision": self.revision}

    def _prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        else:
            text = "".join(f"{m['role']}:\n{m['content']}\n\n" for m in messages) + "assistant:\n"
            ids = tok(text)["input_ids"]
        # keep the end: the question and the answer format come last
        return list(ids)[-self.max_prompt_tokens :]

    def _generate(self, messages: list[dict[str, str]], temperature: float, max_tokens: int, sample: int) -> JudgeReply:
        import torch

        ids = self._prompt_ids(messages)
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        inputs = torch.tensor([ids], device=self.device)
        sampling = temperature > 0
        options: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": sampling, "pad_token_id": pad}
        if sampling:
            options["temperature"] = temperature
        with self._lock, torch.no_grad():
            if sampling:
                torch.manual_seed(sample)
            out = self.lm.generate(inputs, attention_mask=torch.ones_like(inputs), **options)
        new = out[0, len(ids) :].tolist()
        return JudgeReply(tok.decode(new, skip_special_tokens=True), len(ids), len(new))

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
        return await asyncio.to_thread(self._generate, messages, temperature, max_tokens, sample)
