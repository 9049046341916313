"""Timing the phases of a training step, and throughput in tokens per second.

Metric names:

- ``timing_s/<phase>``: seconds spent in the phase during the step (summed if it ran more than once);
- ``timing_s/step``: wall time of the whole step;
- ``timing_share/<phase>``: the phase's fraction of the step; ``timing_share/other`` is the untimed rest,
  so the shares of a step sum to 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

__all__ = ["PHASES", "PhaseTimer", "Timer", "throughput_metrics"]

PHASES = ("generation", "resharding", "reward", "log_prob", "ref", "values", "advantage", "update")
"""The phases of a PPO/GRPO step, in order; any other name is accepted too."""

Clock = Callable[[], float]


class Timer:
    """Wall-clock seconds of one block: ``with Timer() as t: ...`` then ``t.elapsed``."""

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self._clock = clock
        self._start = 0.0
        self.elapsed = 0.0

    def __enter__(self) -> Timer:
        self._start = self._clock()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.elapsed = self._clock() - self._start


class PhaseTimer:
    """Seconds per named phase of one training step::

        timer = PhaseTimer()
        with timer.step():
            with timer.phase("generation"):
                ...
            with timer.phase("update"):
                ...
        metrics = timer.metrics()

    Phases do not nest: the shares are fractions of one step, and a phase inside another would be
    counted twice. Entering ``step()`` starts a new step and forgets the previous one.
    """

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self._clock = clock
        self.seconds: dict[str, float] = {}
        self.step_seconds: float | None = None
        self._open: str | None = None

    @contextmanager
    def step(self) -> Iterator[None]:
        """Time a whole step; phases timed inside it are shares of its wall time."""
        self.seconds = {}
        self.step_seconds = None
        with Timer(self._clock) as timer:
            yield
        self.step_seconds = timer.elapsed

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time one phase of the step; a phase entered again adds to its time."""
        if self._open is not None:
            raise RuntimeError(f"phase {name!r} started inside phase {self._open!r}; phases must not nest")
        self._open = name
        try:
            with Timer(self._clock) as timer:
                yield
        finally:
            self._open = None
        self.seconds[name] = self.seconds.get(name, 0.0) + timer.elapsed

    def metrics(self) -> dict[str, float]:
        """``timing_s/*`` and ``timing_share/*`` of the last step.

        Without a ``step()`` around the phases, the step is taken to be the sum of the phases.
        """
        timed = sum(self.seconds.values())
        total = self.step_seconds if self.step_seconds is not None else timed
        out = {f"timing_s/{name}": seconds for name, seconds in self.seconds.items()}
        out["timing_s/step"] = total
        if total > 0:
            out.update({f"timing_share/{name}": seconds / total for name, seconds in self.seconds.items()})
            out["timing_share/other"] = max(total - timed, 0.0) / total
        return out


def throughput_metrics(
    *,
    total_tokens: int,
    response_tokens: int,
    step_seconds: float,
    generation_seconds: float | None = None,
    world_size: int = 1,
) -> dict[str, float]:
    """Tokens per second of a step.

    Args:
        total_tokens: prompt + response tokens of the step (padding excluded).
        response_tokens: generated tokens of the step.
        step_seconds: wall time of the step.
        generation_seconds: time of the generation phase, if timed.
        world_size: ranks that shared the work.

    Returns:
        ``perf/total_tokens``, ``perf/tokens_per_s``, ``perf/tokens_per_s_per_rank`` and, with
        ``generation_seconds``, ``perf/generation_tokens_per_s`` (response tokens over generation time).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    out = {"perf/total_tokens": float(total_tokens)}
    if step_seconds > 0:
        out["perf/tokens_per_s"] = total_tokens / step_seconds
        out["perf/tokens_per_s_per_rank"] = total_tokens / step_seconds / world_size
    if generation_seconds is not None and generation_seconds > 0:
        out["perf/generation_tokens_per_s"] = response_tokens / generation_seconds
    return out
