"""Reward functions and the RewardManager that runs them.

- :mod:`~hybridflow.rewards.registry`: reward functions by name, the calling convention;
- :mod:`~hybridflow.rewards.rule_based`: ``exact_match``, ``math_verify``, ``think_answer_format``;
- :mod:`~hybridflow.rewards.custom`: :func:`load_reward_function` from a file;
- :mod:`~hybridflow.rewards.shaping`: shaping by name (``overlong_penalty``, ``length_penalty``);
- :mod:`~hybridflow.rewards.config`, :mod:`~hybridflow.rewards.pool`, :mod:`~hybridflow.rewards.manager`:
  :class:`RewardConfig`, the worker pool, :class:`RewardManager`.

Every reward worker process imports this package. The names that need torch (the manager and the
shaping registry) are therefore loaded on first use, so a worker starts without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from hybridflow.rewards import code_execution, rule_based
from hybridflow.rewards.config import RewardConfig, ShapingSpec
from hybridflow.rewards.custom import load_reward_function
from hybridflow.rewards.registry import (
    REWARD_FUNCTIONS,
    get_reward_function,
    register_reward_function,
    resolve_reward_function,
)
from hybridflow.rewards.rule_based import exact_match_reward, math_verify_reward, think_answer_format_reward

_LAZY = {
    "RewardManager": "hybridflow.rewards.manager",
    "RewardFunctionFailingError": "hybridflow.rewards.manager",
    "REWARD_SHAPING": "hybridflow.rewards.shaping",
    "get_reward_shaping": "hybridflow.rewards.shaping",
    "register_reward_shaping": "hybridflow.rewards.shaping",
}

__all__ = [
    "REWARD_FUNCTIONS",
    "REWARD_SHAPING",
    "RewardConfig",
    "RewardFunctionFailingError",
    "RewardManager",
    "ShapingSpec",
    "code_execution",
    "exact_match_reward",
    "get_reward_function",
    "get_reward_shaping",
    "load_reward_function",
    "math_verify_reward",
    "register_reward_function",
    "register_reward_shaping",
    "resolve_reward_function",
    "rule_based",
    "think_answer_format_reward",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hybridflow.rewards' has no attribute {name!r}")
