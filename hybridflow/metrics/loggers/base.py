"""The interface every metric logger implements, and the conversion of metric values to floats."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from numbers import Real
from types import TracebackType
from typing import Any

import torch

__all__ = ["LoggerUnavailableError", "MetricLogger", "to_scalars"]


class LoggerUnavailableError(ImportError):
    """A logger was asked for whose package is not installed; the message names the package."""


def to_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Metric values as Python floats: numbers, numpy scalars and one-element tensors are accepted."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise TypeError(f"metric {name!r} is a tensor of {value.numel()} elements; reduce it first")
            out[name] = float(value.item())
        elif isinstance(value, Real) or hasattr(value, "item"):
            out[name] = float(value)
        else:
            raise TypeError(f"metric {name!r} holds {type(value).__name__}, not a number")
    return out


class MetricLogger(ABC):
    """Receives one dict of metrics per training step.

    Use it as a context manager, or call :meth:`close` at the end of the run so files are flushed.
    """

    @abstractmethod
    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` (name -> number) for training step ``step``."""

    @abstractmethod
    def close(self) -> None:
        """Flush and release what the logger holds."""

    def rewind(self, step: int) -> None:
        """Forget what was recorded for ``step`` and every later step.

        A run restarting from the checkpoint of step ``k`` in the same output folder calls
        ``rewind(k + 1)`` before it logs again (a fresh start calls ``rewind(0)``), so that each step
        appears once. Loggers whose records outlive a run (files) override it; the default keeps nothing
        to forget.
        """
        return

    def __enter__(self) -> MetricLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
