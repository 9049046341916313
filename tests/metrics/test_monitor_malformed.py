"""The ``malformed_reward`` alarm: a reward scoring 0 on every row while its inputs are unusable fires
after ``monitor.malformed_reward_patience`` steps; a hard task (all 0, inputs well formed) and a learning
run never fire it."""

from __future__ import annotations

import logging

import pytest
import torch

from hybridflow.metrics import MonitorConfig, TrainingAlarm, TrainingMonitor
from hybridflow.metrics.monitor import malformed_inputs
from hybridflow.protocol import Batch

LOGGER = "hybridflow.metrics.monitor.training"
ROWS = 8


def step_batch(scores: list[float], texts: list[str], truths: list[object]) -> Batch:
    return Batch(
        {"scores": torch.tensor(scores), "rule_scores": torch.tensor(scores)},
        {"response_text": texts, "ground_truth": truths, "data_source": ["src"] * len(scores)},
    )


def run(monitor: TrainingMonitor, batches: list[Batch]) -> list[dict[str, float]]:
    return [monitor.observe(step, batch, {}) for step, batch in enumerate(batches, 1)]


def fired(outputs: list[dict[str, float]]) -> list[int]:
    return [step for step, out in enumerate(outputs, 1) if out["monitor/alarm/malformed_reward"] == 1.0]


def test_malformed_inputs_counts_empty_responses_and_unusable_ground_truths():
    batch = step_batch(
        [0.0] * 7,
        ["42", "  ", "42", "42", "42", "42", "42"],
        ["42", "42", "", None, b"42", [], 0],
    )
    assert malformed_inputs(batch) == [False, True, True, True, True, True, False]
    masked = Batch({"response_mask": torch.tensor([[1, 1], [0, 0]])}, {})
    assert malformed_inputs(masked) == [False, True]
    assert malformed_inputs(Batch({"scores": torch.zeros(2)}, {})) is None


def test_empty_ground_truths_scoring_zero_fire_at_the_patience_step_and_not_before(caplog):
    """The probe's case: ground truths stored as empty strings, every reward 0."""
    batches = [step_batch([0.0] * ROWS, ["the answer is 7"] * ROWS, [""] * ROWS) for _ in range(5)]
    monitor = TrainingMonitor(MonitorConfig(malformed_reward_patience=3))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        outputs = run(monitor, batches)
    assert fired(outputs) == [3, 4, 5]
    assert [out["monitor/reward/zero_malformed_streak"] for out in outputs] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert outputs[0]["monitor/reward/malformed_input_frac"] == 1.0
    warnings = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert warnings == [
        "step 3: every reward (rule_scores) has been 0 for 3 steps in a row (>= "
        "monitor.malformed_reward_patience=3) while 100% of this step's 8 rows have malformed reward inputs "
        "(an empty response, or a ground truth that is missing, empty or bytes): the reward function cannot "
        "score them; check the data's ground_truth column and the responses"
    ]


def test_empty_responses_fire_and_stop_the_run_under_stop_on_alarm():
    batches = [step_batch([0.0] * ROWS, [""] * 6 + ["7", "8"], ["7"] * ROWS) for _ in range(2)]
    monitor = TrainingMonitor(MonitorConfig(malformed_reward_patience=2, stop_on_alarm=True))
    monitor.observe(1, batches[0], {})
    with pytest.raises(TrainingAlarm, match=r"step 2: .*malformed_reward: every reward"):
        monitor.observe(2, batches[1], {})


def test_a_hard_task_and_a_learning_run_stay_silent():
    hard = [step_batch([0.0] * ROWS, ["the answer is 3"] * ROWS, ["7"] * ROWS) for _ in range(6)]
    # Mostly malformed but one row scores: the reward can score, so no alarm.
    one_scores = [step_batch([0.0] * 7 + [1.0], [""] * ROWS, ["7"] * ROWS) for _ in range(6)]
    # A few malformed rows (under half) in an all-zero step do not count either.
    few = [step_batch([0.0] * ROWS, [""] * 3 + ["x"] * 5, ["7"] * ROWS) for _ in range(6)]
    for batches in (hard, one_scores, few):
        outputs = run(TrainingMonitor(MonitorConfig(malformed_reward_patience=3)), batches)
        assert fired(outputs) == []
        assert outputs[-1]["monitor/reward/zero_malformed_streak"] == 0.0


def test_a_step_that_scores_resets_the_streak_and_the_state_survives_a_resume():
    bad = step_batch([0.0] * ROWS, ["7"] * ROWS, [""] * ROWS)
    good = step_batch([1.0] * ROWS, ["7"] * ROWS, ["7"] * ROWS)
    config = MonitorConfig(malformed_reward_patience=3)
    outputs = run(TrainingMonitor(config), [bad, bad, good, bad, bad, bad])
    assert fired(outputs) == [6]
    first = TrainingMonitor(config)
    run(first, [bad, bad])
    resumed = TrainingMonitor(config)
    resumed.load_state_dict(first.state_dict())
    assert resumed.observe(3, bad, {})["monitor/alarm/malformed_reward"] == 1.0
    # A state saved before the alarm existed has no streak of it: it starts at 0.
    old_state = first.state_dict()
    del old_state["streaks"]["malformed_reward"]
    older = TrainingMonitor(config)
    older.load_state_dict(old_state)
    assert older.observe(3, bad, {})["monitor/reward/zero_malformed_streak"] == 1.0


def test_patience_null_switches_the_alarm_off():
    batches = [step_batch([0.0] * ROWS, [""] * ROWS, [""] * ROWS) for _ in range(5)]
    assert fired(run(TrainingMonitor(MonitorConfig(malformed_reward_patience=None)), batches)) == []
