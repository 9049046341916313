"""Reward shaping: functions that adjust the scores after every sample has been scored.

A shaping function is registered by name and called as::

    new_scores = fn(scores, batch, **kwargs)

with ``scores`` a float32 tensor ``[batch]`` and ``batch`` the scored :class:`~hybridflow.protocol.Batch`
(read its columns, e.g. ``response_mask [batch, response_len]``); it returns float32 ``[batch]``. The
keyword arguments come from the config's :class:`~hybridflow.rewards.config.ShapingSpec`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from hybridflow.protocol import Batch

__all__ = [
    "REWARD_SHAPING",
    "check_shaping_arguments",
    "get_reward_shaping",
    "length_penalty",
    "overlong_penalty",
    "register_reward_shaping",
    "response_lengths",
]

ShapingFn = Callable[..., torch.Tensor]

REWARD_SHAPING: dict[str, ShapingFn] = {}


def register_reward_shaping(name: str) -> Callable[[ShapingFn], ShapingFn]:
    """Decorator registering a shaping function under ``name``; a second function under the same name is an error."""

    def decorate(fn: ShapingFn) -> ShapingFn:
        if name in REWARD_SHAPING and REWARD_SHAPING[name] is not fn:
            raise ValueError(f"a reward shaping is already registered as {name!r}: {REWARD_SHAPING[name]}")
        REWARD_SHAPING[name] = fn
        return fn

    return decorate


def get_reward_shaping(name: str) -> ShapingFn:
    """The shaping function registered as ``name``; a KeyError lists the registered names otherwise."""
    if name not in REWARD_SHAPING:
        raise KeyError(f"no reward shaping registered as {name!r}; registered: {sorted(REWARD_SHAPING)}")
    return REWARD_SHAPING[name]


def check_shaping_arguments(name: str, kwargs: Mapping[str, Any]) -> None:
    """Raise a TypeError naming the shaping if ``kwargs`` do not fit its signature."""
    fn = get_reward_shaping(name)
    try:
        inspect.signature(fn).bind(None, None, **kwargs)
    except TypeError as error:
        raise TypeError(
            f"reward shaping {name!r} cannot take the arguments {dict(kwargs)}: {error}"
        ) from None


def response_lengths(batch: Batch, shaping: str) -> torch.Tensor:
    """Response lengths in tokens, float32 ``[batch]``, from ``response_mask [batch, response_len]``."""
    if "response_mask" not in batch:
        raise KeyError(f"reward shaping {shaping!r} needs the column 'response_mask' [batch, response_len]")
    return batch["response_mask"].sum(dim=-1).to(torch.float32)


@register_reward_shaping("overlong_penalty")
def overlong_penalty(
    scores: torch.Tensor,
    batch: Batch,
    *,
    max_response_length: int,
    cache_length: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13), added to the scores.

    With ``L`` the response length, ``L_max = max_response_length`` and ``L_cache = cache_length``
    (all in tokens) the penalty is 0 up to ``L_max - L_cache``, falls linearly to ``-penalty_factor``
    at ``L_max``, and stays there beyond.
    """
    if not 0 < cache_length <= max_response_length:
        raise ValueError(
            f"overlong_penalty needs 0 < cache_length <= max_response_length, got {cache_length}, {max_response_length}"
        )
    lengths = response_lengths(batch, "overlong_penalty")
    ramp = ((max_response_length - cache_length) - lengths) / cache_length
    return scores + penalty_factor * ramp.clamp(min=-1.0, max=0.0)


@register_reward_shaping("length_penalty")
def length_penalty(
    scores: torch.Tensor, batch: Batch, *, coef: float, max_response_length: int
) -> torch.Tensor:
    """Subtract ``coef * L / max_response_length`` (``L`` the response length in tokens): shorter is better."""
    lengths = response_lengths(batch, "length_penalty")
    return scores - coef * lengths / max_response_length
