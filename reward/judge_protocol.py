"""What a judge is: one coroutine, ``complete``, its reply, the errors it may raise, and the
table that names judges.

A judge implements ``complete`` and nothing else: caching, concurrency, rate limits, the
overall deadline, validation, repair and cost accounting live once in ``JudgeClient``
(``judge_client.py``) and apply to every judge alike. That keeps a new judge (the
trainer's policy model as a self-judge, a remote service, a test double) a dozen lines
long::

    class PolicyJudge:
        model = "policy@step-40"

        async def complete(self, messages, *, schema, schema_name, temperature, max_tokens, sample):
            text, n_in, n_out = await my_generate(messages, temperature, max_tokens)
            return JudgeReply(text, n_in, n_out)

``schema`` is the JSON schema the answer must follow (for servers that can enforce it; a
judge that cannot may ignore it, every answer is validated anyway), ``sample`` numbers
repeated samplings of the same request (the self-judge scores k times).

Transport retries belong to the judge, where the transport's own knowledge lives; the
errors below tell the client what happened. A judge tells the client, with
``cancel_stops_work``, whether giving up on a call also stops its work, and with
``server_slots()`` how many calls it serves at once. Judges join ``JUDGES`` where they are
defined (``@JUDGES.register("openai")``); ``judges.build_judge`` builds one by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from draco_gym.registry import Registry


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


JUDGES: Registry[Any] = Registry("judge")
