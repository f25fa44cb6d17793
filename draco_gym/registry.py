"""Name -> implementation tables, so a config string picks a component (verl style).

Credit rules, rewards and judges each keep one ``Registry``; a new method joins with a
decorator (``@CREDIT_RULES.register("draco")``) instead of another branch in an if/elif
chain, and an unknown name fails with the list of names that do exist.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(self.unknown(name)) from None

    def unknown(self, name: str) -> str:
        hint = difflib.get_close_matches(str(name), list(self._entries), n=1)
        close = f" Did you mean {hint[0]!r}?" if hint else ""
        return f"unknown {self.kind} {name!r}; known: {sorted(self._entries)}.{close}"

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def names(self) -> list[str]:
        return sorted(self._entries)


def import_object(spec: str, what: str):
    """The object a ``"module:name"`` string names (a YAML config can only give names);
    ``ValueError`` naming ``what`` when the string is malformed or names nothing."""
    import importlib

    module, sep, name = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not sep or not module or not name:
        raise ValueError(f"{what} {spec!r} must be written 'module:name'")
    try:
        target = importlib.import_module(module)
        for part in name.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{what} {spec!r}: {exc}") from None
    return target
