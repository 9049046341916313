"""Shared by the benchmarks that run a recipe on SmolLM2 once per setting: one run in its own process and
output folder, and its metrics records."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_recipe(folder: Path, overrides: list[str], recipe: str = "recipes/smollm2/main.py") -> float:
    """Run ``recipe`` (a script path from the repository root) with ``overrides`` into ``folder`` (relative
    to the repository root); the wall seconds of the whole command."""
    command = [sys.executable, recipe, *overrides, f"trainer.output_dir={folder}"]
    print("$", " ".join(command), flush=True)
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True)
    return time.perf_counter() - started


def records(folder: Path) -> list[dict]:
    """The metrics records of the run in ``folder`` (none when it has not run)."""
    path = REPO / folder / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def steps_done(folder: Path) -> int:
    """How many training steps the run in ``folder`` has recorded."""
    return sum("timing_s/update" in record for record in records(folder))


def seeded_schedule(steps: int, val_every: int, seed: int) -> list[str]:
    """The overrides every compared run shares: ``steps`` steps, validation every ``val_every``, and
    ``seed`` for the prompt order and the sampling (the sides of a seed see the same of both)."""
    return [
        f"trainer.total_steps={steps}",
        f"trainer.val_every={val_every}",
        f"data.seed={seed}",
        f"rollout.seed={seed}",
    ]


def completed_run(
    folder: Path,
    overrides: list[str],
    steps: int,
    *,
    fresh: bool = False,
    report: bool = False,
    recipe: str = "recipes/smollm2/main.py",
) -> list[dict] | None:
    """The metrics records of the run in ``folder`` once it has ``steps`` steps: a complete run is reused
    (unless ``fresh``), another is run again from scratch with ``overrides``; with ``report`` nothing runs
    and an incomplete run gives None."""
    done = steps_done(folder)
    if report and done < steps:
        return None
    if fresh or done < steps:
        (REPO / folder / "metrics.jsonl").unlink(missing_ok=True)
        print(f"{folder}: {run_recipe(folder, overrides, recipe):.0f} s", flush=True)
    return records(folder)
