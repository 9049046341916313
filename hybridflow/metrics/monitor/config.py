"""`MonitorConfig`: thresholds and windows of the training monitor, in one frozen dataclass.

It is also the ``monitor`` section of the trainer's run config: each numeric field declares its range in
its metadata (`hybridflow.config_fields.config_field`), which the config loader reports per key and
:meth:`MonitorConfig.__post_init__` checks for a config built in code (`check_bounds`). A threshold set to ``None``
switches its alarm off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridflow.config_fields import check_bounds, config_field

__all__ = ["MonitorConfig"]


@dataclass(frozen=True)
class MonitorConfig:
    """How :class:`~hybridflow.metrics.monitor.TrainingMonitor` judges a run; docs/config.md (section
    ``monitor``) describes every field.

    Reward drift, per data source: ``drift_window`` rewards in the current window and in the reference
    window (``drift_reference``: the window just before, or the source's first), ``drift_bins`` for the
    PSI, alarms at ``psi_threshold`` / ``ks_threshold``.

    Reward hacking, over the last ``trend_window`` steps: accuracy is the share of rows whose first
    present column of ``accuracy_columns`` is at least ``correct_threshold`` (no column present: no
    accuracy, and the signals that compare with it stay silent), and counts as flat when it gained at
    most ``accuracy_flat``. Alarms: mean response length up by ``length_rise`` (relative)
    with flat accuracy; the ``format_fn`` pass rate up by ``format_rise`` to at least
    ``format_saturation`` with flat accuracy; the repeated ``repetition_ngram``-gram share up by
    ``repetition_rise``; the reward model's standardized gain ahead of the rule reward's by
    ``rm_divergence``.

    Malformed reward inputs: every row's reward (``rule_scores``, else ``scores``) exactly 0 while at
    least half of the rows' inputs look malformed (an empty response, or a ground truth that is missing,
    empty, or bytes), for ``malformed_reward_patience`` steps in a row.

    Diagnostics: equal-reward groups at ``zero_advantage_frac``, truncated responses at
    ``truncation_frac``, mean response length up by ``length_growth`` (relative) over the last
    ``length_growth_window`` steps while their mean accuracy is at most ``length_growth_accuracy``
    (length growing without reward), entropy (``entropy_key``) under ``entropy_floor``, clip fraction
    (``clip_frac_key``) at most ``clip_frac_low`` or at least ``clip_frac_high`` for ``clip_patience``
    steps, loss (``loss_key``) exactly 0 when ``warn_zero_loss``.

    ``stop_on_alarm`` raises :class:`~hybridflow.metrics.monitor.TrainingAlarm` when a drift, hacking or
    malformed-reward alarm fires; diagnostics only warn.
    """

    enabled: bool = True
    stop_on_alarm: bool = False
    drift_window: int = config_field(512, ge=1)
    drift_reference: Literal["previous", "first"] = "previous"
    drift_bins: int = config_field(10, ge=2)
    psi_threshold: float | None = config_field(0.25, gt=0)
    ks_threshold: float | None = config_field(0.3, gt=0, le=1)
    trend_window: int = config_field(20, ge=3)
    accuracy_columns: tuple[str, ...] = ("rule_scores", "scores")
    correct_threshold: float = 1.0
    accuracy_flat: float = config_field(0.02, ge=0)
    length_rise: float | None = config_field(0.25, gt=0)
    format_fn: str | None = None
    format_saturation: float = config_field(0.95, gt=0, le=1)
    format_rise: float | None = config_field(0.2, gt=0)
    repetition_ngram: int = config_field(4, ge=1)
    repetition_rise: float | None = config_field(0.1, gt=0)
    rm_divergence: float | None = config_field(1.0, gt=0)
    malformed_reward_patience: int | None = config_field(3, ge=1)
    zero_advantage_frac: float | None = config_field(1.0, gt=0, le=1)
    truncation_frac: float | None = config_field(0.5, gt=0, le=1)
    length_growth: float | None = config_field(0.25, gt=0)
    length_growth_window: int = config_field(5, ge=2)
    length_growth_accuracy: float = config_field(0.2, ge=0, le=1)
    entropy_key: str = "actor/entropy"
    entropy_floor: float | None = config_field(0.05, gt=0)
    clip_frac_key: str = "actor/clip_frac"
    clip_frac_low: float = config_field(0.0, ge=0, le=1)
    clip_frac_high: float = config_field(0.9, gt=0, le=1)
    clip_patience: int | None = config_field(10, ge=1)
    loss_key: str = "actor/pg_loss"
    warn_zero_loss: bool = True

    def __post_init__(self) -> None:
        check_bounds(self, "monitor")
