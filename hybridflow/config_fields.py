"""What every config section is made of: fields whose default and numeric bounds are declared once,
beside the field, and the read-only mapping that sections hold instead of dicts.

The component sections (``hybridflow.rollout.RolloutConfig``, ``workers.config.ActorConfig``, ...) and
the trainer's own sections (``trainer.config.schema``) use these alike. The bounds are checked by
`bound_violation`, and by nothing else: on load (``trainer.config.convert``, which names the YAML key)
and when a component builds a section by hand (`check_bounds`, from the section's ``__post_init__``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Literal

__all__ = ["Dtype", "FrozenMap", "bound_violation", "check_bounds", "config_field", "freeze"]

Dtype = Literal["float32", "bfloat16", "float16"]
"""A torch dtype by name, as the config writes it."""

_BOUNDS = {
    "ge": (">=", lambda value, limit: value >= limit),
    "gt": (">", lambda value, limit: value > limit),
    "le": ("<=", lambda value, limit: value <= limit),
}


def config_field(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None) -> Any:
    """A dataclass field with its default and its numeric bounds (``ge``, ``gt``, ``le``)."""
    bounds = {name: limit for name, limit in (("ge", ge), ("gt", gt), ("le", le)) if limit is not None}
    return dataclasses.field(default=default, metadata={"bounds": bounds})


def bound_violation(bounds: Mapping[str, float], value: Any) -> str | None:
    """Why ``value`` breaks ``bounds`` (``"must be >= 1, got 0"``), or None; only numbers are bounded."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    if all(_BOUNDS[name][1](value, limit) for name, limit in bounds.items()):
        return None
    allowed = " and ".join(f"{_BOUNDS[name][0]} {limit}" for name, limit in bounds.items())
    return f"must be {allowed}, got {value}"


def check_bounds(section: Any, prefix: str) -> None:
    """Check the bounds of every field of the dataclass ``section``, whose keys sit under ``prefix``.

    Raises:
        ValueError: naming the first key out of bounds, e.g. ``rollout.tp_size: must be >= 1, got 0``.
    """
    for spec in dataclasses.fields(section):
        problem = bound_violation(spec.metadata.get("bounds", {}), getattr(section, spec.name))
        if problem is not None:
            raise ValueError(f"{prefix}.{spec.name}: {problem}")


class FrozenMap(Mapping[str, Any]):
    """A read-only mapping that pickles (Ray ships config sections to workers; ``MappingProxyType`` cannot)."""

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
