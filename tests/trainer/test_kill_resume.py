"""kill -9 in the middle of a step, then `resume: auto`: the next steps equal an uninterrupted run's.

Three runs of the real command line (``python -m trainer.main``, 2 ranks, the tiny task of `_runs`, the
HF engine) on the same config: an uninterrupted reference, a run whose driver gets SIGKILL half-way
through step 3 (after the step-2 checkpoint is complete), and the same command again in the killed
run's folder, which resumes from step 2. Steps 3 and 4 of the resumed run must repeat the reference's
numbers: the data position (step 3 starts the second epoch of a shuffled loader), the per-step sampling
seeds, AdamW's moments, the cosine schedule with warm-up and the update count that seeds the
mini-batch shuffle all have to come back for that.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from hybridflow.checkpoint import MARKER_FILE
from tests.trainer._command_line import run_to_the_end, start_driver, wait_for_file
from tests.trainer._runs import run_config, write_task
from trainer.config import config_to_dict

# Three runs, each mostly start-up (Ray, two worker processes, the reward pool): 2.5 min apiece at load
# 20-50 on 2 cores, so more than the suite's default timeout per test.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * 600)]

STEPS = 4
SAVE_EVERY = 2
KILLED_IN = SAVE_EVERY + 1
# 32 prompts in batches of 16: two steps per epoch, so the resumed step starts an epoch.
PROMPTS = 32
SETTINGS = [
    f"trainer.save_every={SAVE_EVERY}",
    "trainer.loggers=[jsonl]",
    "actor.lr_scheduler=cosine",
    "actor.warmup_steps=2",
    "actor.min_lr_ratio=0.1",
    # 128 rows per step in two shuffled mini-batches: two optimizer steps per step.
    "actor.ppo_mini_batch_size=64",
    "actor.shuffle=true",
    "actor.weight_decay=0.01",
]
# What a step measures about the machine rather than the training: durations, their shares, rates,
# fractions of the machine's peak (logged where this machine has a stored peak) and memory peaks.
MACHINE_PREFIXES = ("timing_s/", "timing_share/", "perf/mfu_", "perf/generation_bandwidth_frac")
MACHINE_SUFFIXES = ("_s", "_s_per_rank", "_peak_mb")


def write_run_config(root: Path, output_dir: Path) -> Path:
    """The tiny task's run config as a YAML file, writing into ``output_dir``."""
    config = run_config(root, "hf", STEPS, [*SETTINGS, f"trainer.output_dir={output_dir}"])
    path = output_dir.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config_to_dict(config)))
    return path


def records(output_dir: Path) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def training_metrics(record: dict) -> dict[str, float]:
    """A step's record without what depends on the machine's speed and memory."""
    return {
        key: value
        for key, value in record.items()
        if not key.startswith(MACHINE_PREFIXES) and not key.endswith(MACHINE_SUFFIXES)
    }


def kill_in_step(config: Path, output_dir: Path, log: Path) -> None:
    """Start the run and SIGKILL its driver part-way through step `KILLED_IN`: once the step-2
    checkpoint is complete, after 15% of step 2's duration, and before step 3 has logged. (A longer wait
    lost the race under load: at 40%, a step 3 faster than step 2 had already logged.)"""
    marker = output_dir / "checkpoints" / f"step_{SAVE_EVERY}" / MARKER_FILE
    driver = start_driver(config, log)
    try:
        wait_for_file(driver, marker, log)
        step_seconds = records(output_dir)[-1]["timing_s/step"]
        time.sleep(0.15 * step_seconds)
        logged = [record["step"] for record in records(output_dir)]
        assert logged == list(range(1, KILLED_IN)), f"step {KILLED_IN} ended before the kill: {logged}"
        os.kill(driver.pid, signal.SIGKILL)
        assert driver.wait(timeout=30) == -signal.SIGKILL
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_kill_9_mid_step_then_resume_repeats_the_uninterrupted_steps(tmp_path):
    root = write_task(tmp_path, prompts=PROMPTS)
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    run_to_the_end(write_run_config(root, reference_dir), tmp_path / "reference.log")
    reference = {record["step"]: record for record in records(reference_dir)}
    assert sorted(reference) == list(range(1, STEPS + 1))

    config = write_run_config(root, killed_dir)
    kill_in_step(config, killed_dir, tmp_path / "killed.log")
    checkpoints = killed_dir / "checkpoints"
    assert sorted(path.name for path in checkpoints.iterdir()) == [f"step_{SAVE_EVERY}"]
    before = records(killed_dir)

    output = run_to_the_end(config, tmp_path / "resumed.log")
    assert f"resumed from {checkpoints / f'step_{SAVE_EVERY}'} at step {SAVE_EVERY}" in output
    resumed = records(killed_dir)
    # Each step once; the steps before the kill keep the killed run's records.
    assert [record["step"] for record in resumed] == list(range(1, STEPS + 1))
    assert resumed[:SAVE_EVERY] == before
    for record in resumed[SAVE_EVERY:]:
        step = record["step"]
        want, got = training_metrics(reference[step]), training_metrics(record)
        assert got.keys() == want.keys(), step
        # The numbers that show the restored state: a wrong data position or seed changes the
        # scores and lengths, a wrong optimizer state or schedule the loss, grad norm and lr.
        for key in ("score/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm", "actor/lr"):
            assert key in got, (step, key)
        # Bit for bit: the same computation on the same state.
        mismatched = {key: (want[key], got[key]) for key in want if got[key] != want[key]}
        assert not mismatched, (step, mismatched)
    # The schedule moves every step, so equal lrs are evidence of a restored schedule, not a constant.
    lrs = [reference[step]["actor/lr"] for step in range(1, STEPS + 1)]
    assert len(set(lrs)) == STEPS, lrs
