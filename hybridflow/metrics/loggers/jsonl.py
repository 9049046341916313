"""A JSON-lines file of metrics: one object per step, ``{"step": 3, "score/mean": 0.42, ...}``."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hybridflow.metrics.loggers.base import MetricLogger, to_scalars

__all__ = ["JsonlLogger", "read_jsonl"]


class JsonlLogger(MetricLogger):
    """Appends one JSON object per step to ``path`` (a resumed run continues the same file).

    Each line is flushed as it is written, so the file is readable while the run goes on and survives a
    crash. NaN and infinities, which JSON cannot hold, are written as ``null``. `rewind` drops the
    records of a step and those after it, so a resumed run does not repeat steps in the file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        values = {key: value if math.isfinite(value) else None for key, value in to_scalars(metrics).items()}
        self._file.write(json.dumps({"step": step, **values}) + "\n")
        self._file.flush()

    def rewind(self, step: int) -> None:
        """Rewrite the file with only the records of steps before ``step``, atomically (a crash leaves the
        old file or the new one). A line cut short by an earlier crash goes too."""
        self._file.close()
        kept = [
            line
            for line in self.path.read_text(encoding="utf-8").splitlines(keepends=True)
            if line.endswith("\n") and (line_step := _step_of(line)) is not None and line_step < step
        ]
        temporary = self.path.with_name(f".{self.path.name}.rewind")
        with temporary.open("w", encoding="utf-8") as file:
            file.writelines(kept)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)
        self._file = self.path.open("a", encoding="utf-8")

    def close(self) -> None:
        self._file.close()


def _step_of(line: str) -> int | None:
    """The ``step`` of one line of a metrics file; None for a line that is not such a record."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) else None


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
