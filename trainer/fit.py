"""`fit`: the one training loop, for any step function.

A step function is the algorithm: it takes the runtime and a batch of prompts and returns the step's
rollouts, calling the named steps of `trainer.steps` (or a recipe's own) on the way::

    def my_step(runtime: Runtime, prompts: Batch) -> Batch: ...

    fit(runtime, my_step)                                          # trainer.total_steps steps
    fit(runtime, my_step, stop=StopAt(seconds=300))                # or 300 s of steps, if sooner
    fit(runtime, my_step, evaluate=held_out, evaluate_every=Every(generated_tokens=10_000))

    def held_out(runtime: Runtime, progress: Progress) -> dict[str, float]: ...

`fit` owns everything around it, the same for every algorithm: resuming from a checkpoint, evaluation
(by default the configured validation, `trainer.validation.validate`) before and during training, the
step's timing and throughput, the metrics computed from the returned rollouts
(`hybridflow.metrics.step_metrics`), the rollout-vs-trainer log-prob check, logging (with the console
progress bar), the training monitor and checkpoints.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from hybridflow.lora import LoraConfig
from hybridflow.metrics import step_metrics, throughput_metrics
from hybridflow.metrics.efficiency import (
    MachinePeak,
    device_name,
    fractions_above_peak,
    load_machine_peak,
    phase_efficiency,
)
from hybridflow.metrics.monitor import TrainingAlarm
from hybridflow.planning import ModelShape, lora_shapes
from hybridflow.protocol import Batch
from hybridflow.row_order import carries_advantage
from trainer.config import ConfigError
from trainer.plan import policy_shape
from trainer.runtime import Runtime
from trainer.steps import GENERATED_METRIC
from trainer.validation import validate

logger = logging.getLogger(__name__)

__all__ = [
    "Evaluate",
    "Every",
    "LogProbGapError",
    "MachineLimits",
    "Progress",
    "StepFn",
    "StopAt",
    "check_sync",
    "configured_validation",
    "fit",
    "machine_limits",
    "run_step",
]

StepFn = Callable[[Runtime, Batch], Batch]
"""``step(runtime, prompts) -> rollouts``: one step of an algorithm (see the module docstring)."""

Evaluate = Callable[[Runtime, "Progress"], dict[str, float]]
"""``evaluate(runtime, progress) -> metrics``: run where validation runs (`fit`), told how far training has
got; its metrics are logged with the step's."""

TRAINING_SECONDS_METRIC = "time/training_s"
"""Seconds of steps so far in this `fit` call (validation, checkpoints and start-up left out)."""


@dataclass(frozen=True)
class Progress:
    """How far a `fit` call has trained: ``steps`` (the runtime's step, a resumed run's included),
    ``seconds`` of steps in this call and the response ``generated_tokens`` of its steps (every token the
    engine produced, ``response/generated_tokens``, also in rows a step dropped)."""

    steps: int = 0
    seconds: float = 0.0
    generated_tokens: float = 0.0


