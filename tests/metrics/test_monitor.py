"""TrainingMonitor on constructed reward streams: each alarm fires on its pathology and stays silent on a
healthy stream; a drift at a known step is caught within a stated number of steps and never before."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import torch

from hybridflow.metrics import MonitorConfig, TrainingAlarm, TrainingMonitor
from hybridflow.metrics.monitor import ALARMS, DIAGNOSTICS
from hybridflow.protocol import Batch

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
LOGGER = "hybridflow.metrics.monitor.training"

FORMATTED = "<think>add</think><answer>5</answer>"


def observe_all(
    monitor: TrainingMonitor, steps: Iterable[tuple[int, Batch, dict[str, float]]]
) -> dict[int, dict[str, float]]:
    return {step: monitor.observe(step, batch, metrics) for step, batch, metrics in steps}


def alarm_steps(outputs: dict[int, dict[str, float]], name: str) -> list[int]:
    return [step for step, out in outputs.items() if out[f"monitor/alarm/{name}"] == 1.0]


# ---------------------------------------------------------------------------------------- reward drift

DRIFT_STEP = 40
PER_SOURCE = 256
WINDOW = 512
DETECTION_STEPS = WINDOW // PER_SOURCE  # the current window is all post-drift rewards after this many steps


def drift_stream(steps: int) -> Iterator[tuple[int, Batch, dict[str, float]]]:
    """Two sources, 256 rewards each per step. ``math`` is a 0/1 reward whose success rate climbs slowly
    (learning) until ``DRIFT_STEP``, where it jumps to 0.85; ``code`` is a continuous, stationary reward."""
    generator = torch.Generator().manual_seed(7)
    for step in range(1, steps + 1):
        rate = 0.30 + 0.003 * step if step < DRIFT_STEP else 0.85
        math_scores = (torch.rand(PER_SOURCE, generator=generator) < rate).float()
        code_scores = 0.5 + 0.1 * torch.randn(PER_SOURCE, generator=generator)
        batch = Batch(
            {"scores": torch.cat([math_scores, code_scores])},
            {"data_source": ["math"] * PER_SOURCE + ["code"] * PER_SOURCE},
        )
        yield step, batch, {}


def test_drift_alarm_fires_within_the_window_after_a_jump_and_never_before(caplog):
    monitor = TrainingMonitor(MonitorConfig(drift_window=WINDOW))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        outputs = observe_all(monitor, drift_stream(60))

    fired = alarm_steps(outputs, "drift")
    assert fired, "the drift was never detected"
    assert DRIFT_STEP <= fired[0] <= DRIFT_STEP + DETECTION_STEPS - 1
    # Scores exist from the first step with two full windows (2 * 512 rewards = 4 steps) on.
    assert "monitor/drift/psi/math" not in outputs[3] and "monitor/drift/ks/code" in outputs[4]
    # The stationary source never alarms.
    assert (
        max(out["monitor/drift/psi/code"] for out in outputs.values() if "monitor/drift/psi/code" in out)
        < 0.25
    )
    # With the previous window as reference, the alarm clears once both windows hold post-jump rewards.
    assert outputs[DRIFT_STEP + 2 * DETECTION_STEPS + 1]["monitor/alarm/drift"] == 0.0
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1
    assert f"step {fired[0]}: reward drift on data source 'math'" in warnings[0]
    assert "PSI" in warnings[0] and ">= monitor.psi_threshold=0.25" in warnings[0]


def slow_climb(steps: int) -> Iterator[tuple[int, Batch, dict[str, float]]]:
    """One source of 128 0/1 rewards per step, ``38 + step`` of them ones: a steady climb, no jump."""
    for step in range(1, steps + 1):
        scores = (torch.arange(128) < 38 + step).float()
        yield step, Batch({"scores": scores}, {"data_source": ["math"] * 128}), {}


@pytest.mark.parametrize("reference", ["previous", "first"])
def test_a_first_window_reference_counts_steady_learning_as_drift(reference):
    # For 0/1 rewards KS is the gap between the success rates. Against the previous window it stays at
    # 4 / 256; against the first window (steps 1-2, 79 ones) the window ending at step t has 75 + 2t
    # ones, so KS = (2t - 4) / 256 first reaches 0.1 at step 15.
    config = MonitorConfig(drift_window=256, drift_reference=reference, psi_threshold=None, ks_threshold=0.1)
    outputs = observe_all(TrainingMonitor(config), slow_climb(30))
    assert outputs[20]["monitor/drift/ks/math"] == pytest.approx(
        4 / 256 if reference == "previous" else 36 / 256
    )
    assert alarm_steps(outputs, "drift")[:1] == ([] if reference == "previous" else [15])


def test_stop_on_alarm_raises_with_the_step_metrics_at_the_detection_step():
    detected = alarm_steps(
        observe_all(TrainingMonitor(MonitorConfig(drift_window=WINDOW)), drift_stream(60)), "drift"
    )
    monitor = TrainingMonitor(MonitorConfig(drift_window=WINDOW, stop_on_alarm=True))
    with pytest.raises(
        TrainingAlarm, match=r"stopping on monitor alarm.*reward drift on data source 'math'"
    ) as caught:
        observe_all(monitor, drift_stream(60))
    assert caught.value.step == detected[0]
    assert [alarm.name for alarm in caught.value.alarms] == ["drift"]
    assert caught.value.metrics["monitor/alarm/drift"] == 1.0
    assert caught.value.metrics["monitor/drift/psi/math"] >= 0.25


# ---------------------------------------------------------------------------------------- reward hacking

TREND = 10


def lengths_batch(length: int, correct: int, rows: int = 10) -> Batch:
    mask = (torch.arange(64).unsqueeze(0) < length).long().repeat(rows, 1)
    scores = (torch.arange(rows) < correct).float()
    return Batch({"response_mask": mask, "scores": scores})


@pytest.mark.parametrize("healthy", [False, True])
def test_length_rising_while_accuracy_is_flat(healthy):
    monitor = TrainingMonitor(MonitorConfig(trend_window=TREND))
    # Lengths 10, 12, ..., 28; accuracy flat at 0.5, or (healthy) climbing 0.1 -> 1.0 with them.
    steps = [
        (step, lengths_batch(10 + 2 * (step - 1), step if healthy else 5), {}) for step in range(1, TREND + 1)
    ]
    outputs = observe_all(monitor, steps)
    last = outputs[TREND]
    assert last["monitor/hacking/length_rise"] == pytest.approx(18 / 19)  # fitted rise 18 over mean 19
    assert last["monitor/hacking/accuracy_change"] == pytest.approx(0.9 if healthy else 0.0)
    assert alarm_steps(outputs, "length_hacking") == ([] if healthy else [TREND])
    assert "monitor/hacking/length_rise" not in outputs[TREND - 1]  # no judgement before a full window


@pytest.mark.parametrize(
    ("case", "loss_agg_mode", "correct", "fires"),
    [
        ("per-sequence mean, sparse reward", "seq-mean-token-mean", 1, True),
        ("token mean, sparse reward", "token-mean", 1, True),
        ("rewards plentiful", "seq-mean-token-mean", 5, False),
    ],
)
def test_length_growing_without_reward_names_the_cause_and_the_keys(caplog, case, loss_agg_mode, correct, fires):
    config = MonitorConfig(length_growth_window=5)
    monitor = TrainingMonitor(config, loss_agg_mode=loss_agg_mode)
    # Lengths 20, 30, 40, 50, 60 with 1 of 10 right (sparse) or 5 of 10 right.
    steps = [(step, lengths_batch(10 + 10 * step, correct), {}) for step in range(1, 6)]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        outputs = observe_all(monitor, steps)
    assert outputs[5]["monitor/diag/length_growth"] == pytest.approx(40 / 40)  # fitted rise 40 over mean 40
    assert "monitor/diag/length_growth" not in outputs[4]  # no judgement before a full window
    assert alarm_steps(outputs, "length_growth") == ([5] if fires else [])
    messages = [r.getMessage() for r in caplog.records if "responses grew" in r.getMessage()]
    assert len(messages) == (1 if fires else 0), case
    if fires:
        assert "20 -> 60 tokens" in messages[0] and "10%" in messages[0]
        assert "overlong_penalty" in messages[0]
        per_sequence = loss_agg_mode == "seq-mean-token-mean"
        assert ("length bias of actor.loss_agg_mode=seq-mean-token-mean" in messages[0]) == per_sequence
        assert ("actor.loss_agg_mode=token-mean" in messages[0]) == per_sequence


def test_length_growth_counts_the_policys_ids_not_the_inserted_tool_output():
    # Episodes of an agent run: the policy writes 20 ids every step; from step 2 on it calls a tool whose
    # inserted output (no loss, not sampled) adds 10, 20, 30, 40 ids. Only the inserted ids grow.
    monitor = TrainingMonitor(MonitorConfig(length_growth_window=5))
    steps = []
    for step in range(1, 6):
        batch = lengths_batch(20 + 10 * (step - 1), correct=1)
        sampled = batch["response_mask"].clone()
        sampled[:, 20:] = 0
        steps.append((step, Batch({"response_mask": batch["response_mask"], "scores": batch["scores"], "sampled_mask": sampled}), {}))
    outputs = observe_all(monitor, steps)
    assert outputs[5]["monitor/diag/length_growth"] == pytest.approx(0.0)
    assert alarm_steps(outputs, "length_growth") == []


def format_batch(formatted: int, correct: int, rows: int = 10) -> Batch:
    texts = [FORMATTED if row < formatted else "5" for row in range(rows)]
    return Batch({"scores": (torch.arange(rows) < correct).float()}, {"response_text": texts})


@pytest.mark.parametrize(
    ("case", "formatted", "correct", "fires"),
    [
        ("format climbs to saturation, accuracy flat", lambda t: t, lambda t: 5, True),
        ("format and accuracy climb together", lambda t: t, lambda t: t, False),
        ("format saturated from the start", lambda t: 10, lambda t: 5, False),
    ],
)
def test_format_reward_saturating_while_accuracy_does_not_move(case, formatted, correct, fires):
    monitor = TrainingMonitor(MonitorConfig(trend_window=TREND, format_fn="think_answer_format"))
    steps = [(t, format_batch(formatted(t), correct(t)), {}) for t in range(1, TREND + 1)]
    outputs = observe_all(monitor, steps)
    assert outputs[TREND]["monitor/hacking/format_rate"] == formatted(TREND) / 10
    assert alarm_steps(outputs, "format_saturation") == ([TREND] if fires else []), case


def repetition_batch(period: int, rows: int = 10) -> Batch:
    """16-token responses repeating ``period`` distinct tokens: 13 four-grams, ``min(period, 13)`` distinct."""
    tokens = (torch.arange(16) % period + 1).repeat(rows, 1)
    return Batch({"responses": tokens, "response_mask": torch.ones(rows, 16, dtype=torch.long)})


@pytest.mark.parametrize("healthy", [False, True])
def test_rising_repetition(healthy):
    monitor = TrainingMonitor(MonitorConfig(trend_window=TREND))
    # Periods 13, 12, ..., 4: repeated share 0, 1/13, ..., 9/13; healthy: period 4 (repetitive but steady).
    steps = [(t, repetition_batch(4 if healthy else 14 - t), {}) for t in range(1, TREND + 1)]
    outputs = observe_all(monitor, steps)
    assert outputs[TREND]["monitor/hacking/repetition"] == pytest.approx(9 / 13)
    assert outputs[TREND]["monitor/hacking/repetition_change"] == pytest.approx(0.0 if healthy else 9 / 13)
    assert alarm_steps(outputs, "repetition") == ([] if healthy else [TREND])


def reward_model_batch(step: int, rule_correct: int, rows: int = 10) -> Batch:
    rule = (torch.arange(rows) < rule_correct).float()
    rm = 0.2 * (step - 1) + torch.tensor([1.0, -1.0] * (rows // 2))  # population std 1 per step
    return Batch({"rule_scores": rule, "rm_scores": rm, "scores": rule + rm})


@pytest.mark.parametrize("healthy", [False, True])
def test_reward_model_score_diverging_from_the_rule_reward(healthy):
    monitor = TrainingMonitor(MonitorConfig(trend_window=TREND))
    steps = [(t, reward_model_batch(t, t if healthy else 5), {}) for t in range(1, TREND + 1)]
    outputs = observe_all(monitor, steps)
    # The reward model gains 1.8 over a pooled variance of 1 + var(0, 0.2, ..., 1.8) = 1.33.
    rm_gain = 1.8 / 1.33**0.5
    # Healthy: the rule accuracy climbs 0.1 -> 1.0: change 0.9 over a pooled variance of
    # mean p(1-p) = 0.165 plus var(0.1, ..., 1.0) = 0.0825.
    rule_gain = 0.9 / 0.2475**0.5 if healthy else 0.0
    assert outputs[TREND]["monitor/hacking/rm_rule_divergence"] == pytest.approx(rm_gain - rule_gain)
    assert alarm_steps(outputs, "rm_divergence") == ([] if healthy else [TREND])


# ---------------------------------------------------------------------------------------- diagnostics


def test_every_group_with_equal_rewards(caplog):
    monitor = TrainingMonitor(MonitorConfig())
    groups = torch.arange(16) // 4
    equal = Batch({"scores": groups.float() % 2, "group_ids": groups})  # 0000 1111 0000 1111
    one_differs = Batch(
        {"scores": torch.cat([groups[:-1].float() % 2, torch.tensor([0.0])]), "group_ids": groups}
    )
    single = Batch({"scores": torch.zeros(4), "group_ids": torch.arange(4)})  # rollout.n 1: nothing compared
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = monitor.observe(1, equal, {})
    assert out["monitor/alarm/zero_advantage"] == 1.0 and out["monitor/diag/equal_reward_group_frac"] == 1.0
    assert "4 of 4 prompt groups (100%" in caplog.text
    out = monitor.observe(2, one_differs, {})
    assert out["monitor/alarm/zero_advantage"] == 0.0 and out["monitor/diag/equal_reward_group_frac"] == 0.75
    out = monitor.observe(3, single, {})
    assert out["monitor/alarm/zero_advantage"] == 0.0 and "monitor/diag/equal_reward_group_frac" not in out


def test_most_responses_truncated(caplog):
    monitor = TrainingMonitor(MonitorConfig())

    def reasons(truncated: int) -> Batch:
        return Batch(non_tensors={"finish_reason": ["length"] * truncated + ["stop"] * (10 - truncated)})

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert monitor.observe(1, reasons(4), {})["monitor/alarm/truncation"] == 0.0
        out = monitor.observe(2, reasons(6), {})
    assert out["monitor/alarm/truncation"] == 1.0 and out["monitor/diag/truncation_rate"] == 0.6
    assert "step 2: 6 of 10 responses (60%" in caplog.text


def test_entropy_collapse_from_the_metric_or_the_sampled_log_probs(caplog):
    monitor = TrainingMonitor(MonitorConfig())
    assert monitor.observe(1, Batch(), {"actor/entropy": 0.8})["monitor/alarm/entropy_collapse"] == 0.0
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = monitor.observe(2, Batch(), {"actor/entropy": 0.01})
    assert out["monitor/alarm/entropy_collapse"] == 1.0
    assert "actor/entropy is 0.0100 nats per token" in caplog.text
    # Without the metric: the sampled tokens' mean negative log-prob over the response tokens only.
    log_probs = torch.tensor([[-0.002, -0.004, -9.0], [-0.003, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = TrainingMonitor(MonitorConfig()).observe(
        1, Batch({"rollout_log_probs": log_probs, "response_mask": mask}), {}
    )
    assert out["monitor/diag/entropy"] == pytest.approx(0.003)
    assert out["monitor/alarm/entropy_collapse"] == 1.0


@pytest.mark.parametrize(("value", "name"), [(0.0, "clip_frac_zero"), (0.97, "clip_frac_high")])
def test_clip_fraction_stuck_for_many_steps(value, name):
    monitor = TrainingMonitor(MonitorConfig(clip_patience=5))
    # Stuck for 4 steps, one normal step resets the streak, then stuck for 5.
    values = [value] * 4 + [0.1] + [value] * 5
    outputs = observe_all(
        monitor, ((step, Batch(), {"actor/clip_frac": v}) for step, v in enumerate(values, 1))
    )
    assert alarm_steps(outputs, name) == [10]
    assert outputs[10][f"monitor/diag/{name}_streak"] == 5.0
    other = "clip_frac_high" if name == "clip_frac_zero" else "clip_frac_zero"
    assert alarm_steps(outputs, other) == []
    healthy = TrainingMonitor(MonitorConfig(clip_patience=5))
    steps = ((step, Batch(), {"actor/clip_frac": 0.05}) for step in range(1, 20))
    assert alarm_steps(observe_all(healthy, steps), name) == []


def healthy_update_metrics(clip_frac: float) -> dict[str, float]:
    """What a step's update reports when it trains: a gradient, a learning rate, a loss."""
    return {"actor/clip_frac": clip_frac, "actor/pg_loss": 0.3, "actor/lr": 1e-4, "actor/grad_norm": 0.8}


