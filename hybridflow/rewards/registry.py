"""Reward functions by name, and resolving a config entry to a function.

Every reward function is called with keyword arguments (the convention of veRL's ``compute_score``,
so its custom reward files work unchanged)::

    score = fn(data_source=str, solution_str=str, ground_truth=Any, extra_info=dict | None)

and returns a real number (``bool`` counts as 0/1). A function may carry a ``prepare`` attribute (a
callable without arguments): each worker process calls it once at start, outside any sample's time
limit, for slow setup such as imports. A config names a function in one of three ways:

- a registered name (``"exact_match"``, ``"math_verify"``, ``"think_answer_format"``, or any name a
  recipe registered with :func:`register_reward_function`);
- ``"path/to/file.py:function_name"``, loaded with :func:`~hybridflow.rewards.custom.load_reward_function`;
- the function itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridflow.rewards.custom import load_reward_function

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFn",
    "get_reward_function",
    "is_file_spec",
    "register_reward_function",
    "resolve_reward_function",
]

RewardFn = Callable[..., Any]

REWARD_FUNCTIONS: dict[str, RewardFn] = {}


def register_reward_function(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward function under ``name``; a second function under the same name is an error."""

    def decorate(fn: RewardFn) -> RewardFn:
        if name in REWARD_FUNCTIONS and REWARD_FUNCTIONS[name] is not fn:
            raise ValueError(f"a reward function is already registered as {name!r}: {REWARD_FUNCTIONS[name]}")
        REWARD_FUNCTIONS[name] = fn
        return fn

    return decorate


def get_reward_function(name: str) -> RewardFn:
    """The function registered as ``name``; a KeyError lists the registered names otherwise."""
    if name not in REWARD_FUNCTIONS:
        raise KeyError(f"no reward function registered as {name!r}; registered: {sorted(REWARD_FUNCTIONS)}")
    return REWARD_FUNCTIONS[name]


def is_file_spec(spec: Any) -> bool:
    """Whether ``spec`` has the form ``"path/to/file.py:function_name"``."""
    return isinstance(spec, str) and ":" in spec and spec.rsplit(":", 1)[0].endswith(".py")


def resolve_reward_function(spec: str | RewardFn) -> RewardFn:
    """The function a config entry names (see the module docstring for the three forms)."""
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a reward function is named by a string or given as a callable, got {spec!r}")
    if is_file_spec(spec):
        path, name = spec.rsplit(":", 1)
        return load_reward_function(path, name)
    return get_reward_function(spec)
