"""When a failing reward function stops the run: on every row of its first call at once, after that
when its failures reach `abort_failure_rate` over `abort_window` calls; a hanging one is judged by its
first timeouts. One that fails on some rows, or a run that opted out, goes on."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from hybridflow.protocol import Batch
from hybridflow.rewards import RewardConfig, RewardFunctionFailingError, RewardManager
from hybridflow.rewards.pool import HANG_ROWS

FNS = f"{Path(__file__).with_name('reward_fns.py')}:"


def batch(truths: list[str], sources: list[str] | None = None) -> Batch:
    return Batch(
        {},
        {
            "response_text": [f"response {i}" for i in range(len(truths))],
            "ground_truth": truths,
            "data_source": sources or ["toy"] * len(truths),
        },
    )


def manager(fn: str, **settings) -> RewardManager:
    settings = {"num_workers": 2, "timeout_s": 0.3, "kill_grace_s": 1.0, **settings}
    return RewardManager(RewardConfig(default_fn=FNS + fn, **settings))


@pytest.mark.parametrize(
    ("fn", "failure", "example"),
    [
        ("raising", "raised ValueError", "ValueError: cannot score 'response 0'"),
        ("hanging", "timed out", "no result within 0.3 s"),
        ("wrong_type", "returned a non-number", "returned str, not a finite real number"),
        ("not_a_number", "returned a non-number", "returned float nan, not a finite real number"),
    ],
)
def test_a_function_failing_every_row_of_its_first_call_stops_there_whatever_the_window(fn, failure, example):
    with manager(fn, abort_window=10) as scorer, pytest.raises(RewardFunctionFailingError) as info:
        scorer(batch(["1"] * 2))
    assert info.value.function == FNS + fn
    assert info.value.most_common == failure
    assert str(info.value).startswith(
        f"reward function {FNS + fn!r} failed on 2 of 2 rows in its first call (judged on its own, "
        f"whatever abort_window=10); most common failure (2 rows): {failure}, e.g. {example!r}"
    )


def test_a_function_failing_95_percent_of_rows_stops_at_the_end_of_the_window():
    # echo_ground_truth raises on a ground truth that is not a number: 19 of 20 rows fail.
    rows = ["1"] + ["x"] * 19
    with manager("echo_ground_truth", abort_failure_rate=0.95, abort_window=3) as scorer:
        for _ in range(2):
            assert scorer(batch(rows))["scores"].tolist() == [1.0] + [0.0] * 19
        with pytest.raises(
            RewardFunctionFailingError, match=r"failed on 57 of 60 rows over its last 3 calls"
        ):
            scorer(batch(rows))


def test_a_failure_share_under_the_rate_goes_on():
    rows = ["1", "2"] + ["x"] * 18  # 90%
    with manager("echo_ground_truth", abort_failure_rate=0.95, abort_window=2) as scorer:
        for _ in range(4):
            assert scorer(batch(rows))["scores"].tolist() == [1.0, 2.0] + [0.0] * 18


def test_partial_failures_go_on_by_default_and_stop_at_a_lower_rate():
    half_bad = ["1", "x", "2", "y"]
    with manager("echo_ground_truth") as scorer:
        for _ in range(4):
            assert scorer(batch(half_bad))["scores"].tolist() == [1.0, 0.0, 2.0, 0.0]
    with manager("echo_ground_truth", abort_failure_rate=0.5, abort_window=2) as scorer:
        scorer(batch(half_bad))
        with pytest.raises(RewardFunctionFailingError, match=r"failed on 4 of 8 rows over its last 2 calls"):
            scorer(batch(half_bad))


def test_a_good_call_inside_the_window_keeps_the_run_going():
    with manager("echo_ground_truth") as scorer:
        for truths in (["1", "x", "x"], ["x"] * 3, ["1"] * 3, ["x"] * 3, ["x"] * 3):
            scorer(batch(truths))
        with pytest.raises(RewardFunctionFailingError, match=r"failed on 9 of 9 rows over its last 3 calls"):
            scorer(batch(["x"] * 3))


@pytest.mark.parametrize("fn", ["hanging", "hanging_deaf_to_alarm"])
def test_a_hanging_function_stops_within_a_few_timeouts_not_rows_times_timeout(fn):
    workers, timeout_s, kill_grace_s, rows = 2, 0.5, 1.0, 120
    config = RewardConfig(
        num_workers=workers,
        timeout_s=timeout_s,
        kill_grace_s=kill_grace_s,
        default_fn=FNS + "echo_ground_truth",
        fn_by_source={"hangs": FNS + fn},
    )
    # Judged after its first HANG_ROWS results, which come in waves of `workers` rows, each at most
    # timeout_s + kill_grace_s long; the rest is slack for starting replacement workers on a busy host.
    bound_s = math.ceil(HANG_ROWS / workers) * (timeout_s + kill_grace_s) + 6.0
    # What running every row would cost, even with the alarm working: the old behaviour, per call.
    assert rows * timeout_s / workers > 2 * bound_s
    with RewardManager(config) as scorer:
        assert scorer(batch(["1", "2"]))["scores"].tolist() == [1.0, 2.0]  # workers up
        started = time.monotonic()
        with pytest.raises(
            RewardFunctionFailingError, match=f"failed on {rows} of {rows} rows in its first call"
        ):
            scorer(batch(["1"] * rows, ["hangs"] * rows))
        elapsed = time.monotonic() - started
    assert elapsed < bound_s, f"took {elapsed:.1f} s, bound {bound_s:.1f} s"


def test_a_function_that_scored_first_is_not_cut_short_by_later_timeouts():
    # One worker scores in order: the first row scores, then the hangs run to their timeouts.
    truths = ["1", "h", "h", "h", "h", "2"]
    with manager("hanging_unless_number", num_workers=1, abort_failure_rate=None) as scorer:
        out = scorer(batch(truths))
    assert out["scores"].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 2.0]
    assert list(out["reward_status"]) == ["ok", "timeout", "timeout", "timeout", "timeout", "ok"]


def test_after_its_first_rows_time_out_the_rest_of_the_call_is_not_run():
    rows, timeout_s = 40, 0.3
    with manager("hanging_unless_number", num_workers=1, abort_failure_rate=None) as scorer:
        assert scorer(batch(["1"]))["scores"].tolist() == [1.0]  # worker up
        started = time.monotonic()
        out = scorer(batch(["h"] * rows))
        elapsed = time.monotonic() - started
        # The next call judges afresh.
        assert scorer(batch(["4", "h"]))["scores"].tolist() == [4.0, 0.0]
    assert list(out["reward_status"]) == ["timeout"] * rows
    assert out.meta["reward_metrics"]["reward/timeouts"] == rows
    # HANG_ROWS alarms and a worker's restart, not the rows * timeout_s = 12 s of running every row.
    assert elapsed < HANG_ROWS * timeout_s + 4.0


def test_the_check_can_be_switched_off():
    with manager("raising", abort_failure_rate=None) as scorer:
        for _ in range(4):
            assert scorer(batch(["1"] * 2))["scores"].tolist() == [0.0, 0.0]


def test_only_the_failing_function_is_named():
    config = RewardConfig(
        num_workers=1,
        default_fn=FNS + "echo_ground_truth",
        fn_by_source={"broken": FNS + "raising"},
    )
    rows = Batch(
        {}, {"response_text": ["a", "b"], "ground_truth": ["1", "1"], "data_source": ["toy", "broken"]}
    )
    with (
        RewardManager(config) as scorer,
        pytest.raises(
            RewardFunctionFailingError,
            match=r"'.*reward_fns\.py:raising' failed on 1 of 1 rows in its first call",
        ),
    ):
        scorer(rows)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"abort_failure_rate": 0.0}, r"\.abort_failure_rate\b.*got 0\.0"),
        ({"abort_failure_rate": 1.5}, r"\.abort_failure_rate\b.*got 1\.5"),
        ({"abort_window": 0}, r"\.abort_window\b.*got 0"),
    ],
)
def test_bad_settings_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        RewardConfig(**settings)
