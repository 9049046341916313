"""`FrozenMap`: the read-only mapping that config sections hold instead of dicts."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["FrozenMap", "freeze"]


class FrozenMap(Mapping[str, Any]):
    """A read-only mapping that pickles (Ray ships configs to workers; ``MappingProxyType`` cannot)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._items = dict(items or {})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


def freeze(value: Any) -> Any:
    """``value`` with every mapping made a :class:`FrozenMap` and every list a tuple, recursively."""
    if isinstance(value, Mapping):
        return FrozenMap({key: freeze(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(item) for item in value)
    return value
