"""Text helpers shared by the layers."""

from __future__ import annotations


def truncate_middle(text: str, limit: int, cut: str = "truncated") -> str:
    """Keep the head (two thirds) and tail (one third) of ``text`` within ``limit``
    characters, the cut marked with its size: ``[... N characters truncated ...]`` (``cut``
    words what happened to them, e.g. where the full text is). A long tool output and a long
    agent message both keep their start and their conclusion. ``limit <= 0`` means no limit."""
    return "".join(split_middle(text, limit, cut))


def split_middle(text: str, limit: int, cut: str = "truncated") -> tuple[str, str, str]:
    """``truncate_middle``'s pieces, (head, marker, tail); ("text", "", "") when nothing is
    cut. For callers that must mend what the cut split (an element or a fence left open)."""
    if limit <= 0 or len(text) <= limit:
        return text, "", ""
    marker = "\n[... {} characters " + cut.replace("{", "{{").replace("}", "}}") + " ...]\n"
    room = max(limit - len(marker.format(len(text))), 0)
    head, tail = room - room // 3, room // 3
    return text[:head], marker.format(len(text) - head - tail), (text[-tail:] if tail else "")
