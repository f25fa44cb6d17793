"""A judge from a plain function: a scripted judge for tests, a rule, a one-line experiment."""

from __future__ import annotations

import inspect
from typing import Any

from draco_gym.registry import import_object
from draco_gym.reward.judge_protocol import JUDGES, JudgeReply


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


@JUDGES.register("function")
def function_judge(target: Any, **options: Any):
    """The judge a YAML config names by its code: ``judge: {name: function, target:
    "my_pkg.judges:strict"}``. ``target`` (or the object itself, from Python) is a function
    ``fn(messages) -> text`` or a Judge class, built with the other options (a Judge has
    ``async complete(messages, *, schema, schema_name, temperature, max_tokens, sample) ->
    JudgeReply``)."""
    made = import_object(target, "judge.target") if isinstance(target, str) else target
    if isinstance(made, type):
        made = made(**options)
        if not callable(getattr(made, "complete", None)):
            raise ValueError(f"judge.target {target!r}: a class must make a Judge (async complete(messages, ...))")
        return made
    if not callable(made):
        raise ValueError(f"judge.target {target!r} is neither a Judge class nor a function(messages) -> text")
    if options:
        raise ValueError(f"judge.target {target!r} is a function: it takes no options (got {sorted(options)})")
    return FunctionJudge(made, model=target if isinstance(target, str) else None)
