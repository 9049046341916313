"""A JSON-lines file of metrics: one object per step, ``{"step": 3, "score/mean": 0.42, ...}``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hybridflow.metrics.loggers.base import MetricLogger, to_scalars

__all__ = ["JsonlLogger", "read_jsonl"]


class JsonlLogger(MetricLogger):
    """Appends one JSON object per step to ``path`` (a resumed run continues the same file).

    Each line is flushed as it is written, so the file is readable while the run goes on and survives a
    crash. NaN and infinities, which JSON cannot hold, are written as ``null``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        values = {key: value if math.isfinite(value) else None for key, value in to_scalars(metrics).items()}
        self._file.write(json.dumps({"step": step, **values}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics file, one per step in step order.

    When a step appears more than once (a run resumed from an earlier checkpoint), its last record wins.
    """
    by_step: dict[int, dict[str, Any]] = {}
    with Path(path).open(encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record, dict) or "step" not in record:
                raise ValueError(
                    f"{path}:{number}: expected a JSON object with a 'step', got {line.strip()[:80]}"
                )
            by_step[int(record["step"])] = record
    return [by_step[step] for step in sorted(by_step)]
