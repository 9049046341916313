"""`fit`: the one training loop, for any step function.

A step function is the algorithm: it takes the runtime and a batch of prompts and returns the step's
rollouts, calling the named steps of `trainer.steps` (or a recipe's own) on the way::

    def my_step(trainer: RLTrainer, prompts: Batch) -> Batch: ...

`fit` owns everything around it, the same for every algorithm: resuming from a checkpoint, validation
before and during training, the step's timing and throughput, the metrics computed from the returned
rollouts (`hybridflow.metrics.step_metrics`), the rollout-vs-trainer log-prob check, logging (with the
console progress bar), the training monitor and checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from hybridflow.metrics import step_metrics, throughput_metrics
from hybridflow.metrics.monitor import TrainingAlarm
from hybridflow.protocol import Batch

if TYPE_CHECKING:
    from trainer.rl_trainer import RLTrainer

__all__ = ["LogProbGapError", "StepFn", "check_sync", "fit", "run_step"]

StepFn = Callable[["RLTrainer", Batch], Batch]
"""``step_fn(trainer, prompts) -> rollouts``: one step of an algorithm (see the module docstring)."""


class LogProbGapError(RuntimeError):
    """The engine's log-probs of its own samples disagree with the training layout's beyond the limit."""


def fit(trainer: RLTrainer, step_fn: StepFn) -> dict[str, float]:
    """Run ``step_fn`` until ``trainer.total_steps``; returns the last validation metrics (empty without
    validation).

    Resumes first when ``trainer.resume`` says so (data position, per-step sampling seeds, optimizer and
    schedule all come back, so the next steps equal the uninterrupted run's). Validates before training
    (``trainer.val_before_train``, on a fresh start), every ``trainer.val_every`` steps and at the end;
    logs the start-up's parts (``startup/*``, `RLTrainer.startup`) with the first record;
    saves every ``trainer.save_every`` steps and at the end. A `TrainingAlarm` (``monitor.stop_on_alarm``)
    logs the step, saves a checkpoint and propagates.
    """
    trainer._maybe_resume()
    trainer.startup.lap("resume")
    config = trainer.config.trainer
    has_val = trainer.val_data is not None
    last_val: dict[str, float] = {}
    # The start-up report (``startup/*``) goes with the first record: the validation before training,
    # else the first step.
    startup: dict[str, float] = {}
    if has_val and config.val_before_train and trainer.step == 0:
        last_val = trainer.validate()
        trainer.startup.lap("validation")
        trainer.logger.log({**last_val, **trainer.startup.metrics()}, 0)
    else:
        startup = trainer.startup.metrics()
    while trainer.step < trainer.total_steps:
        trainer.step += 1
        try:
            metrics = {**run_step(trainer, step_fn, trainer.next_prompts()), **startup}
            startup = {}
        except TrainingAlarm as alarm:
            # monitor.stop_on_alarm: the step has trained; keep it, and a checkpoint to look at or resume.
            trainer.logger.log(alarm.metrics, trainer.step)
            trainer.save_checkpoint()
            raise
        if has_val and config.val_every and _due(trainer.step, config.val_every, trainer.total_steps):
            last_val = trainer.validate()
            metrics.update(last_val)
        trainer.logger.log(metrics, trainer.step)
        if config.save_every and _due(trainer.step, config.save_every, trainer.total_steps):
            trainer.save_checkpoint()
    return last_val


def run_step(trainer: RLTrainer, step_fn: StepFn, prompts: Batch) -> dict[str, float]:
    """One timed step of ``step_fn`` on ``prompts``; returns its metrics.

    The metrics are what the step recorded (``trainer.record``), the metrics of the returned rollouts
    (scores, advantages, lengths, groups, truncation, the sync gap when both log-prob columns are
    there), phase timings, throughput and the training monitor's ``monitor/*`` (which warns on the
    console when an alarm fires). Raises `LogProbGapError` when the gap exceeds
    ``resharding.max_log_prob_gap``, and `TrainingAlarm` when an alarm fires under
    ``monitor.stop_on_alarm``.
    """
    trainer.step_metrics = {}
    with trainer.timer.step():
        rollouts = step_fn(trainer, prompts)
    if not isinstance(rollouts, Batch):
        raise TypeError(
            f"the step function {getattr(step_fn, '__name__', step_fn)!r} must return the step's rollouts "
            f"(a Batch), got {type(rollouts).__name__}"
        )
    metrics = {
        **step_metrics(rollouts),
        **trainer.step_metrics,
        **trainer.timer.metrics(),
        **_throughput(trainer, rollouts),
    }
    check_sync(metrics, trainer.config.resharding.max_log_prob_gap, trainer.step)
    metrics.update(trainer.monitor.observe(trainer.step, rollouts, metrics))
    return metrics


def check_sync(metrics: dict[str, float], limit: float | None, step: int) -> None:
    """Raise `LogProbGapError` when ``sync/log_prob_abs_diff_max`` exceeds ``limit`` or is not finite."""
    gap = metrics.get("sync/log_prob_abs_diff_max")
    if limit is None or gap is None:
        return
    if not (gap <= limit and math.isfinite(gap)):
        raise LogProbGapError(
            f"step {step}: rollout-vs-trainer log-prob gap {gap:.3g} exceeds "
            f"resharding.max_log_prob_gap={limit}; the engine's weights are out of sync"
        )


def _due(step: int, every: int, last: int) -> bool:
    return step % every == 0 or step == last


def _throughput(trainer: RLTrainer, rollouts: Batch) -> dict[str, float]:
    if "response_mask" not in rollouts or "attention_mask" not in rollouts:
        return {}
    response_tokens = int(rollouts["response_mask"].sum())
    return throughput_metrics(
        total_tokens=int(rollouts["attention_mask"].sum()) + response_tokens,
        response_tokens=response_tokens,
        step_seconds=trainer.timer.step_seconds or 0.0,
        generation_seconds=trainer.timer.seconds.get("generation"),
        world_size=trainer.sizes.world_size,
    )
