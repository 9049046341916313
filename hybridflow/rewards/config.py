"""`RewardConfig`: how the RewardManager scores, in one frozen dataclass."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["RewardConfig", "ShapingSpec"]


@dataclass(frozen=True)
class ShapingSpec:
    """One reward-shaping step: a name registered with ``register_reward_shaping`` and its keyword arguments."""

    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ShapingSpec.name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))


@dataclass(frozen=True)
class RewardConfig:
    """Configuration of :class:`~hybridflow.rewards.manager.RewardManager`.

    Attributes:
        num_workers: worker processes scoring in parallel.
        timeout_s: seconds one sample may take; past it the sample gets ``fallback_score``.
        fallback_score: the score of a sample whose function raised, timed out or returned a non-number.
        default_fn: reward function for data sources not in ``fn_by_source`` (a registered name,
            ``"file.py:function"`` or a callable; see :mod:`hybridflow.rewards.registry`).
        fn_by_source: reward function per ``data_source``.
        shaping: shaping steps applied in order to the scores (see :mod:`hybridflow.rewards.shaping`);
            ``ShapingSpec`` objects or ``{"name": ..., "kwargs": {...}}`` dicts.
        kill_grace_s: a worker still busy ``timeout_s + kill_grace_s`` seconds into one sample (its
            function ignored the in-process timeout) is killed and replaced.
    """

    num_workers: int = 2
    timeout_s: float = 10.0
    fallback_score: float = 0.0
    default_fn: str | Callable[..., Any] = "math_verify"
    fn_by_source: Mapping[str, str | Callable[..., Any]] = field(default_factory=dict)
    shaping: tuple[ShapingSpec, ...] = ()
    kill_grace_s: float = 2.0

    def __post_init__(self) -> None:
        if not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise ValueError(f"RewardConfig.num_workers must be an int >= 1, got {self.num_workers!r}")
        for key in ("timeout_s", "kill_grace_s"):
            value = getattr(self, key)
            if not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"RewardConfig.{key} must be a number > 0, got {value!r}")
        if not isinstance(self.fallback_score, int | float) or not math.isfinite(self.fallback_score):
            raise ValueError(
                f"RewardConfig.fallback_score must be a finite number, got {self.fallback_score!r}"
            )
        entries = [("default_fn", self.default_fn)]
        entries += [(f"fn_by_source[{source!r}]", spec) for source, spec in self.fn_by_source.items()]
        for key, spec in entries:
            if not (isinstance(spec, str) and spec) and not callable(spec):
                raise ValueError(
                    f"RewardConfig.{key} must be a registered name, 'file.py:function' or a callable, "
                    f"got {spec!r}"
                )
        steps = tuple(s if isinstance(s, ShapingSpec) else ShapingSpec(**s) for s in self.shaping)
        object.__setattr__(self, "shaping", steps)
        object.__setattr__(self, "fn_by_source", MappingProxyType(dict(self.fn_by_source)))
