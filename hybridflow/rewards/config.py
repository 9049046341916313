"""The ``reward`` section of a run config, which is the `RewardManager`'s own settings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hybridflow.config_fields import FrozenMap, check_bounds, config_field

__all__ = ["RewardConfig", "ShapingSpec"]


@dataclass(frozen=True)
class ShapingSpec:
    """One reward-shaping step: a name registered with ``register_reward_shaping`` and its keyword arguments."""

    name: str = ""
    kwargs: Mapping[str, Any] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kwargs", FrozenMap(self.kwargs))


@dataclass(frozen=True)
class RewardConfig:
    """How samples are scored: the settings of :class:`~hybridflow.rewards.manager.RewardManager`.

    Attributes:
        default_fn: reward function for data sources not in ``fn_by_source`` (a registered name,
            ``"file.py:function"`` or, built by hand, a callable; see :mod:`hybridflow.rewards.registry`).
        fn_by_source: reward function per ``data_source``.
        timeout_s: seconds one sample may take; past it the sample gets ``fallback_score``.
        fallback_score: the score of a sample whose function raised, timed out or returned a non-number.
        num_workers: worker processes scoring in parallel.
        kill_grace_s: a worker still busy ``timeout_s + kill_grace_s`` seconds into one sample (its
            function ignored the in-process timeout) is killed and replaced.
        shaping: shaping steps applied in order to the scores (see :mod:`hybridflow.rewards.shaping`);
            ``ShapingSpec`` objects or ``{"name": ..., "kwargs": {...}}`` dicts.
        abort_failure_rate: stop the run (``RewardFunctionFailingError``) when a reward function fails
            on at least this share of its rows over its last ``abort_window`` calls; ``None`` never
            stops (and switches off the first-call rule too). The default 0.95 also stops a function
            that fails on 95% of its rows or more, which a share of 1.0 would train on for ever. Two
            rules act sooner: a function failing on every row of its first call stops at once, whatever
            the window, and within one call a function whose first
            :data:`~hybridflow.rewards.pool.HANG_ROWS` results all timed out is not run on the rest of
            that call's rows (they count as timed out).
        abort_window: how many of a function's latest calls (those in which it scored rows) the failure
            share is taken over.
    """

    default_fn: str | Callable[..., Any] = "exact_match"
    fn_by_source: Mapping[str, str | Callable[..., Any]] = field(default_factory=FrozenMap)
    timeout_s: float = config_field(10.0, gt=0)
    fallback_score: float = 0.0
    num_workers: int = config_field(2, ge=1)
    kill_grace_s: float = config_field(2.0, gt=0)
    shaping: tuple[ShapingSpec, ...] = ()
    abort_failure_rate: float | None = config_field(0.95, gt=0, le=1)
    abort_window: int = config_field(3, ge=1)

    def __post_init__(self) -> None:
        check_bounds(self, "reward")
        steps = tuple(s if isinstance(s, ShapingSpec) else ShapingSpec(**s) for s in self.shaping)
        object.__setattr__(self, "shaping", steps)
        object.__setattr__(self, "fn_by_source", FrozenMap(self.fn_by_source))
