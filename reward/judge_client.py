"""The judge client: everything between a stage and a judge, written once for every judge.

``JudgeClient.ask`` sends one request and returns a validated answer. On the way it
  - reads and writes the on-disk cache (key: judge identity, messages, schema, sampling
    parameters; a resumed run pays for nothing it already asked),
  - waits for a concurrency slot (no more than the judge's server serves at once, when the
    judge can tell: ``server_slots``) and for the request and token rate limits (aiolimiter),
  - bounds the whole call by a deadline and retries a failed call with backoff (tenacity);
    transport-level retries (429 with Retry-After, 5xx) happen inside the judge. A call that
    timed out is retried only when giving up on it stopped the work (the judge's
    ``cancel_stops_work``): a second copy must not queue behind an abandoned one,
  - validates the answer and, when it is wrong, sends the errors back for a bounded number
    of repairs,
  - books calls, tokens, cost and cache hits to the stage in a ``UsageMeter``.
A call that still fails raises ``StageFailed``; the rubric turns that into a counted
fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiolimiter import AsyncLimiter
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from draco_gym.reward.answers import InvalidAnswer
from draco_gym.reward.judge_protocol import FormatRefused, Judge, JudgeReply, JudgeTimedOut, JudgeUnavailable
from draco_gym.reward.judges import as_judge
from draco_gym.types import GroupScore, JudgeFailure, StageUsage

log = logging.getLogger(__name__)

T = TypeVar("T")


class StageFailed(RuntimeError):
    """A stage got no usable answer within its retries and repairs."""

    def __init__(self, stage: str, reason: str) -> None:
        self.stage, self.reason = stage, reason
        super().__init__(f"{stage}: {reason}")


@dataclass(frozen=True)
class Price:
    """US dollars per million prompt and completion tokens."""

    prompt_per_m: float
    completion_per_m: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prompt_per_m + completion_tokens * self.completion_per_m) / 1e6


def price_table(prices: dict[str, Any] | None) -> dict[str, Price]:
    """``{"model": [prompt_per_m, completion_per_m]}`` (as a YAML config writes it) or Price objects."""
    table = {}
    for model, price in (prices or {}).items():
        table[model] = price if isinstance(price, Price) else Price(*map(float, price))
    return table


class UsageMeter:
    """Per-stage usage of one group. A stage's ``latency_s`` is its wall time: from the
    start of its first call to the end of its last, what a training step waits for, not
    the sum of calls that overlapped."""

    def __init__(self) -> None:
        self._usage: dict[str, StageUsage] = {}
        self._spans: dict[str, tuple[float, float]] = {}
        self.answers = 0
        self.failures: list[JudgeFailure] = []

    def onto(self, group: GroupScore) -> GroupScore:
        """``group`` with this meter's judge record: the requests answered and each failure."""
        return group.model_copy(update={"judge_answers": group.judge_answers + self.answers,
                                        "judge_failures": [*group.judge_failures, *self.failures]})

    def book(self, stage: str, **amounts: float) -> None:
        self._usage[stage] = self._usage.get(stage, StageUsage()).add(StageUsage(**amounts))

    @contextlib.contextmanager
    def timed(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            first, last = self._spans.get(stage, (start, end))
            self._spans[stage] = (min(first, start), max(last, end))

    @property
    def stages(self) -> dict[str, StageUsage]:
        out = {}
        for stage in dict.fromkeys([*self._usage, *self._spans]):
            usage = self._usage.get(stage, StageUsage())
            first, last = self._spans.get(stage, (0.0, 0.0))
            out[stage] = usage.model_copy(update={"latency_s": usage.latency_s + (last - first)})
        return out


class DiskCache:
    """One JSON file per request, named by the request's hash. Writes are atomic (rename),
    so concurrent writers and a crash mid-write leave either the old file or the new one.
    Holds only the judge's text and token counts."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> JudgeReply | None:
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
            return JudgeReply(str(data["text"]), int(data["prompt_tokens"]), int(data["completion_tokens"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, reply: JudgeReply) -> None:
        path = self._path(key)
        path.parent.mkdir(exist_ok=True)
        data = {"text": reply.text, "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens}
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        os.replace(tmp, path)


def as_client(judge: Any, **settings: Any) -> JudgeClient:
    """A JudgeClient from a JudgeClient (returned as is), a Judge, a config dict
    ``{"name": "openai", "model": ..., ...}`` or a function ``fn(messages) -> text``;
    ``settings`` are JudgeSettings fields."""
    if isinstance(judge, JudgeClient):
        if settings:
            raise TypeError(f"judge settings {sorted(settings)} given, but the judge is already a JudgeClient with its own")
        return judge
    if judge is None:
        raise ValueError("this reward needs a judge: a Judge, a JudgeClient or a dict such as {'name': 'openai', 'model': ...}")
    return JudgeClient(as_judge(judge), **settings)


def request_key(identity: Any, messages: list[dict], schema: dict | None, params: dict) -> str:
    blob = json.dumps([identity, messages, schema, params], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def judge_identity(judge: Judge) -> Any:
    identity = getattr(judge, "identity", None)
    return identity if identity is not None else {"kind": type(judge).__qualname__, "model": getattr(judge, "model", None)}


@dataclass
class JudgeSettings:
    """Sampling and robustness settings shared by every call of a reward.

    temperature      0.1: DRACO's frozen judge
    max_concurrency  requests in flight at once
    requests_per_minute, tokens_per_minute
                     client-side rate limits (None: off); tokens are estimated before the
                     call as prompt characters / 4 + max_tokens
    rate_window_s    the window those limits count over (60 s; shorter only in tests)
    deadline_s       upper bound on one call, the judge's own retries included
    retries          further attempts when a call fails or passes its deadline
    max_repairs      follow-up requests that show the judge its errors
    cache_dir        on-disk cache (None: off)
    prices           {model: [usd per 1M prompt tokens, usd per 1M completion tokens]}
    """

    temperature: float = 0.1
    max_tokens: int = 4096
    max_concurrency: int = 16
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    rate_window_s: float = 60.0
    deadline_s: float = 600.0
    retries: int = 1
    retry_wait_s: float = 1.0
    max_repairs: int = 2
    cache_dir: str | None = None
    prices: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or None, got {value}")
        if self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {self.deadline_s}")
        if self.retries < 0 or self.max_repairs < 0:
            raise ValueError("retries and max_repairs must be >= 0")
        if not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")


class SlotGate:
    """At most ``size`` calls at once. When a slot frees and calls wait, the one whose prompt
    shares the longest prefix with the prompt sent last goes next (the oldest among equals):
    a server that keeps only its last prompt's KV cache (llama-cpp-python) then reuses the
    rules, task and rollout a rollout's score call just sent for its attribute call, instead
    of recomputing them after another rollout's call. A waiting call passed over
    ``max_passed`` times goes next, so none waits forever."""

    def __init__(self, size: int, max_passed: int = 8) -> None:
        self.size, self.max_passed = size, max_passed
        self._busy = 0
        self._waiting: list[list] = []  # [prompt, future, times passed over], oldest first
        self._last = ""

    @contextlib.asynccontextmanager
    async def slot(self, prompt: str):
        if self._busy < self.size and not self._waiting:
            self._busy += 1
        else:
            entry = [prompt, asyncio.get_running_loop().create_future(), 0]
            self._waiting.append(entry)
            try:
                await entry[1]
            except asyncio.CancelledError:
                if entry in self._waiting:
                    self._waiting.remove(entry)
                elif entry[1].done() and not entry[1].cancelled():
                    self._release()  # the slot was handed over as this call was cancelled
                raise
        self._last = prompt
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        # The choice waits one turn of the event loop: a call that just ended and continues
        # its rollout (score, then attribute) queues its next call in that turn.
        asyncio.get_running_loop().call_soon(self._hand_over)

    def _hand_over(self) -> None:
        if not self._waiting:
            self._busy -= 1
            return
        oldest = self._waiting[0]
        if oldest[2] >= self.max_passed:
            chosen = 0
        else:
            shared = [common_prefix_len(self._last, entry[0]) for entry in self._waiting]
            chosen = shared.index(max(shared))
        for entry in self._waiting[:chosen]:
            entry[2] += 1
        entry = self._waiting.pop(chosen)
        entry[1].set_result(None)  # the slot passes to it: _busy is unchanged


def common_prefix_len(a: Sequence, b: Sequence) -> int:
    """Items (characters, token ids) ``a`` and ``b`` share at their start (bisection over
    C-level slice comparisons: prompts run to tens of thousands of characters)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def prompt_text(messages: list[dict[str, str]]) -> str:
    return "".join(f"\x00{m.get('role', '')}\x01{m.get('content') or ''}" for m in messages)


_SERVER_GATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def server_gate(server: str, slots: int) -> SlotGate:
    """The gate of one judge server (a base URL) in this event loop, shared by every client
    that talks to it: two rewards on one one-slot server still send one request at a time."""
    gates = _SERVER_GATES.setdefault(asyncio.get_running_loop(), {})
    gate = gates.get(server)
    if gate is None or gate.size != slots:
        gate = gates[server] = SlotGate(slots)
    return gate


class _LoopState:
    """asyncio primitives are bound to one event loop; each loop gets its own."""

    def __init__(self, settings: JudgeSettings, server_slots: int | None = None, server: str | None = None) -> None:
        self.server = server_gate(server, server_slots) if server is not None and server_slots else None
        # the server's gate holds it to its slots; without one this client's own cap does
        own = settings.max_concurrency if self.server is not None else min(settings.max_concurrency,
                                                                           server_slots or settings.max_concurrency)
        self.slots = SlotGate(own)
        rpm, tpm = settings.requests_per_minute, settings.tokens_per_minute
        window = settings.rate_window_s
        self.requests = AsyncLimiter(rpm, window) if rpm else None
        self.tokens = AsyncLimiter(tpm, window) if tpm else None

    @contextlib.asynccontextmanager
    async def slot(self, messages: list[dict[str, str]]):
        """This client's concurrency slot, then the server's (when its slots are known)."""
        prompt = prompt_text(messages)
        async with self.slots.slot(prompt):
            if self.server is None:
                yield
                return
            async with self.server.slot(prompt):
                yield


class JudgeClient:
    """A judge plus the machinery of the module docstring. Safe to share between rewards
    and between event loops; pickles without the cache handle or loop state."""

    def __init__(self, judge: Judge, settings: JudgeSettings | None = None, **overrides: Any) -> None:
        if not hasattr(judge, "complete"):
            raise TypeError(f"judge must have an async complete(...) method, got {type(judge).__name__}")
        self.judge = judge
        self.settings = settings if settings is not None else JudgeSettings(**overrides)
        if settings is not None and overrides:
            raise TypeError("pass either settings or keyword overrides, not both")
        self.prices = price_table(self.settings.prices)
        self.cache = DiskCache(self.settings.cache_dir) if self.settings.cache_dir else None
        self._loops: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._probes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_loops"] = state["_probes"] = None
        state["cache"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._loops = weakref.WeakKeyDictionary()
        self._probes = weakref.WeakKeyDictionary()
        self.cache = DiskCache(self.settings.cache_dir) if self.settings.cache_dir else None

    async def aclose(self) -> None:
        close = getattr(self.judge, "aclose", None)
        if close is not None:
            await close()

    @property
    def model(self) -> str:
        return str(getattr(self.judge, "model", type(self.judge).__name__))

    async def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is not None:
            return state
        async with self._probes.setdefault(loop, asyncio.Lock()):  # the first caller asks the server
            state = self._loops.get(loop)
            if state is None:
                state = self._loops[loop] = _LoopState(self.settings, await self._server_slots(),
                                                              getattr(self.judge, "server", None))
        return state

    async def _server_slots(self) -> int | None:
        ask = getattr(self.judge, "server_slots", None)
        if ask is None:
            return None
        try:
            slots = await ask()
        except Exception as exc:  # noqa: BLE001 - an unknown slot count is the configured concurrency
            log.warning("judge %s did not say how many requests it serves at once: %s", self.model, exc)
            return None
        if slots is not None and slots < self.settings.max_concurrency:
            log.warning("judge %s serves %d request(s) at once; max_concurrency %d lowered to it",
                        self.model, slots, self.settings.max_concurrency)
        return slots

    async def ask(
        self,
        stage: str,
        messages: list[dict[str, str]],
        schema: dict | None,
        check: Callable[[str], T],
        meter: UsageMeter,
        *,
        sample: int = 0,
    ) -> T:
        """One validated answer for ``stage``. ``check`` turns the reply text into the
        stage's result or raises InvalidAnswer; its errors drive the repair requests."""
        try:
            answer = await self._answer(stage, messages, schema, check, meter, sample)
        except StageFailed as exc:
            meter.failures.append(JudgeFailure(stage=stage, server=self.server, error=exc.reason))
            raise
        meter.answers += 1
        return answer

    @property
    def server(self) -> str:
        """Where the judge runs, as a failure names it: its server's base URL, or the judge's
        kind and model for one without a server (in-process, a function)."""
        server = getattr(self.judge, "server", None)
        return str(server) if server else f"{type(self.judge).__name__} {self.model}"

    async def _answer(self, stage: str, messages: list[dict[str, str]], schema: dict | None,
                      check: Callable[[str], T], meter: UsageMeter, sample: int) -> T:
        conversation = list(messages)
        errors: list[str] = []
        for repair in range(self.settings.max_repairs + 1):
            reply = await self._complete(stage, conversation, schema, meter, sample)
            try:
                return check(reply.text)
            except ValueError as exc:  # InvalidAnswer, and any other value error a check raises
                errors = exc.errors if isinstance(exc, InvalidAnswer) else [f"{type(exc).__name__}: {exc}"[:500]]
                log.info("judge answer for %s was invalid (attempt %d): %s", stage, repair + 1, exc)
                conversation = [
                    *conversation,
                    {"role": "assistant", "content": reply.text},
                    {"role": "user", "content": repair_request(errors)},
                ]
        raise StageFailed(stage, f"invalid answer after {self.settings.max_repairs} repairs: {'; '.join(errors)[:500]}")

    async def _complete(
        self, stage: str, messages: list[dict[str, str]], schema: dict | None, meter: UsageMeter, sample: int
    ) -> JudgeReply:
        params = {"temperature": self.settings.temperature, "max_tokens": self.settings.max_tokens, "sample": sample}
        key = request_key(judge_identity(self.judge), messages, schema, params)
        if self.cache is not None:
            cached = self.cache.get(key)
            if cached is not None:
                meter.book(stage, cache_hits=1)
                return cached
        reply = await self._call_with_retries(stage, messages, schema, sample)
        price = self.prices.get(self.model)
        meter.book(
            stage,
            calls=1,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            cost=price.cost(reply.prompt_tokens, reply.completion_tokens) if price else 0.0,
        )
        if self.cache is not None:
            self.cache.put(key, reply)
        return reply

    async def _call_with_retries(
        self, stage: str, messages: list[dict[str, str]], schema: dict | None, sample: int
    ) -> JudgeReply:
        settings = self.settings
        state = await self._state()
        retrying = AsyncRetrying(
            stop=stop_after_attempt(settings.retries + 1),
            wait=wait_exponential_jitter(multiplier=settings.retry_wait_s, max=30 * settings.retry_wait_s, jitter=settings.retry_wait_s),
            retry=retry_if_exception(self._worth_retrying),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    async with state.slot(messages):
                        await self._rate_limit(state, messages)
                        return await asyncio.wait_for(self._judge_call(stage, messages, schema, sample),
                                                      timeout=settings.deadline_s)
        except asyncio.TimeoutError:
            if not self._worth_retrying(asyncio.TimeoutError()):
                raise StageFailed(stage, f"no answer within {settings.deadline_s:g} s; not re-sent, since the judge "
                                         "may still be computing it") from None
            raise StageFailed(stage, f"no answer within {settings.deadline_s:g} s ({settings.retries + 1} attempts)") from None
        except FormatRefused as exc:
            raise StageFailed(stage, str(exc)) from None
        except JudgeTimedOut as exc:
            if exc.may_still_run:
                raise StageFailed(stage, f"judge timed out ({exc}); not re-sent, since the server may still be "
                                         "computing it") from None
            raise StageFailed(stage, f"judge unavailable after {settings.retries + 1} attempts: {exc}") from None
        except JudgeUnavailable as exc:
            raise StageFailed(stage, f"judge unavailable after {settings.retries + 1} attempts: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a judge's own bug must not end a training run
            log.warning("judge %s raised during %s", self.model, stage, exc_info=True)
            raise StageFailed(stage, f"judge raised {type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _worth_retrying(self, exc: BaseException) -> bool:
        """Retry what failed without leaving work behind on the judge's side."""
        if isinstance(exc, JudgeTimedOut):
            return not exc.may_still_run
        if isinstance(exc, FormatRefused):
            return False
        if isinstance(exc, asyncio.TimeoutError):  # this client's deadline cancelled the call
            return bool(getattr(self.judge, "cancel_stops_work", True))
        return isinstance(exc, JudgeUnavailable)

    async def _judge_call(self, stage: str, messages: list[dict[str, str]], schema: dict | None,
                          sample: int) -> JudgeReply:
        try:
            return await self.judge.complete(messages, schema=schema, schema_name=stage,
                                             temperature=self.settings.temperature,
                                             max_tokens=self.settings.max_tokens, sample=sample)
        except asyncio.TimeoutError as exc:
            # The judge's own timeout (TimeoutError is asyncio's since Python 3.11): an
            # unavailable judge, not this client's deadline.
            raise JudgeUnavailable(f"{type(exc).__name__}: {exc}") from None

    async def _rate_limit(self, state: _LoopState, messages: list[dict[str, str]]) -> None:
        if state.requests is not None:
            await state.requests.acquire()
        if state.tokens is not None:
            estimate = sum(len(m.get("content") or "") for m in messages) / 4 + self.settings.max_tokens
            await state.tokens.acquire(min(estimate, state.tokens.max_rate))


def repair_request(errors: list[str]) -> str:
    listed = "\n".join(f"- {e}" for e in errors)
    return (
        "Your answer could not be used:\n"
        f"{listed}\n"
        "Reply again with the complete, corrected JSON object and nothing else."
    )
