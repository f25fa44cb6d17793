"""Judges: anything that turns chat messages into text, and the three built in.

A judge implements one coroutine, ``complete``, and nothing else: caching, concurrency,
rate limits, the overall deadline, validation, repair and cost accounting live once in
``JudgeClient`` (``judge_client.py``) and apply to every judge alike. That keeps a
new judge (the trainer's policy model as a self-judge, a remote service, a test double) a
dozen lines long::

    class PolicyJudge:
        model = "policy@step-40"

        async def complete(self, messages, *, schema, schema_name, temperature, max_tokens, sample):
            text, n_in, n_out = await my_generate(messages, temperature, max_tokens)
            return JudgeReply(text, n_in, n_out)

``schema`` is the JSON schema the answer must follow (for servers that can enforce it; a
judge that cannot may ignore it, every answer is validated anyway), ``sample`` numbers
repeated samplings of the same request (the self-judge scores k times).

Transport retries belong to the judge, where the transport's own knowledge lives: the
OpenAI client already retries 408/409/429/5xx and timeouts with backoff and honours
``Retry-After``, so ``OpenAIJudge`` uses it rather than a second retry layer.

Built in: ``OpenAIJudge`` (any OpenAI-compatible endpoint, registered as "openai"),
``TransformersJudge`` (a local HF causal LM, "transformers"; torch loads only when one is
built) and ``FunctionJudge`` (a plain ``fn(messages) -> text``, sync or async: scripted
judges for tests and quick experiments).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import ssl
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from draco_gym.registry import Registry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JudgeReply:
    """The judge's text and the tokens it was billed for (0 when unknown)."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


@runtime_checkable
class Judge(Protocol):
    model: str

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        schema: dict | None,
        schema_name: str,
        temperature: float,
        max_tokens: int,
        sample: int,
    ) -> JudgeReply: ...


class JudgeUnavailable(RuntimeError):
    """The judge could not answer (after its own transport retries)."""


JUDGES: Registry[Any] = Registry("judge")


def build_judge(name: str, **options: Any) -> Judge:
    """The judge registered as ``name`` ("openai", "transformers"), built with ``options``."""
    return JUDGES.get(name)(**options)


StructuredOutput = Literal["auto", "json_schema", "json_object", "none"]
_DOWNGRADE = {"json_schema": "json_object", "json_object": "none"}


