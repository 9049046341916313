"""Metric loggers behind one interface (:class:`MetricLogger`): console, jsonl, tensorboard, wandb."""

from hybridflow.metrics.loggers.base import LoggerUnavailableError, MetricLogger, to_scalars
from hybridflow.metrics.loggers.console import DEFAULT_CONSOLE_KEYS, ConsoleLogger
from hybridflow.metrics.loggers.factory import METRICS_FILE, TENSORBOARD_DIR, create_logger
from hybridflow.metrics.loggers.jsonl import JsonlLogger, read_jsonl
from hybridflow.metrics.loggers.multi import MultiLogger
from hybridflow.metrics.loggers.tensorboard_logger import TensorBoardLogger
from hybridflow.metrics.loggers.wandb_logger import WandbLogger

__all__ = [
    "DEFAULT_CONSOLE_KEYS",
    "METRICS_FILE",
    "TENSORBOARD_DIR",
    "ConsoleLogger",
    "JsonlLogger",
    "LoggerUnavailableError",
    "MetricLogger",
    "MultiLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "create_logger",
    "read_jsonl",
    "to_scalars",
]
