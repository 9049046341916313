"""RewardManager with real worker processes and reward functions that fail on purpose."""

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from hybridflow.protocol import Batch
from hybridflow.rewards import RewardConfig, RewardManager, ShapingSpec

FNS = f"{Path(__file__).with_name('reward_fns.py')}:"
FALLBACK = -1.0


def make_batch(sources, truths, response_mask=None, extra_info=None):
    non_tensors = {
        "response_text": [f"response {i}" for i in range(len(sources))],
        "ground_truth": truths,
        "data_source": sources,
    }
    if extra_info is not None:
        non_tensors["extra_info"] = extra_info
    tensors = {} if response_mask is None else {"response_mask": response_mask}
    return Batch(tensors, non_tensors)


@pytest.fixture(scope="module")
def manager():
    config = RewardConfig(
        num_workers=2,
        timeout_s=1.0,
        kill_grace_s=1.0,
        fallback_score=FALLBACK,
        default_fn=FNS + "echo_ground_truth",
        # These tests are about single failing samples; the run-stopping rule has tests of its own.
        abort_failure_rate=None,
        fn_by_source={
            "raises": FNS + "raising",
            "hangs": FNS + "hanging",
            "wrong_type": FNS + "wrong_type",
            "nan": FNS + "not_a_number",
            "deaf": FNS + "hanging_deaf_to_alarm",
            "crashes": FNS + "crashing",
        },
    )
    with RewardManager(config) as manager:
        yield manager


def test_failing_samples_get_the_fallback_and_are_counted(manager):
    sources = ["good", "raises", "good", "hangs", "good", "wrong_type", "nan", "good"]
    truths = ["0.25", "1", "0.5", "1", "0.75", "1", "1", "2"]
    out = manager(make_batch(sources, truths))

    expected = [0.25, FALLBACK, 0.5, FALLBACK, 0.75, FALLBACK, FALLBACK, 2.0]
    assert out["scores"].dtype == torch.float32
    assert out["scores"].tolist() == expected
    assert list(out["reward_status"]) == ["ok", "error", "ok", "timeout", "ok", "bad_type", "bad_type", "ok"]
    metrics = out.meta["reward_metrics"]
    assert (metrics["reward/errors"], metrics["reward/timeouts"], metrics["reward/bad_type"]) == (
        1.0,
        1.0,
        2.0,
    )
    # The hang was cut short inside the worker: no process had to be replaced.
    assert metrics["reward/worker_restarts"] == 0.0
    assert metrics["reward/score_mean/good"] == pytest.approx(0.875)


def test_worker_stuck_past_the_alarm_is_killed_and_replaced(manager):
    # The workers exist before the call, whichever tests ran before (or none).
    manager.start()
    before = manager.worker_pids
    assert len(before) == 2
    out = manager(make_batch(["good", "deaf", "good", "good"], ["1", "1", "3", "4"]))
    assert out["scores"].tolist() == [1.0, FALLBACK, 3.0, 4.0]
    assert list(out["reward_status"]) == ["ok", "timeout", "ok", "ok"]
    metrics = out.meta["reward_metrics"]
    assert metrics["reward/timeouts"] == 1.0
    assert metrics["reward/worker_restarts"] == 1.0
    killed = set(before) - set(manager.worker_pids)
    assert len(killed) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(killed.pop(), 0)
    # The replacement scores the next batch.
    assert manager(make_batch(["good"] * 3, ["5", "6", "7"]))["scores"].tolist() == [5.0, 6.0, 7.0]


def test_worker_that_dies_costs_only_its_sample(manager):
    out = manager(make_batch(["good", "crashes", "good", "good", "good"], ["1", "1", "2", "3", "4"]))
    assert out["scores"].tolist() == [1.0, FALLBACK, 2.0, 3.0, 4.0]
    assert out.meta["reward_metrics"]["reward/errors"] == 1.0
    assert out.meta["reward_metrics"]["reward/worker_restarts"] == 1.0


class Interrupted(Exception):
    pass


def test_interrupted_call_leaves_no_stale_results_for_the_next(manager):
    def interrupt(signum, frame):
        raise Interrupted

    manager(make_batch(["good"], ["0"]))  # workers up, so the interrupt lands mid-call
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)  # while a worker sits in the 1 s hang
        with pytest.raises(Interrupted):
            manager(make_batch(["hangs", "good", "good", "good"], ["1", "10", "20", "30"]))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # The hang still owed by the interrupted call would report while this call waits on its own
    # hang; it must not be taken for this call's row 0.
    out = manager(make_batch(["good", "good", "good", "hangs"], ["1", "2", "3", "4"]))
    assert out["scores"].tolist() == [1.0, 2.0, 3.0, FALLBACK]
    assert list(out["reward_status"]) == ["ok", "ok", "ok", "timeout"]


