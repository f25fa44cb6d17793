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

import bisect
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


MAX_MESSAGE_CHARS = 100_000
"""The longest message a step parses. Longer ones (a looping policy repeating itself up to
the action space's 1,000,000 characters) are refused before any parsing, unread."""


@functools.lru_cache(maxsize=16)
def _notation(languages: tuple[str, ...]) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """Patterns for the pieces of a block: a fence opener line (with its newline), a closing
    fence line, and (for the leftover check) an opener of either notation.

    None of them holds an unbounded ``.*``: each is tried once per line start or literal,
    so finding every piece is one linear pass. Pairing openers with closers is done in
    ``_blocks`` by binary search, never by a regex scanning to the end of the text for
    each opener (which made repeated unclosed openers quadratic)."""
    tags = "|".join(re.escape(lang) for lang in languages)
    flags = re.MULTILINE | re.IGNORECASE
    opener = re.compile(rf"^[ \t]*```[ \t]*(?:{tags})[ \t]*\n", flags)
    closer = re.compile(r"^[ \t]*```[ \t]*$", re.MULTILINE)
    leftover = re.compile(rf"^[ \t]*```[ \t]*(?:{tags})[ \t]*$|<code>", flags)
    return opener, closer, leftover


_TAG_OPEN = re.compile("<code>", re.IGNORECASE)
_TAG_CLOSE = re.compile("</code>", re.IGNORECASE)


def _blocks(text: str, languages: tuple[str, ...]) -> tuple[list[str], str]:
    """Every block, in order, and the text left once they are cut out.

    The rule: scanning left to right, the first opener of either notation starts a block; a
    fence (```` ```python ```` line) ends at the next line that is only ```` ``` ````, a tag
    block (``<code>``) at the next ``</code>``; the scan resumes after the block's end, so a
    tag quoted inside a fence (or a fence inside tags) belongs to that block. An opener
    without its closer starts nothing, and the scan goes on right after it."""
    opener, closer, _ = _notation(languages)
    fences = [(m.start(), m.end()) for m in opener.finditer(text)]
    closers = [(m.start(), m.end()) for m in closer.finditer(text)]
    closer_starts = [start for start, _ in closers]
    tag_opens = [m.start() for m in _TAG_OPEN.finditer(text)]
    tag_closes = [m.start() for m in _TAG_CLOSE.finditer(text)]

    blocks: list[str] = []
    kept: list[str] = []
    pos = 0
    fi = ti = 0  # next fence opener / tag opener not yet passed
    while True:
        while fi < len(fences) and fences[fi][0] < pos:
            fi += 1
        while ti < len(tag_opens) and tag_opens[ti] < pos:
            ti += 1
        fence = fences[fi] if fi < len(fences) else None
        tag = tag_opens[ti] if ti < len(tag_opens) else None
        if fence is None and tag is None:
            break
        if tag is None or (fence is not None and fence[0] < tag):
            start, body_start = fence
            k = bisect.bisect_left(closer_starts, body_start)
            if k == len(closers):
                fi += 1  # no closing line anywhere after it, so it opens nothing
                continue
            body_end, end = closers[k]
        else:
            start, body_start = tag, tag + len("<code>")
            k = bisect.bisect_left(tag_closes, body_start)
            if k == len(tag_closes):
                ti += 1
                continue
            body_end = tag_closes[k]
            end = body_end + len("</code>")
        blocks.append(text[body_start:body_end])
        kept.append(text[pos:start])
        pos = end
    kept.append(text[pos:])
    return blocks, "".join(kept)


def parse_message(
    text: str,
    *,
    multi_block: MultiBlockPolicy = "reject",
    languages: tuple[str, ...] = DEFAULT_LANGUAGES,
    max_chars: int = MAX_MESSAGE_CHARS,
) -> ParsedMessage:
    """Extract the code to run from an assistant message (see the module docstring).

    Linear in the length of ``text``; a message over ``max_chars`` is an error, unread."""
    if multi_block not in MULTI_BLOCK_POLICIES:
        raise ValueError(f"multi_block must be one of {MULTI_BLOCK_POLICIES}, got {multi_block!r}")
    if not isinstance(text, str):
        return ParsedMessage(code=None, error=f"message must be text, got {type(text).__name__}")
    if len(text) > max_chars:
        return ParsedMessage(
            code=None,
            error=f"the message is {len(text):,} characters long; a step accepts at most {max_chars:,}, "
            "so nothing was read or run. Send one short code block",
        )

    raw, rest = _blocks(text, tuple(languages))
    blocks = [_dedent_block(b) for b in raw]
    unclosed = _notation(tuple(languages))[2].search(rest) is not None
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
