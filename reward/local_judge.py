"""What in-process judges share: schema-constrained decoding, a prompt that fits the model's
context without losing its rules, and the chat template's thinking switch.

Used by ``TransformersJudge`` (any local HF causal LM) and the self-judge (``PolicyJudge``,
the policy being trained). Nothing here imports torch, transformers or llguidance at module
level: the reward layer stays importable without them.

**Constrained decoding.** Each stage sends the JSON schema of its answer (``answers.py``,
narrowed per call: the rubric's titles as an enum, step numbers bounded by the rollout). A
local judge compiles it with llguidance (the grammar engine behind vLLM's ``guidance``
backend and llama.cpp's) and, at every decoding step, masks the logits of every token that
cannot continue a valid answer. A 135M model then answers in the right shape on the first
attempt; whether its verdicts are any good is another matter. The checks in ``answers.py``
still run on every answer (citation rules, repeated titles dropped: what a schema cannot
express). How the schema is tightened for a grammar is ``grammar.py``'s, shared with the
llama.cpp servers' grammar.

**Fitting the prompt.** A judge prompt is the stage's rules (system message), the task, the
rubric and one or more rollouts (``<trajectory>`` elements). When it exceeds the judge's
context budget, only the rollouts are shortened, in their middle (their beginning and end
stay, as does every kept step's number, and a cut inside a fenced span closes and reopens
its fence, so no data is left outside one). Rules, task and rubric are never cut: when they
alone do not fit, the call fails with an error that says so (the client counts a fallback).

**Thinking.** ``thinking=True/False`` is passed to the chat template as ``enable_thinking``
(Qwen3's switch; templates that do not read it ignore it). With thinking on and a model
that closes its reasoning with a ``</think>`` token, the reasoning is generated freely and
only the answer after it is constrained; the reply's text is the answer alone.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from draco_gym.reward.answers import THINK_END
from draco_gym.reward.grammar import DoesNotFit, grammar_schema, string_budget
from draco_gym.reward.render import fences_in, truncate_fenced
from draco_gym.text import truncate_middle

log = logging.getLogger(__name__)

_TRAJECTORY = re.compile(r"(<trajectory\b[^>]*>\n)(.*?)(\n</trajectory>)", re.DOTALL)


class PromptTooLong(DoesNotFit):
    """The stage's rules, task and rubric alone exceed the judge's prompt budget."""


# -- the prompt ------------------------------------------------------------------------------


def chat_ids(tokenizer: Any, messages: list[dict[str, str]], thinking: bool | None = None) -> list[int]:
    """Token ids of ``messages`` with the generation prompt. ``thinking`` (None: the
    template's default) reaches the template as ``enable_thinking``. A tokenizer without a
    chat template gets a plain ``role:`` transcript."""
    if getattr(tokenizer, "chat_template", None):
        extra = {} if thinking is None else {"enable_thinking": bool(thinking)}
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **extra)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    text = "".join(f"{m['role']}:\n{m['content']}\n\n" for m in messages) + "assistant:\n"
    return list(tokenizer(text)["input_ids"])


def fit_messages(messages: list[dict[str, str]], count: Callable[[list[dict[str, str]]], int],
                 limit: int) -> list[dict[str, str]]:
    """``messages`` whose token count (``count``) is at most ``limit``, reached by shortening
    the middle of the rollouts (``<trajectory>`` elements) only. Raises ``PromptTooLong`` when
    the rest of the prompt does not fit on its own."""
    total = count(messages)
    if total <= limit:
        return messages
    spans = [(i, m) for i, m in enumerate(messages) for m in _TRAJECTORY.finditer(m["content"])]
    rollout_chars = sum(len(m.group(2)) for _, m in spans)
    if not spans:
        raise PromptTooLong(f"the judge prompt has {total} tokens, over the limit of {limit}, and holds no "
                            "rollout to shorten; raise max_prompt_tokens")
    # Shrink all rollouts by one ratio, re-measure, repeat: characters per token vary.
    ratio = 1.0
    for _ in range(6):
        ratio *= max(0.0, 1 - (total - limit) / max(total, 1)) * 0.97
        fitted = [dict(m) for m in messages]
        for index in {i for i, _ in spans}:
            fitted[index]["content"] = _TRAJECTORY.sub(
                lambda m, ratio=ratio: m.group(1) + _shortened(m.group(1), m.group(2), max(int(len(m.group(2)) * ratio), 1))
                + m.group(3),
                messages[index]["content"])
        total = count(fitted)
        if total <= limit:
            log.info("judge prompt over its budget: rollouts shortened in the middle to %.0f%% (%d of %d chars)",
                     100 * ratio, int(rollout_chars * ratio), rollout_chars)
            return fitted
    raise PromptTooLong(f"the judge prompt does not fit {limit} tokens even with its rollouts shortened to "
                        f"{int(rollout_chars * ratio)} characters: the stage rules, task and rubric alone are too "
                        "long; raise max_prompt_tokens or shorten the task prompt (max_prompt_chars)")


def _shortened(header: str, body: str, limit: int) -> str:
    """A rollout's body cut in its middle, its data still fenced (``render.truncate_fenced``)."""
    codes = fences_in(header)
    return truncate_fenced(body, limit, codes[0]) if codes else truncate_middle(body, limit)


# -- constrained decoding --------------------------------------------------------------------


def _require_llguidance():
    try:
        import llguidance
        import llguidance.hf  # noqa: F401
    except ImportError as exc:
        raise ImportError("constrained decoding needs llguidance: pip install 'draco-gym[rllib]' (or "
                          "pip install llguidance), or build the judge with constrained=False") from exc


JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""One space after separators, no other whitespace: what instruction-tuned models write."""

class SchemaConstraint:
    """Compiles JSON schemas for one tokenizer and hands out logits processors that keep a
    generation inside the schema. Building it reads the tokenizer's vocabulary (a second or
    two); grammars are compiled once per schema and token budget."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]) -> None:
        _require_llguidance()
        import llguidance.hf
        import numpy as np

        self.eos_ids = [int(i) for i in eos_ids]
        n_vocab = max(int(vocab_size), len(tokenizer))
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=self.eos_ids)
        texts = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        # Token texts as the JSON lexer of JsonLogitsProcessor reads them (quotes, backslashes).
        self.texts = [tokenizer.convert_tokens_to_string([t]) if t is not None else "" for t in texts]
        self.closes_string = np.zeros(n_vocab, dtype=bool)
        self.closes_string[[i for i, t in enumerate(self.texts) if t.startswith('"')]] = True
        self._grammars: dict[str, tuple[str, int]] = {}

    def grammar(self, schema: dict, max_tokens: int, stage: str = "") -> tuple[str, int]:
        """(llguidance grammar, tokens per free-text string) for ``stage``'s ``schema``."""
        import llguidance

        key = json.dumps([schema, max_tokens, stage], sort_keys=True)
        if key not in self._grammars:
            bounded = grammar_schema(schema, stage)
            per_string = string_budget(bounded, max_tokens, lambda text: len(self.tokenizer.tokenize_str(text)))
            grammar = llguidance.LLMatcher.grammar_from_json_schema(bounded, overrides=JSON_STYLE)
            error = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
            if error and not error.startswith("WARNING"):
                raise ValueError(f"the answer schema cannot be compiled to a grammar: {error}")
            self._grammars[key] = (grammar, per_string)
        return self._grammars[key]

    def processor(self, schema: dict, max_tokens: int, stage: str = "") -> JsonLogitsProcessor:
        import llguidance

        grammar, per_string = self.grammar(schema, max_tokens, stage)
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        return JsonLogitsProcessor(matcher, self, per_string)


