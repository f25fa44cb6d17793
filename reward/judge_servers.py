"""What one judge server takes: its family, found by one probe, and the structured-output
form it accepts, stepped down when it refuses one.

Servers that speak the OpenAI chat API differ in how they hold an answer to a schema:
OpenAI, vLLM, SGLang, Ollama >= 0.5 and recent llama.cpp take ``json_schema``; both
llama.cpp servers take their own ``{"type": "json_object", "schema": ...}`` and decode it
under the schema's grammar; others take a bare ``json_object`` or nothing. One GET
``/v1/models`` (whose ``owned_by`` names the family) and llama.cpp's ``/props`` (its slots)
say where to start; a refusal that names the response format steps one rung down the
ladder. What was learnt is remembered per base URL for the process and shared by every
judge that talks to that server.
"""

from __future__ import annotations

import functools
import logging
import ssl
import threading
from dataclasses import dataclass
from typing import Any, Literal

from draco_gym.reward.grammar import grammar_ready

log = logging.getLogger(__name__)

StructuredOutput = Literal["auto", "json_schema", "json_object_schema", "json_object", "none"]
STRUCTURED_OUTPUTS = ("auto", "json_schema", "json_object_schema", "json_object", "none")
# The ladder "auto" walks down when a server refuses a form: OpenAI's json_schema (OpenAI,
# vLLM, SGLang, Ollama >= 0.5, recent llama.cpp), llama.cpp's own {"type": "json_object",
# "schema": ...} (both llama.cpp servers decode it under the schema's grammar), a bare
# json_object, then plain text that only validation and repair hold to the schema.
STEP_DOWN = {"json_schema": "json_object_schema", "json_object_schema": "json_object", "json_object": "none"}
FORMAT_WORDS = ("response_format", "json_schema", "json_object", "schema", "grammar", "guided")
"""Words in a refusal that say the server objects to the response format."""

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


def url_key(base_url: str | None) -> str:
    """The server a base URL names (None: OpenAI's), as profiles and slot limits key it."""
    return (base_url or "https://api.openai.com/v1").rstrip("/")


def server_profile(base_url: str | None) -> ServerProfile | None:
    """The profile remembered for ``base_url`` (None before the first probe)."""
    with _PROFILES_LOCK:
        return _PROFILES.get(url_key(base_url))


def forget_servers() -> None:
    """Drop every remembered profile (a server restarted with other options)."""
    with _PROFILES_LOCK:
        _PROFILES.clear()


async def probe_server(client: Any, base_url: str | None, *, timeout_s: float, sent: str = "auto") -> ServerProfile:
    """The server's profile: its family from GET /v1/models (``owned_by``), llama.cpp's
    slot count from /props. A server that answers neither is an unknown family that
    starts at json_schema. Probed once per base URL and process; ``client`` is the
    judge's ``openai.AsyncOpenAI``, ``sent`` the form the judge forces ("auto": the
    profile's), named in the one log line."""
    profile = server_profile(base_url)
    if profile is not None:
        return profile
    family, form, slots = "unknown", "json_schema", None
    try:
        models = await client.with_options(timeout=min(timeout_s, 30.0)).models.list()
        owners = {str(getattr(m, "owned_by", "") or "").lower() for m in models.data}
        known = [_FAMILIES[o] for o in owners if o in _FAMILIES]
        if known:
            family, form, slots = known[0]
    except Exception as exc:  # noqa: BLE001 - a server without /v1/models is still a judge
        log.debug("judge server %s has no usable /v1/models: %s", base_url, short_error(exc))
    if family == "llama.cpp":
        slots = await _llama_cpp_slots(client)
    with _PROFILES_LOCK:
        profile = _PROFILES.setdefault(url_key(base_url), ServerProfile(family, form, slots))
    if profile.family == family:
        log.warning("judge server %s: %s, structured output %s%s", url_key(base_url), family,
                    sent if sent != "auto" else profile.format,
                    "" if profile.slots is None else f", {profile.slots} slot(s)")
    return profile


async def _llama_cpp_slots(client: Any) -> int | None:
    import httpx

    root = str(client.base_url).rstrip("/").removesuffix("/v1")
    try:
        async with httpx.AsyncClient(timeout=10.0, verify=ssl_context()) as http:
            response = await http.get(f"{root}/props", headers={"Authorization": f"Bearer {client.api_key}"})
            response.raise_for_status()
            slots = int(response.json()["total_slots"])
            return slots if slots >= 1 else None
    except Exception as exc:  # noqa: BLE001
        log.debug("llama.cpp server %s did not report its slots: %s", root, short_error(exc))
        return None


def step_down(base_url: str | None, sent_format: str, message: str) -> bool:
    """After the server refused ``sent_format`` (``message``), move its profile one rung
    down; True if a request should be re-sent (in the new form, or in the form a concurrent
    call already stepped down to), False when no rung is left."""
    with _PROFILES_LOCK:
        profile = _PROFILES.setdefault(url_key(base_url), ServerProfile("unknown", "json_schema"))
        if profile.format != sent_format:
            return True  # a concurrent call already stepped down: resend in the new form
        if sent_format not in STEP_DOWN:
            return False
        profile.format = STEP_DOWN[sent_format]
    log.warning("judge server %s refused structured output %s (%s); now sending %s",
                url_key(base_url), sent_format, short_text(message), profile.format)
    return True


def response_format(form: str, schema: dict | None, schema_name: str, max_tokens: int,
                    base_url: str | None) -> dict | None:
    """The ``response_format`` of a request in structured-output ``form`` (None: send none)."""
    if schema is None or form == "none":
        return None
    if form == "json_object":
        return {"type": "json_object"}
    if form == "json_object_schema":
        return {"type": "json_object", "schema": grammar_ready(schema, schema_name, max_tokens)}
    profile = server_profile(base_url)
    strict = profile is not None and profile.family == "openai" and _strict_ready(schema)
    return {"type": "json_schema", "json_schema": {"name": schema_name, "schema": schema, "strict": strict}}


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


@functools.lru_cache(maxsize=1)
def ssl_context() -> ssl.SSLContext:
    """One verifying SSL context per process: building one reads the CA bundle (~0.1 s),
    and the synchronous API opens a client per call."""
    return ssl.create_default_context()


def short_text(text: str) -> str:
    """``text`` cut to 300 characters, for a log line or an error message."""
    return text if len(text) <= 300 else text[:300] + "..."


def short_error(exc: BaseException) -> str:
    return short_text(str(exc))
