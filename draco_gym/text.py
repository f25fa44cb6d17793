"""Text helpers shared by the layers, and the one place where what the agent controls
becomes valid, bounded data.

Agent text (its messages, its code's output, the values it submits, the arguments of its
tool calls, what its shell sends on a relay) is hostile: a lone surrogate
(``print(chr(0xd800))``) cannot be encoded as UTF-8, so the policy's tokenizer, the rollout
log, the renderer and every judge's HTTP request raise on it; bytes (``submit(b'\\xff')``)
are not text at all; a value nested a thousand levels deep makes any recursive walk
(``json.dumps``, ``repr``, pydantic) raise ``RecursionError``. ``valid_text`` and
``valid_data`` are applied where such data enters the pipeline (the environment's step and
its evaluation, the ``Step`` and ``Trajectory`` records), so every layer after them sees
valid Unicode, JSON-ready values, bounded in depth and size.
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Any

MAX_DEPTH = 64
"""Deepest nesting kept in agent data; anything deeper is replaced by a marker string."""
MAX_ITEMS = 100_000
"""Values (containers, keys and leaves) kept in one agent data value; later ones are
replaced by a marker."""
MAX_CHARS = 1_000_000
"""Longest string kept in agent data (cut in the middle, ``truncate_middle``)."""
_MAX_INT_BITS = 13_000
"""Beyond ~3,900 decimal digits an int has no ``str`` (Python's conversion limit, 4,300)."""

_SURROGATE = re.compile("[\ud800-\udfff]")


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


def valid_text(text: str) -> str:
    """``text`` as valid Unicode: each lone surrogate becomes U+FFFD (a pair of surrogates,
    which a JSON escape or a UTF-16 decode can leave in a Python string, becomes the
    character it encodes). Valid text comes back unchanged (the same object)."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def bytes_text(data: bytes | bytearray | memoryview) -> str:
    """Bytes as text: UTF-8 where they are, each invalid byte as ``\\xNN`` (nothing lost,
    nothing that is not text)."""
    return bytes(data).decode("utf-8", "backslashreplace")


def valid_data(value: Any, *, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS,
               max_chars: int = MAX_CHARS) -> Any:
    """``value`` (agent data: a submitted answer, a step's info, an evaluation) as data that
    JSON, pydantic and every renderer take without raising:

    - strings: ``valid_text``, cut in the middle beyond ``max_chars``; bytes: ``bytes_text``;
    - dicts, lists and tuples: the same kinds, their items made valid; sets: lists; a dict
      key that is not a string, number, bool or None: its text;
    - numbers: kept (numpy's scalars and arrays as Python's); an int too long to print: a marker;
    - anything else (``...``, a complex, an object): its ``repr``, made valid;
    - deeper than ``max_depth``, or past ``max_items`` values in all: a marker string.
    """
    budget = [max_items]
    return _valid(value, max_depth, budget, max_chars)


def _valid(value: Any, depth: int, budget: list[int], max_chars: int) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        return "[... values beyond the limit left out ...]"
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return truncate_middle(valid_text(value), max_chars)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return truncate_middle(bytes_text(value), max_chars)
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # a numpy scalar or array: Python's own values
        return _valid(value.tolist(), depth, budget, max_chars)
    if isinstance(value, numbers.Integral):
        value = int(value)
        return value if value.bit_length() <= _MAX_INT_BITS else f"[an integer of {value.bit_length()} bits]"
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        if depth <= 0:
            return f"[... a {type(value).__name__} nested too deep ...]"
        if isinstance(value, dict):
            return {_valid_key(k, budget, max_chars): _valid(v, depth - 1, budget, max_chars)
                    for k, v in value.items()}
        items = [_valid(v, depth - 1, budget, max_chars) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return truncate_middle(valid_text(_repr(value)), max_chars)


def _valid_key(key: Any, budget: list[int], max_chars: int) -> Any:
    if key is None or isinstance(key, (bool, int)) or (isinstance(key, float) and math.isfinite(key)):
        return key
    text = key if isinstance(key, str) else bytes_text(key) if isinstance(key, (bytes, bytearray)) else _repr(key)
    return _valid(text, 0, budget, max_chars)


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # noqa: BLE001 - a repr that raises (too deep, a broken __repr__) is named by type
        return f"<{type(value).__name__} object>"


def nesting_depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deeply ``value``'s dicts (keys and values), lists, tuples and sets nest (a scalar:
    0, ``[]``: 1), counted level by level without recursion and up to ``limit + 1``: a caller
    refuses a value deeper than ``limit`` before anything recursive (``json.dumps``) walks it."""
    deepest, level = 0, [value]
    while deepest <= limit:
        containers = [item for item in level if isinstance(item, _CONTAINERS)]
        if not containers:
            break
        deepest += 1
        level = [child for c in containers for child in ((*c.keys(), *c.values()) if isinstance(c, dict) else c)]
    return deepest


_CONTAINERS = (dict, list, tuple, set, frozenset)