@dataclass(frozen=True)
class _Amounts:
    steps: int | None = None
    seconds: float | None = None
    generated_tokens: float | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None and not value > 0:
                raise ValueError(f"{type(self).__name__}.{field.name} must be > 0 (or None), got {value}")

    def _set(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class StopAt(_Amounts):
    """Stop once any amount set here is reached (``steps``, training ``seconds`` or ``generated_tokens``,
    counted as in `Progress`). The run never goes past ``trainer.total_steps`` either."""

    def reached(self, progress: Progress) -> bool:
        return any(getattr(progress, name) >= amount for name, amount in self._set().items())


@dataclass(frozen=True)
class Every(_Amounts):
    """Evaluate each time any amount set here passes another multiple of itself (every ``steps`` steps,
    ``seconds`` of training or ``generated_tokens``)."""

    def passed(self, before: Progress, after: Progress) -> bool:
        return any(
            getattr(after, name) // amount > getattr(before, name) // amount for name, amount in self._set().items()
        )


class LogProbGapError(RuntimeError):
    """The engine's log-probs of its own samples disagree with the training layout's beyond the limit."""


def fit(
    runtime: Runtime,
    step: StepFn,
    *,
    stop: StopAt | None = None,
    evaluate: Evaluate | None = None,
    evaluate_every: Every | None = None,
) -> dict[str, float]:
    """Run ``step`` until ``runtime.total_steps`` steps, or sooner when ``stop`` is reached; returns the
    last evaluation's metrics (empty without one).

    Resumes first (`Runtime.resume`: data position, per-step sampling seeds, optimizer and schedule all
    come back, so the next steps equal the uninterrupted run's). ``evaluate`` (default: the configured
    validation when ``data.val_files`` is set) runs before training (``trainer.val_before_train``, on a
    fresh start), whenever ``evaluate_every`` (default: every ``trainer.val_every`` steps; none when 0)
    passes, and after the last step when there is a schedule. Logs the start-up's parts (``startup/*``,
    `Runtime.startup`) with the first record and ``time/training_s`` with every step; saves every
    ``trainer.save_every`` steps and after the last. A `TrainingAlarm` (``monitor.stop_on_alarm``) logs
    the step, saves a checkpoint and propagates.
    """
    runtime.resume()
    runtime.startup.lap("resume")
    config = runtime.config.trainer
    if evaluate is None and runtime.val_data is not None:
        evaluate = configured_validation
    if evaluate_every is None and config.val_every:
        evaluate_every = Every(steps=config.val_every)
    stop = stop or StopAt(steps=runtime.total_steps)
    last_eval: dict[str, float] = {}
    # The start-up report (``startup/*``) goes with the first record: the evaluation before training,
    # else the first step.
    startup: dict[str, float] = {}
    limits = machine_limits(runtime)
    peak_warned = False
    progress = Progress(steps=runtime.step)
    if evaluate is not None and config.val_before_train and runtime.step == 0:
        last_eval = evaluate(runtime, progress)
        runtime.startup.lap("validation")
        runtime.logger.log({**last_eval, **runtime.startup.metrics()}, 0)
    else:
        startup = runtime.startup.metrics()
    done = progress.steps >= runtime.total_steps or stop.reached(progress)
    while not done:
        before = progress
        runtime.begin_step()
        try:
            metrics = {**run_step(runtime, step, runtime.next_prompts(), limits), **startup}
            startup = {}
        except TrainingAlarm as alarm:
            # monitor.stop_on_alarm: the step has trained; keep it, and a checkpoint to look at or resume.
            runtime.logger.log(alarm.metrics, runtime.step)
            runtime.save_checkpoint()
            raise
        if limits is not None and not peak_warned and (above := fractions_above_peak(metrics)):
            peak_warned = True  # once a run: every later step would say the same
            logger.warning(
                "step %d: %s above 1: the peak stored for %r in %s is below what this run achieves (measured "
                "while other jobs shared the machine?); measure it again on a quiet machine: "
                "python benchmarks/bench_machine_peak.py",
                runtime.step,
                ", ".join(f"{key} = {value:.2f}" for key, value in above.items()),
                limits.peak.device,
                runtime.config.trainer.machine_peak_file,
            )
        progress = Progress(
            steps=runtime.step,
            seconds=before.seconds + (runtime.timer.step_seconds or 0.0),
            generated_tokens=before.generated_tokens + metrics.get(GENERATED_METRIC, 0.0),
        )
        metrics[TRAINING_SECONDS_METRIC] = progress.seconds
        done = progress.steps >= runtime.total_steps or stop.reached(progress)
        if evaluate is not None and evaluate_every is not None and (done or evaluate_every.passed(before, progress)):
            last_eval = evaluate(runtime, progress)
            metrics.update(last_eval)
        runtime.logger.log(metrics, runtime.step)
        if config.save_every and (done or runtime.step % config.save_every == 0):
            runtime.save_checkpoint()
    return last_eval


def configured_validation(runtime: Runtime, progress: Progress) -> dict[str, float]:
    """`fit`'s default evaluation: the configured validation (`trainer.validation.validate`)."""
    return validate(runtime)


def run_step(
    runtime: Runtime, step: StepFn, prompts: Batch, limits: MachineLimits | None = None
) -> dict[str, float]:
    """One timed run of ``step`` on ``prompts`` (the runtime's current step); returns its metrics.

    The metrics are what the step recorded (``runtime.record``), the metrics of the returned rollouts
    (scores, advantages, lengths, groups, truncation, the sync gap when both log-prob columns are
    there), phase timings, throughput, each phase against the machine's peak when ``limits`` is given
    (``perf/mfu_*``, ``perf/generation_bandwidth_frac``: `hybridflow.metrics.efficiency`) and the
    training monitor's ``monitor/*`` (which warns on the console when an alarm fires). Raises `LogProbGapError` when the gap exceeds
    ``resharding.max_log_prob_gap``, and `TrainingAlarm` when an alarm fires under
    ``monitor.stop_on_alarm``. With ``trainer.rollout_dump`` the returned rows are written to
    ``rollouts/step_<k>.jsonl`` (`Runtime.rollout_dump`).
    """
    with runtime.timer.step():
        rollouts = step(runtime, prompts)
    if not isinstance(rollouts, Batch):
        raise TypeError(
            f"the step function {getattr(step, '__name__', step)!r} must return the step's rollouts "
            f"(a Batch), got {type(rollouts).__name__}"
        )
    if runtime.rollout_dump is not None:
        runtime.rollout_dump.write(runtime.step, rollouts)
    metrics = {
        **step_metrics(rollouts),
        **runtime.step_metrics,
        **runtime.timer.metrics(),
        **_throughput(runtime, rollouts),
    }
    if limits is not None:
        metrics.update(_efficiency(runtime, rollouts, metrics, limits))
    check_sync(metrics, runtime.config.resharding.max_log_prob_gap, runtime.step)
    metrics.update(runtime.monitor.observe(runtime.step, rollouts, metrics))
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


def _throughput(runtime: Runtime, rollouts: Batch) -> dict[str, float]:
    if "response_mask" not in rollouts or "attention_mask" not in rollouts:
        return {}
    response_tokens = int(rollouts["response_mask"].sum())
    return throughput_metrics(
        total_tokens=int(rollouts["attention_mask"].sum()) + response_tokens,
        response_tokens=response_tokens,
        step_seconds=runtime.timer.step_seconds or 0.0,
        generation_seconds=runtime.timer.seconds.get("generation"),
        world_size=runtime.sizes.world_size,
    )


@dataclass(frozen=True)
class MachineLimits:
    """What `run_step` holds each phase against: the policy's ``shape``, the machine's measured ``peak``,
    the training layout's ``compute_dtype``, the engine's ``engine_dtype``, the number of ``engines``, and
    whether the actor's forwards run each prompt once for all its samples (``shared_prefix``: packed
    forwards under the varlen SDPA attention, `workers.actor.sequence_log_probs`), and the parameters of
    its LoRA adapters (``adapter_parameters``, 0 without ``actor.lora``)."""

    shape: ModelShape
    peak: MachinePeak
    compute_dtype: str
    engine_dtype: str
    engines: int
    shared_prefix: bool
    adapter_parameters: int


def adapter_parameters(shape: ModelShape, lora: LoraConfig | None) -> int:
    """Parameters of the LoRA adapters ``lora`` adds to a model of ``shape`` (0 for ``None``)."""
    if lora is None:
        return 0
    return sum(math.prod(dims) for dims in lora_shapes(shape, lora.target_modules, lora.rank).values())


def machine_limits(runtime: Runtime) -> MachineLimits | None:
    """The run's `MachineLimits`, from the peak stored for its device in ``trainer.machine_peak_file``
    (``python benchmarks/bench_machine_peak.py`` measures and stores it); ``None``, said in the log, when
    that device has no stored peak or the policy's shape is not one the planner knows."""
    config = runtime.config
    on_gpu = config.resource.use_gpu
    if on_gpu and not torch.cuda.is_available():
        return None  # a driver without a GPU cannot name the workers' device
    device = device_name("cuda" if on_gpu else "cpu")
    peak = load_machine_peak(device, config.trainer.machine_peak_file)
    if peak is None:
        logger.info(
            "perf/mfu_* not reported: no measured peak for %r in %s (python benchmarks/bench_machine_peak.py)",
            device,
            config.trainer.machine_peak_file,
        )
        return None
    try:
        shape = policy_shape(config)
    except ConfigError as error:
        logger.info("perf/mfu_* not reported: %s", error)
        return None
    compute_dtype = config.actor.param_dtype or ("bfloat16" if on_gpu else "float32")
    return MachineLimits(
        shape=shape,
        peak=peak,
        compute_dtype=compute_dtype,
        engine_dtype=config.rollout.dtype or config.model.dtype,
        engines=runtime.sizes.world_size // config.rollout.tp_size,
        # Half precision on a GPU trains under flash-attn (hybridflow.parallel.choose_attn_implementation),
        # which runs every row's prompt; elsewhere packed forwards share each prompt.
        shared_prefix=config.actor.use_packing and not (on_gpu and compute_dtype != "float32"),
        adapter_parameters=adapter_parameters(shape, config.actor.lora),
    )


def _efficiency(
    runtime: Runtime, rollouts: Batch, metrics: dict[str, float], limits: MachineLimits
) -> dict[str, float]:
    if "response_mask" not in rollouts or "attention_mask" not in rollouts:
        return {}
    # Rows without advantage are left out of the update where actor.skip_zero_advantage_rows allows.
    skipped = "actor/rows_skipped" in metrics and "advantages" in rollouts
    updated = carries_advantage(rollouts) if skipped else torch.ones(len(rollouts), dtype=torch.bool)
    return phase_efficiency(
        limits.shape,
        limits.peak,
        runtime.timer.seconds,
        prompt_lengths=rollouts["attention_mask"].sum(-1),
        response_lengths=rollouts["response_mask"].sum(-1),
        updated_rows=updated,
        update_passes=runtime.config.actor.ppo_epochs,
        compute_dtype=limits.compute_dtype,
        engine_dtype=limits.engine_dtype,
        engines=limits.engines,
        prompt_ids=rollouts["input_ids"] if limits.shared_prefix and "input_ids" in rollouts else None,
        adapter_parameters=limits.adapter_parameters,
    )
