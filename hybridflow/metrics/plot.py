"""Plot a run's metrics file as PNG curves (matplotlib, Agg backend: no display needed).

Command line::

    python -m hybridflow.metrics.plot RUN.jsonl --out DIR [--keys score/mean timing_s/step] [--grid]

writes one ``DIR/<key>.png`` per metric (``/`` in a name becomes ``__``), or with ``--grid`` a single
``DIR/metrics.png`` with one panel per metric. Without ``--keys`` every numeric metric is plotted.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridflow.metrics.loggers.jsonl import read_jsonl

__all__ = ["main", "plot_run"]

GRID_FILE = "metrics.png"


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [
        (record["step"], float(record[key]))
        for record in records
        if isinstance(record.get(key), int | float) and not isinstance(record.get(key), bool)
    ]
    return [step for step, _ in points], [value for _, value in points]


def _numeric_keys(records: list[dict[str, Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for record in records:
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                keys[key] = None
    return sorted(keys)


def _file_name(key: str) -> str:
    return key.replace("/", "__") + ".png"


def plot_run(
    jsonl_path: str | Path, out_dir: str | Path, keys: Sequence[str] | None = None, grid: bool = False
) -> list[Path]:
    """Write the PNG curves of ``keys`` (default: every numeric metric) and return their paths.

    Raises:
        ImportError: matplotlib is not installed (the message names it).
        KeyError: a requested key never appears in the file (the message lists those that do).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError("plotting needs the matplotlib package: pip install matplotlib") from error

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
            ax.plot(*_series(records, key))
            ax.set_title(key, fontsize=9)
            ax.set_xlabel("step")
        for ax in list(axes.flat)[len(keys) :]:
            ax.set_visible(False)
        fig.tight_layout()
        path = out_dir / GRID_FILE
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return [path]

    paths = []
    for key in keys:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(*_series(records, key))
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / _file_name(key)
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
    args = parser.parse_args(argv)
    try:
        paths = plot_run(args.jsonl, args.out, args.keys, args.grid)
    except KeyError as error:
        parser.error(str(error.args[0]))
    for path in paths:
        print(path)
    return paths


if __name__ == "__main__":
    main()
