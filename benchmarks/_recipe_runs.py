"""Shared by the benchmarks that run `recipes/smollm2` once per setting: one run in its own process and
output folder, and its metrics records."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_recipe(folder: Path, overrides: list[str]) -> float:
    """Run `recipes/smollm2/main.py` with ``overrides`` into ``folder`` (relative to the repository root);
    the wall seconds of the whole command."""
    command = [sys.executable, "recipes/smollm2/main.py", *overrides, f"trainer.output_dir={folder}"]
    print("$", " ".join(command), flush=True)
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True)
    return time.perf_counter() - started


def records(folder: Path) -> list[dict]:
    """The metrics records of the run in ``folder`` (none when it has not run)."""
    path = REPO / folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