class JsonLogitsProcessor:
    """A transformers logits processor (``generate(logits_processor=[...])``) for one
    generation of batch size 1: before each token, every token the grammar forbids gets
    -inf. A string that has used its share of the token budget is closed at the next token
    that can close it. Once the answer is complete only end-of-sequence remains."""

    def __init__(self, matcher: Any, constraint: SchemaConstraint, string_tokens: int) -> None:
        self.matcher = matcher
        self.constraint = constraint
        self.string_tokens = string_tokens
        self._start: int | None = None
        self._in_string = self._escaped = False
        self._string_length = 0
        self.failed = ""

    def _read(self, token: int) -> None:
        """Follow the JSON lexer state: inside a string or not, and for how many tokens."""
        texts = self.constraint.texts
        for char in texts[token] if token < len(texts) else "":
            if self._escaped:
                self._escaped = False
            elif self._in_string and char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = not self._in_string
                self._string_length = 0
        if self._in_string:
            self._string_length += 1

    def __call__(self, input_ids, scores):
        import numpy as np
        import torch

        if input_ids.shape[0] != 1:
            raise ValueError("JsonLogitsProcessor constrains one sequence at a time")
        if self._start is None:
            self._start = input_ids.shape[1]
        elif not self.failed:
            token = int(input_ids[0, -1])
            self.matcher.consume_token(token)
            self._read(token)
        if self.failed or self.matcher.is_error():
            # Cannot happen while the mask is applied; if it does, stop constraining and let
            # the answer checks report what is wrong.
            self.failed = self.failed or self.matcher.get_error()
            return scores
        vocab = scores.shape[-1]
        allowed = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = allowed[:vocab].astype(bool)
        if allowed.shape[0] < vocab:
            allowed = np.concatenate([allowed, np.zeros(vocab - allowed.shape[0], dtype=bool)])
        if self._in_string and self._string_length >= self.string_tokens:
            closing = allowed & self.constraint.closes_string[:vocab]
            if closing.any():
                allowed = closing
        forbid = torch.from_numpy(~allowed).to(scores.device)
        return scores.masked_fill(forbid[None, :], float("-inf"))


