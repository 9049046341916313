"""`MonitorConfig`: thresholds and windows of the training monitor, in one frozen dataclass.

It is also the ``monitor`` section of the trainer's run config: each numeric field declares its range in
its metadata (``{"bounds": {"ge"|"gt"|"le": limit}}``), which the config loader reports per key and
:meth:`MonitorConfig.__post_init__` checks for a config built in code. A threshold set to ``None``
switches its alarm off.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["MonitorConfig"]


def _bounded(
    default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None
) -> Any:
    bounds = {name: limit for name, limit in (("ge", ge), ("gt", gt), ("le", le)) if limit is not None}
    return field(default=default, metadata={"bounds": bounds})


_CHECKS = {
    "ge": (">=", lambda value, limit: value >= limit),
    "gt": (">", lambda value, limit: value > limit),
    "le": ("<=", lambda value, limit: value <= limit),
}


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

    Diagnostics: equal-reward groups at ``zero_advantage_frac``, truncated responses at
    ``truncation_frac``, entropy (``entropy_key``) under ``entropy_floor``, clip fraction
    (``clip_frac_key``) at most ``clip_frac_low`` or at least ``clip_frac_high`` for ``clip_patience``
    steps, loss (``loss_key``) exactly 0 when ``warn_zero_loss``.

    ``stop_on_alarm`` raises :class:`~hybridflow.metrics.monitor.TrainingAlarm` when a drift or hacking
    alarm fires; diagnostics only warn.
    """

    enabled: bool = True
    stop_on_alarm: bool = False
    drift_window: int = _bounded(512, ge=1)
    drift_reference: Literal["previous", "first"] = "previous"
    drift_bins: int = _bounded(10, ge=2)
    psi_threshold: float | None = _bounded(0.25, gt=0)
    ks_threshold: float | None = _bounded(0.3, gt=0, le=1)
    trend_window: int = _bounded(20, ge=3)
    accuracy_columns: tuple[str, ...] = ("rule_scores", "scores")
    correct_threshold: float = 1.0
    accuracy_flat: float = _bounded(0.02, ge=0)
    length_rise: float | None = _bounded(0.25, gt=0)
    format_fn: str | None = None
    format_saturation: float = _bounded(0.95, gt=0, le=1)
    format_rise: float | None = _bounded(0.2, gt=0)
    repetition_ngram: int = _bounded(4, ge=1)
    repetition_rise: float | None = _bounded(0.1, gt=0)
    rm_divergence: float | None = _bounded(1.0, gt=0)
    zero_advantage_frac: float | None = _bounded(1.0, gt=0, le=1)
    truncation_frac: float | None = _bounded(0.5, gt=0, le=1)
    entropy_key: str = "actor/entropy"
    entropy_floor: float | None = _bounded(0.05, gt=0)
    clip_frac_key: str = "actor/clip_frac"
    clip_frac_low: float = _bounded(0.0, ge=0, le=1)
    clip_frac_high: float = _bounded(0.9, gt=0, le=1)
    clip_patience: int | None = _bounded(10, ge=1)
    loss_key: str = "actor/pg_loss"
    warn_zero_loss: bool = True

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if value is None or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            bounds = spec.metadata.get("bounds", {})
            if not all(_CHECKS[name][1](value, limit) for name, limit in bounds.items()):
                allowed = " and ".join(f"{_CHECKS[name][0]} {limit}" for name, limit in bounds.items())
                raise ValueError(f"MonitorConfig.{spec.name} must be {allowed}, got {value}")
