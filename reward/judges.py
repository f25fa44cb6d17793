"""Judges: anything that turns chat messages into text, and the three built in.

Built in: ``OpenAIJudge`` (any OpenAI-compatible endpoint, "openai": ``openai_judge.py``),
``TransformersJudge`` (a local HF causal LM, "transformers": ``transformers_judge.py``;
torch loads only when one is built) and ``FunctionJudge`` (a plain ``fn(messages) ->
text``, sync or async: ``function_judge.py``). What a judge is, its reply and its errors
are ``judge_protocol.py``'s; what a judge server takes, ``judge_servers.py``'s; the answer
grammar, ``grammar.py``'s. This module names them all in one place and turns what a user
or a config gives (a judge, a dict, a function) into a judge.
"""

from __future__ import annotations

from typing import Any

from draco_gym.reward.function_judge import FunctionJudge
from draco_gym.reward.grammar import grammar_ready
from draco_gym.reward.judge_protocol import (
    JUDGES,
    FormatRefused,
    Judge,
    JudgeReply,
    JudgeTimedOut,
    JudgeUnavailable,
)
from draco_gym.reward.judge_servers import (
    STRUCTURED_OUTPUTS,
    ServerProfile,
    StructuredOutput,
    forget_servers,
    server_profile,
)
from draco_gym.reward.openai_judge import OpenAIJudge
from draco_gym.reward.transformers_judge import TransformersJudge

__all__ = [
    "JUDGES",
    "STRUCTURED_OUTPUTS",
    "FormatRefused",
    "FunctionJudge",
    "Judge",
    "JudgeReply",
    "JudgeTimedOut",
    "JudgeUnavailable",
    "OpenAIJudge",
    "ServerProfile",
    "StructuredOutput",
    "TransformersJudge",
    "as_judge",
    "build_judge",
    "forget_servers",
    "grammar_ready",
    "server_profile",
]


def build_judge(name: str, **options: Any) -> Judge:
    """The judge registered as ``name`` ("openai", "transformers"), built with ``options``."""
    return JUDGES.get(name)(**options)


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
