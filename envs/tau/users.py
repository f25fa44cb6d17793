"""The simulated customer on the other side of a τ-bench conversation.

One interface, two implementations:

- ``LLMUser``: any OpenAI-compatible chat endpoint (OpenAI, vLLM, SGLang, llama.cpp, ...)
  plays the customer from the benchmark's own user-simulator prompt. τ-bench scores move
  with the user model, so ``describe()`` (model, endpoint, sampling settings) is stored in
  every episode's metrics.
- ``ScriptedUser``: no model. It opens with the task's instruction, answers with the replies
  it was given, then ends the conversation with the benchmark's stop token. Deterministic,
  offline: the user of the tests and of ``check_env``.

A user that has tools of its own (τ²'s telecom: the customer toggles airplane mode on their
phone) calls them through ``UserContext.call_tool``; the call is logged in the episode, so
the benchmark's evaluator sees it, exactly as in the official runner.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

STOP = "###STOP###"
STOP_TOKENS: tuple[str, ...] = (STOP, "###TRANSFER###", "###OUT-OF-SCOPE###")
"""Tokens that end a conversation when the user writes them (τ² checks all three, τ v1 the first)."""

GREETING = "Hi! How can I help you today?"
"""The agent's fixed first message in both τ-bench runners; the user answers it."""


def is_stop(text: str) -> bool:
    return any(token in text for token in STOP_TOKENS)


@dataclass
class UserContext:
    """What the user is given at the start of an episode.

    ``instructions`` is the task's scenario for the customer; ``system_prompt`` the
    benchmark's user-simulator prompt built from it; ``tools`` OpenAI-style schemas of the
    user's own tools (empty in most domains) and ``call_tool(name, arguments) -> str`` runs one.
    ``history`` is the conversation a task starts from, as ("agent" | "user", text) pairs.
    """

    instructions: str
    system_prompt: str
    tools: list[dict[str, Any]] = field(default_factory=list)
    call_tool: Callable[[str, dict[str, Any]], str] | None = None
    history: list[tuple[str, str]] = field(default_factory=list)


class User(ABC):
    """A simulated customer. ``respond`` gets the agent's message and returns the reply."""

    @abstractmethod
    def reset(self, context: UserContext) -> None: ...

    @abstractmethod
    def respond(self, agent_message: str) -> str: ...

    def describe(self) -> dict[str, Any]:
        """What this user is (recorded in the episode, since results depend on it)."""
        return {"type": type(self).__name__}


class ScriptedUser(User):
    """Opens with the task instruction, then says ``replies`` in order, then ``###STOP###``.

    With no replies the conversation ends right after the agent's first answer, as the
    benchmark's stop token would. ``opening`` replaces the instruction as first message.
    """

    def __init__(self, replies: Sequence[str] = (), opening: str | None = None) -> None:
        if isinstance(replies, str) or not all(isinstance(r, str) for r in replies):
            raise TypeError("replies must be a sequence of strings")
        self.replies = list(replies)
        self.opening = opening
        self._queue: list[str] = []

    def reset(self, context: UserContext) -> None:
        self._queue = [self.opening or context.instructions, *self.replies]

    def respond(self, agent_message: str) -> str:
        return self._queue.pop(0) if self._queue else STOP

    def describe(self) -> dict[str, Any]:
        return {"type": "scripted", "replies": len(self.replies)}


