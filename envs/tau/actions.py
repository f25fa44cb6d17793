"""Reading one tool call out of a code block, without ever running it.

τ-bench agents act through function calls. Here the policy writes the call as text, in one
of two notations, so that a plain chat model (no native tool calling) can play:

    ```python
    get_order_details(order_id="#W2378156")
    ```

    ```json
    {"name": "get_order_details", "arguments": {"order_id": "#W2378156"}}
    ```

The Python form is parsed with ``ast`` and its arguments evaluated with
``ast.literal_eval``: nothing the agent writes is executed, so a block holding
``__import__("os").system(...)`` is just a malformed action. Every rule that is broken
(positional arguments, several calls, a variable instead of a literal, ``**kwargs``)
produces a ``ToolCallError`` whose message tells the agent how to fix it. So does a block
over ``MAX_CALL_CHARS`` (refused before parsing) or one nested too deeply for the parsers;
the host's work per action is bounded by its length, whatever the agent writes.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

FORMAT_HINT = (
    'write one call with keyword arguments, e.g. tool_name(arg="value"), '
    'or JSON {"name": "tool_name", "arguments": {"arg": "value"}}'
)

MAX_CALL_CHARS = 20_000
"""The longest tool call read: a τ-bench call with its arguments is a few hundred characters."""


class ToolCallError(ValueError):
    """The block is not exactly one well-formed tool call; the message says why."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def parse_tool_call(code: str) -> ToolCall:
    """The single tool call written in ``code`` (Python call or JSON object)."""
    text = code.strip()
    if not text:
        raise ToolCallError(f"the block is empty; {FORMAT_HINT}")
    if len(text) > MAX_CALL_CHARS:
        raise ToolCallError(
            f"the block is {len(text):,} characters long; a tool call may have at most {MAX_CALL_CHARS:,}, "
            f"so it was not read; {FORMAT_HINT}"
        )
    try:
        return _from_json(text) if text.startswith("{") else _from_python(text)
    except (RecursionError, MemoryError):
        raise ToolCallError(f"the call is nested too deeply to read; {FORMAT_HINT}") from None


def _from_json(text: str) -> ToolCall:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if not isinstance(payload, dict):
        raise ToolCallError(f"the JSON must be one object; {FORMAT_HINT}")
    unknown = sorted(set(payload) - {"name", "arguments"})
    if unknown:
        raise ToolCallError(f'unexpected JSON keys {unknown}; use only "name" and "arguments"')
    name, arguments = payload.get("name"), payload.get("arguments", {})
    if not isinstance(name, str) or not name.isidentifier():
        raise ToolCallError(f'"name" must be a tool name, got {name!r}')
    if not isinstance(arguments, dict):
        raise ToolCallError(f'"arguments" must be an object, got {type(arguments).__name__}')
    return ToolCall(name, arguments)


def _from_python(text: str) -> ToolCall:
    try:
        module = ast.parse(text, mode="exec")
    except SyntaxError as exc:
        raise ToolCallError(f"not valid Python syntax ({exc.msg}, line {exc.lineno}); {FORMAT_HINT}") from None
    calls = [node for node in module.body if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)]
    if len(module.body) != 1 or len(calls) != 1:
        what = f"{len(calls)} calls" if len(calls) > 1 else "code that is not a single call"
        raise ToolCallError(f"the block holds {what}; make exactly one tool call per message: {FORMAT_HINT}")
    call = calls[0].value
    if not isinstance(call.func, ast.Name):
        raise ToolCallError(f"call a tool by its bare name, not {_short(_source(text, call.func))!r}")
    if call.args:
        raise ToolCallError(f"{call.func.id}: positional arguments are not allowed; name every argument (arg=value)")
    arguments: dict[str, Any] = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            raise ToolCallError(f"{call.func.id}: **kwargs is not allowed; name every argument (arg=value)")
        if keyword.arg in arguments:
            raise ToolCallError(f"{call.func.id}: argument {keyword.arg!r} is given twice")
        try:
            value = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            value = _NOT_JSON
        if not _is_json(value):
            raise ToolCallError(
                f"{call.func.id}: argument {keyword.arg}={_short(_source(text, keyword.value))} is not a JSON-like literal; "
                "use strings, numbers, True/False/None, lists and dicts with string keys"
            )
        arguments[keyword.arg] = value
    return ToolCall(call.func.id, arguments)


_NOT_JSON = object()


def _is_json(value: Any) -> bool:
    """Only values a function-calling API could carry reach the benchmark (no tuples, sets, bytes)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def _source(text: str, node: ast.AST) -> str:
    """The agent's own spelling of ``node``: sliced from the text, so no deep recursion."""
    return ast.get_source_segment(text, node) or type(node).__name__


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_tool_call(call: ToolCall) -> str:
    """The Python notation of ``call`` (what a correct agent message would hold)."""
    args = ", ".join(f"{key}={value!r}" for key, value in call.arguments.items())
    return f"{call.name}({args})"
