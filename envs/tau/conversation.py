"""One τ-bench episode's bookkeeping, shared by the Gymnasium and PettingZoo forms.

``Conversation`` picks the task (``begin``), turns a participant's raw text into what the
benchmark sees: a tool call (run in the domain and logged), a message to the other side
(logged), or an error shown only to its author (never logged, never forwarded), and decides
when a turn ends the episode (``ending``). It applies the official runner's episode limits:
at most ``max_steps`` messages of any kind (agent, user, tool) and at most ``max_errors``
failed tool calls; τ-bench scores an episode ended by either as 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from draco_gym.codeblock import parse_message
from draco_gym.envs.tau.actions import ToolCall, ToolCallError, format_tool_call, parse_tool_call
from draco_gym.envs.tau.backends import Backend, TaskSpec
from draco_gym.envs.tau.users import STOP, is_stop
from draco_gym.types import Termination

LANGUAGES: tuple[str, ...] = ("python", "py", "json")

AGENT_INSTRUCTION = """\
You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user: write plain text, with no code block.
- Make a tool call: write exactly one code block holding exactly one call, with every argument
  passed by name as a literal value, for example
```python
tool_name(argument="value", count=2)
```
  or the same call as JSON:
```json
{"name": "tool_name", "arguments": {"argument": "value", "count": 2}}
```
You cannot do both at the same time: text outside the code block of a tool-call turn is not
sent to the user. The tool's result comes back as the next message.
Try to be helpful and always follow the policy."""

SPEAKERS = {"agent": "Agent", "user": "User", "tool": "Tool"}


def render_tools(schemas: list[dict[str, Any]]) -> str:
    """OpenAI-style function schemas as Python-like signatures with their documentation."""
    blocks = []
    for schema in schemas:
        function = schema.get("function", schema)
        parameters = function.get("parameters") or {}
        properties = parameters.get("properties") or {}
        required = set(parameters.get("required") or [])
        args = []
        for name, prop in properties.items():
            kind = prop.get("type") or "/".join(p.get("type", "any") for p in prop.get("anyOf", [])) or "any"
            args.append(f"{name}: {kind}" if name in required else f"{name}: {kind} = {json.dumps(prop.get('default'))}")
        lines = [f"{function['name']}({', '.join(args)})"]
        if function.get("description"):
            lines.append("    " + function["description"].strip().replace("\n", "\n    "))
        for name, prop in properties.items():
            if prop.get("description"):
                lines.append(f"    {name}: {prop['description']}")
            if prop.get("enum"):
                lines.append(f"    {name} is one of {prop['enum']}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def agent_system_prompt(spec: TaskSpec) -> str:
    return (
        f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n"
        f"<policy>\n{spec.policy.strip()}\n</policy>\n"
        f"<tools>\n{render_tools(spec.tools)}\n</tools>"
    )


def render_lines(lines: list[tuple[str, str]], me: str) -> str:
    """A transcript from one side's point of view (``me`` is "agent" or "user")."""
    out = []
    for speaker, text in lines:
        label = SPEAKERS[speaker] + (" (you)" if speaker == me else "")
        out.append(f"{label}: {text}")
    return "\n".join(out)


@dataclass
class Turn:
    """The outcome of one participant's action.

    kind: "tool" (a tool ran; ``observation`` is its result for the author, ``message`` the raw
    output), "message" (the
    text went to the other side), "stop" (the author ended the conversation), "error"
    (malformed; ``observation`` tells the author why, nothing was forwarded).
    """

    kind: str
    observation: str = ""
    message: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Conversation:
    def __init__(
        self,
        backend: Backend,
        *,
        multi_block: str = "reject",
        max_steps: int = 100,
        max_errors: int = 10,
    ) -> None:
        if max_steps < 1 or max_errors < 1:
            raise ValueError(f"max_steps and max_errors must be >= 1, got {max_steps} and {max_errors}")
        self.backend = backend
        self.multi_block = multi_block
        self.max_steps = max_steps
        self.max_errors = max_errors
        self.spec: TaskSpec | None = None
        self.steps = 0  # messages of any role, as the official orchestrator counts them
        self.tool_errors = 0
        self.malformed = 0

    def start(self, task_id: str) -> TaskSpec:
        self.spec = self.backend.start(task_id)
        self.steps = self.tool_errors = self.malformed = 0
        return self.spec

    def begin(self, task_id: str | int | None, rng) -> TaskSpec:
        """Start ``task_id``, or a task drawn with ``rng`` (a numpy Generator) when None."""
        if task_id is None:
            ids = self.backend.task_ids()
            task_id = ids[int(rng.integers(len(ids)))]
        return self.start(self.backend.check_task(task_id))

    def limit_reached(self) -> str | None:
        if self.tool_errors >= self.max_errors:
            return Termination.TOO_MANY_ERRORS
        if self.steps >= self.max_steps:
            return Termination.MAX_STEPS
        return None

    def ending(self, turn: Turn, speaker: str) -> tuple[str, bool] | None:
        """``(termination, truncated)`` when ``turn`` of ``speaker`` ends the episode: a stop
        (a tool that ended it is ``submitted``), or one of the official limits (``max_steps``
        is a truncation)."""
        if turn.kind == "stop":
            if "tool_call" in turn.info:
                return Termination.SUBMITTED, False
            return (Termination.AGENT_STOP if speaker == "assistant" else Termination.USER_STOP), False
        limit = self.limit_reached()
        return None if limit is None else (limit, limit == Termination.MAX_STEPS)

    def act(self, speaker: str, text: Any, *, tools_allowed: bool = True) -> Turn:
        """Apply ``speaker``'s raw output ("assistant" or "user")."""
        if not isinstance(text, str):
            return self._error(f"the action must be text, got {type(text).__name__}")
        parsed = parse_message(text, multi_block=self.multi_block, languages=LANGUAGES) if tools_allowed else None
        if parsed is not None and parsed.error is not None:
            return self._error(f"{parsed.error}")
        if parsed is not None and parsed.code is not None:
            try:
                call = parse_tool_call(parsed.code)
            except ToolCallError as exc:
                return self._error(f"{exc}. Nothing was run")
            return self.tool(call.name, call.arguments, requestor=speaker)
        message = text.strip()
        if not message:
            return self._error("the message is empty; nothing was sent")
        self.backend.say(speaker, message)
        self.steps += 1
        ended = STOP in message if speaker == "assistant" else is_stop(message)
        return Turn("stop" if ended else "message", message=message)

    def tool(self, name: str, arguments: dict[str, Any], *, requestor: str) -> Turn:
        result = self.backend.call_tool(name, arguments, requestor=requestor)
        self.steps += 2  # the call and the environment's answer
        self.tool_errors += result.error
        return Turn(
            "stop" if result.ended else "tool",
            observation=f"Tool result ({name}):\n{result.output}",
            message=result.output,
            info={"tool_call": format_tool_call(ToolCall(name, arguments)), "tool_error": result.error},
        )

    def user_tool_output(self, name: str, arguments: dict[str, Any]) -> str:
        """``UserContext.call_tool`` for a simulated user with tools of its own."""
        return self.tool(name, arguments, requestor="user").message or ""

    def _error(self, reason: str) -> Turn:
        self.malformed += 1
        return Turn("error", observation=f"Error: {reason}.", info={"action_error": reason})
