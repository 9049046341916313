"""TensorBoard event files through ``torch.utils.tensorboard.SummaryWriter``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hybridflow.metrics.loggers.base import LoggerUnavailableError, MetricLogger, to_scalars

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger(MetricLogger):
    """Writes every metric as a scalar series under its name into ``log_dir``.

    `rewind` starts a new event file that marks its step as a restart: TensorBoard then drops the
    events of that step and later ones from the earlier files, so a resumed run shows each step once.

    Raises:
        LoggerUnavailableError: the ``tensorboard`` package is not installed.
    """

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise LoggerUnavailableError(
                "the 'tensorboard' logger needs the tensorboard package: pip install tensorboard"
            ) from error
        self.log_dir = Path(log_dir)
        self._summary_writer = SummaryWriter
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for name, value in to_scalars(metrics).items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def rewind(self, step: int) -> None:
        self._writer.close()
        self._writer = self._summary_writer(log_dir=str(self.log_dir), purge_step=step)

    def close(self) -> None:
        self._writer.close()