def test_one_on_policy_optimizer_step_keeps_the_zero_clip_alarm_silent(caplog):
    # One optimizer step per batch: the ratio is exactly 1, so clip_frac is 0 on every healthy step.
    monitor = TrainingMonitor(MonitorConfig(), optimizer_steps_per_batch=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        outputs = observe_all(
            monitor, ((step, Batch(), healthy_update_metrics(0.0)) for step in range(1, 31))
        )
    assert not caplog.records
    assert all(out[f"monitor/alarm/{name}"] == 0.0 for out in outputs.values() for name in DIAGNOSTICS)
    assert outputs[30]["monitor/diag/clip_frac_zero_streak"] == 30.0  # still measured, never alarmed


@pytest.mark.parametrize("steps_per_batch", [None, 4])
def test_several_optimizer_steps_with_zero_clip_fraction_alarm(caplog, steps_per_batch):
    # Several optimizer steps (or a count the runtime did not give): the later mini-batches' ratio
    # should leave 1, and a clip fraction stuck at 0 says the updates barely move the policy.
    monitor = TrainingMonitor(MonitorConfig(), optimizer_steps_per_batch=steps_per_batch)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        outputs = observe_all(
            monitor, ((step, Batch(), healthy_update_metrics(0.0)) for step in range(1, 31))
        )
    assert alarm_steps(outputs, "clip_frac_zero") == list(range(10, 31))  # default clip_patience 10
    assert [record.getMessage() for record in caplog.records] == [
        "step 10: actor/clip_frac has been <= monitor.clip_frac_low=0.0 for 10 steps (now 0): the policy "
        "ratio never leaves the clip range: the updates barely move the policy (learning rate too small?)"
    ]


@pytest.mark.parametrize("steps_per_batch", [1, 4, None])
def test_a_learning_rate_of_zero_is_not_learning(caplog, steps_per_batch):
    # A run at lr 0 computes its gradients and reports them, ratio 1 and clip fraction 0 included; only
    # the learning rate shows that no optimizer step moves the policy. Steps 4-6 train, step 7 does not.
    monitor = TrainingMonitor(MonitorConfig(), optimizer_steps_per_batch=steps_per_batch)
    stopped = [{**healthy_update_metrics(0.0), "actor/lr": 0.0}] * 3
    trained = [healthy_update_metrics(0.0)] * 3
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        outputs = observe_all(
            monitor,
            ((step, Batch(), metrics) for step, metrics in enumerate([*stopped, *trained, stopped[0]], 1)),
        )
    assert alarm_steps(outputs, "not_learning") == [1, 2, 3, 7]
    not_learning = [record.getMessage() for record in caplog.records if "actor/lr" in record.getMessage()]
    assert [message.split(":")[0] for message in not_learning] == ["step 1", "step 7"]
    assert "actor/lr is 0: this step's optimizer steps left the policy unchanged" in not_learning[0]
    # A small learning rate is not 0; a step without the metric (no update) says nothing.
    quiet = TrainingMonitor(MonitorConfig(), optimizer_steps_per_batch=steps_per_batch)
    assert quiet.observe(1, Batch(), {"actor/lr": 1e-12})["monitor/alarm/not_learning"] == 0.0
    assert quiet.observe(2, Batch(), {})["monitor/alarm/not_learning"] == 0.0


def test_optimizer_steps_per_batch_must_be_positive():
    with pytest.raises(ValueError, match=r"optimizer_steps_per_batch must be >= 1, got 0"):
        TrainingMonitor(MonitorConfig(), optimizer_steps_per_batch=0)


def test_loss_exactly_zero_warns_once_per_episode(caplog):
    monitor = TrainingMonitor(MonitorConfig(stop_on_alarm=True))  # diagnostics never stop the run
    losses = [0.0, 0.0, 0.0, 1e-9, 0.0]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        outputs = observe_all(
            monitor, ((step, Batch(), {"actor/pg_loss": v}) for step, v in enumerate(losses, 1))
        )
    assert alarm_steps(outputs, "zero_loss") == [1, 2, 3, 5]
    assert [record.getMessage().split(":")[0] for record in caplog.records] == ["step 1", "step 5"]
    assert "actor/pg_loss is exactly 0" in caplog.text


def test_a_healthy_step_raises_no_alarm(caplog):
    # Drift is left to the stream tests: 8 rewards per step are too few for its default thresholds.
    monitor = TrainingMonitor(MonitorConfig(trend_window=3, format_fn="think_answer_format"))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        outputs = observe_all(monitor, (rich_step(step) for step in range(1, 8)))
    assert (
        "monitor/hacking/rm_rule_divergence" in outputs[7] and "monitor/hacking/format_change" in outputs[7]
    )
    assert not caplog.records
    assert all(
        out[f"monitor/alarm/{name}"] == 0.0 for out in outputs.values() for name in (*ALARMS, *DIAGNOSTICS)
    )


# ---------------------------------------------------------------------------------------- state and docs


def rich_step(step: int) -> tuple[int, Batch, dict[str, float]]:
    """A healthy step with every column and metric the monitor reads: half the answers right in every
    group, a reward model that agrees with the rule, 10-token responses without loops."""
    rows = 8
    generator = torch.Generator().manual_seed(step)
    rule = torch.tensor([1.0, 0.0] * (rows // 2))
    rm = 2 * rule - 1 + 0.1 * torch.randn(rows, generator=generator)
    batch = Batch(
        {
            "scores": rule + rm,
            "rule_scores": rule,
            "rm_scores": rm,
            "response_mask": (torch.arange(12) < 10).long().repeat(rows, 1),
            "responses": torch.randint(1, 1000, (rows, 12), generator=generator),
            "rollout_log_probs": -torch.rand(rows, 12, generator=generator) - 0.5,
            "group_ids": torch.arange(rows) // 4,
        },
        {
            "data_source": ["src"] * rows,
            "response_text": [FORMATTED] * rows,
            "finish_reason": ["stop"] * rows,
        },
    )
    return step, batch, {"actor/clip_frac": 0.1, "actor/pg_loss": 0.3, "actor/lr": 1e-4}


def test_state_dict_resumes_to_the_same_metrics(tmp_path):
    config = MonitorConfig(trend_window=3, drift_window=8, format_fn="think_answer_format")
    straight = observe_all(TrainingMonitor(config), (rich_step(step) for step in range(1, 13)))
    first = TrainingMonitor(config)
    observe_all(first, (rich_step(step) for step in range(1, 7)))
    torch.save(first.state_dict(), tmp_path / "monitor.pt")
    resumed = TrainingMonitor(config)
    resumed.load_state_dict(torch.load(tmp_path / "monitor.pt"))
    continued = observe_all(resumed, (rich_step(step) for step in range(7, 13)))
    assert continued == {step: straight[step] for step in range(7, 13)}
    assert "monitor/hacking/rm_rule_divergence" in continued[12]


def test_unknown_format_function_is_named():
    with pytest.raises(ValueError, match=r"monitor.format_fn: cannot resolve 'no_such_format'"):
        TrainingMonitor(MonitorConfig(format_fn="no_such_format"))


def test_disabled_monitor_returns_nothing():
    assert TrainingMonitor(MonitorConfig(enabled=False)).observe(1, Batch(), {"actor/pg_loss": 0.0}) == {}


def test_every_monitor_metric_is_documented():
    config = MonitorConfig(trend_window=3, drift_window=8, format_fn="think_answer_format")
    outputs = observe_all(TrainingMonitor(config), (rich_step(step) for step in range(1, 6)))
    outputs[6] = TrainingMonitor(config).observe(6, Batch(), {"actor/entropy": 1.0})
    names = {name.replace("/src", "/<source>") for out in outputs.values() for name in out}
    assert len(names) == 18 + len(ALARMS) + len(DIAGNOSTICS)
    text = DOCS.read_text()
    missing = sorted(name for name in names if f"`{name}`" not in text)
    assert not missing, f"docs/metrics.md lacks {missing}"
