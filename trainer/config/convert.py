"""Converting a plain tree (dicts, lists, scalars) onto the schema dataclasses, reporting every misfit.

Checked here, per value: unknown keys (with a close-match suggestion), types (an integer is accepted
where a number is expected, a boolean never is), choices of ``Literal`` fields and the numeric bounds
declared in each field's metadata. A value that does not fit is reported and its default stands in, so
the rest of the tree is still checked.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import types
from collections.abc import Mapping
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from hybridflow.config_fields import FrozenMap, bound_violation, freeze
from trainer.config.problems import Problems

__all__ = ["build"]

_INVALID = object()


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def build(cls: type, data: Mapping[str, Any], prefix: str, problems: Problems) -> Any:
    """Instantiate dataclass ``cls`` from ``data``, whose keys sit under ``prefix`` in the config."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in data:
        if name not in fields:
            problems.reject(_join(prefix, str(name)), _unknown_key_message(str(name), prefix, list(fields)))
    kwargs: dict[str, Any] = {}
    for name, spec in fields.items():
        if name not in data:
            continue
        key = _join(prefix, name)
        value = _convert(_hints(cls)[name], data[name], key, problems)
        if value is not _INVALID and _within_bounds(spec.metadata.get("bounds", {}), value, key, problems):
            kwargs[name] = value
    return cls(**kwargs)


def _unknown_key_message(name: str, prefix: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1)
    if close:
        return f"unknown key; did you mean {_join(prefix, close[0])!r}?"
    return f"unknown key; valid keys here: {', '.join(valid)}"


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join("null" if arg is type(None) else _describe(arg) for arg in _from_text(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in get_args(tp))
    if origin is tuple:
        return f"a list of ({_describe(get_args(tp)[0])})"
    if origin is Mapping or dataclasses.is_dataclass(tp):
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _convert(tp: Any, value: Any, key: str, problems: Problems, expected: str | None = None) -> Any:
    """``value`` checked against annotation ``tp`` and frozen; ``_INVALID`` (after reporting) if it misfits.

    ``expected`` describes the declared type in the message when ``tp`` is only part of it.
    """
    origin = get_origin(tp)
    if tp is Any:
        return freeze(value)
    if origin in (Union, types.UnionType):
        # A section's unions are ``X | None``, or ``str | Callable``, whose callable a file cannot hold.
        if value is None and type(None) in get_args(tp):
            return None
        (inner,) = [arg for arg in _from_text(tp) if arg is not type(None)]
        return _convert(inner, value, key, problems, expected or _describe(tp))
    if origin is Literal:
        return _convert_choice(tp, value, key, problems)
    if dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
        return build(tp, value, key, problems)
    if origin is tuple and isinstance(value, list | tuple):
        items = [_convert(get_args(tp)[0], item, f"{key}[{i}]", problems) for i, item in enumerate(value)]
        return _INVALID if any(item is _INVALID for item in items) else tuple(items)
    if origin is Mapping and isinstance(value, Mapping):
        items = {str(k): _convert(get_args(tp)[1], v, _join(key, str(k)), problems) for k, v in value.items()}
        return _INVALID if any(item is _INVALID for item in items.values()) else FrozenMap(items)
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    # bool is a subclass of int, but `true` where a count belongs is a mistake, not a 1.
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (bool, str) and isinstance(value, tp):
        return value
    problems.reject(key, f"expected {expected or _describe(tp)}, got {value!r} ({type(value).__name__})")
    return _INVALID


def _convert_choice(tp: Any, value: Any, key: str, problems: Problems) -> Any:
    choices = get_args(tp)
    if value in choices:
        return value
    close = difflib.get_close_matches(str(value), [str(choice) for choice in choices], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    problems.reject(key, f"expected {_describe(tp)}, got {value!r}{hint}")
    return _INVALID


def _from_text(tp: Any) -> tuple[Any, ...]:
    """The members of union ``tp`` that a YAML value can be: all but callables (given in code only)."""
    return tuple(arg for arg in get_args(tp) if get_origin(arg) is not collections.abc.Callable)


def _within_bounds(bounds: Mapping[str, float], value: Any, key: str, problems: Problems) -> bool:
    problem = bound_violation(bounds, value)
    if problem is not None:
        problems.reject(key, problem)
    return problem is None
