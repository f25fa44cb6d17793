"""Tool-call parsing for τ-bench actions: pure, no benchmark package needed."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draco_gym.envs.tau.actions import ToolCall, ToolCallError, format_tool_call, parse_tool_call


def test_python_call_with_keyword_literals():
    call = parse_tool_call('create_task(user_id="user_1", title="Meeting", tags=["a", 2], extra={"k": None}, n=-3.5)')
    assert call == ToolCall("create_task", {"user_id": "user_1", "title": "Meeting", "tags": ["a", 2], "extra": {"k": None}, "n": -3.5})


def test_call_without_arguments_and_json_form():
    assert parse_tool_call("get_users()") == ToolCall("get_users", {})
    assert parse_tool_call('{"name": "get_users", "arguments": {}}') == ToolCall("get_users", {})
    assert parse_tool_call('{"name": "f", "arguments": {"x": [1, {"y": "z"}]}}') == ToolCall("f", {"x": [1, {"y": "z"}]})
    assert parse_tool_call('{"name": "f"}') == ToolCall("f", {})


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        ('f("x")', "positional"),
        ("f(a=1)\ng(b=2)", "2 calls"),
        ("x = f(a=1)", "not a single call"),
        ("f(a=1); f(a=2)", "2 calls"),
        ("import os", "not a single call"),
        ("f(**{'a': 1})", "**kwargs"),
        ("f(a=some_variable)", "not a JSON-like literal"),
        ("f(a=__import__('os').system('echo hacked'))", "not a JSON-like literal"),
        ("f(a=(1, 2))", "not a JSON-like literal"),
        ("f(a={1, 2})", "not a JSON-like literal"),
        ("f(a=b'x')", "not a JSON-like literal"),
        ("f(a={1: 'x'})", "not a JSON-like literal"),
        ("os.system(cmd='ls')", "bare name"),
        ("f(a=1", "not valid Python syntax"),
        ("f(a=1, a=2)", "given twice"),
        ('{"name": "f", "arguments": [1]}', '"arguments" must be an object'),
        ('{"name": "f", "args": {}}', "unexpected JSON keys"),
        ('{"name": 3}', '"name" must be a tool name'),
        ('{"name": "f",', "invalid JSON"),
        ("   ", "empty"),
    ],
)
def test_malformed_calls_are_rejected_with_a_reason(code, needle):
    with pytest.raises(ToolCallError, match=re.escape(needle)):
        parse_tool_call(code)


def test_nothing_is_executed(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(ToolCallError, match="is not a JSON-like literal"):
        parse_tool_call(f"f(a=open({str(marker)!r}, 'w').write('x'))")
    assert not marker.exists()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@given(
    st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True),
    st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True), json_values, max_size=4),
)
def test_format_then_parse_round_trips(name, arguments):
    from keyword import iskeyword

    if iskeyword(name) or any(iskeyword(k) for k in arguments):
        return
    call = ToolCall(name, arguments)
    assert parse_tool_call(format_tool_call(call)) == call


# -- hostile text: bounded work, a clear error, never an exception other than ToolCallError ----

from draco_gym.envs.tau.actions import MAX_CALL_CHARS

TOO_DEEP = "the call is nested too deeply to read"
HOSTILE_CALLS = {  # name: (call, what the agent is told)
    "deep sum": ("f(a=" + "1+" * 5_000 + "1)", TOO_DEEP),
    "deep unary": ("f(a=" + "-" * 10_000 + "1)", TOO_DEEP),
    "deep attribute": ("f(a=" + "x." * 5_000 + "y)", TOO_DEEP),
    "deep JSON": ('{"name": "f", "arguments": {"a": ' + "[" * 5_000 + "]" * 5_000 + "}}", TOO_DEEP),
    "deep brackets": ("f(a=" + "[" * 5_000 + "]" * 5_000 + ")", "not valid Python syntax"),
    "many calls": ("f()\n" * 4_000, "the block holds 4000 calls; make exactly one tool call per message"),
}


@pytest.mark.parametrize("name", list(HOSTILE_CALLS))
def test_hostile_calls_are_tool_call_errors(name):
    call, message = HOSTILE_CALLS[name]
    with pytest.raises(ToolCallError, match=re.escape(message)):
        parse_tool_call(call)


@pytest.mark.parametrize("unit", ["1+", "f()\n", "[", "x"])
def test_a_1mb_call_is_refused_unread_with_the_cap_named(unit):
    text = "f(a=" + unit * (1_000_000 // len(unit)) + ")"
    with pytest.raises(ToolCallError, match=f"at most {MAX_CALL_CHARS:,}"):
        parse_tool_call(text)
