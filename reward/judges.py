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

Transport retries belong to the judge, where the transport's own knowledge lives:
``OpenAIJudge`` retries what the server never started computing (429 with ``Retry-After``,
502-504, a refused connection) and plain 500s, but never a request that timed out, which
the server may still be computing (the openai client's own retries, which would re-send it,
are off). A judge tells the client, with ``cancel_stops_work``, whether giving up on a call
also stops its work, and with ``server_slots()`` how many calls it serves at once.

Built in: ``OpenAIJudge`` (any OpenAI-compatible endpoint, registered as "openai"),
``TransformersJudge`` (a local HF causal LM, "transformers"; torch loads only when one is
built) and ``FunctionJudge`` (a plain ``fn(messages) -> text``, sync or async: scripted
judges for tests and quick experiments).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import os
import ssl
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from draco_gym.registry import Registry
from draco_gym.reward.local_judge import TITLE_WORD_CHARS

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


StructuredOutput = Literal["auto", "json_schema", "json_object_schema", "json_object", "none"]
STRUCTURED_OUTPUTS = ("auto", "json_schema", "json_object_schema", "json_object", "none")
# The ladder "auto" walks down when a server refuses a form: OpenAI's json_schema (OpenAI,
# vLLM, SGLang, Ollama >= 0.5, recent llama.cpp), llama.cpp's own {"type": "json_object",
# "schema": ...} (both llama.cpp servers decode it under the schema's grammar), a bare
# json_object, then plain text that only validation and repair hold to the schema.
_STEP_DOWN = {"json_schema": "json_object_schema", "json_object_schema": "json_object", "json_object": "none"}
_FORMAT_WORDS = ("response_format", "json_schema", "json_object", "schema", "grammar", "guided")

# What a server's GET /v1/models says about it (``owned_by``): its family, the structured
# output it takes first time, and how many requests it serves at once when that is fixed.
# llama-cpp-python serves one request at a time and, by default, cuts a streaming answer
# short as soon as another request arrives; llama.cpp's own server reports its slots at /props.
_FAMILIES = {
    "me": ("llama-cpp-python", "json_object_schema", 1),
    "llamacpp": ("llama.cpp", "json_object_schema", None),
    "vllm": ("vllm", "json_schema", None),
    "sglang": ("sglang", "json_schema", None),
    "library": ("ollama", "json_schema", None),
    "ollama": ("ollama", "json_schema", None),
    "openai": ("openai", "json_schema", None),
    "system": ("openai", "json_schema", None),
    "openai-internal": ("openai", "json_schema", None),
}


@dataclass
class ServerProfile:
    """What one judge server (one base URL) takes: found by one probe, adjusted by the
    server's refusals, and shared by every OpenAIJudge of the process that talks to it."""

    family: str
    format: str
    slots: int | None = None


_PROFILES: dict[str, ServerProfile] = {}
_PROFILES_LOCK = threading.Lock()


def server_profile(base_url: str | None) -> ServerProfile | None:
    """The profile remembered for ``base_url`` (None before the first probe)."""
    with _PROFILES_LOCK:
        return _PROFILES.get(_url_key(base_url))


def forget_servers() -> None:
    """Drop every remembered profile (a server restarted with other options)."""
    with _PROFILES_LOCK:
        _PROFILES.clear()


def _url_key(base_url: str | None) -> str:
    return (base_url or "https://api.openai.com/v1").rstrip("/")


