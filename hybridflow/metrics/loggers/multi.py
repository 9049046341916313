"""`MultiLogger`: one logger that hands every step to several."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hybridflow.metrics.loggers.base import MetricLogger

__all__ = ["MultiLogger"]


class MultiLogger(MetricLogger):
    """Fans each call out to ``loggers`` in order."""

    def __init__(self, loggers: Sequence[MetricLogger]) -> None:
        self.loggers = tuple(loggers)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def rewind(self, step: int) -> None:
        for logger in self.loggers:
            logger.rewind(step)

    def close(self) -> None:
        """Close every logger, even if one fails; the first failure is raised afterwards."""
        errors = []
        for logger in self.loggers:
            try:
                logger.close()
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]
