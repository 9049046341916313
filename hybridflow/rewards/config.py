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
        abort_failure_rate: stop the run (``RewardFunctionFailingError``) when a reward function fails
            on at least this share of its rows over its last ``abort_window`` calls; ``None`` never
            stops. The default 1.0 stops only a function that fails on every row.
        abort_window: how many of a function's latest calls (those in which it scored rows) the failure
            share is taken over.
    """

    num_workers: int = 2
    timeout_s: float = 10.0
    fallback_score: float = 0.0
    default_fn: str | Callable[..., Any] = "exact_match"
    fn_by_source: Mapping[str, str | Callable[..., Any]] = field(default_factory=dict)
    shaping: tuple[ShapingSpec, ...] = ()
    kill_grace_s: float = 2.0
    abort_failure_rate: float | None = 1.0
    abort_window: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise ValueError(f"RewardConfig.num_workers must be an int >= 1, got {self.num_workers!r}")
        for key in ("timeout_s", "kill_grace_s"):
            value = getattr(self, key)
            if not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"RewardConfig.{key} must be a number > 0, got {value!r}")
        rate = self.abort_failure_rate
        if rate is not None and not (isinstance(rate, int | float) and 0 < rate <= 1):
            raise ValueError(f"RewardConfig.abort_failure_rate must be in (0, 1] or None, got {rate!r}")
        if not isinstance(self.abort_window, int) or self.abort_window < 1:
            raise ValueError(f"RewardConfig.abort_window must be an int >= 1, got {self.abort_window!r}")
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
