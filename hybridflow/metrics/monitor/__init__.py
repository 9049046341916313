"""The training monitor: reward drift per data source, reward-hacking signals and "is it training?" checks.

- :mod:`~hybridflow.metrics.monitor.config`: ``MonitorConfig`` (the run config's ``monitor`` section);
- :mod:`~hybridflow.metrics.monitor.signals`: pure functions (trend over a window, repeated n-grams,
  equal-reward groups);
- :mod:`~hybridflow.metrics.monitor.training`: ``TrainingMonitor.observe(step, rollouts, metrics)``,
  ``Alarm``, ``TrainingAlarm``, and ``malformed_inputs`` (the rows whose reward inputs look unusable).

The drift scores themselves live in :mod:`hybridflow.metrics.drift`.
"""

from hybridflow.metrics.monitor.config import MonitorConfig
from hybridflow.metrics.monitor.signals import (
    batch_repetition,
    equal_reward_groups,
    repeated_ngram_share,
    standardized_change,
    window_change,
)
from hybridflow.metrics.monitor.training import (
    ALARMS,
    DIAGNOSTICS,
    LEARNING_RATE_KEY,
    MALFORMED_SHARE,
    Alarm,
    TrainingAlarm,
    TrainingMonitor,
    malformed_inputs,
)

__all__ = [
    "ALARMS",
    "DIAGNOSTICS",
    "LEARNING_RATE_KEY",
    "MALFORMED_SHARE",
    "Alarm",
    "MonitorConfig",
    "TrainingAlarm",
    "TrainingMonitor",
    "batch_repetition",
    "equal_reward_groups",
    "malformed_inputs",
    "repeated_ngram_share",
    "standardized_change",
    "window_change",
]
