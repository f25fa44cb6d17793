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


# -- hostile text: linear time, a cap, and the same answers as the regex it replaced ---------

import re
import signal
import textwrap
import time

from draco_gym.codeblock import MAX_MESSAGE_CHARS


def reference_parse(text: str, languages=("python", "py")) -> tuple[list[str], bool]:
    """The earlier regex implementation (quadratic on repeated openers), kept as the oracle
    the linear parser must agree with: the blocks found and whether an opener is left."""
    tags = "|".join(re.escape(lang) for lang in languages)
    block = re.compile(
        rf"^[ \t]*```[ \t]*(?:{tags})[ \t]*\n(?P<fence>.*?)^[ \t]*```[ \t]*$|<code>(?P<tag>.*?)</code>",
        re.DOTALL | re.MULTILINE | re.IGNORECASE,
    )
    opener = re.compile(rf"^[ \t]*```[ \t]*(?:{tags})[ \t]*$|<code>", re.MULTILINE | re.IGNORECASE)
    blocks = [textwrap.dedent((m.group("fence") if m.group("fence") is not None else m.group("tag")).strip("\n")).rstrip()
              for m in block.finditer(text)]
    return blocks, opener.search(block.sub("", text)) is not None


PIECES = ["```python\n", "```py\n", "```PYTHON \n", "  ```python\n", "```\n", "  ``` \n", "```", "```json\n",
          "<code>", "</code>", "<CODE>", "</Code>", "<co", "de>", "\n", " ", "\t", "x = 1", "print(2)", "`", "<", "py"]


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=30))
def test_same_blocks_as_the_reference_regex(pieces):
    text = "".join(pieces)
    blocks, unclosed = reference_parse(text)
    parsed = parse_message(text, multi_block="join")
    assert parsed.blocks == blocks
    assert (parsed.error is not None and "never closed" in parsed.error) == unclosed


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="`<>/codepyth \n\tCODE", max_size=80))
def test_same_blocks_as_the_reference_regex_on_near_miss_text(text):
    assert parse_message(text, multi_block="join").blocks == reference_parse(text)[0]


def _timed(text: str, budget_s: float = 10.0) -> tuple[float, object]:
    """CPU seconds to parse (wall time on a loaded machine says little), with a wall-clock
    alarm as a hard stop, so a quadratic parser fails instead of hanging."""
    def stop(*_):
        raise TimeoutError(f"parsing {len(text):,} characters took over {budget_s} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    try:
        start = time.process_time()
        parsed = parse_message(text, max_chars=len(text))
        return time.process_time() - start, parsed
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


ADVERSARIAL = {
    "repeated fence openers": "```python\n",
    "repeated tag openers": "<code>",
    "mixed unclosed openers": "```python\nx\n<code>y\n",
    "closed tag then open fence": "<code>a</code>\n```py\n",
    "closers without openers": "```\n</code>\n",
    "fence with a tag inside, unclosed": "```python\nprint('<code>')\n",
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_a_1mb_adversarial_message_parses_in_linear_time(name):
    unit = ADVERSARIAL[name]
    text = (unit * (1_000_000 // len(unit) + 1))[:1_000_000]
    elapsed, parsed = _timed(text)
    assert elapsed < 1.0, f"{name}: {elapsed:.2f} s for 1 MB"
    assert parsed.code is None or isinstance(parsed.code, str)


def test_a_message_over_the_cap_is_refused_unread_with_the_cap_named():
    text = "```python\nprint(1)\n```\n" + "x" * MAX_MESSAGE_CHARS
    parsed = parse_message(text)
    assert parsed.code is None and parsed.has_block
    assert f"{MAX_MESSAGE_CHARS:,}" in parsed.error and f"{len(text):,}" in parsed.error
    assert parse_message(text[:MAX_MESSAGE_CHARS]).error is None  # at the cap it still parses
