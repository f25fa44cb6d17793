"""Finding the code block: both notations, the multi-block policy, and garbage in."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draco_gym.codeblock import parse_message

FENCE = "```python\n{}\n```"


def test_fenced_and_tagged_blocks():
    assert parse_message("Let me look.\n" + FENCE.format("print(1)")).code == "print(1)"
    assert parse_message("<code>\nx = 1\nprint(x)\n</code>").code == "x = 1\nprint(x)"
    assert parse_message("```py\nprint(2)\n```").code == "print(2)"
    assert parse_message("  ```python\n    a = 1\n    b = 2\n  ```").code == "a = 1\nb = 2"


def test_no_block_is_not_an_error():
    parsed = parse_message("The task is complete.")
    assert parsed.code is None and parsed.error is None and not parsed.has_block


def test_other_languages_are_prose_unless_asked_for():
    text = "```json\n{\"a\": 1}\n```"
    assert parse_message(text).code is None
    assert parse_message(text, languages=("json",)).code == '{"a": 1}'


def test_several_blocks_policy():
    text = FENCE.format("a = 1") + "\nthen\n<code>b = 2</code>"
    rejected = parse_message(text)
    assert rejected.code is None and "found 2 code blocks" in rejected.error and rejected.blocks == ["a = 1", "b = 2"]
    first = parse_message(text, multi_block="first")
    assert first.code == "a = 1" and "only the first" in first.warning
    joined = parse_message(text, multi_block="join")
    assert joined.code == "a = 1\nb = 2" and joined.error is None
    with pytest.raises(ValueError, match="multi_block must be one of"):
        parse_message(text, multi_block="all")


def test_malformed_blocks_are_errors_not_exceptions():
    assert "never closed" in parse_message("```python\nprint(1)").error
    assert "never closed" in parse_message("<code>print(1)").error
    assert "empty" in parse_message("```python\n\n```").error
    assert "must be text" in parse_message(None).error


def test_a_tag_inside_a_fence_belongs_to_the_fence():
    parsed = parse_message(FENCE.format('html = "<code>x</code>"'))
    assert parsed.code == 'html = "<code>x</code>"' and len(parsed.blocks) == 1


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_never_raises_on_any_text(text):
    parsed = parse_message(text)
    assert parsed.code is None or isinstance(parsed.code, str)
