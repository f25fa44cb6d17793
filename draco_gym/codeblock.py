"""Finding the code block in an assistant message: the boundary of one step.

Two notations are accepted, because both occur in the literature this library follows:
Markdown fences (```` ```python ... ``` ````, language tag from ``languages``) and DRACO's
AppWorld tags (``<code> ... </code>``). Parsing never raises on model output; it returns a
``ParsedMessage`` whose ``error`` says what was wrong, so the environment can show the agent
an error observation and count it.

Policy when a message holds several blocks (``multi_block``):
  - ``"reject"`` (default): nothing runs and the agent is told to send exactly one block.
    One block per turn keeps one step = one action, which is what the judge cites and
    what step credit distributes over.
  - ``"first"``: run the first block, ignore the rest (recorded as a warning).
  - ``"join"``: run all blocks, concatenated in order (recorded as a warning).
A message with no block is not an error by itself: whether it ends the episode (DRACO's
``no_code`` rule) or is an error observation depends on the environment's end rule. An
opened but unclosed block (often a generation cut off by the token limit) is an error.
"""

from __future__ import annotations

import functools
import re
import textwrap
from dataclasses import dataclass, field
from typing import Literal

MultiBlockPolicy = Literal["reject", "first", "join"]
MULTI_BLOCK_POLICIES: tuple[str, ...] = ("reject", "first", "join")

DEFAULT_LANGUAGES: tuple[str, ...] = ("python", "py")

@dataclass(frozen=True)
class ParsedMessage:
    """What one assistant message contains. ``code`` is what should run (or None)."""

    code: str | None
    blocks: list[str] = field(default_factory=list)
    error: str | None = None
    warning: str | None = None

    @property
    def has_code(self) -> bool:
        return self.code is not None

    @property
    def has_block(self) -> bool:
        """The agent tried to write code, even if the attempt was malformed."""
        return bool(self.blocks) or self.error is not None

    def to_info(self) -> dict:
        return {"n_blocks": len(self.blocks), "error": self.error, "warning": self.warning}


@functools.lru_cache(maxsize=16)
def _block_pattern(languages: tuple[str, ...]) -> re.Pattern[str]:
    tags = "|".join(re.escape(lang) for lang in languages)
    # A fence opens at a line start with ``` + a language tag and closes at a line that is ```;
    # a tag block is <code>...</code>. One alternation, so a tag quoted inside a fence (or a
    # fence inside tags) is part of that block, not a block of its own.
    return re.compile(
        rf"^[ \t]*```[ \t]*(?:{tags})[ \t]*\n(?P<fence>.*?)^[ \t]*```[ \t]*$"
        rf"|<code>(?P<tag>.*?)</code>",
        re.DOTALL | re.MULTILINE | re.IGNORECASE,
    )


@functools.lru_cache(maxsize=16)
def _opener_pattern(languages: tuple[str, ...]) -> re.Pattern[str]:
    tags = "|".join(re.escape(lang) for lang in languages)
    return re.compile(rf"^[ \t]*```[ \t]*(?:{tags})[ \t]*$|<code>", re.MULTILINE | re.IGNORECASE)


def parse_message(
    text: str,
    *,
    multi_block: MultiBlockPolicy = "reject",
    languages: tuple[str, ...] = DEFAULT_LANGUAGES,
) -> ParsedMessage:
    """Extract the code to run from an assistant message (see the module docstring)."""
    if multi_block not in MULTI_BLOCK_POLICIES:
        raise ValueError(f"multi_block must be one of {MULTI_BLOCK_POLICIES}, got {multi_block!r}")
    if not isinstance(text, str):
        return ParsedMessage(code=None, error=f"message must be text, got {type(text).__name__}")

    pattern = _block_pattern(languages)
    blocks = [
        _dedent_block(m.group("fence") if m.group("fence") is not None else m.group("tag"))
        for m in pattern.finditer(text)
    ]
    unclosed = _opener_pattern(languages).search(pattern.sub("", text)) is not None
    if unclosed:
        return ParsedMessage(
            code=None,
            blocks=blocks,
            error="a code block was opened but never closed; nothing was run",
        )
    if not blocks:
        return ParsedMessage(code=None)
    if any(not b.strip() for b in blocks):
        return ParsedMessage(code=None, blocks=blocks, error="the code block is empty; nothing was run")
    if len(blocks) == 1:
        return ParsedMessage(code=blocks[0], blocks=blocks)
    if multi_block == "reject":
        return ParsedMessage(
            code=None,
            blocks=blocks,
            error=f"found {len(blocks)} code blocks; send exactly one per message. Nothing was run",
        )
    if multi_block == "first":
        return ParsedMessage(
            code=blocks[0], blocks=blocks, warning=f"{len(blocks)} code blocks; ran only the first"
        )
    return ParsedMessage(
        code="\n".join(blocks), blocks=blocks, warning=f"{len(blocks)} code blocks; ran them joined in order"
    )


def _dedent_block(body: str) -> str:
    return textwrap.dedent(body.strip("\n")).rstrip()
