"""Tools by name: a recipe registers a tool class, a config names it.

The built-in tools are ``calculator`` (:class:`~hybridflow.tools.calculator.Calculator`) and
``python`` (:class:`~hybridflow.tools.python_interpreter.PythonInterpreter`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridflow.tools.base import Tool

__all__ = ["TOOLS", "get_tool", "make_tool", "register_tool"]

TOOLS: dict[str, type[Tool]] = {}


def register_tool(name: str) -> Callable[[type[Tool]], type[Tool]]:
    """Class decorator registering a tool under ``name``; a second class under the same name is an error."""

    def decorate(cls: type[Tool]) -> type[Tool]:
        if name in TOOLS and TOOLS[name] is not cls:
            raise ValueError(f"a tool is already registered as {name!r}: {TOOLS[name]}")
        cls.name = name
        TOOLS[name] = cls
        return cls

    return decorate


def get_tool(name: str) -> type[Tool]:
    """The tool class registered as ``name``; a KeyError lists the registered names otherwise."""
    if name not in TOOLS:
        raise KeyError(f"no tool registered as {name!r}; registered: {sorted(TOOLS)}")
    return TOOLS[name]


def make_tool(name: str, **kwargs: Any) -> Tool:
    """A new instance of the tool registered as ``name``, built with ``kwargs``."""
    return get_tool(name)(**kwargs)
