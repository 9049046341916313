"""A reward function that fails on every row stops the run after `abort_window` calls, naming itself and
its most common failure; one that fails on some rows, or a run that opted out, goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.protocol import Batch
from hybridflow.rewards import RewardConfig, RewardFunctionFailingError, RewardManager

FNS = f"{Path(__file__).with_name('reward_fns.py')}:"


def batch(truths: list[str]) -> Batch:
    return Batch(
        {},
        {
            "response_text": [f"response {i}" for i in range(len(truths))],
            "ground_truth": truths,
            "data_source": ["toy"] * len(truths),
        },
    )


def manager(fn: str, **settings) -> RewardManager:
    return RewardManager(
        RewardConfig(num_workers=2, timeout_s=0.3, kill_grace_s=1.0, default_fn=FNS + fn, **settings)
    )


@pytest.mark.parametrize(
    ("fn", "failure", "example"),
    [
        ("raising", "raised ValueError", "ValueError: cannot score 'response 0'"),
        ("hanging", "timed out", "no result within 0.3 s"),
        ("wrong_type", "returned a non-number", "returned str, not a finite real number"),
        ("not_a_number", "returned a non-number", "returned float nan, not a finite real number"),
    ],
)
def test_a_function_failing_every_row_stops_on_the_third_call(fn, failure, example):
    with manager(fn) as scorer:
        for _ in range(2):
            assert scorer(batch(["1"] * 4))["scores"].tolist() == [0.0] * 4
        with pytest.raises(RewardFunctionFailingError) as info:
            scorer(batch(["1"] * 4))
    assert info.value.function == FNS + fn
    assert info.value.most_common == failure
    assert str(info.value).startswith(
        f"reward function {FNS + fn!r} failed on 12 of 12 rows over its last 3 calls "
        f"(abort_failure_rate=1.0, abort_window=3); most common failure (12 rows): {failure}, e.g. {example!r}"
    )


def test_partial_failures_go_on_by_default_and_stop_at_a_lower_rate():
    # echo_ground_truth raises on a ground truth that is not a number: half the rows fail.
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
        for truths in (["x"] * 3, ["x"] * 3, ["1"] * 3, ["x"] * 3, ["x"] * 3):
            scorer(batch(truths))
        with pytest.raises(RewardFunctionFailingError, match="failed on 9 of 9 rows"):
            scorer(batch(["x"] * 3))


def test_the_check_can_be_switched_off():
    with manager("raising", abort_failure_rate=None) as scorer:
        for _ in range(4):
            assert scorer(batch(["1"] * 2))["scores"].tolist() == [0.0, 0.0]


def test_only_the_failing_function_is_named():
    config = RewardConfig(
        num_workers=1,
        default_fn=FNS + "echo_ground_truth",
        fn_by_source={"broken": FNS + "raising"},
        abort_window=2,
    )
    rows = Batch({}, {"response_text": ["a", "b"], "ground_truth": ["1", "1"], "data_source": ["toy", "broken"]})
    with RewardManager(config) as scorer:
        scorer(rows)
        with pytest.raises(RewardFunctionFailingError, match=r"'.*reward_fns\.py:raising' failed on 2 of 2 rows"):
            scorer(rows)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"abort_failure_rate": 0.0}, "abort_failure_rate must be in \\(0, 1\\] or None, got 0.0"),
        ({"abort_failure_rate": 1.5}, "abort_failure_rate must be in \\(0, 1\\] or None, got 1.5"),
        ({"abort_window": 0}, "abort_window must be an int >= 1, got 0"),
    ],
)
def test_bad_settings_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        RewardConfig(**settings)
