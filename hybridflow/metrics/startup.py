"""Where the time before a run's first step goes: ``startup/<part>_s`` and ``startup/total_s``."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from hybridflow.metrics.timing import Clock

__all__ = ["STARTUP_PREFIX", "StartupTimer", "process_age_s"]

STARTUP_PREFIX = "startup/"


class StartupTimer:
    """Seconds of the named parts of a start-up, in the order they first ran::

        startup = StartupTimer()          # the clock starts here
        startup.add("ray", 2.5)           # a part measured elsewhere, before
        load_models()
        startup.lap("model")              # the time since the timer started or the last lap
        start_engine()
        startup.lap("engine")
        startup.metrics()   # {"startup/ray_s": 2.5, "startup/model_s": ..., "startup/engine_s": ...,
                            #  "startup/total_s": ...}

    Laps cover the time since the timer started end to end, so ``startup/total_s`` (the sum of all
    parts) is the wall time before the first step when the parts added cover what ran before the
    timer. A part counted twice accumulates.
    """

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self._clock = clock
        self._last = clock()
        self.seconds: dict[str, float] = {}

    def add(self, part: str, seconds: float) -> None:
        """Count ``seconds`` (wall time, >= 0) towards ``part``."""
        if not part or "/" in part:
            raise ValueError(f"a start-up part is a non-empty name without '/', got {part!r}")
        if seconds < 0:
            raise ValueError(f"start-up part {part!r}: seconds must be >= 0, got {seconds}")
        self.seconds[part] = self.seconds.get(part, 0.0) + seconds

    def lap(self, part: str, within: Mapping[str, float] | None = None) -> float:
        """Count the seconds since the timer started or since the last lap towards ``part``; returns them.

        ``within`` names shares of the lap measured inside it (by another process, say): each counts
        towards its own part and ``part`` gets the rest. They must fit in the lap.
        """
        now = self._clock()
        seconds = now - self._last
        self._last = now
        within = within or {}
        inner = sum(within.values())
        if inner > seconds:
            raise ValueError(f"start-up lap {part!r}: parts {dict(within)} exceed the lap's {seconds:.3f} s")
        for name, share in within.items():
            self.add(name, share)
        self.add(part, seconds - inner)
        return seconds

    def metrics(self) -> dict[str, float]:
        """``startup/<part>_s`` for every part, in order, then ``startup/total_s``."""
        out = {f"{STARTUP_PREFIX}{part}_s": seconds for part, seconds in self.seconds.items()}
        out[f"{STARTUP_PREFIX}total_s"] = sum(self.seconds.values())
        return out


def process_age_s() -> float | None:
    """Seconds since this process started (its interpreter start and imports included), from
    ``/proc/self/stat``; None where there is no ``/proc``. Resolution: one clock tick (10 ms)."""
    try:
        stat = Path("/proc/self/stat").read_text()
    except OSError:
        return None
    # Field 22 (start time, in clock ticks since boot); the command name before it may hold spaces.
    started_ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
