"""Weights & Biases runs; ``mode="offline"`` writes the run under ``dir`` without a network or an account."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from hybridflow.metrics.loggers.base import LoggerUnavailableError, MetricLogger, to_scalars

__all__ = ["WandbLogger"]


class WandbLogger(MetricLogger):
    """Logs each step's metrics to a wandb run.

    Args:
        project: wandb project.
        name: run name (the experiment).
        dir: folder for wandb's files (``<dir>/wandb/...``); usually the run's output folder.
        mode: ``"offline"`` (sync later with ``wandb sync``), ``"online"`` or ``"disabled"``.
        config: the run config as plain data, stored with the run.

    Raises:
        LoggerUnavailableError: the ``wandb`` package is not installed.
    """

    def __init__(
        self,
        project: str,
        name: str,
        dir: str | Path,
        mode: Literal["online", "offline", "disabled"] = "offline",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            import wandb
        except ImportError as error:
            raise LoggerUnavailableError(
                "the 'wandb' logger needs the wandb package: pip install wandb"
            ) from error
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        # console="off": the console logger owns stdout; wandb wrapping it also races with
        # whatever else captures output (pytest, tee) and can lose the run's records.
        self._run = wandb.init(
            project=project,
            name=name,
            dir=str(self.dir),
            mode=mode,
            config=dict(config or {}),
            settings=wandb.Settings(console="off"),
        )

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self._run.log(to_scalars(metrics), step=step)

    def close(self) -> None:
        self._run.finish()
