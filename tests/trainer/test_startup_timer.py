"""The start-up report's pieces without a cluster: `StartupTimer`, `process_age_s`, the console line."""

from __future__ import annotations

import subprocess
import sys
import time
from io import StringIO

import pytest

from hybridflow.metrics.loggers import ConsoleLogger
from hybridflow.metrics.startup import StartupTimer, process_age_s


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_laps_cover_the_time_end_to_end_and_added_parts_come_first_in_order():
    clock = FakeClock()
    startup = StartupTimer(clock)
    startup.add("ray", 2.5)
    clock.now = 101.0
    assert startup.lap("data") == 1.0
    clock.now = 108.0
    # 7 s of which the workers measured 4 s of model loading: the engine gets the other 3.
    assert startup.lap("engine", within={"model": 4.0}) == 7.0
    clock.now = 108.5
    startup.lap("data")
    assert startup.metrics() == {
        "startup/ray_s": 2.5,
        "startup/data_s": 1.5,
        "startup/model_s": 4.0,
        "startup/engine_s": 3.0,
        "startup/total_s": 11.0,
    }
    assert list(startup.metrics()) == [
        "startup/ray_s", "startup/data_s", "startup/model_s", "startup/engine_s", "startup/total_s"
    ]


def test_bad_parts_are_refused_with_the_part_named():
    clock = FakeClock()
    startup = StartupTimer(clock)
    with pytest.raises(ValueError, match="'ray': seconds must be >= 0"):
        startup.add("ray", -1.0)
    with pytest.raises(ValueError, match="without '/'"):
        startup.add("a/b", 1.0)
    clock.now = 101.0
    with pytest.raises(ValueError, match=r"lap 'engine': parts \{'model': 2.0\} exceed the lap's 1.000 s"):
        startup.lap("engine", within={"model": 2.0})


def test_process_age_counts_from_the_process_start():
    # The child reports its age after sleeping 1.5 s; the parent's clock brackets the child's life.
    code = "import time; time.sleep(1.5); from hybridflow.metrics.startup import process_age_s; print(process_age_s())"
    before = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lifetime = time.monotonic() - before
    age = float(out.stdout)
    assert 1.5 <= age <= lifetime + 0.02
    assert process_age_s() > 0


def test_the_console_line_lists_every_startup_part_once():
    stream = StringIO()
    console = ConsoleLogger(total_steps=10, stream=stream, progress=False)
    metrics = {"val/accuracy": 0.25, "startup/ray_s": 2.5, "startup/engine_s": 3.25, "startup/total_s": 5.75}
    console.log(metrics, 0)
    assert stream.getvalue() == (
        "step 0/10 | val/accuracy 0.25 | startup/ray_s 2.5 | startup/engine_s 3.25 | startup/total_s 5.75\n"
    )