def _strict_ready(schema: Any) -> bool:
    """OpenAI's strict mode takes a schema only when every object lists all its properties
    as required and forbids others."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            props = schema.get("properties", {})
            if schema.get("additionalProperties") is not False or set(schema.get("required", [])) != set(props):
                return False
        return all(_strict_ready(v) for v in schema.values())
    if isinstance(schema, list):
        return all(_strict_ready(v) for v in schema)
    return True


def _bounded_strings(schema: Any, max_chars: int = 300) -> Any:
    """The schema with every string capped (``maxLength``, which llama.cpp's grammar
    enforces): a small model that rambles inside a string would otherwise run into
    max_tokens and leave its JSON unterminated."""
    if isinstance(schema, dict):
        out = {k: _bounded_strings(v, max_chars) for k, v in schema.items()}
        if out.get("type") == "string" and "enum" not in out:
            out.setdefault("maxLength", max_chars)
        return out
    if isinstance(schema, list):
        return [_bounded_strings(v, max_chars) for v in schema]
    return schema


_TITLE_WORD = rf"[A-Za-z0-9][A-Za-z0-9,'/()&:-]{{0,{TITLE_WORD_CHARS - 1}}}"
"""A word of a criterion title: a letter or digit first, at most ``TITLE_WORD_CHARS``, no period
(SmolLM2 wrote "but..." to end a title copied from the prompt's "..." placeholder)."""
# ~3 characters a token: fewer characters per token than English prose takes, so strings
# sized by it fit the token budget
_CHARS_PER_TOKEN = 3


def grammar_ready(schema: dict, stage: str, max_tokens: int) -> dict:
    """The stage's schema as llama.cpp's grammar should enforce it (its ``json_object`` +
    ``schema`` form): tightened like the in-process constrained judge's
    (``local_judge.grammar_schema``: one verdict per criterion in rubric order, each PASS
    or FAIL citing a step, no unnamed keys, open lists capped), a criterion title of
    ``TITLE_WORDS`` words that start with a letter or digit (so a small model cannot copy
    the prompt's "..." placeholder as a title), and every string short enough that a whole
    answer fits ``max_tokens`` (60 to 300 characters each, and fewer criteria in an open
    list when 60 would not fit: ``_fit_answer``). The title pattern names its characters (no quote, no
    backslash, no control character): llama.cpp turns a pattern into grammar verbatim, so a
    negated class would let a raw quote end the JSON string early."""
    from draco_gym.reward.answers import TITLE_WORDS
    from draco_gym.reward.local_judge import grammar_schema

    tight = grammar_schema(schema, stage)
    title = tight.get("properties", {}).get("criteria", {}).get("items", {}).get("properties", {}).get("title")
    if isinstance(title, dict) and "pattern" in title:
        low, high = TITLE_WORDS
        title["pattern"] = rf"^{_TITLE_WORD}( {_TITLE_WORD}){{{low - 1},{high - 1}}}$"
    chars = _fit_answer(tight, max_tokens)  # first: it may shorten the criteria list in place
    return _bounded_strings(_enumerated_steps(tight), chars)


def _enumerated_steps(schema: Any) -> Any:
    """Bounded integers (a rollout's step numbers) as an enum: llama-cpp-python's grammar
    converter ignores ``minimum`` and ``maximum`` (a live attribute answer cited step 4 of a
    2-step rollout), every converter honours an enum."""
    if isinstance(schema, list):
        return [_enumerated_steps(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _enumerated_steps(v) for k, v in schema.items()}
    low, high = out.get("minimum"), out.get("maximum")
    if out.get("type") == "integer" and isinstance(low, int) and isinstance(high, int) and 0 <= high - low < 1000:
        out = {"enum": list(range(low, high + 1))}
    return out


_MIN_STRING_CHARS = 60
"""Below this a criterion's title or a piece of evidence no longer fits."""


def _fit_answer(schema: dict, max_tokens: int) -> int:
    """The character cap of every string such that the longest answer the grammar allows
    fits ``max_tokens``; when even strings of ``_MIN_STRING_CHARS`` would not fit, the
    open list of criteria (propose, augment, merge) is shortened first, in place. A small
    model under a grammar keeps adding criteria until it is stopped: a merge answer cut by
    max_tokens is unterminated JSON."""
    from draco_gym.reward.local_judge import DoesNotFit, string_budget

    def budget() -> int:
        try:
            return string_budget(schema, max_tokens, lambda text: len(text) // _CHARS_PER_TOKEN + 1) * _CHARS_PER_TOKEN
        except DoesNotFit:
            return 0

    criteria = schema.get("properties", {}).get("criteria")
    chars = budget()
    while chars < _MIN_STRING_CHARS and isinstance(criteria, dict) and criteria.get("maxItems", 0) > 1:
        criteria["maxItems"] -= 1
        chars = budget()
    return max(_MIN_STRING_CHARS, min(300, chars))


class FormatRefused(JudgeUnavailable):
    """The server refuses the structured-output form, and no other form is left to try (it
    was forced, or plain text was refused too): sending the same request again cannot help."""


class JudgeTimedOut(JudgeUnavailable):
    """The judge did not answer in time. ``may_still_run``: the server may still be computing
    the answer (it was not streamed, so closing the connection did not stop it); re-sending
    now would queue a second copy behind the abandoned one."""

    def __init__(self, message: str, *, may_still_run: bool) -> None:
        super().__init__(message)
        self.may_still_run = may_still_run


@JUDGES.register("openai")
class OpenAIJudge:
    """A judge behind any OpenAI-compatible chat-completions endpoint: OpenAI, vLLM, SGLang,
    llama.cpp's servers (C++ and llama-cpp-python), Ollama's /v1, a proxy.

    Structured output: ``structured_output="auto"`` probes the server once (GET /v1/models,
    and llama.cpp's /props) and starts with the form its family takes (the ladder above);
    any 4xx/5xx whose body names the response format steps one rung down. The form in use is
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
        return _url_key(self.base_url)

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
                http_client=openai.DefaultAsyncHttpxClient(verify=_ssl_context()),
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
        """The server's profile: its family from GET /v1/models (``owned_by``), llama.cpp's
        slot count from /props. A server that answers neither is an unknown family that
        starts at json_schema. Probed once per base URL and process."""
        profile = server_profile(self.base_url)
        if profile is not None:
            return profile
        family, form, slots = "unknown", "json_schema", None
        client = self._client()
        try:
            models = await client.with_options(timeout=min(self.request_timeout_s, 30.0)).models.list()
            owners = {str(getattr(m, "owned_by", "") or "").lower() for m in models.data}
            known = [_FAMILIES[o] for o in owners if o in _FAMILIES]
            if known:
                family, form, slots = known[0]
        except Exception as exc:  # noqa: BLE001 - a server without /v1/models is still a judge
            log.debug("judge server %s has no usable /v1/models: %s", self.base_url, _short(exc))
        if family == "llama.cpp":
            slots = await self._llama_cpp_slots(client)
        with _PROFILES_LOCK:
            profile = _PROFILES.setdefault(_url_key(self.base_url), ServerProfile(family, form, slots))
        if profile.family == family:
            sent = self.structured_output if self.structured_output != "auto" else profile.format
            log.warning("judge server %s: %s, structured output %s%s", _url_key(self.base_url), family,
                        sent, "" if profile.slots is None else f", {profile.slots} slot(s)")
        return profile

    async def _llama_cpp_slots(self, client) -> int | None:
        import httpx

        root = str(client.base_url).rstrip("/").removesuffix("/v1")
        try:
            async with httpx.AsyncClient(timeout=10.0, verify=_ssl_context()) as http:
                response = await http.get(f"{root}/props", headers={"Authorization": f"Bearer {client.api_key}"})
                response.raise_for_status()
                slots = int(response.json()["total_slots"])
                return slots if slots >= 1 else None
        except Exception as exc:  # noqa: BLE001
            log.debug("llama.cpp server %s did not report its slots: %s", root, _short(exc))
            return None

    def _adapt_to(self, message: str, request: dict[str, Any]) -> bool:
        """Adjust future requests to what a server rejected; True if the rejected request
        would now be sent differently, so repeating it is worth it. Decided from what *this*
        request carried, so concurrent calls rejected together all retry."""
        text = message.lower()
        sent_format = request.get("_format", "none")
        if "max_tokens" in text and "max_tokens" in request:
            self._token_param = "max_completion_tokens"
        elif "temperature" in text and "temperature" in request:
            self._send_temperature = False
        elif "stream_options" in text and "stream_options" in request:
            self._send_stream_options = False
        elif sent_format != "none" and any(word in text for word in _FORMAT_WORDS):
            if self.structured_output != "auto":
                return False
            return self._step_down(sent_format, message)
        else:
            return False
        log.warning("judge %s rejected a request (%s); now sending %s, temperature=%s, stream_options=%s",
                    self.model, _short(Exception(message)), self._token_param, self._send_temperature,
                    self._send_stream_options)
        return True

    def _step_down(self, sent_format: str, message: str) -> bool:
        with _PROFILES_LOCK:
            profile = _PROFILES.setdefault(_url_key(self.base_url), ServerProfile("unknown", "json_schema"))
            if profile.format != sent_format:
                return True  # a concurrent call already stepped down: resend in the new form
            if sent_format not in _STEP_DOWN:
                return False
            profile.format = _STEP_DOWN[sent_format]
        log.warning("judge server %s refused structured output %s (%s); now sending %s",
                    _url_key(self.base_url), sent_format, _short(Exception(message)), profile.format)
        return True

    def _response_format(self, form: str, schema: dict | None, schema_name: str, max_tokens: int) -> dict | None:
        if schema is None or form == "none":
            return None
        if form == "json_object":
            return {"type": "json_object"}
        if form == "json_object_schema":
            return {"type": "json_object", "schema": grammar_ready(schema, schema_name, max_tokens)}
        strict = server_profile(self.base_url) is not None and server_profile(self.base_url).family == "openai" \
            and _strict_ready(schema)
        return {"type": "json_schema", "json_schema": {"name": schema_name, "schema": schema, "strict": strict}}

    def _request(self, messages, schema, schema_name, temperature, max_tokens) -> dict[str, Any]:
        form = self.format
        request: dict[str, Any] = {"model": self.model, "messages": messages, self._token_param: max_tokens}
        if self._send_temperature:
            request["temperature"] = temperature
        response_format = self._response_format(form, schema, schema_name, max_tokens)
        if response_format is not None:
            request["response_format"] = response_format
        if self.stream:
            request["stream"] = True
            if self._send_stream_options:
                request["stream_options"] = {"include_usage": True}
        return {**request, **self.extra_body, "_format": form if response_format is not None else "none"}

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
                raise JudgeTimedOut(f"{type(exc).__name__}: {_short(exc)}", may_still_run=not self.stream) from None
            except openai.APIStatusError as exc:
                text = f"{exc.status_code} {_error_text(exc)}"
                if adaptations < 5 and self._adapt_to(text, request):
                    adaptations += 1
                    continue
                if request["_format"] != "none" and any(word in text.lower() for word in _FORMAT_WORDS):
                    raise FormatRefused(f"the server refuses structured_output={request['_format']!r} "
                                           f"(forced, or the last rung): {_short(exc)}") from None
                if exc.status_code in (408, 409, 429) or exc.status_code >= 500:
                    if retries < self.max_retries:
                        retries += 1
                        await asyncio.sleep(_retry_after(exc, retries))
                        continue
                    raise JudgeUnavailable(f"{type(exc).__name__}: {_short(exc)}") from None
                raise JudgeUnavailable(f"judge rejected the request: {_short(exc)}") from None
            except openai.APIConnectionError as exc:
                # the request never reached a server (refused, reset before an answer began)
                if retries < self.max_retries:
                    retries += 1
                    await asyncio.sleep(_retry_after(None, retries))
                    continue
                raise JudgeUnavailable(f"{type(exc).__name__}: {_short(exc)}") from None

    async def _send(self, request: dict[str, Any]) -> JudgeReply:
        from openai import AsyncStream
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        body = {k: v for k, v in request.items() if k != "_format"}
        client = self._client()
        if not self.stream:
            # The client's generic post: its timeouts and error types, without re-walking
            # every message through the typed-parameter transform (~8 ms a call).
            response = await client.post("/chat/completions", body=body, cast_to=ChatCompletion)
            if not response.choices:
                raise JudgeUnavailable("judge returned no choices")
            usage = response.usage
            return JudgeReply(response.choices[0].message.content or "",
                              getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0)
        stream = await client.post("/chat/completions", body=body, cast_to=ChatCompletion, stream=True,
                                   stream_cls=AsyncStream[ChatCompletionChunk])
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
