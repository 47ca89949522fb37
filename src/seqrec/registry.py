"""A name -> object table with helpful errors; models register themselves by decorator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, unknown_hint: str = "") -> None:
        self._kind = kind
        self._unknown_hint = unknown_hint  # appended to the error for an unknown name
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries and not _same_definition(self._entries[name], obj):
                raise KeyError(f"{self._kind} {name!r} is already registered")
            self._entries[name] = obj  # the same definition again: a module imported anew
            return obj

        return add

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            available = ", ".join(sorted(self._entries))
            hint = f" ({self._unknown_hint})" if self._unknown_hint else ""
            raise KeyError(f"unknown {self._kind} {name!r}; available: {available}{hint}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


def _same_definition(old: object, new: object) -> bool:
    """Whether ``new`` is ``old`` defined again (its module reloaded, a notebook cell run
    twice): the same module and qualified name."""
    names = ("__module__", "__qualname__")
    return all(getattr(old, n, None) == getattr(new, n, object()) for n in names)
