"""The HTTP judge: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, SGLang,
llama.cpp's servers, Ollama's /v1, a proxy), registered as "openai".

Its transport knowledge lives here: which failures are worth a retry (429 with
``Retry-After``, 502-504, a refused connection, plain 500s), which never are (a request
that timed out, which the server may still be computing), how a refused parameter is
adapted to, and how an answer is streamed so that giving up on it stops the server. What
each server takes (its family, slots and structured-output form) is ``judge_servers.py``'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import weakref
from typing import Any

from draco_gym.reward.judge_protocol import JUDGES, FormatRefused, JudgeReply, JudgeTimedOut, JudgeUnavailable
from draco_gym.reward.judge_servers import (
    FORMAT_WORDS,
    STRUCTURED_OUTPUTS,
    ServerProfile,
    StructuredOutput,
    probe_server,
    response_format,
    server_profile,
    short_error,
    short_text,
    ssl_context,
    step_down,
    url_key,
)

log = logging.getLogger(__name__)


@JUDGES.register("openai")
class OpenAIJudge:
    """A judge behind any OpenAI-compatible chat-completions endpoint: OpenAI, vLLM, SGLang,
    llama.cpp's servers (C++ and llama-cpp-python), Ollama's /v1, a proxy.

    Structured output: ``structured_output="auto"`` probes the server once (GET /v1/models,
    and llama.cpp's /props) and starts with the form its family takes (``judge_servers``' ladder);
    any 4xx/5xx whose body names the response format, or an error event naming it inside a
    200 stream (vLLM's streamed grammar refusal), steps one rung down. The form in use is
    logged once per server and remembered per base URL for the process. Any other value
    forces that form (no probe for the format, no step-down). A 400 about ``max_tokens``
    switches to ``max_completion_tokens``, one about ``temperature`` stops sending it
    (OpenAI's reasoning models).

    No abandoned work: answers are streamed (``stream=True``), so a request given up on
    closes its connection and the server stops generating it (llama.cpp, vLLM, SGLang and
    Ollama all stop on disconnect); ``request_timeout_s`` bounds the wait for the next piece
    of the answer, not the whole answer. A request that timed out is never re-sent here; with
    ``stream=False`` the client is told the server may still be computing it, and does not
    re-send it either. Only answers the server never started (429, 502-504, a refused
    connection) and plain 500s are retried here, ``max_retries`` times; the openai client's
    own retries are off. ``server_slots`` tells the client how many requests the server
    serves at once (1 for llama-cpp-python, /props's total_slots for llama.cpp's server).

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
        stream: bool = True,
        slots: int | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if structured_output not in STRUCTURED_OUTPUTS:
            raise ValueError(f"structured_output must be one of {STRUCTURED_OUTPUTS}, got {structured_output!r}")
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if slots is not None and slots < 1:
            raise ValueError(f"slots must be >= 1 or None (ask the server), got {slots}")
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self._api_key = api_key
        self.structured_output = structured_output
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.stream = stream
        self.slots = slots
        self.extra_body = dict(extra_body or {})
        self._token_param = "max_tokens"
        self._send_temperature = True
        self._send_stream_options = True
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"OpenAIJudge(model={self.model!r}, base_url={self.base_url!r}, format={self.format!r})"

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

    @property
    def server(self) -> str:
        """The server this judge talks to (its base URL): clients of one server share its slots."""
        return url_key(self.base_url)

    @property
    def cancel_stops_work(self) -> bool:
        """Whether giving up on a request also stops the server computing it."""
        return self.stream

    @property
    def format(self) -> str:
        """The structured-output form the next request carries."""
        if self.structured_output != "auto":
            return self.structured_output
        profile = server_profile(self.base_url)
        return profile.format if profile is not None else "json_schema"

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
                max_retries=0,  # retries are decided in complete(): a timed-out request is never re-sent
                http_client=openai.DefaultAsyncHttpxClient(verify=ssl_context()),
            )
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Close this event loop's HTTP client."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    async def server_slots(self) -> int | None:
        """How many requests the server serves at once (None: no fixed number known). The
        first call for a base URL probes the server; the answer is remembered."""
        profile = await self.probe()
        return self.slots if self.slots is not None else profile.slots

    async def probe(self) -> ServerProfile:
        """The server's profile (``judge_servers.probe_server``), probed once per base URL."""
        return await probe_server(self._client(), self.base_url, timeout_s=self.request_timeout_s,
                                  sent=self.structured_output)

    def _adapt_to(self, message: str, request: dict[str, Any]) -> bool:
        """Adjust future requests to what a server rejected; True if the rejected request
        would now be sent differently, so repeating it is worth it. Decided from what *this*
        request carried, so concurrent calls rejected together all retry."""
        text = message.lower()
        if "max_tokens" in text and "max_tokens" in request:
            self._token_param = "max_completion_tokens"
        elif "temperature" in text and "temperature" in request:
            self._send_temperature = False
        elif "stream_options" in text and "stream_options" in request:
            self._send_stream_options = False
        elif _refuses_format(message, request):
            return self._step_down(message, request)
        else:
            return False
        log.warning("judge %s rejected a request (%s); now sending %s, temperature=%s, stream_options=%s",
                    self.model, short_text(message), self._token_param, self._send_temperature,
                    self._send_stream_options)
        return True

    def _step_down(self, message: str, request: dict[str, Any]) -> bool:
        """After the server refused the form ``request`` carried: True if the request should be
        re-sent in the next form down; never for a forced form."""
        return self.structured_output == "auto" and step_down(self.base_url, request["_format"], message)

    def _request(self, messages, schema, schema_name, temperature, max_tokens) -> dict[str, Any]:
        form = self.format
        request: dict[str, Any] = {"model": self.model, "messages": messages, self._token_param: max_tokens}
        if self._send_temperature:
            request["temperature"] = temperature
        form_spec = response_format(form, schema, schema_name, max_tokens, self.base_url)
        if form_spec is not None:
            request["response_format"] = form_spec
        if self.stream:
            request["stream"] = True
            if self._send_stream_options:
                request["stream_options"] = {"include_usage": True}
        return {**request, **self.extra_body, "_format": form if form_spec is not None else "none"}

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

        if self.structured_output == "auto" or self.slots is None:
            await self.probe()
        adaptations = 0
        retries = 0
        while True:
            request = self._request(messages, schema, schema_name, temperature, max_tokens)
            try:
                return await self._send(request)
            except openai.APITimeoutError as exc:
                raise JudgeTimedOut(f"{self.server}: {type(exc).__name__}: {short_error(exc)}", may_still_run=not self.stream) from None
            except openai.APIStatusError as exc:
                text = f"{exc.status_code} {_error_text(exc)}"
                if adaptations < 5 and self._adapt_to(text, request):
                    adaptations += 1
                    continue
                if _refuses_format(text, request):
                    raise self._format_refused(request, exc) from None
                if exc.status_code in (408, 409, 429) or exc.status_code >= 500:
                    if retries < self.max_retries:
                        retries += 1
                        await asyncio.sleep(_retry_after(exc, retries))
                        continue
                    raise JudgeUnavailable(f"{self.server}: {type(exc).__name__}: {short_error(exc)}") from None
                raise JudgeUnavailable(f"{self.server} rejected the request: {short_error(exc)}") from None
            except openai.APIConnectionError as exc:
                # the request never reached a server (refused, reset before an answer began)
                if retries < self.max_retries:
                    retries += 1
                    await asyncio.sleep(_retry_after(None, retries))
                    continue
                raise JudgeUnavailable(f"{self.server}: {type(exc).__name__}: {short_error(exc)}") from None
            except openai.APIError as exc:
                # An error event inside a 200 stream. Streamed, vLLM refuses a schema its grammar
                # compiler cannot take this way (unstreamed, the same body comes with a 400): the
                # same refusal, so the same step down. Any other event is a failure mid-answer.
                text = _error_text(exc)
                if not _refuses_format(text, request):
                    raise
                if adaptations < 5 and self._step_down(text, request):
                    adaptations += 1
                    continue
                raise self._format_refused(request, exc) from None

    def _format_refused(self, request: dict[str, Any], exc: Exception) -> FormatRefused:
        return FormatRefused(f"{self.server} refuses structured_output={request['_format']!r} "
                             f"(forced, or the last rung): {short_error(exc)}")

    async def _send(self, request: dict[str, Any]) -> JudgeReply:
        from openai import AsyncStream
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        body = {k: v for k, v in request.items() if k != "_format"}
        client = self._client()
        if not self.stream:
            # The client's generic post: its timeouts and error types, without re-walking
            # every message through the typed-parameter transform (~8 ms a call).
            try:
                response = await client.post("/chat/completions", body=body, cast_to=ChatCompletion)
            except json.JSONDecodeError as exc:  # a JSON content type over a body that is not JSON
                raise JudgeUnavailable(_not_an_answer(self.server, "application/json", exc.doc, "JSON")) from None
            if isinstance(response, str):  # a body of another content type comes back as its text
                raise JudgeUnavailable(_not_an_answer(self.server, "", response, "JSON"))
            if not response.choices:
                raise JudgeUnavailable(f"{self.server} returned no choices")
            usage = response.usage
            return JudgeReply(response.choices[0].message.content or "",
                              getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0)
        stream = await client.post("/chat/completions", body=body, cast_to=ChatCompletion, stream=True,
                                   stream_cls=AsyncStream[ChatCompletionChunk])
        content_type = stream.response.headers.get("content-type", "")
        if "event-stream" not in content_type:  # read as events, any other body is no answer at all
            try:
                text = (await stream.response.aread())[:4096].decode("utf-8", "replace")
            finally:
                await stream.close()
            raise JudgeUnavailable(_not_an_answer(self.server, content_type, text, "an event stream"))
        parts: list[str] = []
        pieces = prompt_tokens = completion_tokens = 0
        try:
            async for chunk in stream:
                for choice in chunk.choices or []:
                    if choice.delta is not None and choice.delta.content:
                        parts.append(choice.delta.content)
                        pieces += 1
                if chunk.usage is not None:
                    prompt_tokens = chunk.usage.prompt_tokens or 0
                    completion_tokens = chunk.usage.completion_tokens or 0
        finally:
            await stream.close()  # on cancellation too: the closed connection stops the server
        # a server that reports no usage while streaming sends about one token per piece
        return JudgeReply("".join(parts), prompt_tokens, completion_tokens or pieces)


def _not_an_answer(server: str, content_type: str, text: str, expected: str) -> str:
    """What a 200 whose body is not a chat completion was: an HTML page (a proxy's error page,
    a login wall) named as such, else a body that is not ``expected``; with its start."""
    head = text.lstrip()[:200]
    kind = "an HTML page" if head.lower().startswith(("<!doctype html", "<html")) else f"a body that is not {expected}"
    return (f"{server} answered {kind} (status 200{f', content type {content_type}' if content_type else ''}), "
            f"not a chat completion: {head[:120]!r}")


def _refuses_format(message: str, request: dict[str, Any]) -> bool:
    """Whether an error for ``request`` objects to the response format it carried."""
    return request["_format"] != "none" and any(word in message.lower() for word in FORMAT_WORDS)


def _error_text(exc: Exception) -> str:
    """The error's message and body: llama-cpp-python puts the refusal in the body's message."""
    body = getattr(exc, "body", None)
    return f"{exc} {json.dumps(body) if isinstance(body, (dict, list)) else body or ''}"


def _retry_after(exc: Exception | None, attempt: int) -> float:
    """The server's Retry-After when it gives one (capped at 60 s), else exponential backoff."""
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            return min(float(headers[name]) * scale, 60.0)
        except (KeyError, TypeError, ValueError):
            continue
    return min(0.5 * 2 ** (attempt - 1), 8.0)
