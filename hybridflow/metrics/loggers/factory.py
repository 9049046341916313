"""Building the loggers a run asks for by name (``trainer.loggers`` in the run config)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from hybridflow.metrics.loggers.base import MetricLogger
from hybridflow.metrics.loggers.console import ConsoleLogger
from hybridflow.metrics.loggers.jsonl import JsonlLogger
from hybridflow.metrics.loggers.multi import MultiLogger
from hybridflow.metrics.loggers.tensorboard_logger import TensorBoardLogger
from hybridflow.metrics.loggers.wandb_logger import WandbLogger

__all__ = ["METRICS_FILE", "TENSORBOARD_DIR", "create_logger"]

METRICS_FILE = "metrics.jsonl"
"""The jsonl logger's file, under the run's output folder."""

TENSORBOARD_DIR = "tensorboard"
"""The tensorboard logger's folder, under the run's output folder."""


def create_logger(
    names: Sequence[str],
    *,
    output_dir: str | Path,
    total_steps: int | None = None,
    project: str = "hybridflow",
    experiment: str = "default",
    config: Mapping[str, Any] | None = None,
    wandb_mode: Literal["online", "offline", "disabled"] = "offline",
) -> MultiLogger:
    """A :class:`MultiLogger` over the loggers ``names`` (``console``, ``jsonl``, ``tensorboard``, ``wandb``).

    Files go under ``output_dir``: ``metrics.jsonl``, ``tensorboard/``, ``wandb/``.

    Raises:
        ValueError: an unknown name (the message lists the valid ones).
        LoggerUnavailableError: a logger whose package is not installed.
    """
    output_dir = Path(output_dir)
    builders: dict[str, Callable[[], MetricLogger]] = {
        "console": lambda: ConsoleLogger(total_steps),
        "jsonl": lambda: JsonlLogger(output_dir / METRICS_FILE),
        "tensorboard": lambda: TensorBoardLogger(output_dir / TENSORBOARD_DIR),
        "wandb": lambda: WandbLogger(project, experiment, output_dir, mode=wandb_mode, config=config),
    }
    unknown = [name for name in names if name not in builders]
    if unknown:
        raise ValueError(f"unknown logger(s) {unknown}; valid names: {', '.join(builders)}")
    built: list[MetricLogger] = []
    try:
        for name in names:
            built.append(builders[name]())
    except BaseException:
        # Do not leave a progress bar or open files behind when a later logger cannot start.
        MultiLogger(built).close()
        raise
    return MultiLogger(built)
