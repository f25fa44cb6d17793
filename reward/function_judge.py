"""A judge from a plain function: a scripted judge for tests, a rule, a one-line experiment."""

from __future__ import annotations

import inspect

from draco_gym.reward.judge_protocol import JudgeReply


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