def turn_end_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """Every token that ends the judge's turn: the model's EOS ids and the tokenizer's (the
    reward layer's own copy of ``algos.policy.chat.eos_token_ids``; reward never imports algos)."""
    ids: list[int] = []
    for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        for i in source if isinstance(source, (list, tuple)) else [source]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("the judge's tokenizer has no EOS token: its answers could never end")
    return ids


# -- one answer ------------------------------------------------------------------------------


def think_end_id(tokenizer: Any) -> int | None:
    """The id of a single ``</think>`` token, if the tokenizer has one."""
    ids = tokenizer.encode(THINK_END, add_special_tokens=False)
    return int(ids[0]) if len(ids) == 1 else None


def generate_answer(lm: Any, tokenizer: Any, prompt: list[int], *, eos_ids: Sequence[int], pad_id: int,
                    temperature: float, max_tokens: int, seed: int, schema: dict | None = None,
                    constraint: SchemaConstraint | None = None, thinking: bool | None = None,
                    thinking_tokens: int = 1024, stage: str = "") -> tuple[str, int, int]:
    """(answer text, prompt tokens, generated tokens) for one prompt. With a ``constraint``
    and a ``schema`` the answer decodes under the schema; with ``thinking`` and a model
    that has a ``</think>`` token, a free reasoning phase (at most ``thinking_tokens``)
    comes first and is not part of the answer."""
    eos = [int(i) for i in eos_ids]
    generated = 0
    ids = list(prompt)
    stop = think_end_id(tokenizer) if thinking else None
    if stop is not None:
        reasoning = _generate(lm, ids, eos + [stop], pad_id, temperature, thinking_tokens, seed, None)
        generated += len(reasoning)
        ids += reasoning
        if not reasoning or reasoning[-1] != stop:
            ids += [stop]  # out of thinking budget (or an early end): close the reasoning
        ids += tokenizer.encode("\n\n", add_special_tokens=False)
    processor = constraint.processor(schema, max_tokens, stage) if (constraint is not None and schema is not None) else None
    answer = _generate(lm, ids, eos, pad_id, temperature, max_tokens, seed, processor)
    if processor is not None and processor.failed:
        log.warning("constrained decoding left the grammar (%s); the answer is checked as usual", processor.failed)
    return tokenizer.decode(answer, skip_special_tokens=True), len(prompt), generated + len(answer)


def _generate(lm, ids: list[int], eos: list[int], pad_id: int, temperature: float, max_tokens: int, seed: int,
              processor) -> list[int]:
    import torch

    device = next(lm.parameters()).device
    inputs = torch.tensor([ids], device=device)
    options: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": temperature > 0, "pad_token_id": pad_id,
                               "eos_token_id": eos}
    if temperature > 0:
        options["temperature"] = temperature
        options["top_k"] = None  # sample from the whole (masked) distribution, as temperature says
        options["top_p"] = None
    if processor is not None:
        options["logits_processor"] = [processor]
    with torch.no_grad():
        if temperature > 0:
            torch.manual_seed(seed)
        out = lm.generate(inputs, attention_mask=torch.ones_like(inputs), **options)
    return out[0, len(ids):].tolist()
