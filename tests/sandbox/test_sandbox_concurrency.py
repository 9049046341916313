"""Sandboxed runs overlap in time: four 2-second sleeps submitted together finish together, not one by one."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from hybridflow.sandbox import Outcome, Sandbox, SandboxLimits

SLEEP = 2.0
RUNS = 4


def _timed(sandbox: Sandbox) -> tuple[float, float, Outcome]:
    start = time.monotonic()
    result = sandbox.run(["/usr/bin/sleep", str(SLEEP)])
    return start, time.monotonic(), result.outcome


def test_threaded_runs_overlap():
    sandbox = Sandbox(SandboxLimits(wall_seconds=30.0))
    with ThreadPoolExecutor(max_workers=RUNS) as pool:
        spans = [future.result() for future in [pool.submit(_timed, sandbox) for _ in range(RUNS)]]
    assert all(outcome is Outcome.OK for _, _, outcome in spans)
    assert all(end - start >= SLEEP for start, end, _ in spans)
    # All four are running at one instant: the last start precedes the first end.
    assert max(start for start, _, _ in spans) < min(end for _, end, _ in spans)
    # One by one they would take RUNS * SLEEP = 8 s.
    assert max(end for _, end, _ in spans) - min(start for start, _, _ in spans) < (RUNS - 1) * SLEEP


def test_async_runs_overlap():
    sandbox = Sandbox(SandboxLimits(wall_seconds=30.0), max_workers=RUNS)

    async def gather() -> float:
        start = time.monotonic()
        results = await asyncio.gather(
            *(sandbox.run_async(["/usr/bin/sleep", str(SLEEP)]) for _ in range(RUNS))
        )
        assert [result.outcome for result in results] == [Outcome.OK] * RUNS
        return time.monotonic() - start

    try:
        elapsed = asyncio.run(gather())
    finally:
        sandbox.close()
    assert SLEEP <= elapsed < (RUNS - 1) * SLEEP
