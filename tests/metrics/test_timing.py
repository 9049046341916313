"""Phase timers: seconds per phase, shares of the step that sum to 1, throughput."""

from __future__ import annotations

import pytest

from hybridflow.metrics import PhaseTimer, Timer, throughput_metrics


class FakeClock:
    """A clock that moves only when told, so timings are exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_timer_measures_the_block():
    clock = FakeClock()
    with Timer(clock) as timer:
        clock.now += 2.5
    assert timer.elapsed == 2.5


def test_phase_seconds_and_shares_of_the_step():
    clock = FakeClock()
    timer = PhaseTimer(clock)
    with timer.step():
        with timer.phase("generation"):
            clock.now += 6.0
        clock.now += 1.0  # untimed work between phases
        with timer.phase("update"):
            clock.now += 2.0
        with timer.phase("generation"):  # a second visit adds up
            clock.now += 1.0
    metrics = timer.metrics()
    assert metrics["timing_s/generation"] == 7.0
    assert metrics["timing_s/update"] == 2.0
    assert metrics["timing_s/step"] == 10.0
    assert metrics["timing_share/generation"] == pytest.approx(0.7)
    assert metrics["timing_share/update"] == pytest.approx(0.2)
    assert metrics["timing_share/other"] == pytest.approx(0.1)
    shares = [value for key, value in metrics.items() if key.startswith("timing_share/")]
    assert sum(shares) == pytest.approx(1.0)


def test_without_a_step_the_phases_make_the_whole():
    clock = FakeClock()
    timer = PhaseTimer(clock)
    for phase, seconds in (("reward", 1.0), ("log_prob", 3.0)):
        with timer.phase(phase):
            clock.now += seconds
    metrics = timer.metrics()
    assert metrics["timing_s/step"] == 4.0
    assert metrics["timing_share/log_prob"] == 0.75
    assert metrics["timing_share/other"] == 0.0


def test_a_new_step_forgets_the_previous_one():
    clock = FakeClock()
    timer = PhaseTimer(clock)
    with timer.step(), timer.phase("ref"):
        clock.now += 1.0
    with timer.step(), timer.phase("values"):
        clock.now += 2.0
    assert "timing_s/ref" not in timer.metrics()
    assert timer.metrics()["timing_s/values"] == 2.0


def test_nested_phases_are_refused():
    timer = PhaseTimer(FakeClock())
    with pytest.raises(RuntimeError, match="phase 'resharding' started inside phase 'update'"):  # noqa: SIM117
        with timer.phase("update"), timer.phase("resharding"):
            pass
    with timer.phase("update"):  # the timer is usable again after the error
        pass


def test_throughput():
    metrics = throughput_metrics(
        total_tokens=3000, response_tokens=1000, step_seconds=2.0, generation_seconds=0.5, world_size=2
    )
    assert metrics == {
        "perf/total_tokens": 3000.0,
        "perf/tokens_per_s": 1500.0,
        "perf/tokens_per_s_per_rank": 750.0,
        "perf/generation_tokens_per_s": 2000.0,
    }
