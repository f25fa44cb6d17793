"""State keys: a short name for the situation a step was taken in (``Step.info["state_key"]``).

Credit rules that compare steps across a group's rollouts (TRCA, after GiGPO's anchor
states) need to know which steps faced the same situation. An environment names it by the
last call that changed or revealed its world, read from the code that ran: a block that
failed or called nothing leaves the key as it was. The code is parsed, never run.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable

START = "start"
"""The key of the first step: nothing has been called yet."""

MAX_KEY_CHARS = 160


def dotted_name(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, None for anything else (a subscript, a call)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def last_call(code: str, wanted: Callable[[str], bool]) -> tuple[str, ast.Call] | None:
    """The call in ``code`` that comes last in the text among those whose dotted name
    ``wanted`` accepts, with its name; None when there is none or the code does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = dotted_name(node.func)
            if name is not None and wanted(name):
                found.append(((node.lineno, node.col_offset), name, node))
    if not found:
        return None
    _, name, node = max(found, key=lambda x: x[0])
    return name, node


def call_key(name: str, call: ast.Call) -> str:
    """``name(arguments)`` as written, the arguments replaced by a digest when long."""
    args = ", ".join([ast.unparse(a) for a in call.args] + [ast.unparse(k) for k in call.keywords])
    key = f"{name}({args})"
    if len(key) > MAX_KEY_CHARS:
        key = f"{name}(#{hashlib.sha1(args.encode()).hexdigest()[:12]})"
    return key
