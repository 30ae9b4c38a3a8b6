"""A tiny name → object registry, filled by decorators, so callers never grow if-ladders."""
from __future__ import annotations

from typing import Generic, TypeVar
from collections.abc import Callable, Iterator

from .errors import InputError
from .plugins import load_plugins

T = TypeVar("T")


class Registry(Generic[T]):
    """`plugins`: a group of `core.plugins.PLUGINS` imported on first lookup (they fill this registry)."""

    def __init__(self, kind: str, plugins: str | None = None):
        self.kind = kind
        self.plugins = plugins
        self._items: dict[str, T] = {}

    def _load(self) -> None:
        if self.plugins:
            group, self.plugins = self.plugins, None   # once; set before importing, which registers here
            load_plugins(group)

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            return obj
        return add

    def get(self, name: str) -> T:
        self._load()
        try:
            return self._items[name]
        except KeyError:
            raise InputError(f"unknown {self.kind} {name!r}",
                             f"choose one of: {', '.join(sorted(self._items))}") from None

    def names(self) -> list[str]:
        self._load()
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._items

    def __iter__(self) -> Iterator[tuple[str, T]]:
        self._load()
        return iter(sorted(self._items.items()))
