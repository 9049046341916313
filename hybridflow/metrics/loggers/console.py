"""Console logging: one compact line per step above a tqdm progress bar over the run's steps."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from tqdm import tqdm

from hybridflow.metrics.loggers.base import MetricLogger, to_scalars

__all__ = ["DEFAULT_CONSOLE_KEYS", "ConsoleLogger"]

DEFAULT_CONSOLE_KEYS = (
    "score/mean",
    "reward/mean",
    "val/accuracy",
    "response_length/mean",
    "group/zero_variance_frac",
    "actor/pg_loss",
    "actor/entropy",
    "sync/log_prob_abs_diff_max",
    "timing_s/step",
    "startup/*",
)
"""The headline metrics printed per step (when present); the rest go to the file loggers. A key ending
in ``/*`` stands for every metric under that prefix, in the order logged (``startup/*``: the start-up's
parts, logged once)."""


class ConsoleLogger(MetricLogger):
    """Prints ``step 3/100 | score/mean 0.42 | ... | timing_s/step 1.23`` and advances a progress bar.

    Args:
        total_steps: length of the run, for the bar and the ``3/100`` counter; None if unknown.
        keys: metrics to print, in order; those missing from a step are left out. ``prefix/*`` names
            every metric under ``prefix/``.
        stream: where lines and the bar go (default: standard error, away from program output).
        progress: whether to show the progress bar.
    """

    def __init__(
        self,
        total_steps: int | None = None,
        keys: Sequence[str] = DEFAULT_CONSOLE_KEYS,
        stream: TextIO | None = None,
        progress: bool = True,
    ) -> None:
        self.total_steps = total_steps
        self.keys = tuple(keys)
        self._stream = stream if stream is not None else sys.stderr
        self._bar = (
            tqdm(total=total_steps, file=self._stream, desc="training", unit="step", dynamic_ncols=True)
            if progress
            else None
        )

    def format_line(self, metrics: Mapping[str, Any], step: int) -> str:
        """The line printed for one step."""
        values = to_scalars({key: metrics[key] for key in self._present(metrics)})
        counter = f"step {step}/{self.total_steps}" if self.total_steps else f"step {step}"
        return " | ".join([counter, *(f"{key} {value:.4g}" for key, value in values.items())])

    def _present(self, metrics: Mapping[str, Any]) -> list[str]:
        present: list[str] = []
        for key in self.keys:
            if key.endswith("/*"):
                present.extend(name for name in metrics if name.startswith(key[:-1]))
            elif key in metrics:
                present.append(key)
        return present

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        line = self.format_line(metrics, step)
        if self._bar is None:
            print(line, file=self._stream, flush=True)
            return
        # tqdm.write keeps the bar below the printed lines instead of breaking it.
        self._bar.write(line, file=self._stream)
        # A resumed run starts at its checkpoint's step, so move the bar to the step rather than by one.
        self._bar.update(max(step - self._bar.n, 0))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