class LLMUser(User):
    """The customer played by a chat model behind an OpenAI-compatible endpoint.

    ``base_url`` defaults to ``OPENAI_BASE_URL`` (else OpenAI). The key is ``api_key``, else the
    environment variable named by ``api_key_env`` (how configs give it, so that keys never sit
    in files), else ``OPENAI_API_KEY``, else ``"EMPTY"`` (local servers accept it). Temperature 0 is the
    τ² default for the user. ``max_tool_rounds`` bounds how many user-tool calls one reply
    may chain before the user must say something.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        max_tool_rounds: int = 10,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError("LLMUser needs a model name")
        if api_key is None and api_key_env is not None:
            api_key = os.environ.get(api_key_env)
            if not api_key:
                raise ValueError(f"LLMUser: api_key_env names {api_key_env!r}, but that environment variable is not set")
        import openai  # a core dependency, imported here to keep `import draco_gym` light

        self.model = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_tool_rounds = max_tool_rounds
        self.extra_body = dict(extra_body or {})
        self._client = openai.OpenAI(
            base_url=self.base_url,
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            timeout=timeout_s,
            max_retries=max_retries,
        )
        self._context: UserContext | None = None
        self._messages: list[dict[str, Any]] = []
        self.usage = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}

    def reset(self, context: UserContext) -> None:
        self._context = context
        # The user model sees the conversation with the roles flipped: the agent's messages
        # are "user" turns, its own are "assistant" turns.
        self._messages = [{"role": "system", "content": context.system_prompt}]
        roles = {"agent": "user", "user": "assistant"}
        self._messages += [{"role": roles[speaker], "content": text} for speaker, text in context.history]
        self.usage = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}

    def respond(self, agent_message: str) -> str:
        if self._context is None:
            raise RuntimeError("LLMUser.respond called before reset")
        self._messages.append({"role": "user", "content": agent_message})
        for _ in range(self.max_tool_rounds + 1):
            message = self._complete(with_tools=bool(self._context.tools))
            tool_calls = list(message.tool_calls or [])
            if not tool_calls or self._context.call_tool is None:
                text = (message.content or "").strip()
                self._messages.append({"role": "assistant", "content": text})
                return text
            self._messages.append(
                {
                    "role": "assistant",
                    "content": message.content,
                    "tool_calls": [tc.model_dump(exclude_none=True) for tc in tool_calls],
                }
            )
            for tc in tool_calls:
                output = self._run_tool(tc.function.name, tc.function.arguments)
                self._messages.append({"role": "tool", "tool_call_id": tc.id, "content": output})
        raise RuntimeError(f"the user model made tool calls for {self.max_tool_rounds} rounds without replying")

    def _complete(self, *, with_tools: bool) -> Any:
        kwargs: dict[str, Any] = {"model": self.model, "messages": self._messages, "temperature": self.temperature}
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
        if with_tools:
            kwargs["tools"] = self._context.tools
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        response = self._client.chat.completions.create(**kwargs)
        if not response.choices:
            raise RuntimeError(f"the user model at {self.base_url} returned no choices")
        self.usage["calls"] += 1
        if response.usage is not None:
            self.usage["prompt_tokens"] += response.usage.prompt_tokens or 0
            self.usage["completion_tokens"] += response.usage.completion_tokens or 0
        return response.choices[0].message

    def _run_tool(self, name: str, raw_arguments: str | None) -> str:
        try:
            arguments = json.loads(raw_arguments or "{}")
        except json.JSONDecodeError as exc:
            return f"Error: tool arguments are not valid JSON ({exc.msg})"
        if not isinstance(arguments, dict):
            return "Error: tool arguments must be a JSON object"
        return self._context.call_tool(name, arguments)

    def describe(self) -> dict[str, Any]:
        return {
            "type": "llm",
            "model": self.model,
            "endpoint": self.base_url,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "usage": dict(self.usage),
        }


def make_user(spec: User | str | dict[str, Any] | None) -> User:
    """A user from a config value: a ``User``, ``"scripted"``, or a dict
    (``{"type": "llm", "model": ..., "base_url": ...}`` / ``{"type": "scripted", "replies": [...]}``)."""
    if spec is None or spec == "scripted":
        return ScriptedUser()
    if isinstance(spec, User):
        return spec
    if isinstance(spec, dict):
        options = dict(spec)
        kind = options.pop("type", "llm")
        if kind == "scripted":
            return ScriptedUser(**options)
        if kind == "llm":
            return LLMUser(**options)
        raise ValueError(f"user type must be 'llm' or 'scripted', got {kind!r}")
    raise TypeError(f"user must be a User, 'scripted' or a dict, got {type(spec).__name__}")
