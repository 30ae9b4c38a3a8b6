"""A tiny name → object registry, filled by decorators, so callers never grow if-ladders."""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from .errors import InputError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            return obj
        return add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise InputError(f"unknown {self.kind} {name!r}",
                             f"choose one of: {', '.join(sorted(self._items))}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[tuple[str, T]]:
        return iter(sorted(self._items.items()))