@JUDGES.register("openai")
class OpenAIJudge:
    """A judge behind any OpenAI-compatible chat-completions endpoint: OpenAI, a vLLM or
    SGLang server, a proxy.

    ``structured_output="auto"`` asks for ``json_schema`` output and steps down to
    ``json_object``, then to plain text, the first time the server rejects the request
    format with a 400. A 400 about ``max_tokens`` switches to ``max_completion_tokens``,
    one about ``temperature`` stops sending it (OpenAI's reasoning models). Each
    adaptation is logged and remembered for the judge's lifetime.

    The API key is read from ``api_key`` or the environment variable ``api_key_env`` and is
    never part of ``repr``, pickles or cache keys: a pickled judge re-reads the variable.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        structured_output: StructuredOutput = "auto",
        request_timeout_s: float = 120.0,
        max_retries: int = 4,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if structured_output not in ("auto", "json_schema", "json_object", "none"):
            raise ValueError(f"structured_output must be auto, json_schema, json_object or none, got {structured_output!r}")
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self._api_key = api_key
        self.structured_output = structured_output
        self._format = "json_schema" if structured_output == "auto" else structured_output
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.extra_body = dict(extra_body or {})
        self._token_param = "max_tokens"
        self._send_temperature = True
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"OpenAIJudge(model={self.model!r}, base_url={self.base_url!r}, format={self._format!r})"

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_api_key"] = None
        state["_clients"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._clients = weakref.WeakKeyDictionary()

    @property
    def identity(self) -> dict[str, Any]:
        """What makes two judges answer alike: part of every cache key (never the key)."""
        return {"kind": "openai", "model": self.model, "base_url": self.base_url, **({"extra_body": self.extra_body} if self.extra_body else {})}

    def _client(self):
        # httpx connections belong to the event loop that opened them; one client per loop
        # lets the synchronous API (a fresh loop per call) and async callers share a judge.
        import openai

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            key = self._api_key or os.environ.get(self.api_key_env) or "EMPTY"
            client = openai.AsyncOpenAI(
                api_key=key,
                base_url=self.base_url,
                timeout=self.request_timeout_s,
                max_retries=self.max_retries,
                http_client=openai.DefaultAsyncHttpxClient(verify=_ssl_context()),
            )
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Close this event loop's HTTP client."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    def _adapt_to(self, message: str, request: dict[str, Any]) -> bool:
        """Adjust future requests to what a server rejected (a 400); True if the rejected
        request would now be sent differently, so repeating it is worth it. Decided from
        what *this* request carried, so concurrent calls rejected together all retry.
        Servers differ: OpenAI's reasoning models want max_completion_tokens and no
        temperature, some servers have no json_schema output."""
        text = message.lower()
        sent_format = (request.get("response_format") or {}).get("type", "none")
        if "max_tokens" in text and "max_tokens" in request:
            self._token_param = "max_completion_tokens"
        elif "temperature" in text and "temperature" in request:
            self._send_temperature = False
        elif sent_format != "none" and any(word in text for word in ("response_format", "json_schema", "json_object", "schema")):
            if self.structured_output != "auto":
                return False
            if self._format == sent_format and self._format in _DOWNGRADE:
                self._format = _DOWNGRADE[self._format]
        else:
            return False
        log.warning("judge %s rejected a request (%s); now sending %s, temperature=%s, format=%s",
                    self.model, _short(Exception(message)), self._token_param, self._send_temperature, self._format)
        return True

    def _response_format(self, schema: dict | None, schema_name: str) -> dict | None:
        if schema is None or self._format == "none":
            return None
        if self._format == "json_object":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": {"name": schema_name, "schema": schema, "strict": False}}

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        schema: dict | None,
        schema_name: str,
        temperature: float,
        max_tokens: int,
        sample: int = 0,
    ) -> JudgeReply:
        import openai
        from openai.types.chat import ChatCompletion

        for _ in range(4):  # at most one adaptation per kind of rejection, then the call
            request: dict[str, Any] = {"model": self.model, "messages": messages, self._token_param: max_tokens}
            if self._send_temperature:
                request["temperature"] = temperature
            response_format = self._response_format(schema, schema_name)
            if response_format is not None:
                request["response_format"] = response_format
            try:
                # The client's generic post: its retries, timeouts and error types, without
                # re-walking every message through the typed-parameter transform (~8 ms a call).
                response = await self._client().post(
                    "/chat/completions", body={**request, **self.extra_body}, cast_to=ChatCompletion
                )
                break
            except openai.BadRequestError as exc:
                if not self._adapt_to(str(exc), request):
                    raise JudgeUnavailable(f"judge rejected the request: {_short(exc)}") from None
            except (openai.APIStatusError, openai.APIConnectionError) as exc:
                # APITimeoutError is an APIConnectionError; the client has already retried.
                raise JudgeUnavailable(f"{type(exc).__name__}: {_short(exc)}") from None
        else:
            raise JudgeUnavailable("judge kept rejecting the request format")
        if not response.choices:
            raise JudgeUnavailable("judge returned no choices")
        text = response.choices[0].message.content or ""
        usage = response.usage
        return JudgeReply(
            text=text,
            prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
            completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
        )


@functools.lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    """One verifying SSL context per process: building one reads the CA bundle (~0.1 s),
    and the synchronous API opens a client per call."""
    return ssl.create_default_context()


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 300 else text[:300] + "..."


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

        from draco_gym.algos.models import resolve_model
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
        from draco_gym.reward.local_judge import turn_end_ids

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
        from draco_gym.reward.local_judge import chat_ids, fit_messages

        def count(ms):
            return len(chat_ids(self.tokenizer, ms, self.thinking))

        return chat_ids(self.tokenizer, fit_messages(messages, count, self.max_prompt_tokens), self.thinking)

    def constraint(self):
        """The schema constraint for this model's tokenizer, built on first use."""
        from draco_gym.reward.local_judge import SchemaConstraint

        if self._constraint is None:
            vocab = self.lm.get_output_embeddings().weight.shape[0]
            self._constraint = SchemaConstraint(self.tokenizer, vocab, self.eos_ids)
        return self._constraint

    def _generate(self, messages: list[dict[str, str]], schema: dict | None, schema_name: str, temperature: float,
                  max_tokens: int, sample: int) -> JudgeReply:
        from draco_gym.reward.local_judge import DoesNotFit, generate_answer

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


class FunctionJudge:
    """A judge from a function ``fn(messages) -> str`` (or a coroutine function, or one that
    returns a ``JudgeReply``): a scripted judge, a rule, an experiment in one line."""

    def __init__(self, fn, *, model: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionJudge needs a callable(messages) -> text, got {type(fn).__name__}")
        self.fn = fn
        self.model = model or getattr(fn, "__qualname__", type(fn).__name__)

    async def complete(self, messages, *, schema=None, schema_name="", temperature=0.1, max_tokens=1024, sample=0):
        answer = self.fn(messages)
        if inspect.isawaitable(answer):
            answer = await answer
        if isinstance(answer, JudgeReply):
            return answer
        if not isinstance(answer, str):
            raise TypeError(f"the judge function returned {type(answer).__name__}; expected text or a JudgeReply")
        return JudgeReply(answer)


def as_judge(judge: Any) -> Judge:
    """A Judge from a Judge (as is), a config dict ``{"name": "openai", "model": ...}``, or a
    function ``fn(messages) -> text``."""
    if isinstance(judge, dict):
        options = dict(judge)
        return build_judge(options.pop("name", "openai"), **options)
    if callable(getattr(judge, "complete", None)):
        return judge
    if callable(judge):
        return FunctionJudge(judge)
    raise ValueError("a judge is a Judge (async complete(messages, ...)), a dict such as "
                     f"{{'name': 'openai', 'model': ...}}, or a function(messages) -> text; got {judge!r}")
