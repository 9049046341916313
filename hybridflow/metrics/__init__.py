"""Observability of a run: phase timers, metric reducers, RL step metrics, loggers and plots.

- :mod:`~hybridflow.metrics.timing`: ``Timer``, ``PhaseTimer`` (``timing_s/*``, ``timing_share/*``),
  ``throughput_metrics`` (``perf/*``);
- :mod:`~hybridflow.metrics.reduce`: ``reduce_metrics`` over ranks / micro-batches by each metric's
  kind, ``tensor_stats`` (mean / std / min / max under a mask);
- :mod:`~hybridflow.metrics.rl`: pure functions from a step's ``Batch`` to ``score/*``, ``reward/*``,
  ``advantage/*``, ``group/*``, ``response/*``, ``response_length/*``, ``sync/*``;
- :mod:`~hybridflow.metrics.drift`: ``population_stability_index``, ``ks_statistic``,
  ``RewardDriftTracker`` (rolling and reference reward windows per data source);
- :mod:`~hybridflow.metrics.monitor`: ``TrainingMonitor`` built from ``MonitorConfig``: reward drift,
  reward-hacking signals and "is it training?" diagnostics (``monitor/*``), ``TrainingAlarm``;
- :mod:`~hybridflow.metrics.loggers`: console, jsonl, tensorboard and wandb loggers, ``MultiLogger``,
  ``create_logger``;
- :mod:`~hybridflow.metrics.plot`: ``python -m hybridflow.metrics.plot RUN.jsonl --out DIR``;
- :mod:`~hybridflow.metrics.startup`: ``StartupTimer`` (``startup/*``: where the time before the first
  step goes), ``process_age_s``;
- :mod:`~hybridflow.metrics.log_routing`: a quiet console: worker output and library warnings to the
  run's log folder, own warnings to the console.

docs/metrics.md lists every metric name.
"""

from hybridflow.metrics.drift import DriftScore, RewardDriftTracker, ks_statistic, population_stability_index
from hybridflow.metrics.loggers import (
    ConsoleLogger,
    JsonlLogger,
    LoggerUnavailableError,
    MetricLogger,
    MultiLogger,
    TensorBoardLogger,
    WandbLogger,
    create_logger,
    read_jsonl,
)
from hybridflow.metrics.monitor import Alarm, MonitorConfig, TrainingAlarm, TrainingMonitor
from hybridflow.metrics.reduce import DEFAULT_KINDS, MetricKind, metric_kind, reduce_metrics, tensor_stats
from hybridflow.metrics.rl import (
    advantage_metrics,
    group_metrics,
    log_prob_gap_metrics,
    response_length_metrics,
    reward_metrics,
    sequence_scores,
    step_metrics,
    truncation_metrics,
    zero_variance_group_fraction,
)
from hybridflow.metrics.startup import StartupTimer, process_age_s
from hybridflow.metrics.timing import PHASES, PhaseTimer, Timer, throughput_metrics

__all__ = [
    "DEFAULT_KINDS",
    "PHASES",
    "Alarm",
    "ConsoleLogger",
    "DriftScore",
    "JsonlLogger",
    "LoggerUnavailableError",
    "MetricKind",
    "MetricLogger",
    "MonitorConfig",
    "MultiLogger",
    "PhaseTimer",
    "RewardDriftTracker",
    "StartupTimer",
    "TensorBoardLogger",
    "Timer",
    "TrainingAlarm",
    "TrainingMonitor",
    "WandbLogger",
    "advantage_metrics",
    "create_logger",
    "group_metrics",
    "ks_statistic",
    "log_prob_gap_metrics",
    "metric_kind",
    "population_stability_index",
    "process_age_s",
    "read_jsonl",
    "reduce_metrics",
    "response_length_metrics",
    "reward_metrics",
    "sequence_scores",
    "step_metrics",
    "tensor_stats",
    "throughput_metrics",
    "truncation_metrics",
    "zero_variance_group_fraction",
]