def test_token_level_scores_sit_on_the_last_response_token(manager):
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 1, 0]])
    extra = [{"bonus": 0.5}, None, {}, {"bonus": 1.0}]
    out = manager(make_batch(["good"] * 4, ["1", "2", "3", "4"], response_mask=mask, extra_info=extra))
    assert out["scores"].tolist() == [1.5, 2.0, 3.0, 5.0]
    expected = torch.tensor(
        [[0, 0, 1.5, 0], [0, 0, 0, 2.0], [0, 0, 0, 0], [0, 0, 5.0, 0]], dtype=torch.float32
    )
    assert torch.equal(out["token_level_scores"], expected)
    assert out.meta["reward_metrics"]["reward/empty_responses"] == 1.0


def test_result_unites_with_the_input_batch(manager):
    batch = make_batch(["good", "good"], ["1", "2"])
    united = batch | manager(batch)
    assert united["scores"].tolist() == [1.0, 2.0]
    assert list(united["ground_truth"]) == ["1", "2"]


def test_missing_columns_are_named(manager):
    batch = Batch({}, {"response_text": np.array(["a"], dtype=object), "data_source": ["good"]})
    with pytest.raises(KeyError, match=r"\['ground_truth'\]"):
        manager(batch)


def test_builtin_functions_by_source_and_overlong_shaping():
    config = RewardConfig(
        num_workers=1,
        default_fn="math_verify",
        fn_by_source={"synthetic/arithmetic": "exact_match"},
        shaping=(ShapingSpec("overlong_penalty", {"max_response_length": 10, "cache_length": 4}),),
    )
    batch = Batch(
        {"response_mask": (torch.arange(12) < torch.tensor([[5], [8], [12]])).long()},
        {
            # exact_match reads the tag; math_verify would also accept the plain "12" of the last row.
            "response_text": ["<answer>12</answer>", "<answer>12</answer>", "7+5 is \\boxed{12}"],
            "ground_truth": ["12", "13", "12"],
            "data_source": ["synthetic/arithmetic", "synthetic/arithmetic", "math"],
        },
    )
    with RewardManager(config) as manager:
        out = manager(batch)
    # Lengths 5, 8, 12 against L_max=10, L_cache=4: penalties 0, -0.5, -1.
    assert out["scores"].tolist() == [1.0, -0.5, 0.0]
    metrics = out.meta["reward_metrics"]
    assert metrics["reward/raw_score_mean"] == pytest.approx(2 / 3)
    assert metrics["reward/shaping/overlong_penalty_delta_mean"] == pytest.approx(-0.5)


def test_configuration_errors_are_raised_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"\.timeout_s\b.*got 0"):
        RewardConfig(timeout_s=0)
    with pytest.raises(KeyError, match="no reward function registered as 'exact'"):
        RewardManager(RewardConfig(fn_by_source={"x": "exact"}))
    with pytest.raises(FileNotFoundError, match=r"gone\.py"):
        RewardManager(RewardConfig(default_fn=f"{tmp_path}/gone.py:score"))
    with pytest.raises(TypeError, match=r"fn_by_source\['x'\].*cannot be sent to worker processes"):
        RewardManager(RewardConfig(fn_by_source={"x": lambda **kwargs: 1.0}))
    with pytest.raises(KeyError, match="no reward shaping registered as 'shorter'"):
        RewardManager(RewardConfig(shaping=({"name": "shorter"},)))
    with pytest.raises(TypeError, match="'overlong_penalty' cannot take"):
        RewardManager(RewardConfig(shaping=(ShapingSpec("overlong_penalty", {"max_len": 5}),)))


def test_start_runs_the_workers_before_the_first_call_and_the_call_uses_them():
    config = RewardConfig(num_workers=2, default_fn=FNS + "echo_ground_truth")
    with RewardManager(config) as manager:
        assert manager.worker_pids == []
        manager.start()
        started = manager.worker_pids
        assert len(started) == 2 and all(pid is not None for pid in started)
        for pid in started:
            os.kill(pid, 0)  # alive
        manager.start()  # running already: nothing new
        assert manager.worker_pids == started
        out = manager(make_batch(["any"] * 3, ["1", "2", "3"]))
        assert out["scores"].tolist() == [1.0, 2.0, 3.0]
        assert manager.worker_pids == started
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
