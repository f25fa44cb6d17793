"""Is the judge there? A dead judge (refusing connections, answering garbage) must stop a
run, not zero every reward in silence.

Every judge stage request that gets no usable answer is recorded in its ``GroupScore``
(``judge_failures``: stage, server, error) beside the count of those answered
(``judge_answers``). From those records:

    every_call_failed(group)       the judge was asked and answered nothing usable
    judge_down(groups)             the one line naming server and error when every judge call
                                   of these groups (an iteration's) failed; the trainer prints
                                   it the first iteration that happens, whatever k is
    dead_judge(groups, k)          the message naming server and error when each of the last
                                   k groups had every judge call fail (None otherwise); the
                                   trainer stops the run on it
    probe_judge(judge)             one cheap request (``draco-gym train --check``): raises
                                   ``JudgeUnavailable`` naming the server and the error

A group whose reward asked no judge (``rule``, ``outcome``) has neither answers nor
failures and never counts as a dead judge's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from draco_gym.reward.answers import InvalidAnswer, extract_json
from draco_gym.reward.base import run_sync
from draco_gym.reward.judge_protocol import JudgeUnavailable
from draco_gym.reward.judges import as_judge
from draco_gym.types import GroupScore

DEAD_JUDGE_GROUPS = 3
"""Consecutive groups whose every judge call failed before a run stops (the default k)."""

PROBE_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                "additionalProperties": False}
PROBE_MESSAGES = [
    {"role": "system", "content": "You check that a judge server answers. Reply with the JSON object only."},
    {"role": "user", "content": 'Reply with {"ok": true}.'},
]


class DeadJudge(JudgeUnavailable):
    """Raised by the trainer on ``dead_judge``'s message."""


def every_call_failed(group: GroupScore) -> bool:
    """The group's reward asked the judge, and no request got a usable answer."""
    return bool(group.judge_failures) and group.judge_answers == 0


def judge_down(groups: Sequence[GroupScore]) -> str | None:
    """One line naming each judge server and its latest errors when the groups that asked a
    judge (one iteration's) got no usable answer at all; None when one answered, or none was
    asked."""
    asked = [g for g in groups if g.judge_failures or g.judge_answers]
    if not asked or not all(every_call_failed(g) for g in asked):
        return None
    calls = sum(len(g.judge_failures) for g in asked)
    return (f"the judge failed every call of this iteration ({calls} requests, none answered): {_named(asked)}. "
            f"{_CHECK}")


def dead_judge(groups: Sequence[GroupScore], k: int = DEAD_JUDGE_GROUPS) -> str | None:
    """The message to stop a run with when each of the last ``k`` groups (in scoring order)
    had every judge call fail, naming each server and its latest errors; None otherwise
    (fewer than ``k`` groups included)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    recent = list(groups)[-k:]
    if len(recent) < k or not all(every_call_failed(g) for g in recent):
        return None
    calls = sum(len(g.judge_failures) for g in recent)
    return (f"the judge failed every call of the last {k} groups ({calls} requests, none answered): "
            f"{_named(recent)}. {_CHECK}")


_CHECK = "Check that the judge server is running and reachable (draco-gym train --check probes it)"


def _named(groups: Sequence[GroupScore]) -> str:
    """Each server of the groups' failures with its latest two distinct errors, newest first."""
    errors: dict[str, list[str]] = {}
    for failure in reversed([f for g in groups for f in g.judge_failures]):
        seen = errors.setdefault(failure.server, [])
        if failure.error not in seen and len(seen) < 2:
            seen.append(failure.error)
    return "; ".join(f"{server}: {' | '.join(found)}" for server, found in errors.items())


async def aprobe_judge(judge: Any, *, timeout_s: float = 60.0) -> None:
    """One small request to ``judge`` (a Judge, a config dict, a function); raises
    ``JudgeUnavailable`` naming its server and the error when no JSON object comes back."""
    built = as_judge(judge)
    server = getattr(built, "server", None) or f"{type(built).__name__} {getattr(built, 'model', '')}".strip()
    try:
        reply = await asyncio.wait_for(
            built.complete(PROBE_MESSAGES, schema=PROBE_SCHEMA, schema_name="probe", temperature=0.0, max_tokens=16,
                           sample=0), timeout=timeout_s)
        extract_json(reply.text)
    except asyncio.TimeoutError:
        raise JudgeUnavailable(f"judge at {server} did not answer a probe within {timeout_s:g} s") from None
    except InvalidAnswer as exc:
        raise JudgeUnavailable(f"judge at {server} answered a probe with no JSON object ({'; '.join(exc.errors)}): "
                               f"{reply.text[:120]!r}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the transport raised is the message
        message = str(exc) if server in str(exc) else f"{type(exc).__name__}: {exc}"
        raise JudgeUnavailable(f"judge at {server} did not answer a probe: {message}"[:600]) from None
    finally:
        close = getattr(built, "aclose", None)
        if close is not None:
            await close()


def probe_judge(judge: Any, *, timeout_s: float = 60.0) -> None:
    """``aprobe_judge`` from synchronous code (the CLI)."""
    run_sync(aprobe_judge(judge, timeout_s=timeout_s))
