"""Plot a run's metrics file as PNG curves (matplotlib, Agg backend: no display needed).

Command line::

    python -m hybridflow.metrics.plot RUN.jsonl --out DIR [--keys score/mean timing_s/step] [--grid] \\
        [--x step|time]

writes one ``DIR/<key>.png`` per metric (``/`` in a name becomes ``__``), or with ``--grid`` a single
``DIR/metrics.png`` with one panel per metric. Without ``--keys`` every numeric metric is plotted.

The x axis is the step (``--x step``, the default) or the training time (``--x time``): seconds of
training up to the end of each step, the running sum of ``timing_s/step`` (a record without it, such as
the validation before training at step 0, adds nothing). Time spent outside the steps (start-up,
validation, checkpoints) is not counted. Files plotted against time end in ``__time.png``
(``DIR/metrics__time.png`` for the grid).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridflow.metrics.loggers.jsonl import read_jsonl

__all__ = ["main", "plot_run", "series", "x_values"]

GRID_FILE = "metrics.png"
X_AXES = {"step": "step", "time": "training time (s)"}
STEP_SECONDS = "timing_s/step"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def x_values(records: Sequence[dict[str, Any]], x: str = "step") -> list[float]:
    """The x coordinate of each record (in step order): its ``step``, or for ``x="time"`` the seconds of
    training up to the end of its step (the running sum of ``timing_s/step``)."""
    if x == "step":
        return [float(record["step"]) for record in records]
    if x != "time":
        raise ValueError(f"x must be one of {sorted(X_AXES)}, got {x!r}")
    elapsed, out = 0.0, []
    for record in records:
        seconds = record.get(STEP_SECONDS)
        elapsed += float(seconds) if _is_number(seconds) else 0.0
        out.append(elapsed)
    return out


def series(records: Sequence[dict[str, Any]], key: str, x: str = "step") -> tuple[list[float], list[float]]:
    """``(xs, values)`` of the records that hold a number for ``key``; ``x`` as in `x_values`."""
    points = [
        (position, float(record[key]))
        for position, record in zip(x_values(records, x), records, strict=True)
        if _is_number(record.get(key))
    ]
    return [position for position, _ in points], [value for _, value in points]


def _numeric_keys(records: list[dict[str, Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for record in records:
        for key, value in record.items():
            if key != "step" and _is_number(value):
                keys[key] = None
    return sorted(keys)


def _file_name(key: str, x: str) -> str:
    return key.replace("/", "__") + ("__time" if x == "time" else "") + ".png"


def plot_run(
    jsonl_path: str | Path,
    out_dir: str | Path,
    keys: Sequence[str] | None = None,
    grid: bool = False,
    x: str = "step",
) -> list[Path]:
    """Write the PNG curves of ``keys`` (default: every numeric metric) against ``x`` (``"step"`` or
    ``"time"``, see the module docstring) and return their paths.

    Raises:
        ValueError: ``x`` is neither ``"step"`` nor ``"time"``.
        ImportError: matplotlib is not installed (the message names it).
        KeyError: a requested key never appears in the file (the message lists those that do).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError("plotting needs the matplotlib package: pip install matplotlib") from error

    if x not in X_AXES:
        raise ValueError(f"x must be one of {sorted(X_AXES)}, got {x!r}")
    records = read_jsonl(jsonl_path)
    available = _numeric_keys(records)
    keys = list(keys) if keys else available
    missing = [key for key in keys if key not in available]
    if missing:
        raise KeyError(f"{jsonl_path} has no values for {missing}; it has {available}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    if grid:
        cols = math.ceil(math.sqrt(len(keys)))
        rows = math.ceil(len(keys) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
        for ax, key in zip(axes.flat, keys, strict=False):
            ax.plot(*series(records, key, x))
            ax.set_title(key, fontsize=9)
            ax.set_xlabel(X_AXES[x])
        for ax in list(axes.flat)[len(keys) :]:
            ax.set_visible(False)
        fig.tight_layout()
        path = out_dir / _file_name(Path(GRID_FILE).stem, x)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return [path]

    paths = []
    for key in keys:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(*series(records, key, x))
        ax.set_title(key)
        ax.set_xlabel(X_AXES[x])
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / _file_name(key, x)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> list[Path]:
    """The command line described in the module docstring; prints each file written."""
    parser = argparse.ArgumentParser(
        prog="python -m hybridflow.metrics.plot", description=__doc__.split("\n")[0]
    )
    parser.add_argument("jsonl", help="the run's metrics file (metrics.jsonl)")
    parser.add_argument("--out", required=True, help="folder for the PNG files")
    parser.add_argument("--keys", nargs="+", help="metrics to plot (default: all)")
    parser.add_argument("--grid", action="store_true", help="one PNG with a panel per metric")
    parser.add_argument(
        "--x", choices=sorted(X_AXES), default="step", help="x axis: the step, or seconds of training"
    )
    args = parser.parse_args(argv)
    try:
        paths = plot_run(args.jsonl, args.out, args.keys, args.grid, args.x)
    except KeyError as error:
        parser.error(str(error.args[0]))
    for path in paths:
        print(path)
    return paths


if __name__ == "__main__":
    main()
